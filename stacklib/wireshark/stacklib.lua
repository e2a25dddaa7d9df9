-- Wireshark dissectors for stacklib's wire formats (docs/captures.md).
--
--   unet    the U-Net/FE header after EtherType 0x88B5: message length and port
--           (paper 001 §3.2; stacklib/wire/unet_eth.py)
--   uam     U-Net Active Messages PDUs (paper 000 §5; stacklib/layers/uam/wire.py), found in
--           U-Net/FE messages and in AAL5 messages of SunATM captures
--   splitc  Split-C scalar accesses in the four argument words of a UAM request or reply
--           (paper 000 §6; stacklib/layers/splitc/wire.py)
--
-- Load it for one run with `tshark -X lua_script:stacklib.lua -r FILE`, or install it where
-- Wireshark looks for plugins (`stacklib wireshark --install`).  Field names: unet.*, uam.*,
-- splitc.*, as below.
--
-- What a U-Net message holds is not written in the frame: the dissector recognises an IPv4
-- datagram by a version-4 header whose length and checksum are right (IP/UDP/TCP over U-Net),
-- and a UAM PDU by the checks stacklib's UAM parser makes (a known type, at most four
-- arguments, exactly the bytes the type announces); anything else is data.  The preference
-- unet.uam_ports (e.g. `-o unet.uam_ports:1`) makes every message on those U-Net ports UAM,
-- without the guess (to see what is wrong with a broken PDU).  On ATM, stacklib writes traffic type 0 (unknown) and
-- the same guess runs on each AAL5 message (preference uam.atm, on by default); LLC/SNAP
-- messages (AA AA 03) still go to LLC.

local ETHERTYPE_UNET = 0x88B5
local UNET_HEADER = 3 -- length (u16), port (u8), after the Ethernet header
local UAM_HEADER = 8
local UAM_BULK = 16
local UAM_MAX_ARGS = 4

-- --- U-Net/FE -------------------------------------------------------------------------------

local unet = Proto("unet", "U-Net/FE")
local unet_f = {
    length = ProtoField.uint16("unet.length", "Message length", base.DEC),
    port = ProtoField.uint8("unet.port", "Port", base.DEC),
    padding = ProtoField.bytes("unet.padding", "Padding"),
}
unet.fields = { unet_f.length, unet_f.port, unet_f.padding }
local unet_e = {
    short = ProtoExpert.new("unet.short", "Shorter than the 3-byte U-Net header",
        expert.group.MALFORMED, expert.severity.ERROR),
    length = ProtoExpert.new("unet.length_past_data", "Length field past the frame's data",
        expert.group.MALFORMED, expert.severity.ERROR),
}
unet.experts = { unet_e.short, unet_e.length }
-- Another plugin may claim a port's messages: DissectorTable.get("unet.port"):add(N, proto).
local unet_ports = DissectorTable.new("unet.port", "U-Net port", ftypes.UINT8, base.DEC, unet)
unet.prefs.uam_ports = Pref.range("Ports carrying UAM", "",
    "U-Net ports whose messages are dissected as UAM PDUs without guessing, e.g. 1,3-5", 255)

-- The ports of a range preference's text ("1,3-5"), as a set.
local function port_set(text)
    local ports = {}
    for first, last in string.gmatch(text or "", "(%d+)%s*%-?%s*(%d*)") do
        local low = tonumber(first)
        local high = tonumber(last) or low
        for port = low, math.min(high, 255) do ports[port] = true end
    end
    return ports
end
local uam_ports = {}

-- --- UAM ------------------------------------------------------------------------------------

local UAM_TYPES = {
    [1] = "REQUEST", [2] = "REPLY", [3] = "ACK", [4] = "STORE", [5] = "GET", [6] = "GET_REPLY",
}
local UAM_BULK_TYPES = { [4] = true, [5] = true, [6] = true }
local UAM_DATA_TYPES = { [4] = true, [6] = true }
local UAM_STATUS = { [0] = "ok", [1] = "bad remote address" }

local uam = Proto("uam", "U-Net Active Messages")
local uam_f = {
    type = ProtoField.uint8("uam.type", "Type", base.DEC, UAM_TYPES),
    handler = ProtoField.uint8("uam.handler", "Handler", base.DEC),
    status = ProtoField.uint8("uam.status", "Status", base.DEC, UAM_STATUS),
    seq = ProtoField.uint16("uam.seq", "Sequence number", base.DEC),
    ack = ProtoField.uint16("uam.ack", "Acknowledgment (next seq to handle)", base.DEC),
    nargs = ProtoField.uint8("uam.nargs", "Argument words", base.DEC),
    reserved = ProtoField.uint8("uam.reserved", "Reserved", base.HEX),
    arg = ProtoField.uint32("uam.arg", "Argument", base.HEX),
    region = ProtoField.uint16("uam.region", "Region", base.DEC),
    xfer = ProtoField.uint16("uam.xfer", "Transfer", base.DEC),
    offset = ProtoField.uint32("uam.offset", "Offset", base.DEC),
    total = ProtoField.uint32("uam.total", "Total bytes", base.DEC),
    chunk = ProtoField.uint32("uam.chunk", "Chunk offset", base.DEC),
    data = ProtoField.bytes("uam.data", "Data"),
}
uam.fields = {
    uam_f.type, uam_f.handler, uam_f.status, uam_f.seq, uam_f.ack, uam_f.nargs,
    uam_f.reserved, uam_f.arg, uam_f.region, uam_f.xfer, uam_f.offset, uam_f.total,
    uam_f.chunk, uam_f.data,
}
local uam_malformed = ProtoExpert.new("uam.malformed", "Malformed UAM PDU",
    expert.group.MALFORMED, expert.severity.ERROR)
uam.experts = { uam_malformed }
-- stacklib's UdpParams.port: the port of UDP's datagram face (stacklib/layers/udp/driver.py).
local UDP_FACE_PORT = 5995
uam.prefs.udp_port = Pref.uint("UDP port of the datagram face", UDP_FACE_PORT,
    "Datagrams to or from this UDP port are dissected as UAM where they are UAM PDUs")
uam.prefs.atm = Pref.bool("Guess the contents of unknown AAL5 traffic", true,
    "On SunATM captures of traffic type 0 (stacklib's U-Net/ATM), dissect each AAL5 message "
    .. "as IPv4, UAM or LLC/SNAP where it looks like one, else as data")

-- --- Split-C --------------------------------------------------------------------------------

local SPLITC_KINDS = { [1] = "READ", [2] = "WRITE", [3] = "STORE", [5] = "VALUE", [6] = "ACK" }
local SPLITC_REQUESTS = { [1] = true, [2] = true, [3] = true }
local SPLITC_REPLIES = { [5] = true, [6] = true }
local SPLITC_STATUS = { [0] = "ok", [1] = "no such region", [2] = "out of bounds" }

local splitc = Proto("splitc", "Split-C")
local splitc_f = {
    kind = ProtoField.uint8("splitc.kind", "Kind", base.DEC, SPLITC_KINDS, 0xF0),
    size = ProtoField.uint8("splitc.size", "Size", base.DEC, nil, 0x0F),
    region = ProtoField.uint8("splitc.region", "Region", base.DEC),
    status = ProtoField.uint8("splitc.status", "Status", base.DEC, SPLITC_STATUS),
    op = ProtoField.uint16("splitc.op", "Operation", base.DEC),
    offset = ProtoField.uint32("splitc.offset", "Offset", base.DEC),
    reserved = ProtoField.uint32("splitc.reserved", "Reserved", base.HEX),
    value = ProtoField.bytes("splitc.value", "Value"),
}
splitc.fields = {
    splitc_f.kind, splitc_f.size, splitc_f.region, splitc_f.status, splitc_f.op,
    splitc_f.offset, splitc_f.reserved, splitc_f.value,
}
-- Split-C's runtime enters its handlers first, in this order (stacklib/layers/splitc/
-- runtime.py): the scalar request handler at index 0 and the reply handler at index 1.
splitc.prefs.request_handler = Pref.uint("UAM handler of requests", 0,
    "Index of Split-C's request handler in UAM's handler table")
splitc.prefs.reply_handler = Pref.uint("UAM handler of replies", 1,
    "Index of Split-C's reply handler in UAM's handler table")

-- --- recognising a message ------------------------------------------------------------------

-- An IPv4 header of version 4 whose total length fits the message and whose checksum holds.
local function is_ipv4(tvb)
    local size = tvb:len()
    if size < 20 then return false end
    local first = tvb(0, 1):uint()
    if bit.rshift(first, 4) ~= 4 then return false end
    local ihl = bit.band(first, 0x0F) * 4
    if ihl < 20 or ihl > size then return false end
    local total = tvb(2, 2):uint()
    if total < ihl or total > size then return false end
    local sum = 0
    for i = 0, ihl - 2, 2 do sum = sum + tvb(i, 2):uint() end
    while sum > 0xFFFF do sum = bit.band(sum, 0xFFFF) + bit.rshift(sum, 16) end
    return sum == 0xFFFF
end

-- Nil if `tvb` is a UAM PDU stacklib's parser accepts, else the reason it would refuse it
-- (stacklib/layers/uam/wire.py: parse, _check).
local function uam_problem(tvb)
    local size = tvb:len()
    if size < UAM_HEADER then return "shorter than the 8-byte header" end
    local kind = tvb(0, 1):uint()
    local handler = tvb(1, 1):uint()
    local seq = tvb(2, 2):uint()
    local nargs = tvb(6, 1):uint()
    if UAM_TYPES[kind] == nil then return "unknown PDU type " .. kind end
    if nargs > UAM_MAX_ARGS then return "more than 4 argument words" end
    local position = UAM_HEADER + 4 * nargs
    local needed = position
    if UAM_BULK_TYPES[kind] then needed = position + UAM_BULK end
    if size < needed then return "shorter than its arguments and bulk header" end
    if not UAM_DATA_TYPES[kind] and size > needed then
        return "bytes after a PDU that carries no data"
    end
    if UAM_BULK_TYPES[kind] then
        local length = size - needed
        if kind == 5 and nargs > 0 then length = tvb(UAM_HEADER, 4):uint() end
        local total = tvb(position + 8, 4):uint()
        local chunk = tvb(position + 12, 4):uint()
        if chunk + length > total then return "chunk outside its transfer" end
    end
    if kind == 3 and (nargs > 0 or handler ~= 0 or seq ~= 0) then
        return "an ACK carries only its ack field"
    end
    if kind == 5 and nargs ~= 1 then return "a GET carries 1 argument" end
    if kind == 6 and handler ~= 0 and (nargs > 0 or size > needed) then
        return "a failed GET_REPLY carries no data"
    end
    return nil
end

local ip_dissector = Dissector.get("ip")
local llc_dissector = Dissector.get("llc")
local data_dissector = Dissector.get("data")

-- What a U-Net message is, guessed from its bytes (see the top of this file).
local function dissect_message(tvb, pinfo, tree)
    if is_ipv4(tvb) then
        return ip_dissector:call(tvb, pinfo, tree)
    end
    if uam_problem(tvb) == nil then
        return uam.dissector(tvb, pinfo, tree)
    end
    return data_dissector:call(tvb, pinfo, tree)
end

-- --- dissectors -----------------------------------------------------------------------------

function unet.dissector(tvb, pinfo, tree)
    local size = tvb:len()
    local item = tree:add(unet, tvb(0, math.min(size, UNET_HEADER)))
    pinfo.cols.protocol = "U-Net"
    if size < UNET_HEADER then
        item:add_proto_expert_info(unet_e.short)
        return size
    end
    local length = tvb(0, 2):uint()
    local port = tvb(2, 1):uint()
    local length_item = item:add(unet_f.length, tvb(0, 2))
    item:add(unet_f.port, tvb(2, 1))
    item:append_text(string.format(", port %d, %d bytes", port, length))
    pinfo.cols.info = string.format("U-Net port %d, %d bytes", port, length)
    if length > size - UNET_HEADER then
        length_item:add_proto_expert_info(unet_e.length)
        return size
    end
    if size > UNET_HEADER + length then
        item:add(unet_f.padding, tvb(UNET_HEADER + length))
    end
    if length > 0 then
        local message = tvb(UNET_HEADER, length):tvb()
        local chosen = unet_ports:get_dissector(port)
        if chosen ~= nil then
            chosen:call(message, pinfo, tree)
        elseif uam_ports[port] then
            uam.dissector(message, pinfo, tree)
        else
            dissect_message(message, pinfo, tree)
        end
    end
    return size
end

-- The 16 bytes of a request's or reply's four words; the kind says which (their kinds differ).
function splitc.dissector(words, pinfo, tree)
    local first = words(0, 1):uint()
    local kind = bit.rshift(first, 4)
    local request = SPLITC_REQUESTS[kind] ~= nil
    local item = tree:add(splitc, words)
    item:add(splitc_f.kind, words(0, 1))
    item:add(splitc_f.size, words(0, 1))
    if request then
        item:add(splitc_f.region, words(1, 1))
    else
        item:add(splitc_f.status, words(1, 1))
    end
    item:add(splitc_f.op, words(2, 2))
    if request then
        item:add(splitc_f.offset, words(4, 4))
    else
        item:add(splitc_f.reserved, words(4, 4))
    end
    item:add(splitc_f.value, words(8, 8))
    local size = bit.band(first, 0x0F)
    local text = string.format("%s op=%d size=%d", SPLITC_KINDS[kind], words(2, 2):uint(), size)
    if request then
        text = text .. string.format(" region=%d offset=%d", words(1, 1):uint(), words(4, 4):uint())
    end
    item:append_text(", " .. text)
    pinfo.cols.protocol = "Split-C"
    pinfo.cols.info:append(", Split-C " .. text)
    return words:len()
end

local splitc_dissector = Dissector.get("splitc")

function uam.dissector(tvb, pinfo, tree)
    local size = tvb:len()
    local item = tree:add(uam, tvb())
    pinfo.cols.protocol = "UAM"
    if size < UAM_HEADER then
        item:add_proto_expert_info(uam_malformed, "shorter than the 8-byte header")
        return size
    end
    local kind = tvb(0, 1):uint()
    local handler = tvb(1, 1):uint()
    local nargs = tvb(6, 1):uint()
    item:add(uam_f.type, tvb(0, 1))
    if kind == 6 then
        item:add(uam_f.status, tvb(1, 1))
    else
        item:add(uam_f.handler, tvb(1, 1))
    end
    item:add(uam_f.seq, tvb(2, 2))
    item:add(uam_f.ack, tvb(4, 2))
    item:add(uam_f.nargs, tvb(6, 1))
    item:add(uam_f.reserved, tvb(7, 1))
    local name = UAM_TYPES[kind] or string.format("type %d", kind)
    local info = string.format("UAM %s seq=%d ack=%d", name, tvb(2, 2):uint(), tvb(4, 2):uint())
    if kind == 1 or kind == 2 or kind == 4 then info = info .. " handler=" .. handler end
    item:append_text(", " .. info:sub(5))
    pinfo.cols.info = info
    local problem = uam_problem(tvb)
    if problem ~= nil then
        item:add_proto_expert_info(uam_malformed, "Malformed UAM PDU: " .. problem)
        pinfo.cols.info:append(" [malformed: " .. problem .. "]")
    end
    local position = UAM_HEADER
    local nwords = math.min(nargs, UAM_MAX_ARGS, math.floor((size - position) / 4))
    for i = 0, nwords - 1 do
        item:add(uam_f.arg, tvb(position + 4 * i, 4))
    end
    position = position + 4 * nwords
    if UAM_BULK_TYPES[kind] and size >= position + UAM_BULK then
        item:add(uam_f.region, tvb(position, 2))
        item:add(uam_f.xfer, tvb(position + 2, 2))
        item:add(uam_f.offset, tvb(position + 4, 4))
        item:add(uam_f.total, tvb(position + 8, 4))
        item:add(uam_f.chunk, tvb(position + 12, 4))
        position = position + UAM_BULK
    end
    if size > position then
        item:add(uam_f.data, tvb(position))
    end
    -- Split-C: a request to its request handler, a reply to its reply handler, whose kind is
    -- one of a request's or a reply's.
    if problem == nil and nargs == 4 and (kind == 1 or kind == 2) then
        local expected, kinds = splitc.prefs.reply_handler, SPLITC_REPLIES
        if kind == 1 then expected, kinds = splitc.prefs.request_handler, SPLITC_REQUESTS end
        if handler == expected and kinds[bit.rshift(tvb(UAM_HEADER, 1):uint(), 4)] then
            splitc_dissector:call(tvb(UAM_HEADER, 16):tvb(), pinfo, tree)
        end
    end
    return size
end

-- U-Net/ATM: an AAL5 message of unknown traffic type, as stacklib writes them.
local unet_atm = Proto("unet_atm", "U-Net/ATM")

function unet_atm.dissector(tvb, pinfo, tree)
    if tvb:len() >= 3 and tvb(0, 3):uint() == 0xAAAA03 then
        return llc_dissector:call(tvb, pinfo, tree)
    end
    return dissect_message(tvb, pinfo, tree)
end

-- UAM over UDP: the datagram face of stacklib's UDP layer, one port on every node.
local uam_udp = Proto("uam_udp", "UAM over UDP")

function uam_udp.dissector(tvb, pinfo, tree)
    if uam_problem(tvb) == nil then
        return uam.dissector(tvb, pinfo, tree)
    end
    return data_dissector:call(tvb, pinfo, tree)
end

-- --- registration ---------------------------------------------------------------------------

DissectorTable.get("ethertype"):add(ETHERTYPE_UNET, unet)

local aal5_types = DissectorTable.get("atm.aal5.type")
local TRAFFIC_UNKNOWN = 0

local function register_atm()
    if uam.prefs.atm then
        aal5_types:add(TRAFFIC_UNKNOWN, unet_atm)
    else
        aal5_types:remove(TRAFFIC_UNKNOWN, unet_atm)
    end
end

local udp_ports = DissectorTable.get("udp.port")
local udp_port = nil

local function register_udp()
    if udp_port ~= nil then udp_ports:remove(udp_port, uam_udp) end
    udp_port = uam.prefs.udp_port
    if udp_port ~= 0 then udp_ports:add(udp_port, uam_udp) end
end

function uam.prefs_changed()
    register_atm()
    register_udp()
end

function unet.prefs_changed()
    uam_ports = port_set(unet.prefs.uam_ports)
end

register_atm()
register_udp()

/* The UAM C core's types: a PDU kept until acknowledged (Out) and the core's state (Core),
 * with the argument binding its methods share.  Included by _uamcore.c only (one
 * translation unit, built by `stacklib compile`). */
#ifndef STACKLIB_UAMCORE_TYPES_H
#define STACKLIB_UAMCORE_TYPES_H

/* ------------------------------------------------------------------ a PDU kept until acked */

typedef struct {
    PyObject_HEAD
    long type;
    long handler;
    PyObject *args; /* a tuple of ints */
    PyObject *bulk; /* a Bulk, or None */
    PyObject *data; /* bytes */
    char credit;    /* consumes window space (requests, store chunks, gets) */
    char acked;
    long seq;
    long transmissions;
} Out;

static void Out_dealloc(Out *self) {
    Py_XDECREF(self->args);
    Py_XDECREF(self->bulk);
    Py_XDECREF(self->data);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyMemberDef Out_members[] = {
    {"type", T_LONG, offsetof(Out, type), READONLY, NULL},
    {"handler", T_LONG, offsetof(Out, handler), READONLY, NULL},
    {"args", T_OBJECT, offsetof(Out, args), READONLY, NULL},
    {"bulk", T_OBJECT, offsetof(Out, bulk), READONLY, NULL},
    {"data", T_OBJECT, offsetof(Out, data), READONLY, NULL},
    {"credit", T_BOOL, offsetof(Out, credit), READONLY, NULL},
    {"acked", T_BOOL, offsetof(Out, acked), READONLY, NULL},
    {"seq", T_LONG, offsetof(Out, seq), READONLY, NULL},
    {"transmissions", T_LONG, offsetof(Out, transmissions), READONLY, NULL},
    {NULL},
};

static PyTypeObject OutType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "stacklib.layers.uam._uamcore._Out",
    .tp_doc = "A PDU kept until acknowledged (made by the core only).",
    .tp_basicsize = sizeof(Out),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = (destructor)Out_dealloc,
    .tp_members = Out_members,
};

static Out *new_out(long type, long handler, PyObject *args, PyObject *bulk, PyObject *data,
                    int credit) {
    Out *out = PyObject_New(Out, &OutType);
    if (out == NULL) {
        return NULL;
    }
    out->type = type;
    out->handler = handler;
    Py_INCREF(args);
    out->args = args;
    Py_INCREF(bulk);
    out->bulk = bulk;
    Py_INCREF(data);
    out->data = data;
    out->credit = (char)credit;
    out->acked = 0;
    out->seq = -1;
    out->transmissions = 0;
    return out;
}

/* ------------------------------------------------------------------ the core */

typedef struct {
    PyObject_HEAD
    long window;
    double rto;
    long max_retries;
    double ack_delay;
    long chunk_size;
    long ack_threshold;
    char failed;
    /* Sender half. */
    long next_seq;
    long credits_used;
    double deadline;
    char has_deadline;
    long retries;
    PyObject *unacked; /* list of Out */
    PyObject *backlog; /* list of Out: credit PDUs waiting for window space */
    PyObject *to_send; /* list of Out */
    /* Receiver half. */
    long expected;
    long handled_through;
    long owed;
    double ack_deadline;
    char has_ack_deadline;
    char ack_now;
    long open_token;
    char has_open_token;
    long open_type;
    PyObject *open_pdu; /* the arrival being handled that may be answered, or None */
    PyObject *ready;    /* list of arrival tuples */
    PyObject *events;   /* list of events */
    /* Counters. */
    long sent, retransmitted, timeouts, acks_sent, acks_received, received, handled;
    long duplicates, out_of_order, no_buffer, malformed, stale_acks, ignored;
    /* What the last express_poll / express_send took and wrote (uamcore_express.h). */
    long express_taken, express_bytes, express_handled;
    long express_sent, express_sent_bytes, express_wakes;
    char express_broken;
} Core;

/* Bind a METH_FASTCALL | METH_KEYWORDS call's arguments to the parameters ``names`` (all
 * required, positional or by keyword, as the reference's methods take them): out[i] is a
 * borrowed reference to the value of names[i].  -1 with TypeError naming the problem. */
static int bind(const char *method, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
                const char *const *names, Py_ssize_t count, PyObject **out) {
    if (nargs > count) {
        PyErr_Format(PyExc_TypeError, "%s() takes %zd arguments (%zd given)", method, count,
                     nargs);
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        out[i] = i < nargs ? args[i] : NULL;
    }
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        Py_ssize_t i;
        for (i = 0; i < count; i++) {
            if (PyUnicode_CompareWithASCIIString(key, names[i]) == 0) {
                break;
            }
        }
        if (i == count) {
            PyErr_Format(PyExc_TypeError, "%s() got an unexpected keyword argument '%U'", method,
                         key);
            return -1;
        }
        if (out[i] != NULL) {
            PyErr_Format(PyExc_TypeError, "%s() got multiple values for argument '%s'", method,
                         names[i]);
            return -1;
        }
        out[i] = args[nargs + k];
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        if (out[i] == NULL) {
            PyErr_Format(PyExc_TypeError, "%s() missing required argument '%s'", method,
                         names[i]);
            return -1;
        }
    }
    return 0;
}

#define BIND(method, ...)                                                                      \
    static const char *const names[] = {__VA_ARGS__};                                         \
    PyObject *arg[sizeof(names) / sizeof(names[0])];                                           \
    if (bind(method, args, nargs, kwnames, names, sizeof(names) / sizeof(names[0]), arg) < 0) \
        return NULL;

static PyObject *s_check_room, *s_check_args, *s_check_handler, *s_take_token;
static PyObject *s_receive_other, *s_event, *s_fail, *empty_bytes, *one_int;

/* The value of an exact int in [0, max], or -1 (no error set) if it is anything else. */
static inline long small_value(PyObject *obj, unsigned long max) {
    if (!PyLong_CheckExact(obj)) {
        return -1;
    }
    int overflow;
    long value = PyLong_AsLongAndOverflow(obj, &overflow);
    if (overflow || value < 0 || (unsigned long)value > max) {
        PyErr_Clear();
        return -1;
    }
    return value;
}

static inline PyObject *optional_float(char has, double value) {
    if (!has) {
        Py_RETURN_NONE;
    }
    return PyFloat_FromDouble(value);
}

/* A REQUEST, REPLY or ACK into p (room for SMALL_MAX bytes): the 8-byte header and the words,
 * big-endian.  Its length, or -1 with an error set. */
static Py_ssize_t pack_small_into(unsigned char *p, long type, long handler, long seq, long ack,
                                  PyObject *words) {
    Py_ssize_t nargs = words == NULL ? 0 : PyTuple_GET_SIZE(words);
    p[0] = (unsigned char)type;
    p[1] = (unsigned char)handler;
    p[2] = (unsigned char)(seq >> 8);
    p[3] = (unsigned char)seq;
    p[4] = (unsigned char)(ack >> 8);
    p[5] = (unsigned char)ack;
    p[6] = (unsigned char)nargs;
    p[7] = 0;
    for (Py_ssize_t i = 0; i < nargs; i++) {
        unsigned long word = PyLong_AsUnsignedLong(PyTuple_GET_ITEM(words, i));
        if (word == (unsigned long)-1 && PyErr_Occurred()) {
            return -1;
        }
        unsigned char *w = p + HEADER_SIZE + 4 * i;
        w[0] = (unsigned char)(word >> 24);
        w[1] = (unsigned char)(word >> 16);
        w[2] = (unsigned char)(word >> 8);
        w[3] = (unsigned char)word;
    }
    return HEADER_SIZE + 4 * nargs;
}

/* pack_small_into as bytes. */
static PyObject *pack_small(long type, long handler, long seq, long ack, PyObject *words) {
    unsigned char buffer[SMALL_MAX];
    Py_ssize_t length = pack_small_into(buffer, type, handler, seq, ack, words);
    return length < 0 ? NULL : PyBytes_FromStringAndSize((const char *)buffer, length);
}

/* Drop the first `count` (1 .. size) items of a list in place: the rest moved down, the
 * allocation kept (the queues here stay short and refill at once).  PyList_SetSlice does the
 * same through the general slice assignment, some 200 instructions a call, several times per
 * round trip.  The list is consistent before the dropped items are released, since releasing
 * one may run any code.  Never fails. */
static void drop_front(PyObject *list, Py_ssize_t count) {
    PyListObject *self = (PyListObject *)list;
    PyObject *dropped[8];
    while (count > 8) { /* (a cumulative acknowledgment of many: in eights) */
        drop_front(list, 8);
        count -= 8;
    }
    Py_ssize_t size = Py_SIZE(self);
    memcpy(dropped, self->ob_item, (size_t)count * sizeof(PyObject *));
    memmove(self->ob_item, self->ob_item + count, (size_t)(size - count) * sizeof(PyObject *));
    Py_SET_SIZE(self, size - count);
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_DECREF(dropped[i]);
    }
}

/* Remove and return (a new reference) the first item of a non-empty list. */
static PyObject *pop_first(PyObject *list) {
    PyObject *item = PyList_GET_ITEM(list, 0);
    Py_INCREF(item);
    drop_front(list, 1);
    return item;
}

#endif

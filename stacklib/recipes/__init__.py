"""Recipes: TOML files that name a transport, the layers bottom-up and a workload.

A recipe is validated strictly when loaded: an unknown key, a value of the wrong type, an
unknown transport, layer or workload, or layers that do not fit together is a
:class:`~stacklib.errors.ConfigError` naming the file, the key and the reason.  See
docs/recipes.md for the format.

Example::

    description = "Raw U-Net ping-pong over the in-process memory transport"

    [run]
    clock = "real"          # or "virtual": a deterministic simulation
    seed = 0

    [transport]
    kind = "memory"
    latency_us = 0.0

    [endpoint]              # EndpointConfig fields, plus emulated = true|false
    rx_buffers = 32

    [[layers]]              # bottom-up; none means raw U-Net
    kind = "arq"
    rto_us = 1000.0

    [workload]
    kind = "pingpong"
    sizes = [0, 40, 1000]
    iterations = 1000

Per-node layer parameters: every node gets its own layer objects built from the same table, but
a string value (or table key) in ``[[layers]]`` may contain ``{node}`` (the node's index,
0..n-1) or ``{node1}`` (index + 1), expanded per node before validation, so
``address = "10.0.0.{node1}"`` gives node0 10.0.0.1 and node1 10.0.0.2.  A layer whose
parameters have ``address`` and ``peers`` (IP over U-Net) and that leaves ``peers`` out of the
recipe gets it filled per node from the channel table: every other node's ``address`` -> the
channel that reaches it.

Workloads that need a number of nodes of the recipe's choosing (Split-C's SPMD programs,
``kind = "splitc"``, stacklib/bench/splitc/workload.py) carry it as an integer ``nodes``
parameter: when the workload's parameters have one, the recipe builds that many nodes,
connects every pair and expands per-node layer parameters for each (:func:`workload_nodes`);
otherwise the registered kind's fixed ``nodes`` applies.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, Literal

import attrs
import trio

from stacklib.bench import Result, Session, WorkloadKind, workload_kind
from stacklib.config import structure
from stacklib.errors import AssemblyError, ConfigError
from stacklib.registry import RegistryError
from stacklib.services import Service, UNetService
from stacklib.sim import CostProfile, RealWorld, Resource, Simulation, World
from stacklib.stack import Layer, Placement, check_fit, layer_class, open_stacks
from stacklib.transports import TransportKind, transport_kind
from stacklib.unet import EndpointConfig, connect

#: Where recipe names are looked up, in order: $STACKLIB_RECIPES (a path list), ./recipes,
#: and the recipes that ship inside this package (this folder), so they are found from any
#: directory after a plain install.
PACKAGE_RECIPES = Path(__file__).resolve().parent


def recipe_dirs() -> list[Path]:
    dirs = [Path(p) for p in os.environ.get("STACKLIB_RECIPES", "").split(os.pathsep) if p]
    dirs += [Path.cwd() / "recipes", PACKAGE_RECIPES]
    unique: list[Path] = []
    for directory in dirs:
        if directory.is_dir() and directory.resolve() not in [u.resolve() for u in unique]:
            unique.append(directory)
    return unique


@attrs.frozen
class RunSettings:
    """The ``[run]`` table: which clock, which seed."""

    clock: Literal["real", "virtual"] = "real"
    seed: int = 0


@attrs.frozen
class Recipe:
    """A loaded, validated recipe."""

    name: str
    path: Path
    description: str
    run: RunSettings
    transport: TransportKind
    transport_params: Any
    endpoint: EndpointConfig
    emulated: bool
    #: Each layer with node 0's parameters.
    layers: tuple[tuple[type[Layer[Any]], Any], ...]
    workload: WorkloadKind
    workload_params: Any
    profile: CostProfile | None
    #: ``node_params[k][i]``: layer ``k``'s parameters on node ``i`` (templates expanded); empty
    #: when made without them (every node then uses :attr:`layers`).
    node_params: tuple[tuple[Any, ...], ...] = ()
    #: Indices of the layers whose ``peers`` are filled from the channel table.
    auto_peers: frozenset[int] = frozenset()

    def make_layers(
        self, node: int = 0, channels: Mapping[int, int] | None = None
    ) -> list[Layer[Any]]:
        """Fresh layer objects for node ``node``'s stack.

        ``channels`` maps every other node's index to the channel id that reaches it; layers in
        :attr:`auto_peers` get ``peers`` = {that node's ``address``: channel}.
        """
        made: list[Layer[Any]] = []
        for k, (cls, params) in enumerate(self.layers):
            if self.node_params:
                if node >= len(self.node_params[k]):
                    raise ConfigError(
                        str(self.path),
                        "workload.kind",
                        f"layer parameters were expanded for {len(self.node_params[k])} nodes, "
                        f"not node {node}",
                    )
                params = self.node_params[k][node]
            if k in self.auto_peers and channels:
                peers = {self.node_params[k][j].address: ch for j, ch in channels.items()}
                params = attrs.evolve(params, peers=peers)
            made.append(cls(params))
        return made


_TOP_KEYS = {"description", "run", "transport", "endpoint", "host", "layers", "workload"}


def _table(data: Mapping[str, object], key: str, where: str) -> Mapping[str, object]:
    value = data.get(key, {})
    if not isinstance(value, Mapping):
        raise ConfigError(where, key, f"expected a table, got {type(value).__name__}")
    return value


def _kind(table: Mapping[str, object], where: str, key: str) -> tuple[str, dict[str, object]]:
    rest = dict(table)
    kind = rest.pop("kind", None)
    if not isinstance(kind, str):
        raise ConfigError(where, f"{key}.kind", "missing or not a string")
    return kind, rest


_TEMPLATE = re.compile(r"\{([^{}]*)\}")


def expand_node(value: object, node: int, where: str, key: str) -> object:
    """``value`` with ``{node}`` and ``{node1}`` in its strings (and table keys) replaced by
    ``node`` and ``node + 1``; any other ``{...}`` is a :class:`ConfigError` naming ``key``."""

    def substitute(text: str) -> str:
        def one(match: re.Match[str]) -> str:
            name = match.group(1)
            if name == "node":
                return str(node)
            if name == "node1":
                return str(node + 1)
            raise ConfigError(
                where, key, f"unknown template {match.group(0)!r} (known: {{node}}, {{node1}})"
            )

        return _TEMPLATE.sub(one, text)

    if isinstance(value, str):
        return substitute(value)
    if isinstance(value, Mapping):
        out: dict[object, object] = {}
        for k, v in value.items():
            sub_key = f"{key}.{k}"
            out[substitute(k) if isinstance(k, str) else k] = expand_node(v, node, where, sub_key)
        return out
    if isinstance(value, list):
        return [expand_node(v, node, where, f"{key}[{i}]") for i, v in enumerate(value)]
    return value


def _expand_table(
    table: Mapping[str, object], node: int, where: str, key: str
) -> Mapping[str, object]:
    expanded = expand_node(table, node, where, key)
    assert isinstance(expanded, Mapping)
    return expanded


def _wants_peers(cls: type[Layer[Any]], params: Mapping[str, object]) -> bool:
    """Whether the layer's ``peers`` should be filled from the channel table."""
    names = {field.name for field in attrs.fields(cls.Params)} if attrs.has(cls.Params) else set()
    return {"address", "peers"} <= names and "peers" not in params


def workload_nodes(workload: WorkloadKind, params: object) -> int:
    """How many nodes ``workload`` runs on with ``params``: their integer ``nodes`` if they
    have one, else the kind's fixed number."""
    nodes = getattr(params, "nodes", None)
    if isinstance(nodes, int) and not isinstance(nodes, bool):
        return nodes
    return workload.nodes


def find_recipe(name_or_path: str | os.PathLike[str]) -> Path:
    """The file of a recipe given by path or by name (``unet-memory-pingpong``)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    name = path.name.removesuffix(".toml")
    for directory in recipe_dirs():
        candidate = directory / f"{name}.toml"
        if candidate.is_file():
            return candidate
    searched = ", ".join(str(d) for d in recipe_dirs()) or "no recipe folders found"
    raise ConfigError(str(name_or_path), "", f"no such recipe file or name (searched {searched})")


def load_recipe(name_or_path: str | os.PathLike[str]) -> Recipe:
    """Load and validate a recipe."""
    path = find_recipe(name_or_path)
    return parse_recipe(read_recipe_file(path), str(path), path)


def read_recipe_file(path: Path) -> dict[str, Any]:
    """The TOML table of the recipe file ``path``.  A file that cannot be read, is not UTF-8
    (TOML's encoding) or is not valid TOML raises :class:`~stacklib.errors.ConfigError`
    naming the file and the reason."""
    where = str(path)
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(where, "", f"not valid TOML: {error}") from None
    except UnicodeDecodeError as error:
        raise ConfigError(
            where,
            "",
            f"not UTF-8 text (byte {error.start}: {error.object[error.start : error.start + 1]!r})",
        ) from None
    except OSError as error:
        raise ConfigError(where, "", f"cannot read: {error.strerror or error}") from None


def parse_recipe(data: Mapping[str, object], where: str, path: Path | None = None) -> Recipe:
    """Validate recipe data (as parsed from TOML)."""
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise ConfigError(
            where, unknown[0], f"unknown key (known keys: {', '.join(sorted(_TOP_KEYS))})"
        )
    description = data.get("description", "")
    if not isinstance(description, str):
        raise ConfigError(where, "description", "expected a string")
    run = structure(RunSettings, _table(data, "run", where), where, "run")

    kind_name, params = _kind(_table(data, "transport", where), where, "transport")
    try:
        transport = transport_kind(kind_name)
    except RegistryError as error:
        raise ConfigError(where, "transport.kind", str(error)) from None
    if transport.clock != "any" and transport.clock != run.clock:
        raise ConfigError(
            where, "run.clock", f"transport {kind_name!r} runs only in {transport.clock} time"
        )
    transport_params = structure(transport.Params, params, where, "transport")

    if transport.open_nodes is not None and "endpoint" in data:
        raise ConfigError(
            where,
            "endpoint",
            f"transport {kind_name!r} runs {transport.bottom.__name__} on its nodes, "
            "not U-Net endpoints",
        )
    endpoint_table = dict(_table(data, "endpoint", where))
    emulated = endpoint_table.pop("emulated", False)
    if not isinstance(emulated, bool):
        raise ConfigError(where, "endpoint.emulated", "expected true or false")
    endpoint = structure(EndpointConfig, endpoint_table, where, "endpoint")

    host = _table(data, "host", where)
    unknown = sorted(set(host) - {"profile"})
    if unknown:
        raise ConfigError(where, f"host.{unknown[0]}", "unknown key (known keys: profile)")
    profile = None
    if "profile" in host:
        profile_table = host["profile"]
        if not isinstance(profile_table, Mapping):
            raise ConfigError(where, "host.profile", "expected a table")
        try:
            profile = CostProfile.from_mapping(profile_table, where)
        except ConfigError as error:
            raise ConfigError(where, f"host.profile.{error.key}", error.reason) from None

    raw_layers = data.get("layers", [])
    if not isinstance(raw_layers, list):
        raise ConfigError(where, "layers", "expected an array of tables ([[layers]])")
    layers = []
    raw_params: list[dict[str, object]] = []
    for index, raw in enumerate(raw_layers):
        key = f"layers[{index}]"
        if not isinstance(raw, Mapping):
            raise ConfigError(where, key, "expected a table")
        layer_name, params = _kind(raw, where, key)
        try:
            cls = layer_class(layer_name)
        except RegistryError as error:
            raise ConfigError(where, f"{key}.kind", str(error)) from None
        raw_params.append(params)
        layers.append(
            (cls, structure(cls.Params, _expand_table(params, 0, where, key), where, key))
        )

    workload_name, params = _kind(_table(data, "workload", where), where, "workload")
    try:
        workload = workload_kind(workload_name)
    except RegistryError as error:
        raise ConfigError(where, "workload.kind", str(error)) from None
    workload_params = structure(workload.Params, params, where, "workload")
    nodes = workload_nodes(workload, workload_params)
    node_params, auto_peers = _per_node(layers, raw_params, nodes, where)

    layer_objects = [cls(p) for cls, p in layers]
    try:
        check_fit(transport.bottom, layer_objects)
    except AssemblyError as error:
        raise ConfigError(where, "layers", str(error)) from None
    top = layer_objects[-1].provides if layer_objects else transport.bottom
    if not workload.accepts(top):
        raise ConfigError(
            where,
            "workload.kind",
            f"workload {workload_name!r} needs {workload.needs} but the "
            f"stack's top provides {top.kind!r}",
        )
    name = path.stem if path is not None else "recipe"
    return Recipe(
        name=name,
        path=path if path is not None else Path(where),
        description=description,
        run=run,
        transport=transport,
        transport_params=transport_params,
        endpoint=endpoint,
        emulated=emulated,
        layers=tuple(layers),
        workload=workload,
        workload_params=workload_params,
        profile=profile,
        node_params=node_params,
        auto_peers=auto_peers,
    )


def _per_node(
    layers: Sequence[tuple[type[Layer[Any]], Any]],
    raw_params: Sequence[Mapping[str, object]],
    nodes: int,
    where: str,
) -> tuple[tuple[tuple[Any, ...], ...], frozenset[int]]:
    """Every layer's parameters on every node, and the layers that get ``peers`` filled."""
    node_params = []
    auto: set[int] = set()
    for index, ((cls, first), raw) in enumerate(zip(layers, raw_params, strict=True)):
        key = f"layers[{index}]"
        per_node = [first] + [
            structure(cls.Params, _expand_table(raw, i, where, key), where, key)
            for i in range(1, nodes)
        ]
        if _wants_peers(cls, raw):
            addresses = [p.address for p in per_node]
            if len(set(addresses)) < len(addresses):
                raise ConfigError(
                    where,
                    f"{key}.address",
                    f"nodes share the address {addresses[0]!r}; give each its own with "
                    "{node} or {node1}, e.g. '10.0.0.{node1}', or set peers",
                )
            auto.add(index)
        node_params.append(tuple(per_node))
    return tuple(node_params), frozenset(auto)


def list_recipes() -> list[tuple[str, str, Path]]:
    """(name, description, path) of every recipe in the recipe folders, by name."""
    found: dict[str, tuple[str, str, Path]] = {}
    for directory in recipe_dirs():
        for path in sorted(directory.glob("*.toml")):
            if path.stem in found:
                continue
            try:
                description = read_recipe_file(path).get("description", "")
            except ConfigError as error:
                description = f"(unreadable: {error.reason})"
            found[path.stem] = (path.stem, str(description), path)
    return [found[name] for name in sorted(found)]


async def _run(recipe: Recipe, world: World, params: Any, pcap: str | None = None) -> Result:
    async with open_session(recipe, world, params, pcap=pcap) as session:
        return await recipe.workload.run(session, params)


@asynccontextmanager
async def open_session(
    recipe: Recipe,
    world: World,
    workload_params: Any = None,
    *,
    pcap: str | None = None,
) -> AsyncIterator[Session]:
    """Build the recipe's network in ``world``, open one stack per node and yield the
    :class:`~stacklib.bench.Session` a workload runs on (its top services and peer tables).

    Call it inside ``world``'s run (``Simulation.run`` or ``trio.run``); leaving the block
    closes the stacks.  ``workload_params`` (default: the recipe's) decide how many nodes a
    workload with a ``nodes`` parameter gets; ``pcap`` names a capture file for the links of
    a simulated transport.
    """
    params = recipe.workload_params if workload_params is None else workload_params
    names = [f"node{i}" for i in range(workload_nodes(recipe.workload, params))]
    network = recipe.transport.build(world, recipe.transport_params, names, recipe.profile)
    capture = None
    if pcap is not None:
        fabric = getattr(network, "fabric", None)
        if fabric is None:
            raise ConfigError(
                str(recipe.path),
                "transport.kind",
                f"{recipe.transport.name} has no link to capture",
            )
        from stacklib.transports.sim.capture import FabricCapture

        capture = FabricCapture(fabric, pcap)
    try:
        nodes = [network.nodes[name] for name in names]
        bottoms: list[Service]
        if recipe.transport.open_nodes is not None:
            bottoms, peers = recipe.transport.open_nodes(network, recipe.transport_params)
        else:
            endpoints = [
                node.os.create_endpoint(
                    node.os.process(f"{recipe.name}@{node.name}"),
                    recipe.endpoint,
                    emulated=recipe.emulated,
                )
                for node in nodes
            ]
            peers = [{} for _ in nodes]
            for i in range(len(nodes)):
                for j in range(i + 1, len(nodes)):
                    peers[i][j], peers[j][i] = connect(endpoints[i], endpoints[j])
            bottoms = [UNetService(ep) for ep in endpoints]
        simulated = isinstance(world, Simulation)
        cpus = [node.host.resource("cpu") if simulated else None for node in nodes]
        async with _open_stacks(recipe, bottoms, peers, cpus) as services:
            yield Session(world, network, services, peers)
    finally:
        if capture is not None:
            capture.close()


@asynccontextmanager
async def _open_stacks(
    recipe: Recipe,
    bottoms: Sequence[Service],
    channels: Sequence[Mapping[int, int]],
    cpus: Sequence[Resource | None],
) -> AsyncIterator[list[Service]]:
    """One stack per node over its bottom service, each with its own layer objects (node
    ``i``'s parameters, its channel table and its place), opened side by side."""
    stacks: list[tuple[Service, list[Layer[Any]]]] = []
    for i, bottom in enumerate(bottoms):
        layers = recipe.make_layers(i, channels[i])
        placement = Placement(node=i, nodes=len(bottoms), channels=channels[i], cpu=cpus[i])
        for layer in layers:
            layer.place(placement)
        stacks.append((bottom, layers))
    async with open_stacks(stacks) as services:
        yield services


def run_recipe(
    recipe: Recipe,
    *,
    seed: int | None = None,
    workload_params: Any = None,
    pcap: str | None = None,
) -> Result:
    """Run a recipe's workload and return its result.

    ``seed`` overrides the recipe's; ``workload_params`` replaces its workload parameters;
    ``pcap`` names a capture file for the transport's links (simulated transports).  A
    recipe on a one-node-per-process transport (ether, xdp) runs as ranks instead
    (:func:`stacklib.recipes.ranks.run_rank`); here it is a :class:`ConfigError` saying how.
    """
    if recipe.transport.per_process:
        from stacklib.recipes.ranks import not_a_rank

        raise ConfigError(str(recipe.path), "transport.kind", not_a_rank(recipe))
    run_seed = recipe.run.seed if seed is None else seed
    params = recipe.workload_params if workload_params is None else workload_params
    if recipe.run.clock == "virtual":
        sim = Simulation(seed=run_seed)
        result: Result = sim.run(_run, recipe, sim, params, pcap)
        return attrs.evolve(result, facts={**result.facts, "clock": "virtual", "seed": run_seed})
    world = RealWorld(seed=run_seed)
    result = trio.run(_run, recipe, world, params, pcap)
    return attrs.evolve(result, facts={**result.facts, "clock": "real"})

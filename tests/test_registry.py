"""The registries: built-ins in one table, entry points, import paths, errors that name what is
known, and content that does not depend on import order."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from stacklib import builtin
from stacklib.bench import WORKLOADS
from stacklib.registry import Registry, RegistryError, UnknownName, load_object
from stacklib.stack import LAYERS, Layer, layer_class, register_layer
from stacklib.testing import check_format
from stacklib.transports import TRANSPORTS
from stacklib.wire.registry import FORMATS, decode, formats

REPO = Path(__file__).resolve().parents[1]
SEQSUM = REPO / "examples" / "seqsum"


def _fresh(code: str) -> str:
    """Run ``code`` in a fresh interpreter (nothing imported yet) and return its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return done.stdout


def test_a_fresh_interpreter_sees_every_builtin_whatever_was_imported() -> None:
    out = _fresh(
        """
        import json
        from stacklib.transports import transports
        from stacklib.bench import workload_kind
        from stacklib.stack import LAYERS
        print(json.dumps({
            "transports": sorted(transports()),
            "splitc": workload_kind("splitc").name,
            "layers": sorted(LAYERS.load_all()),
        }))
        """
    )
    seen = json.loads(out)
    assert seen["transports"] == sorted(builtin.TRANSPORTS)
    assert seen["splitc"] == "splitc"
    assert seen["layers"] == sorted(builtin.LAYERS)


@pytest.mark.parametrize(
    ("table", "registry_path"),
    [
        ("LAYERS", "stacklib.stack:LAYERS"),
        ("TRANSPORTS", "stacklib.transports:TRANSPORTS"),
        ("WORKLOADS", "stacklib.bench:WORKLOADS"),
        ("FORMATS", "stacklib.wire.registry:FORMATS"),
        ("EXPERIMENTS", "stacklib.reporting.figures:EXPERIMENTS"),
    ],
)
def test_the_builtin_table_names_the_module_that_registers_each_part(
    table: str, registry_path: str
) -> None:
    # Importing every declared module registers exactly the declared names, no more: a part
    # registered by a module but missing from the table would depend on import order.
    out = _fresh(
        f"""
        import importlib, json
        from stacklib import builtin
        from stacklib.registry import load_object
        for module in sorted(set(builtin.{table}.values())):
            importlib.import_module(module)
        print(json.dumps(sorted(load_object({registry_path!r})._parts)))
        """
    )
    declared: dict[str, str] = getattr(builtin, table)
    assert json.loads(out) == sorted(declared)
    registry: Registry[object] = load_object(registry_path)  # type: ignore[assignment]
    for name in declared:
        assert registry[name] is registry[name]  # loads, and once


def test_an_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(UnknownName) as info:
        layer_class("seqsum")
    message = str(info.value)
    assert message.startswith("no layer named 'seqsum' (known layers: arq, ip, ip-ether")
    assert "import path" in message
    assert isinstance(info.value, KeyError)  # callers that catch KeyError keep working


def test_a_name_taken_twice_is_refused_naming_both() -> None:
    class Impostor(Layer):
        name = "arq"

        def open(self, below):  # type: ignore[no-untyped-def]
            raise NotImplementedError

    with pytest.raises(RegistryError, match="layer name 'arq' is taken by class"):
        register_layer(Impostor)


def test_register_layer_still_works_as_a_decorator() -> None:
    @register_layer
    class Late(Layer):
        name = "test-late-layer"

        def open(self, below):  # type: ignore[no-untyped-def]
            raise NotImplementedError

    try:
        assert layer_class("test-late-layer") is Late
        assert "test-late-layer" in LAYERS
        assert LAYERS.source("test-late-layer") == "run time"
        assert LAYERS.source("arq") == "stacklib"
    finally:
        LAYERS.unregister("test-late-layer")
    assert "test-late-layer" not in LAYERS


@pytest.fixture
def seqsum_on_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.syspath_prepend(str(SEQSUM))
    yield
    sys.modules.pop("seqsum_layer", None)


def test_an_import_path_names_a_class_not_installed(seqsum_on_path: None) -> None:
    cls = layer_class("seqsum_layer:SeqSumLayer")
    assert cls.name == "seqsum"
    assert layer_class("seqsum_layer:SeqSumLayer") is cls
    assert "seqsum" not in LAYERS  # an import path does not register a name


def test_an_import_path_to_the_wrong_kind_of_object_is_refused(seqsum_on_path: None) -> None:
    with pytest.raises(RegistryError, match=r"is class .*SeqSumService, not a Layer subclass"):
        layer_class("seqsum_layer:SeqSumService")
    with pytest.raises(RegistryError, match=r"is class .*SeqSumLayer, not a TransportKind"):
        TRANSPORTS["seqsum_layer:SeqSumLayer"]
    with pytest.raises(RegistryError, match="cannot import 'no_such_module_x'"):
        layer_class("no_such_module_x:Layer")
    with pytest.raises(RegistryError, match="has no 'Nothing'"):
        layer_class("seqsum_layer:Nothing")
    with pytest.raises(RegistryError, match="not an import path"):
        load_object("seqsum_layer:")


def _dist_info(root: Path, name: str, entry_points: str) -> None:
    """A minimal installed distribution: metadata and entry points, no code."""
    info = root / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))


def test_entry_points_add_parts_and_name_their_distribution(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _dist_info(
        tmp_path,
        "plugin_test",
        """
        [stacklib.layers]
        seqsum = seqsum_layer:SeqSumLayer
        misnamed = seqsum_layer:SeqSumLayer
        broken = no_such_module_y:Layer

        [stacklib.workloads]
        pingpong = this_is_shadowed:ByTheBuiltin

        [stacklib.formats]
        seqsum = seqsum_layer:FORMAT_INFO
        """,
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(SEQSUM))
    LAYERS.rescan()
    WORKLOADS.rescan()
    FORMATS.rescan()
    try:
        assert {"seqsum", "misnamed", "broken"} <= set(LAYERS)  # listed without importing
        assert "seqsum_layer" not in sys.modules
        assert layer_class("seqsum").__name__ == "SeqSumLayer"
        assert LAYERS.source("seqsum") == "plugin_test"
        with pytest.raises(RegistryError, match="the entry point's name must be the same"):
            layer_class("misnamed")
        with pytest.raises(RegistryError, match=r"cannot load entry point 'broken'.*plugin_test"):
            layer_class("broken")
        # A built-in name cannot be taken over by an entry point.
        assert WORKLOADS["pingpong"].run.__module__ == "stacklib.bench.pingpong"
        assert WORKLOADS.source("pingpong") == "stacklib"
        # A format from an entry point decodes, lists and passes the conformance suite.
        assert "seq: 7" in decode("seqsum", bytes.fromhex("00000007c462616263"))
        assert "seqsum" in formats()
        check_format("seqsum", max_examples=20)
    finally:
        LAYERS.unregister("seqsum")
        FORMATS.unregister("seqsum")
        sys.modules.pop("seqsum_layer", None)
        monkeypatch.undo()
        LAYERS.rescan()
        WORKLOADS.rescan()
        FORMATS.rescan()
    assert "seqsum" not in LAYERS
    assert "seqsum" not in FORMATS


@pytest.mark.slow
def test_a_layer_in_its_own_distribution_runs_from_a_recipe_through_the_cli(
    tmp_path: Path,
) -> None:
    # A plain (non-editable) install of the example distribution into a folder of its own,
    # then the command run from elsewhere with that folder on the path.
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
         str(SEQSUM)],
        check=True,
        capture_output=True,
        timeout=300,
    )  # fmt: skip
    assert not (target / "seqsum_layer.py").is_symlink()
    env = {"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}
    command = [sys.executable, "-m", "stacklib.cli"]
    run = subprocess.run(
        [*command, "run", str(SEQSUM / "seqsum.toml"), "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert [row["size"] for row in result["rows"]] == [0, 40, 1000]
    # Without the distribution on the path the same recipe is refused, naming the layer.
    refused = subprocess.run(
        [*command, "run", str(SEQSUM / "seqsum.toml")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin"},
        timeout=300,
    )
    assert refused.returncode == 2
    assert "no layer named 'seqsum'" in refused.stderr
    # Its format is listed with the distribution it comes from, and decodes.
    listed = subprocess.run(
        [*command, "decode", "--list"], capture_output=True, text=True, env=env, timeout=300
    )
    assert "seqsum" in listed.stdout and "[stacklib-seqsum]" in listed.stdout
    decoded = subprocess.run(
        [*command, "decode", "seqsum", "00000007c462616263"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert "sum: 0xc462" in decoded.stdout


@pytest.mark.slow
def test_a_plain_install_ships_the_recipes(tmp_path: Path) -> None:
    # A non-editable install of stacklib itself into a folder of its own: the recipes come
    # with the package and are found from any directory.
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
         str(REPO)],
        check=True,
        capture_output=True,
        timeout=600,
    )  # fmt: skip
    shipped = sorted(p.name for p in (target / "stacklib" / "recipes").glob("*.toml"))
    assert shipped == sorted(p.name for p in (REPO / "stacklib" / "recipes").glob("*.toml"))
    listed = subprocess.run(
        [sys.executable, "-m", "stacklib.cli", "list", "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"},
        timeout=300,
        check=True,
    )
    recipes = {r["name"]: r["path"] for r in json.loads(listed.stdout)}
    assert "unet-memory-pingpong" in recipes
    assert recipes["unet-memory-pingpong"].startswith(str(target))

"""Named parts that recipes and commands look up: one mechanism for every kind.

stacklib names five kinds of part: layers, transports, workloads, wire formats and
experiments.  Each kind has one :class:`Registry`, which finds a name in four places, in order:

1. parts registered at run time (:meth:`Registry.register`, what ``@register_layer`` and the
   other ``register_*`` functions call);
2. the parts that ship with stacklib, declared in one table (:mod:`stacklib.builtin`) as the
   module that registers each name; the module is imported the first time the name is asked
   for, so what is registered never depends on what happened to be imported before;
3. other distributions' entry points in the kind's group (``stacklib.layers``,
   ``stacklib.transports``, ``stacklib.workloads``, ``stacklib.formats``,
   ``stacklib.experiments``); an entry point names the class or object, and its name must be
   the part's own name;
4. an import path ``"package.module:attribute"``, for code that is not installed as a
   distribution (a recipe's ``kind = "mylayers:SeqSumLayer"``).

An unknown name raises :class:`UnknownName`, which lists the known names.  A registry is a
read-only :class:`~collections.abc.Mapping` of names to parts: iterating lists every name
without importing anything; looking one up (or ``items()``) imports what it needs.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable, Iterator, Mapping
from typing import Generic, Protocol, TypeVar

from stacklib.errors import StacklibError

__all__ = ["ENTRY_POINT_GROUPS", "Registry", "RegistryError", "UnknownName", "load_object"]

T = TypeVar("T")


class _Named(Protocol):
    @property
    def name(self) -> str: ...


N = TypeVar("N", bound=_Named)

#: The entry-point group of each kind of part.
ENTRY_POINT_GROUPS: Mapping[str, str] = {
    "layer": "stacklib.layers",
    "transport": "stacklib.transports",
    "workload": "stacklib.workloads",
    "format": "stacklib.formats",
    "experiment": "stacklib.experiments",
}


class RegistryError(StacklibError):
    """A part cannot be registered or loaded: a name taken twice, an entry point or import
    path that fails to import or names the wrong kind of object."""


class UnknownName(RegistryError, KeyError):
    """No part of this kind has the name; the message lists the known ones."""

    def __str__(self) -> str:
        # KeyError's own str() would show the message in quotes.
        return str(self.args[0]) if self.args else ""


def load_object(path: str) -> object:
    """The object an import path ``"package.module:attribute.attribute"`` names.

    Raises :class:`RegistryError` naming the path and the reason.
    """
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise RegistryError(f"{path!r} is not an import path of the form 'package.module:name'")
    try:
        target: object = importlib.import_module(module_name)
    except ImportError as error:
        raise RegistryError(f"cannot import {module_name!r} (from {path!r}): {error}") from None
    for part in attribute.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise RegistryError(f"{module_name!r} has no {attribute!r} (from {path!r})") from None
    return target


class Registry(Mapping[str, T], Generic[T]):
    """The parts of one kind, by name.  See the module docstring for where names come from.

    ``what`` names the kind in messages ("layer"); ``builtin`` maps each built-in name to the
    module that registers it when imported; ``name_of`` gives a part's own name and ``accept``
    returns the part if an object loaded from an entry point or import path is one (None if
    not: the error then says what was expected, ``expected``).
    """

    def __init__(
        self,
        what: str,
        *,
        builtin: Mapping[str, str],
        name_of: Callable[[T], str],
        accept: Callable[[object], T | None],
        expected: str,
    ) -> None:
        self.what = what
        self.group = ENTRY_POINT_GROUPS[what]
        self._builtin = dict(builtin)
        self._name_of = name_of
        self._accept = accept
        self._expected = expected
        self._parts: dict[str, T] = {}
        self._by_path: dict[str, T] = {}
        self._entry_points: dict[str, importlib.metadata.EntryPoint] | None = None

    def __repr__(self) -> str:
        return f"<Registry of {self.what}s: {', '.join(self)}>"

    @classmethod
    def of_instances(cls, what: str, kind: type[N], builtin: Mapping[str, str]) -> Registry[N]:
        """A registry of ``kind`` objects named by their ``name`` attribute (transports,
        workloads, formats and experiments are such descriptions)."""
        return Registry(
            what,
            builtin=builtin,
            name_of=lambda part: part.name,
            accept=lambda obj: obj if isinstance(obj, kind) else None,
            expected=f"{'an' if kind.__name__[0] in 'AEIOU' else 'a'} {kind.__name__}",
        )

    # ------------------------------------------------------------------ registering

    def register(self, part: T, name: str | None = None) -> T:
        """Make ``part`` known as ``name`` (default: its own name) and return it.

        Registering the same part twice is harmless; another part under a taken name raises
        :class:`RegistryError` naming both.
        """
        name = self._name_of(part) if name is None else name
        existing = self._parts.get(name)
        if existing is not None and existing is not part:
            raise RegistryError(
                f"{self.what} name {name!r} is taken by {_describe(existing)}; "
                f"cannot register {_describe(part)}"
            )
        self._parts[name] = part
        return part

    def unregister(self, name: str) -> None:
        """Forget a part registered at run time (tests use it to clean up)."""
        self._parts.pop(name, None)

    # ------------------------------------------------------------------ looking up

    def __getitem__(self, name: str) -> T:
        part = self._parts.get(name)
        if part is not None:
            return part
        module = self._builtin.get(name)
        if module is not None:
            importlib.import_module(module)
            part = self._parts.get(name)
            if part is None:
                raise RegistryError(
                    f"stacklib's {self.what} {name!r} should be registered by {module}, "
                    "which did not register it"
                )
            return part
        entry_point = self._scan_entry_points().get(name)
        if entry_point is not None:
            return self._load_entry_point(entry_point)
        if ":" in name:
            return self._load_path(name)
        known = ", ".join(sorted(self)) or "none"
        raise UnknownName(
            f"no {self.what} named {name!r} (known {self.what}s: {known}; or give an import "
            "path 'package.module:name')"
        )

    def __iter__(self) -> Iterator[str]:
        names = dict.fromkeys(self._builtin)
        names.update(dict.fromkeys(self._scan_entry_points()))
        names.update(dict.fromkeys(self._parts))
        return iter(names)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in set(self)

    def load_all(self) -> dict[str, T]:
        """Every part by name, importing whatever is not loaded yet."""
        return {name: self[name] for name in self}

    def source(self, name: str) -> str:
        """Where ``name`` comes from: ``"stacklib"``, a distribution's name, or ``"run time"``."""
        if name in self._builtin:
            return "stacklib"
        entry_point = self._scan_entry_points().get(name)
        if entry_point is not None:
            dist = entry_point.dist
            return dist.name if dist is not None else entry_point.value
        if name in self._parts:
            return "run time"
        raise UnknownName(f"no {self.what} named {name!r}")

    # ------------------------------------------------------------------ loading

    def _scan_entry_points(self) -> dict[str, importlib.metadata.EntryPoint]:
        if self._entry_points is None:
            found = importlib.metadata.entry_points(group=self.group)
            self._entry_points = {ep.name: ep for ep in found if ep.name not in self._builtin}
        return self._entry_points

    def rescan(self) -> None:
        """Look for entry points again (after installing a distribution in this process)."""
        self._entry_points = None

    def _load_entry_point(self, entry_point: importlib.metadata.EntryPoint) -> T:
        where = f"entry point {entry_point.name!r} = {entry_point.value!r} in group {self.group!r}"
        if entry_point.dist is not None:
            where += f" of {entry_point.dist.name}"
        try:
            loaded = entry_point.load()
        except Exception as error:  # a broken plug-in is reported, named, not crashed on
            raise RegistryError(f"cannot load {where}: {error}") from error
        part = self._check(loaded, where)
        if self._name_of(part) != entry_point.name:
            raise RegistryError(
                f"{where} names a {self.what} called {self._name_of(part)!r}; the entry "
                "point's name must be the same"
            )
        existing = self._parts.get(entry_point.name)
        return existing if existing is not None else self.register(part)

    def _load_path(self, path: str) -> T:
        part = self._by_path.get(path)
        if part is None:
            part = self._check(load_object(path), f"import path {path!r}")
            self._by_path[path] = part
        return part

    def _check(self, loaded: object, where: str) -> T:
        part = self._accept(loaded)
        if part is None:
            raise RegistryError(f"{where} is {_describe(loaded)}, not {self._expected}")
        return part


def _describe(obj: object) -> str:
    if isinstance(obj, type):
        return f"class {obj.__module__}.{obj.__qualname__}"
    return f"{type(obj).__name__} {getattr(obj, 'name', obj)!r}"

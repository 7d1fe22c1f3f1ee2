"""Finding and building chunk handlers: the ``ddmd.handlers`` entry points.

Layer: standard library only (``importlib.metadata``); the daemon calls ``load_handlers`` once
at start and hands the handlers to every VM session.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from typing import Any

__all__ = ["LoadFailure", "LoadedHandlers", "load_handlers"]

_TYPE = re.compile(r"^(?:[\x20-\x7e]{4}|\*)$")


@dataclass(frozen=True, slots=True)
class LoadFailure:
    """An entry point that gave no handler, and why (for ``ddmd extensions``)."""

    name: str
    target: str
    error: str

    def to_json(self) -> dict[str, str]:
        return {"name": self.name, "target": self.target, "error": self.error}


@dataclass(slots=True)
class LoadedHandlers:
    handlers: list[Any] = field(default_factory=list)
    failures: list[LoadFailure] = field(default_factory=list)
    disabled: list[str] = field(default_factory=list)
    targets: dict[str, str] = field(default_factory=dict)  # handler name -> entry point value

    def to_json(self) -> dict[str, Any]:
        return {
            "loaded": [
                {
                    "name": h.name,
                    "chunk_types": list(h.chunk_types),
                    "target": self.targets.get(h.name, ""),
                }
                for h in self.handlers
            ],
            "failed": [f.to_json() for f in self.failures],
            "disabled": list(self.disabled),
        }


def _problem(handler: object) -> str | None:
    """What keeps ``handler`` from being a chunk handler, in words; None if it is one."""
    name = getattr(handler, "name", None)
    if not isinstance(name, str) or not name:
        return "its handler has no name (set ChunkHandler.name to a non-empty string)"
    types = getattr(handler, "chunk_types", None)
    if not isinstance(types, tuple | list) or not all(
        isinstance(t, str) and _TYPE.match(t) for t in types
    ):
        return (
            f"handler {name!r}: chunk_types must be a tuple of four-character types or '*', "
            f"not {types!r}"
        )
    for method in ("connected", "disconnected", "handle_chunk"):
        if not callable(getattr(handler, method, None)):
            return f"handler {name!r} has no {method}() method (subclass ddmd.ext.ChunkHandler)"
    return None


def load_handlers(
    disabled: Collection[str] = (),
    *,
    group: str = "ddmd.handlers",
    found: Callable[[], Iterable[EntryPoint]] | None = None,
) -> LoadedHandlers:
    """Build one handler per entry point of ``group``, skipping the ``disabled`` names. A
    plugin that fails to import, to build, or builds something that is not a handler is a
    ``LoadFailure``; nothing here raises."""
    result = LoadedHandlers()
    points = list(found() if found is not None else entry_points(group=group))
    for point in sorted(points, key=lambda p: p.name):
        if point.name in disabled:
            result.disabled.append(point.name)
            continue
        try:
            factory = point.load()
            handler = factory() if callable(factory) else factory
        except Exception as exc:  # a plugin's bug must not stop the daemon
            result.failures.append(
                LoadFailure(point.name, point.value, f"{type(exc).__name__}: {exc}")
            )
            continue
        problem = _problem(handler)
        if problem is None and handler.name in result.targets:
            problem = f"another handler is already called {handler.name!r}"
        if problem is not None:
            result.failures.append(LoadFailure(point.name, point.value, problem))
            continue
        handler.chunk_types = tuple(handler.chunk_types)
        result.handlers.append(handler)
        result.targets[handler.name] = point.value
    return result

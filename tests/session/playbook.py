"""A Playbook for sans-IO session objects, in the shape of mitmproxy's ``tutils.Playbook``.

    assert (
        Playbook(handle)
        >> ConsumerBytes(1, HANDSHAKE)
        << SendToDebugger(1, HANDSHAKE)
    )

``>>`` feeds an input, ``<<`` expects a command; the commands an input produces must follow it
in the script, in order. ``Placeholder()`` matches any one value and remembers it. ``Log``
commands are left out of the comparison unless ``logs=True``, and so are the command types
listed in ``ignore``. A mismatch raises with both transcripts side by side, each line written
by ``describe`` (``repr`` unless given), so the first differing line is easy to find. No event
loop, no sockets, no clock: time is a value inside the inputs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from ddmd.session.commands import Log


class Placeholder:
    """Matches any value; ``.value`` is what it matched last."""

    def __init__(self, name: str = "?") -> None:
        self.name = name
        self.value: Any = None
        self.bound = False

    def matches(self, other: Any) -> bool:
        self.value, self.bound = other, True
        return True

    def __repr__(self) -> str:
        return f"Placeholder({self.name}={self.value!r})" if self.bound else f"<{self.name}>"


def _matches(expected: Any, actual: Any) -> bool:
    if isinstance(expected, Placeholder):
        return expected.matches(actual)
    if isinstance(expected, dict):  # a Log's fields, with a Placeholder for a value or two
        return (
            isinstance(actual, dict)
            and expected.keys() == actual.keys()
            and all(_matches(value, actual[key]) for key, value in expected.items())
        )
    if dataclasses.is_dataclass(expected) and not isinstance(expected, type):
        if type(expected) is not type(actual):
            return False
        return all(
            _matches(getattr(expected, f.name), getattr(actual, f.name))
            for f in dataclasses.fields(expected)
        )
    return bool(expected == actual)


class Playbook:
    def __init__(
        self,
        handle: Callable[[Any], Iterable[Any]],
        *,
        logs: bool = False,
        ignore: tuple[type, ...] = (),
        describe: Callable[[Any], str] = repr,
    ) -> None:
        self.handle = handle
        self.logs = logs
        self.ignore = ignore if logs else (*ignore, Log)
        self.describe = describe
        self.script: list[tuple[str, Any]] = []
        self._played = 0  # inputs already fed in an earlier `assert playbook`
        self.actual: list[tuple[str, Any]] = []

    def __rshift__(self, event: Any) -> Playbook:
        self.script.append((">>", event))
        return self

    def __lshift__(self, command: Any) -> Playbook:
        self.script.append(("<<", command))
        return self

    def __bool__(self) -> bool:
        # Feed the inputs not fed yet (a playbook can be asserted, extended and asserted again).
        inputs = [item for kind, item in self.script if kind == ">>"]
        for event in inputs[self._played :]:
            self.actual.append((">>", event))
            for command in self.handle(event):
                if not isinstance(command, self.ignore):
                    self.actual.append(("<<", command))
        self._played = len(inputs)
        expected = self.script
        same = len(expected) == len(self.actual) and all(
            e_kind == a_kind and _matches(e_item, a_item)
            for (e_kind, e_item), (a_kind, a_item) in zip(expected, self.actual, strict=True)
        )
        if not same:
            raise AssertionError(self._diff())
        return True

    def _diff(self) -> str:
        lines = ["playbook mismatch (expected | actual):"]
        for i in range(max(len(self.script), len(self.actual))):
            e = self.script[i] if i < len(self.script) else ("", "")
            a = self.actual[i] if i < len(self.actual) else ("", "")
            mark = "  " if e[0] == a[0] and e[0] and _matches(e[1], a[1]) else "!!"
            lines.append(f"{mark} {e[0]} {self._short(e[1])}")
            lines.append(f"   {' ' * len(e[0])} | {a[0]} {self._short(a[1])}")
        return "\n".join(lines)

    def _short(self, item: Any, limit: int = 160) -> str:
        text = item if isinstance(item, str) else self.describe(item)
        return text if len(text) <= limit else text[: limit - 3] + "..."

"""Objects each debugger keeps from collection: ObjectReference.DisableCollection (9.7) and
EnableCollection (9.8), counted per debugger and object id (``bridge.py``).

Layer: standard library only (sans-IO).

JDI pins an object it hands out while it may need it (a value being evaluated, a string it
creates), and a debugger that leaves without re-enabling collection would leave the object
pinned in the VM for as long as the connection lives: ddmd keeps a connection open after its
debuggers leave (a VM without DDM), so what a departed debugger pinned is re-enabled for it.

Decisions:
- A pin counts once the VM answered the DisableCollection without an error; an
  EnableCollection lowers the sender's count once the VM answered it (never below 0).
- On departure EnableCollection is sent as many times as the debugger's count: the JDWP
  agent keeps one count per object, so the pins of other debuggers stay.
"""

from __future__ import annotations

__all__ = ["Pins"]


class Pins:
    """Per debugger: object id -> how many DisableCollection it did not balance."""

    __slots__ = ("_by",)

    def __init__(self) -> None:
        self._by: dict[int, dict[int, int]] = {}

    def clear(self) -> None:
        self._by.clear()

    def held_by(self, debugger: int) -> int:
        """How many pins ``debugger`` holds (all objects)."""
        return sum(self._by.get(debugger, {}).values())

    def change(self, debugger: int, obj: int, delta: int) -> None:
        """The VM carried out a DisableCollection (+1) or EnableCollection (-1) of ``debugger``."""
        counts = self._by.setdefault(debugger, {})
        n = counts.get(obj, 0) + delta
        if n > 0:
            counts[obj] = n
        else:
            counts.pop(obj, None)
            if not counts:
                del self._by[debugger]

    def release(self, debugger: int) -> list[int]:
        """``debugger`` is gone: the object ids to re-enable, each as often as it pinned it."""
        counts = self._by.pop(debugger, {})
        return [obj for obj, n in counts.items() for _ in range(n)]

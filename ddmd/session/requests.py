"""Who owns each event request of one VM connection (a part of ``Bridge``, ``bridge.py``).

Layer: standard library and ``ddmd.session.split`` only (sans-IO). It sees nobody: the bridge tells
it what the VM answered and asks it whose a request is; it sends nothing.

- A debugger's EventRequest.Set, once the VM answered it, gives a request the debugger owns
  (``add``), with its kind and the suspend policy it asked for (``split.Request``).
- A debugger may clear only its own requests (``clearing``). A request being cleared is retired
  (``retire``): its events still on their way are dropped. The retired ids are kept, newest
  last, up to ``MAX_RETIRED``. A request whose Set the VM answered after its sender left was
  never owned, and is retired all the same.
- ddmd's own requests (foresight's CLASS_UNLOAD, ``hide``) are hidden: their events go to
  nobody. The VM keeps them while the connection lasts, so only a new connection (``unhide``)
  forgets them; a release (``reset``) does not.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import Final

from ddmd.session.split import Request

__all__ = ["MAX_RETIRED", "Requests"]

MAX_RETIRED: Final = 4096


class Requests:
    """The event requests of one VM connection: owned, retired, hidden."""

    def __init__(self) -> None:
        self.owned: dict[int, Request] = {}  # requestID -> its owner, kind and policy
        self.retired: dict[int, None] = {}  # cleared requests, newest last (bounded)
        self.hidden: set[int] = set()  # ddmd's own requests: events to nobody

    def reset(self) -> None:
        """The VM dropped every debugger's requests (``hidden`` stays: the VM keeps ddmd's)."""
        self.owned.clear()
        self.retired.clear()

    def unhide(self) -> None:
        """A new connection: request ids restart, ddmd's own requests are gone."""
        self.hidden.clear()

    # ------------------------------------------------------------------ queries

    def by_id(self) -> Mapping[int, Request]:
        """Every owned request, by requestID (``split`` reads it)."""
        return self.owned

    def owned_by(self, debugger: int) -> int:
        """How many event requests ``debugger`` owns."""
        return sum(1 for r in self.owned.values() if r.owner == debugger)

    def dropped(self) -> Container[int]:
        """The requestIDs whose events go to nobody: retired or hidden."""
        return self.retired.keys() | self.hidden if self.hidden else self.retired

    # ------------------------------------------------------------------ changes

    def add(self, request_id: int, request: Request) -> None:
        """The VM answered a debugger's Set with ``request_id``."""
        self.owned[request_id] = request

    def hide(self, request_id: int) -> None:
        """One of ddmd's own requests: its events reach no debugger."""
        self.hidden.add(request_id)

    def clearing(self, debugger: int, request_id: int, kind: int) -> bool:
        """A Clear of ``debugger``: whether ``request_id`` is its own (its Clear goes to the VM,
        and the request is retired when ``kind`` is its kind: the VM clears it then). False:
        not its own, or unknown; nothing changes."""
        request = self.owned.get(request_id)
        if request is None or request.owner != debugger:
            return False
        if request.kind == kind:
            self.retire(request_id)
        return True

    def retire(self, request_id: int) -> Request | None:
        """``request_id`` is being cleared: its events still on their way are dropped. Returns
        the request it was (None: never owned, a Set whose sender left before the reply)."""
        request = self.owned.pop(request_id, None)
        self.retired[request_id] = None
        if len(self.retired) > MAX_RETIRED:
            del self.retired[next(iter(self.retired))]
        return request

    def retire_all(self, debugger: int, kind: int | None = None) -> list[tuple[int, int]]:
        """Retire every request ``debugger`` owns (of ``kind`` only, unless None), oldest
        first. Returns each one's (requestID, kind): what a Clear of it says."""
        mine = [
            (rid, r.kind)
            for rid, r in self.owned.items()
            if r.owner == debugger and (kind is None or r.kind == kind)
        ]
        for rid, _ in mine:
            self.retire(rid)
        return mine

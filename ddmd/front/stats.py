"""What the adb front did so far, for /metrics (``ddmd.front.statistics``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

__all__ = ["FrontStatistics"]


@dataclass(slots=True)
class FrontStatistics:
    """Counters since the front started; ``forwards`` is the number it owns now. Changed only
    in the trio thread; `copy` gives a snapshot."""

    port: int | None = None  # where it listens; None: not listening
    connections: int = 0  # accepted (after the peer-uid check)
    relayed: int = 0  # requests relayed to the real server
    jdwp_served: int = 0  # jdwp:PID sockets handed to ddmd's VM connections
    jdwp_relayed: int = 0  # jdwp:PID and jdwp forwards left to the real server
    forwards: int = 0  # forwards the front owns now
    forwards_by_device: dict[str, int] = field(default_factory=dict)  # the same, by serial
    forward_connections: int = 0  # connections to them handed to VMs
    forward_refused: int = 0  # connections to them closed: ddmd does not hold the VM
    kills_refused: int = 0
    kills_relayed: int = 0
    bad_requests: int = 0  # lengths adb's server refuses too
    timeouts: int = 0  # requests that did not arrive whole in time
    upstream_starts: int = 0  # adb servers the front started
    upstream_failures: int = 0  # clients closed because no server answered

    def copy(self) -> FrontStatistics:
        return dataclasses.replace(self, forwards_by_device=dict(self.forwards_by_device))

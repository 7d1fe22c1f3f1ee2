"""The fake device's counters (`DeviceStatistics`), kept by `ddmd.sim.adbd.FakeDevice` and
moved by its connections (`ddmd.sim.adbconn`) and its log (`ddmd.sim.devicelog`).
`ddmd.sim.adbd` re-exports the class.

Layer: the simulator; the standard library only.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

__all__ = ["DeviceStatistics"]


@dataclass(slots=True)
class DeviceStatistics:
    """Counters of one `FakeDevice` since it was made."""

    port: int | None = None
    connections: int = 0  # TCP connections from a server
    online: int = 0  # connections open now that finished the CNXN exchange
    bad_input: int = 0  # connections closed for bytes that are not the protocol
    stalled: int = 0  # connections closed because the server stalled (a deadline ran out)
    last_problem: str | None = None
    services: Counter[str] = field(default_factory=Counter)  # accepted, by kind
    refused: int = 0  # OPENs answered CLSE(0, id)
    dropped: int = 0  # jdwp:PID accepted and dropped (a stream to the pid was open)
    connect_failed: int = 0  # jdwp:PID accepted, the pid's TCP connect failed
    bytes_to_vm: int = 0
    bytes_from_vm: int = 0
    log_records: int = 0  # records logged (set_log, log, replay) since the device was made
    log_followers: int = 0  # logcat streams following the log now
    log_overflows: int = 0  # followers closed because they fell too far behind

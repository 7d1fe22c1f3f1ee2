"""The parts of the configuration a VM session decides with (the driver builds them).

Layer: standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """The parts of the configuration a session decides with (built by the driver)."""

    ddm_request: float = 5.0
    dbgd_ack: float = 1.0
    reconnect: float = 10.0
    thread_poll_interval: float = 0.5
    always_poll_threads: bool = False
    heap_info: bool = True
    auto_select_waiting: bool = True
    max_packet: int = 1 << 30
    stream_threshold: int = 1 << 20
    max_inflated: int = 64 << 20
    max_debuggers: int = 1
    thread_lease: float = 5.0  # how long one RefreshThreads keeps the polls going
    quiet_confirm: float = 1.0  # how long a GC without heap info waits for a reply
    poll_phase: float = 0.0  # 0..1: this VM's place in the poll interval (spreads many VMs)
    capture: float = 60.0  # how long a trace or heap dump may take to start arriving
    # [debugger] speculate (foresight.py): off here (Playbooks); the config's default is "auto".
    speculate: str = "off"
    speculate_rtt: float = 0.002  # seconds
    speculate_max_inflight: int = 64
    speculate_max_bytes: int = 4 << 20

"""The benches' shared rig: what every bench needs around its own workload.

- ``children``: child processes with their output drained (``Child``, ``Children``);
- ``proc``: /proc readers: whole-process-tree CPU from schedstat, RSS/VmHWM, machine ticks;
- ``ports``: free loopback ports, listening sockets;
- ``daemon``: ddmd's config, its start and stop, its control API and JSON log, which code runs;
- ``jvm``: the java helpers in bench/java (compile, target JVMs, RoundTrip client, jdb attach);
- ``adb``: a private real adb server with the fake device adopted;
- ``relays``: the reference relays (trio, bare epoll/java, socat) and the stand-in adb server;
- ``jdwp``: a raw blocking JDWP client;
- ``delay``: a delay line (RTT/2 each way) that logs the JDWP commands crossing it;
- ``rounds``: paired rounds and their report (medians of per-round paired ratios, min-max).

Benches run as scripts (``.venv/bin/python bench/NAME.py``): bench/ is then first on sys.path
and they import ``rig``. ``bare_relay.py``, ``trio_relay.py``, ``fake_adb.py`` and ``delay.py``
here are run as scripts by path.
"""

from __future__ import annotations

from pathlib import Path

#: The checkout the benches belong to (its ddmd is the one run unless a bench says otherwise).
ROOT = Path(__file__).resolve().parent.parent.parent
RIG = Path(__file__).resolve().parent
JAVA_DIR = ROOT / "bench" / "java"
HOST = "127.0.0.1"

"""ddmd's adb front: an adb server port of ddmd's own (``[front]``, default 5038).

Every adb request is relayed to the real server byte for byte; ``jdwp:PID`` and ``adb forward
tcp:N jdwp:PID`` are served from the VM connection ddmd holds, so adb tools share an app with
ddmd instead of losing it (issue 18; the wire protocol: /work/shared/docs/adb-front.md,
parsing in `ddmd.protocol.adbwire`).

- `server`: `serve_front`, the listener, transparent mode; `statistics` for /metrics.
- `conversation`: one client, request by request: what is relayed, what the front answers.
- `forwards`: the front's own forward table and listeners.
- `upstream`: the real server: connect, start it when it is down, stop the one it started.
- `relay`: requests under a deadline, exact reads of replies, the two-way pipe.
- `tools`: which program is at the other end ("jdb", "Android Studio", ...).
- `hub`: what the front needs from the daemon (`VmHub`, `ConsumerTarget`).
"""

from ddmd.front.hub import ConsumerTarget, VmHub
from ddmd.front.server import FrontServer, serve_front, statistics
from ddmd.front.stats import FrontStatistics

__all__ = [
    "ConsumerTarget",
    "FrontServer",
    "FrontStatistics",
    "VmHub",
    "serve_front",
    "statistics",
]

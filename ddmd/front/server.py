"""The adb front's listener: `serve_front`, the entry point the daemon starts in its root
nursery.

Layer: trio, structlog, config, logs, errors, `peers` (every accepted connection goes through
the peer-uid check first), `drive.ports` (listener helpers) and the front's modules.

- ``[front] enabled = false``: nothing runs (``task_status.started(None)``).
- The port taken by another program: one warning naming ``[front] port`` and the port, and
  ddmd runs on without the front (``started(None)``); never an exception.
- ``[front] port`` equal to the adb server's port on this machine (possible only through
  ANDROID_ADB_SERVER_PORT: the config file cannot say so): the same, the front would relay to
  itself.
- Transparent mode (the front on adb's default port 5037, ``[adb] port`` another one): the
  real server is started on ``[adb] port`` at once if none runs there, and stopped when the
  front stops, if the front started it.

Each accepted connection is one `Conversation` in the front's nursery; cancelling
`serve_front` closes the listener, every relayed connection and the front's forwards.
Connections handed to VMs belong to the hub.
"""

from __future__ import annotations

import structlog
import trio

from ddmd.config import DEFAULT_ADB_PORT, Config, is_loopback_host
from ddmd.drive.ports import accept_loop, guarded, open_listener
from ddmd.errors import PortInUse
from ddmd.front.conversation import Conversation, FrontContext
from ddmd.front.forwards import FrontForwards
from ddmd.front.hub import VmHub
from ddmd.front.stats import FrontStatistics
from ddmd.front.upstream import Upstream
from ddmd.logs import Event
from ddmd.peers import PeerGuard

__all__ = ["FrontServer", "serve_front", "statistics"]

log = structlog.get_logger("ddmd.front")

_current: FrontServer | None = None


def statistics() -> FrontStatistics | None:
    """A snapshot of the running front's counters (None when no front runs)."""
    return _current.statistics() if _current is not None else None


def _same_machine(a: str, b: str) -> bool:
    return a == b or (is_loopback_host(a) and is_loopback_host(b))


class FrontServer:
    """The listener and its conversations."""

    def __init__(self, config: Config, hub: VmHub, guard: PeerGuard | None) -> None:
        self._config = config
        self._front = config.front
        self._guard = guard
        self.upstream = Upstream(config.adb, config.timeouts)
        self.forwards = FrontForwards(
            hub, self.upstream, guard, open_timeout=config.front.open_timeout
        )
        self.stats = FrontStatistics()
        self._ctx = FrontContext(config.front, hub, self.upstream, self.forwards, self.stats)

    @property
    def transparent(self) -> bool:
        """The front stands where adb's server usually is, and the server runs elsewhere."""
        return self._front.port == DEFAULT_ADB_PORT and self._config.adb.port != DEFAULT_ADB_PORT

    def statistics(self) -> FrontStatistics:
        snapshot = self.stats.copy()
        snapshot.forwards = len(self.forwards)
        snapshot.forwards_by_device = self.forwards.per_device()
        snapshot.forward_connections = self.forwards.connections
        snapshot.forward_refused = self.forwards.refused
        snapshot.upstream_starts = self.upstream.starts
        return snapshot

    def _refusal(self) -> str | None:
        front, adb = self._front, self._config.adb
        if not front.enabled:
            return "[front] enabled = false"
        if front.port == adb.port and _same_machine(front.host, adb.host):
            return (
                f"[front] port {front.port} is the adb server's own port ([adb] port, here "
                "from ANDROID_ADB_SERVER_PORT): the front would relay to itself; set [adb] "
                "port in the config file"
            )
        return None

    async def run(self, *, task_status: trio.TaskStatus[int | None]) -> None:
        global _current
        refusal = self._refusal()
        if refusal is not None:
            if self._front.enabled:
                log.warning(Event.FRONT_DISABLED, reason=refusal, key="[front] port")
            task_status.started(None)
            return
        front = self._front
        try:
            listener = await open_listener(front.host, front.port, key="[front] port")
        except (PortInUse, OSError) as exc:
            log.warning(
                Event.FRONT_PORT_IN_USE,
                port=front.port,
                host=front.host,
                key="[front] port",
                reason=str(exc),
                effect="ddmd runs without its adb front",
            )
            task_status.started(None)
            return
        bound = int(listener.socket.getsockname()[1])
        self.stats.port = bound
        _current = self
        try:
            async with trio.open_nursery() as nursery:
                await nursery.start(self.forwards.run)
                log.info(
                    Event.FRONT_LISTENING,
                    host=front.host,
                    port=bound,
                    server=self.upstream.address,
                    transparent=self.transparent,
                )
                if self.transparent:
                    nursery.start_soon(self.upstream.ensure_running)
                task_status.started(bound)

                def accept(stream: trio.SocketStream, peer: str) -> None:
                    self.stats.connections += 1
                    nursery.start_soon(Conversation(self._ctx, stream, peer).run)

                await accept_loop(guarded(listener, self._guard, "front"), accept)
        finally:
            if _current is self:
                _current = None
            self.stats.port = None
            if self.transparent:
                with trio.CancelScope(shield=True):
                    await self.upstream.stop_started()


async def serve_front(
    config: Config,
    hub: VmHub,
    guard: PeerGuard | None,
    *,
    task_status: trio.TaskStatus[int | None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the adb front until cancelled. ``task_status.started`` gets the bound port, or
    None when the front does not run (off, or its port taken: logged)."""
    await FrontServer(config, hub, guard).run(task_status=task_status)

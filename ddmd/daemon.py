"""The daemon: builds the objects and the nursery tree, handles signals, shuts down gracefully.

Layer: the only place where tasks are wired together. Imports everything below it.

    trio.run(daemon.run)
    └── root nursery
        ├── signal watcher: SIGTERM/SIGINT -> stop (deadline = now + grace)
        ├── control API (nursery.start -> started once bound)
        ├── current-VM listener, adb front (each nursery.start, in a scope of its own)
        ├── discovery.scan --VmFound--> supervisor
        ├── discovery.adb  --VmFound/VmLost--> supervisor   (when [adb] enabled is not "off")
        ├── supervisor: one task per VM (VmDriver.run), errors contained per VM; a VmLost
        │   ends that VM's actor (its debugger's connection is closed) and logs why
        ├── forget_old_ports: once a day, drops port-book entries of apps not seen for
        │   [debugger] forget_after_days (also done once at start, before anything runs)
        └── logcat: devices' logs (with adb)

``run`` reads as its parts: `_Parts.build` makes the long-lived objects (registry, port book,
peer rule, extensions, `_Discovery`, supervisor, event hub, logcat hub, metrics collector),
then each task is started by a function of its own (`_start_control`, `_start_front`,
`_discovery_and_vms`, ...) and `_Shutdown` stops them.

Around the tree: the event hub (`events.EventHub`, fed by the registry's change notices
through `events.RegistryEvents`) behind ``GET /api/v1/events``; the metrics collector
(`metrics.DaemonCollector`, reading live state at scrape time) behind ``GET /metrics``; the
browser-safety middleware (`safety`); and sd_notify (`notify`): READY=1 once the control API
and the current-VM port are bound, STOPPING=1 when shutdown starts.
"""

from __future__ import annotations

import errno
import os
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import structlog
import trio

from ddmd import notify, peers
from ddmd.config import Config, is_loopback_host
from ddmd.control import app as control
from ddmd.control import events, metrics, safety
from ddmd.control.server import ControlBound, serve_control
from ddmd.discovery.scan import PortScanner
from ddmd.drive.found import VmFound, VmLost
from ddmd.drive.hub import DeviceVms
from ddmd.drive.ports import CurrentVmListener, VmPorts
from ddmd.drive.supervisor import Supervisor
from ddmd.errors import PortInUse
from ddmd.ext.loading import LoadedHandlers, load_handlers
from ddmd.logcat.device import LogcatSettings
from ddmd.logcat.hub import LogcatHub
from ddmd.logs import Event
from ddmd.portbook import SECONDS_PER_DAY, PortBook, PortEntry, format_time
from ddmd.registry import VmRegistry

if TYPE_CHECKING:
    from ddmd.discovery.adb import AdbDiscovery

log = structlog.get_logger("ddmd.daemon")


@dataclass(frozen=True, slots=True)
class Started:
    """What ``run`` reports through ``task_status`` once every listener is bound.

    ``control`` is the control API's TCP address, None with ``[control] tcp = false``;
    ``control_socket`` its unix socket, None with ``[control] socket = ""``."""

    control: tuple[str, int] | None
    current_port: int
    registry: VmRegistry
    supervisor: Supervisor
    stop: Callable[[], None]
    hub: events.EventHub | None = None
    control_socket: Path | None = None
    guard: peers.PeerGuard | None = None
    front_port: int | None = None  # the adb front's port, None when it does not run
    metrics_port: int | None = None  # [metrics] listen: the metrics-only port, None when off


async def run(
    config: Config,
    *,
    install_signal_handlers: bool = True,
    task_status: trio.TaskStatus[Started] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the daemon until SIGINT/SIGTERM (or ``Started.stop()``); then stop within the grace."""
    parts = _Parts.build(config)
    async with trio.open_nursery() as root:
        shutdown = _Shutdown(config.timeouts.shutdown_grace, parts, root.cancel_scope)
        # The listeners and the VM work have scopes of their own, so that shutdown closes them
        # at once; otherwise the root nursery waits for them until the grace deadline.
        signals, current, front, work = [trio.CancelScope() for _ in range(4)]
        if install_signal_handlers:
            root.start_soon(_watch_signals, shutdown.stop, signals)
        bound = await _start_control(root, config, parts, shutdown)
        metrics_port = await _start_metrics(root, config, parts, shutdown)
        current_port = await root.start(_within, current, _current_vm_listener(config, parts).run)
        parts.registry.current_port = current_port  # the API names it (`ddmd clients`, the page)
        front_port = await _start_front(root, front, config, parts)
        root.start_soon(_discovery_and_vms, work, parts)
        _announce(config, bound, current_port, front_port)
        task_status.started(
            Started(
                bound.tcp,
                current_port,
                parts.registry,
                parts.supervisor,
                shutdown.stop,
                parts.hub,
                control_socket=bound.unix,
                guard=parts.guard,
                front_port=front_port,
                metrics_port=metrics_port,
            )
        )
        await shutdown.wait()
        for scope in (work, current, front, signals):
            scope.cancel()
    log.info(Event.DAEMON_STOPPED)


# --------------------------------------------------------------------------------------------------
# The parts, built before any task runs


@dataclass(frozen=True, slots=True)
class _Forgetting:
    """[debugger] forget_after_days: apps not seen for ``max_age`` seconds lose their port, at
    start and then once a day; ``at_start``: the start dropped some (save the book at once)."""

    max_age: float
    at_start: bool


@dataclass(frozen=True, slots=True)
class _Parts:
    """The daemon's long-lived objects, each built once, in this order, before any task runs."""

    registry: VmRegistry
    forgetting: _Forgetting
    guard: peers.PeerGuard
    ports: VmPorts
    extensions: LoadedHandlers
    discovery: _Discovery
    supervisor: Supervisor
    hub: events.EventHub
    registry_events: events.RegistryEvents
    logcat: LogcatHub | None
    collector: metrics.DaemonCollector

    @classmethod
    def build(cls, config: Config) -> _Parts:
        registry = VmRegistry()
        book, forgetting = _port_book(config)
        # Who may connect to every port, and whose JVMs the scan adopts (ddmd.peers).
        policy = peers.PeerPolicy.from_config(config.security)
        peers.warn_if_unchecked(policy)
        guard = peers.PeerGuard(policy)
        ports = VmPorts(book, config.debugger.host, guard=guard)
        extensions = _load_extensions(config)
        discovery = _Discovery(config, registry, policy)
        supervisor = Supervisor(
            config,
            registry,
            ports,
            on_vm_ended=discovery.vm_ended,
            handlers=tuple(extensions.handlers),
        )
        hub = events.EventHub()
        registry_events = events.RegistryEvents(registry, hub)
        logcat = _logcat_hub(config, registry, hub)
        collector = metrics.DaemonCollector(
            registry,
            vms=lambda: list(supervisor.actors.values()),
            retired=supervisor.retired,
            scan_probes=discovery.scan_probes,
            hub=hub,
            peers=guard,
            host=config.metrics.host,
            logcat=logcat,
            front=_front_statistics if _front_runs(config) else None,
        )
        return cls(
            registry,
            forgetting,
            guard,
            ports,
            extensions,
            discovery,
            supervisor,
            hub,
            registry_events,
            logcat,
            collector,
        )


def _front_runs(config: Config) -> bool:
    """The adb front runs: it is enabled, and adb is used."""
    return config.front.enabled and config.adb.enabled != "off"


def _front_statistics() -> metrics.FrontCounts | None:
    """The adb front's counters while it listens (for /metrics)."""
    from ddmd.front.server import statistics  # adb's wire: imported once the front is used

    return statistics()


def _port_book(config: Config) -> tuple[PortBook, _Forgetting]:
    """The per-VM port book; apps not seen for [debugger] forget_after_days lose their port now."""
    book = PortBook(config.debugger.state_file, config.debugger.ports)
    max_age = config.debugger.forget_after_days * SECONDS_PER_DAY
    forgotten = _log_forgotten(book.expire(max_age), max_age)
    return book, _Forgetting(max_age, bool(forgotten))


def _load_extensions(config: Config) -> LoadedHandlers:
    """The chunk-handler plugins ([extensions]), each load and failure logged."""
    extensions = load_handlers(config.extensions.disabled)
    for failure in extensions.failures:
        log.warning(Event.EXT_LOAD_FAILED, handler=failure.name, error=failure.error)
    for handler in extensions.handlers:
        log.info(Event.EXT_LOADED, handler=handler.name, chunk_types=list(handler.chunk_types))
    return extensions


def _logcat_hub(config: Config, registry: VmRegistry, hub: events.EventHub) -> LogcatHub | None:
    """Devices' logs (ddmd.logcat): one stream per device, read through the adb server; None
    without adb."""
    if config.adb.enabled == "off":
        return None
    from ddmd.discovery.adbserver import AdbServer  # adbutils: slow to import, adb only

    adb_server = AdbServer(config.adb, config.timeouts.adb)
    return LogcatHub(
        registry,
        adb_server.open,
        LogcatSettings(
            buffer_lines=config.logcat.buffer_lines,
            keep=config.logcat.keep,
            idle_stop=config.logcat.idle_stop,
            stall=config.logcat.stall_timeout,
        ),
        lambda name, fields: hub.emit(name, **fields),
    )


class _Discovery:
    """The discoverers: the port scan ([scan]) and the adb devices ([adb]). Started with the
    VM work, they send ``VmFound``/``VmLost`` to the supervisor, which tells them how each VM
    ended (`vm_ended`: the scanner backs off from a port whose VM keeps breaking the protocol)."""

    def __init__(self, config: Config, registry: VmRegistry, policy: peers.PeerPolicy) -> None:
        self._config = config
        self._registry = registry
        self._policy = policy
        self._scanner: PortScanner | None = None
        self._adb: AdbDiscovery | None = None

    def start(
        self,
        nursery: trio.Nursery,
        send: trio.MemorySendChannel[VmFound | VmLost],
        held: Callable[[], set[int]],
    ) -> None:
        if self._config.scan.enabled:
            self._scanner = PortScanner(self._config, held, policy=self._policy)
            nursery.start_soon(self._scanner.run, send.clone())
        if self._config.adb.enabled != "off":
            # Imported here: adbutils is slow to import and unused without adb.
            from ddmd.discovery.adb import AdbDiscovery

            self._adb = AdbDiscovery(self._config, self._registry)
            nursery.start_soon(self._adb.run, send.clone())

    def vm_ended(self, key: object, broke: bool, reason: str) -> None:
        # Workstation VMs are keyed by port, device VMs by (serial, pid).
        if isinstance(key, int) and self._scanner is not None:
            self._scanner.vm_ended(key, protocol_error=broke, reason=reason)
        elif isinstance(key, tuple) and self._adb is not None:
            self._adb.vm_ended(key, protocol_error=broke, reason=reason)

    def scan_probes(self) -> int:
        return self._scanner.probes if self._scanner is not None else 0


# --------------------------------------------------------------------------------------------------
# The tasks


class _Shutdown:
    """Stopping starts once (a signal, or ``Started.stop``): the registry stops announcing
    current-VM changes, systemd hears STOPPING=1, every event stream ends (so the control
    server's graceful stop is quick), and whatever has not finished within the grace is
    cancelled."""

    def __init__(self, grace: float, parts: _Parts, root: trio.CancelScope) -> None:
        self._grace = grace
        self._registry = parts.registry
        self._hub = parts.hub
        self._root = root
        self._event = trio.Event()

    def stop(self) -> None:
        if self._event.is_set():
            return
        grace = self._grace
        log.info(Event.DAEMON_STOPPING, grace=grace)
        self._registry.stopping()  # no current.changed per VM as they leave
        _notify_systemd(notify.stopping, f"stopping (grace {grace:g} s)")
        self._event.set()
        self._hub.close(self._hub.event(events.StreamEvent.DAEMON_STOPPING))
        # Hard cap: whatever has not finished within the grace period is cancelled.
        self._root.deadline = min(self._root.deadline, trio.current_time() + grace)

    async def wait(self) -> None:
        await self._event.wait()


async def _start_control(
    root: trio.Nursery, config: Config, parts: _Parts, shutdown: _Shutdown
) -> ControlBound:
    """The control API, bound (its port in use is a `PortInUse`); it stops serving when
    shutdown starts. The token is checked by the safety middleware (Bearer header or
    ddmd_token cookie)."""
    app = control.create_app(
        parts.registry,
        ports=parts.ports,
        middleware=safety.control_middleware(config.control),
        extra_routes=[
            events.events_route(parts.hub, parts.registry_events),
            metrics.metrics_route(metrics.make_registry(parts.collector)),
        ],
        health={"adb": _adb_health(config)},
        extensions=parts.extensions.to_json(),
        capture_dir=config.debugger.state_file.parent / "captures",
        logcat=parts.logcat,
    )
    tcp = (config.control.host, config.control.port) if config.control.tcp else None
    try:
        bound: ControlBound = await root.start(
            partial(
                serve_control,
                app,
                tcp=tcp,
                unix=config.control.socket,
                guard=parts.guard,
                shutdown_trigger=shutdown.wait,
            )
        )
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE or "in use" in str(exc).lower():
            raise PortInUse(config.control.port, "[control] port") from exc
        raise
    if bound.tcp is not None:
        safety.warn_if_exposed(config.control.host, bound.tcp[1])
    return bound


async def _start_metrics(
    root: trio.Nursery, config: Config, parts: _Parts, shutdown: _Shutdown
) -> int | None:
    """``[metrics] listen``: ``/metrics`` alone on its own port (nothing else answers there), for
    a Prometheus on another machine; None when off. Peer-checked like every port; a bind beyond
    loopback is allowed by the config only with [security] allow_non_loopback, and warned of."""
    if not config.metrics.listen:
        return None
    from starlette.applications import Starlette

    app = Starlette(routes=[metrics.metrics_route(metrics.make_registry(parts.collector))])
    try:
        bound: ControlBound = await root.start(
            partial(
                serve_control,
                app,
                tcp=(config.metrics.bind, config.metrics.port),
                guard=parts.guard,
                shutdown_trigger=shutdown.wait,
                listening=Event.METRICS_LISTENING,
            )
        )
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE or "in use" in str(exc).lower():
            raise PortInUse(config.metrics.port, "[metrics] port") from exc
        raise
    assert bound.tcp is not None
    if not is_loopback_host(config.metrics.bind):
        log.warning(
            Event.LISTENER_NON_LOOPBACK,
            host=config.metrics.bind,
            port=bound.tcp[1],
            key="metrics.bind",
        )
    return bound.tcp[1]


def _current_vm_listener(config: Config, parts: _Parts) -> CurrentVmListener:
    return CurrentVmListener(
        parts.registry, config.debugger.host, config.debugger.current_port, guard=parts.guard
    )


async def _start_front(
    root: trio.Nursery, scope: trio.CancelScope, config: Config, parts: _Parts
) -> int | None:
    """The adb front (ddmd.front): adb tools share the VMs ddmd holds. Not without adb; None
    when it does not run."""
    if not _front_runs(config):
        return None
    from ddmd.front.server import serve_front  # adb's wire, only when adb is used

    serve = partial(serve_front, config, DeviceVms(parts.supervisor), parts.guard)
    port: int | None = await root.start(_within, scope, serve)
    return port


async def _within(
    scope: trio.CancelScope,
    serve: Callable[..., Awaitable[None]],
    *,
    task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED,
) -> None:
    """``serve(task_status=...)`` inside ``scope``."""
    with scope:
        await serve(task_status=task_status)


async def _discovery_and_vms(scope: trio.CancelScope, parts: _Parts) -> None:
    """The VM work: discovery feeding the supervisor, the port book's saver and sweeper, and the
    devices' logs. The event stream follows the registry meanwhile (the hub is closed when
    shutdown starts)."""
    with scope, parts.registry.subscribe(parts.registry_events):
        send, receive = trio.open_memory_channel[VmFound | VmLost](0)
        async with trio.open_nursery() as inner:
            inner.start_soon(parts.supervisor.run, receive)
            inner.start_soon(parts.ports.run_saver)
            forgetting = parts.forgetting
            inner.start_soon(
                forget_old_ports,
                parts.ports,
                parts.registry,
                forgetting.max_age,
                forgetting.at_start,
            )
            parts.discovery.start(inner, send, parts.supervisor.held_ports)
            if parts.logcat is not None:
                inner.start_soon(parts.logcat.run)
            await send.aclose()


def _announce(
    config: Config, bound: ControlBound, current_port: int, front_port: int | None
) -> None:
    """Every listener is bound (the control API, the current-VM port; per-VM ports open later,
    as VMs are named): the log says so, and systemd hears READY=1."""
    log.info(
        Event.DAEMON_STARTED,
        control=f"{config.control.host}:{config.control.port}" if config.control.tcp else "off",
        control_socket=str(bound.unix) if bound.unix is not None else None,
        scan=f"{config.scan.host}:{config.scan.ports}" if config.scan.enabled else "off",
        adb=config.adb.enabled,
        front=front_port,
    )
    where = [] if bound.tcp is None else [f"http://{_host_port(*bound.tcp)}/"]
    if bound.unix is not None:
        where.append(f"unix socket {bound.unix}")
    _notify_systemd(
        notify.ready,
        f"control API {' and '.join(where)}, current-VM port {current_port}",
    )


def _adb_health(config: Config) -> dict[str, str | None]:
    """For ``GET /api/v1/health``: the adb mode and the config file that set it, so that
    `ddmd devices` can say where adb was turned off (None: the built-in defaults)."""
    source = config.source
    is_file = source is not None and not source.startswith("<")  # "<defaults>" is no file
    return {
        "enabled": config.adb.enabled,
        # Absolute: the client asking may run in another directory.
        "config": os.path.abspath(source) if is_file and source is not None else None,
    }


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _notify_systemd(send: Callable[[str], bool], status: str) -> None:
    """Tell systemd (``Type=notify``); outside systemd this does nothing."""
    try:
        send(status)
    except OSError as exc:
        log.warning(Event.DAEMON_NOTIFY_FAILED, error=str(exc))


def _log_forgotten(entries: list[PortEntry], max_age: float) -> list[PortEntry]:
    for entry in entries:
        log.info(
            Event.PORTS_FORGOTTEN,
            key=entry.key,
            port=entry.port,
            last_seen=format_time(entry.last_seen),
            reason="not seen for longer than [debugger] forget_after_days",
            days=max_age / SECONDS_PER_DAY,
        )
    return entries


async def forget_old_ports(
    ports: control.PortBookOwner,
    registry: VmRegistry,
    max_age: float,
    save_now: bool = False,
    *,
    interval: float = SECONDS_PER_DAY,
) -> None:
    """Keep the port book small while the daemon runs: every ``interval`` seconds the apps
    connected now count as seen, and entries not seen for ``max_age`` seconds are dropped.
    ``save_now``: the book changed at start (entries dropped), write it at once."""
    if save_now:
        await ports.save()
    while True:
        await trio.sleep(interval)
        book = ports.book
        connected = control.port_users(registry, book.entries())
        dropped = _log_forgotten(book.sweep(max_age, connected), max_age)
        if dropped or connected:
            await ports.save()


async def _watch_signals(stop: Callable[[], None], scope: trio.CancelScope) -> None:
    with scope, trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info(Event.DAEMON_SIGNAL, signal=signal.Signals(signum).name)
            stop()

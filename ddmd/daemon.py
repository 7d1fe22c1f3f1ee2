"""The daemon: builds the objects and the nursery tree, handles signals, shuts down gracefully.

Layer: the only place where tasks are wired together. Imports everything below it.

    trio.run(daemon.run)
    └── root nursery
        ├── signal watcher: SIGTERM/SIGINT -> stop (deadline = now + grace)
        ├── control API (nursery.start -> started once bound)
        ├── discovery.scan --VmFound--> supervisor
        ├── discovery.adb  --VmFound/VmLost--> supervisor   (when [adb] enabled is not "off")
        ├── supervisor: one task per VM (VmDriver.run), errors contained per VM; a VmLost
        │   ends that VM's actor (its debugger's connection is closed) and logs why
        └── forget_old_ports: once a day, drops port-book entries of apps not seen for
            [debugger] forget_after_days (also done once at start, before anything runs)

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
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import structlog
import trio

from ddmd import notify, peers
from ddmd.config import Config
from ddmd.control import app as control
from ddmd.control import events, metrics, safety
from ddmd.control.server import ControlBound, serve_control
from ddmd.discovery.scan import PortScanner
from ddmd.drive.found import VmFound, VmLost
from ddmd.drive.hub import DeviceVms
from ddmd.drive.ports import CurrentVmListener, VmPorts
from ddmd.drive.supervisor import Supervisor
from ddmd.errors import PortInUse
from ddmd.ext.loading import load_handlers
from ddmd.logcat.device import LogcatSettings
from ddmd.logcat.hub import LogcatHub
from ddmd.logs import Event
from ddmd.portbook import SECONDS_PER_DAY, PortBook, PortEntry, format_time
from ddmd.registry import VmRegistry

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


async def run(
    config: Config,
    *,
    install_signal_handlers: bool = True,
    task_status: trio.TaskStatus[Started] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the daemon until SIGINT/SIGTERM (or ``Started.stop()``); then stop within the grace."""
    registry = VmRegistry()
    book = PortBook(config.debugger.state_file, config.debugger.ports)
    # Apps not seen for [debugger] forget_after_days lose their port: now, then once a day.
    forget_after = config.debugger.forget_after_days * SECONDS_PER_DAY
    forgotten_at_start = _log_forgotten(book.expire(forget_after), forget_after)
    # Who may connect to every port below, and whose JVMs the scan adopts (ddmd.peers).
    policy = peers.PeerPolicy.from_config(config.security)
    peers.warn_if_unchecked(policy)
    guard = peers.PeerGuard(policy)
    ports = VmPorts(book, config.debugger.host, guard=guard)
    extensions = load_handlers(config.extensions.disabled)
    for failure in extensions.failures:
        log.warning(Event.EXT_LOAD_FAILED, handler=failure.name, error=failure.error)
    for handler in extensions.handlers:
        log.info(Event.EXT_LOADED, handler=handler.name, chunk_types=list(handler.chunk_types))
    supervisor = Supervisor(config, registry, ports, handlers=tuple(extensions.handlers))
    hub = events.EventHub()
    registry_events = events.RegistryEvents(registry, hub)
    scanners: list[PortScanner] = []
    # Devices' logs (ddmd.logcat): one stream per device, read through the adb server.
    logcat: LogcatHub | None = None
    if config.adb.enabled != "off":
        from ddmd.discovery.adbserver import AdbServer  # adbutils: slow to import, adb only

        adb_server = AdbServer(config.adb, config.timeouts.adb)
        logcat = LogcatHub(
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
    collector = metrics.DaemonCollector(
        registry,
        vms=lambda: list(supervisor.actors.values()),
        retired=supervisor.retired,
        scan_probes=lambda: sum(s.probes for s in scanners),
        hub=hub,
        peers=guard,
    )
    shutdown = trio.Event()
    grace = config.timeouts.shutdown_grace

    async with trio.open_nursery() as root:

        def stop() -> None:
            if not shutdown.is_set():
                log.info(Event.DAEMON_STOPPING, grace=grace)
                registry.stopping()  # no current.changed per VM as they leave
                _notify_systemd(notify.stopping, f"stopping (grace {grace:g} s)")
                shutdown.set()
                # Every event stream ends now, so the control server's graceful stop is quick.
                hub.close(hub.event(events.StreamEvent.DAEMON_STOPPING))
                # Hard cap: whatever has not finished within the grace period is cancelled.
                root.cancel_scope.deadline = min(
                    root.cancel_scope.deadline, trio.current_time() + grace
                )

        signals_scope = trio.CancelScope()
        if install_signal_handlers:
            root.start_soon(_watch_signals, stop, signals_scope)

        # The token is checked by the safety middleware (Bearer header or ddmd_token cookie).
        app = control.create_app(
            registry,
            ports=ports,
            middleware=safety.control_middleware(config.control),
            extra_routes=[
                events.events_route(hub, registry_events),
                metrics.metrics_route(metrics.make_registry(collector)),
            ],
            health={"adb": _adb_health(config)},
            extensions=extensions.to_json(),
            capture_dir=config.debugger.state_file.parent / "captures",
            logcat=logcat,
        )
        tcp = (config.control.host, config.control.port) if config.control.tcp else None
        try:
            bound: ControlBound = await root.start(
                partial(
                    serve_control,
                    app,
                    tcp=tcp,
                    unix=config.control.socket,
                    guard=guard,
                    shutdown_trigger=shutdown.wait,
                )
            )
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE or "in use" in str(exc).lower():
                raise PortInUse(config.control.port, "[control] port") from exc
            raise
        if bound.tcp is not None:
            safety.warn_if_exposed(config.control.host, bound.tcp[1])

        current = CurrentVmListener(
            registry, config.debugger.host, config.debugger.current_port, guard=guard
        )
        # Its own scope so that shutdown closes it at once; otherwise the root nursery waits
        # for the accept loop until the grace deadline cancels it.
        current_scope = trio.CancelScope()

        async def run_current(
            *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
        ) -> None:
            with current_scope:
                await current.run(task_status=task_status)

        current_port = await root.start(run_current)
        registry.current_port = current_port  # the API names it (`ddmd clients`, the page)

        # The adb front (ddmd.front): adb tools share the VMs ddmd holds. Not without adb.
        front_port: int | None = None
        front_scope = trio.CancelScope()
        if config.front.enabled and config.adb.enabled != "off":
            from ddmd.front.server import serve_front  # adb's wire, only when adb is used

            async def run_front(
                *, task_status: trio.TaskStatus[int | None] = trio.TASK_STATUS_IGNORED
            ) -> None:
                with front_scope:
                    await serve_front(config, DeviceVms(supervisor), guard, task_status=task_status)

            front_port = await root.start(run_front)

        work = trio.CancelScope()

        async def discovery_and_vms() -> None:
            # The event stream follows the registry while VMs come and go (the hub is closed
            # when shutdown starts).
            with work, registry.subscribe(registry_events):
                send, receive = trio.open_memory_channel[VmFound | VmLost](0)
                async with trio.open_nursery() as inner:
                    inner.start_soon(supervisor.run, receive)
                    inner.start_soon(ports.run_saver)
                    inner.start_soon(
                        forget_old_ports, ports, registry, forget_after, bool(forgotten_at_start)
                    )
                    scanner: PortScanner | None = None
                    adb: AdbDiscovery | None = None
                    if config.scan.enabled:
                        scanner = PortScanner(config, supervisor.held_ports, policy=policy)
                        scanners.append(scanner)
                        inner.start_soon(scanner.run, send.clone())
                    if config.adb.enabled != "off":
                        # Imported here: adbutils is slow to import and unused without adb.
                        from ddmd.discovery.adb import AdbDiscovery

                        adb = AdbDiscovery(config, registry)
                        inner.start_soon(adb.run, send.clone())

                    def vm_ended(key: object, broke: bool, reason: str) -> None:
                        # Workstation VMs are keyed by port, device VMs by (serial, pid).
                        if isinstance(key, int) and scanner is not None:
                            scanner.vm_ended(key, protocol_error=broke, reason=reason)
                        elif isinstance(key, tuple) and adb is not None:
                            adb.vm_ended(key, protocol_error=broke, reason=reason)

                    supervisor.on_vm_ended = vm_ended
                    if logcat is not None:
                        inner.start_soon(logcat.run)
                    await send.aclose()

        root.start_soon(discovery_and_vms)
        log.info(
            Event.DAEMON_STARTED,
            control=f"{config.control.host}:{config.control.port}" if tcp else "off",
            control_socket=str(bound.unix) if bound.unix is not None else None,
            scan=f"{config.scan.host}:{config.scan.ports}" if config.scan.enabled else "off",
            adb=config.adb.enabled,
            front=front_port,
        )
        address = bound.tcp
        # Every listener is bound: the control API above, the current-VM port (per-VM ports
        # open later, as VMs are named).
        where = [] if address is None else [f"http://{_host_port(*address)}/"]
        if bound.unix is not None:
            where.append(f"unix socket {bound.unix}")
        _notify_systemd(
            notify.ready,
            f"control API {' and '.join(where)}, current-VM port {current_port}",
        )
        task_status.started(
            Started(
                address,
                current_port,
                registry,
                supervisor,
                stop,
                hub,
                control_socket=bound.unix,
                guard=guard,
                front_port=front_port,
            )
        )
        await shutdown.wait()
        work.cancel()
        current_scope.cancel()
        front_scope.cancel()
        signals_scope.cancel()
    log.info(Event.DAEMON_STOPPED)


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

"""The daemon: builds the objects and the nursery tree, handles signals, shuts down gracefully.

Layer: the only place where tasks are wired together. Imports everything below it.

    trio.run(daemon.run)
    └── root nursery
        ├── signal watcher: SIGTERM/SIGINT -> stop (deadline = now + grace)
        ├── control API (nursery.start -> started once bound)
        ├── discovery.scan --VmFound--> supervisor
        └── supervisor: one task per VM (VmActor.run), errors contained per VM
"""

from __future__ import annotations

import errno
import signal
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog
import trio

from ddmd import control
from ddmd.config import Config
from ddmd.discovery import VmFound
from ddmd.discovery.scan import PortScanner
from ddmd.errors import PortInUse
from ddmd.listeners import CurrentVmListener, VmPorts
from ddmd.logs import Event
from ddmd.ports import PortBook
from ddmd.registry import VmRegistry
from ddmd.vm import VmActor

log = structlog.get_logger("ddmd.daemon")


@dataclass(slots=True)
class Supervisor:
    """Runs one VmActor per found VM; one VM's failure never reaches the others."""

    config: Config
    registry: VmRegistry
    ports: VmPorts | None = None
    # Told how each VM ended: (discovery key, protocol error?, reason). The scanner uses it to
    # back off from a port whose VM keeps breaking the protocol.
    on_vm_ended: Callable[[object, bool, str], None] | None = None
    held: set[object] = field(default_factory=set)
    actors: dict[str, VmActor] = field(default_factory=dict)

    def held_ports(self) -> set[int]:
        return {k for k in self.held if isinstance(k, int)}

    async def run(self, receive: trio.MemoryReceiveChannel[VmFound]) -> None:
        async with trio.open_nursery() as nursery, receive:
            async for found in receive:
                if found.key in self.held or found.vm_id in self.actors:
                    await _close_quietly(found.stream)
                    continue
                if len(self.actors) >= self.config.limits.max_vms:
                    log.warning(Event.VM_REJECTED, vm=found.vm_id, reason="limits.max_vms reached")
                    await _close_quietly(found.stream)
                    continue
                self.held.add(found.key)
                nursery.start_soon(self._run_vm, found)

    async def _run_vm(self, found: VmFound) -> None:
        actor = VmActor(
            vm_id=found.vm_id,
            source=found.source,
            address=found.address,
            config=self.config,
            registry=self.registry,
            device=found.device,
            expected_pid=found.pid,
            ports=self.ports,
        )
        self.actors[found.vm_id] = actor
        log.info(Event.VM_FOUND, vm=found.vm_id, address=found.address, source=found.source)
        reason = "crashed"
        try:
            reason = await actor.run(found.stream, found.leftover, found.opener)
        except* Exception as group:
            log.error(Event.VM_CRASHED, vm=found.vm_id, exc_info=group)
            await _close_quietly(found.stream)
        finally:
            if self.on_vm_ended is not None:
                broke = reason.startswith("protocol error") or reason == "crashed"
                self.on_vm_ended(found.key, broke, reason)
            self.actors.pop(found.vm_id, None)
            self.held.discard(found.key)
            self.registry.remove(found.vm_id)


async def _close_quietly(stream: trio.abc.Stream) -> None:
    with trio.move_on_after(1) as scope:
        scope.shield = True
        try:
            await stream.aclose()
        except Exception:
            log.debug("stream.close_failed")


@dataclass(frozen=True, slots=True)
class Started:
    """What ``run`` reports through ``task_status`` once every listener is bound."""

    control: tuple[str, int]
    current_port: int
    registry: VmRegistry
    supervisor: Supervisor
    stop: Callable[[], None]


async def run(
    config: Config,
    *,
    install_signal_handlers: bool = True,
    task_status: trio.TaskStatus[Started] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the daemon until SIGINT/SIGTERM (or ``Started.stop()``); then stop within the grace."""
    registry = VmRegistry()
    book = PortBook(config.debugger.state_file, config.debugger.ports)
    ports = VmPorts(book, config.debugger.host)
    supervisor = Supervisor(config, registry, ports)
    shutdown = trio.Event()
    grace = config.timeouts.shutdown_grace

    async with trio.open_nursery() as root:

        def stop() -> None:
            if not shutdown.is_set():
                log.info(Event.DAEMON_STOPPING, grace=grace)
                shutdown.set()
                # Hard cap: whatever has not finished within the grace period is cancelled.
                root.cancel_scope.deadline = min(
                    root.cancel_scope.deadline, trio.current_time() + grace
                )

        signals_scope = trio.CancelScope()
        if install_signal_handlers:
            root.start_soon(_watch_signals, stop, signals_scope)

        app = control.create_app(registry, token=config.control.token)
        try:
            bound = await root.start(
                control.serve, app, config.control.host, config.control.port, shutdown.wait
            )
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE or "in use" in str(exc).lower():
                raise PortInUse(config.control.port, "[control] port") from exc
            raise

        current = CurrentVmListener(registry, config.debugger.host, config.debugger.current_port)
        # Its own scope so that shutdown closes it at once; otherwise the root nursery waits
        # for the accept loop until the grace deadline cancels it.
        current_scope = trio.CancelScope()

        async def run_current(
            *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
        ) -> None:
            with current_scope:
                await current.run(task_status=task_status)

        current_port = await root.start(run_current)

        work = trio.CancelScope()

        async def discovery_and_vms() -> None:
            with work:
                send, receive = trio.open_memory_channel[VmFound](0)
                async with trio.open_nursery() as inner:
                    inner.start_soon(supervisor.run, receive)
                    if config.scan.enabled:
                        scanner = PortScanner(config, supervisor.held_ports)

                        def vm_ended(key: object, broke: bool, reason: str) -> None:
                            if isinstance(key, int):
                                scanner.vm_ended(key, protocol_error=broke, reason=reason)

                        supervisor.on_vm_ended = vm_ended
                        inner.start_soon(scanner.run, send)
                    else:
                        await send.aclose()

        root.start_soon(discovery_and_vms)
        log.info(
            Event.DAEMON_STARTED,
            control=f"{config.control.host}:{config.control.port}",
            scan=f"{config.scan.host}:{config.scan.ports}" if config.scan.enabled else "off",
        )
        task_status.started(
            Started(_as_address(bound, config), current_port, registry, supervisor, stop)
        )
        await shutdown.wait()
        work.cancel()
        current_scope.cancel()
        signals_scope.cancel()
    log.info(Event.DAEMON_STOPPED)


def _as_address(bound: object, config: Config) -> tuple[str, int]:
    if isinstance(bound, tuple) and len(bound) == 2:
        return (str(bound[0]), int(bound[1]))
    return (config.control.host, config.control.port)


async def _watch_signals(stop: Callable[[], None], scope: trio.CancelScope) -> None:
    with scope, trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            log.info(Event.DAEMON_SIGNAL, signal=signal.Signals(signum).name)
            stop()

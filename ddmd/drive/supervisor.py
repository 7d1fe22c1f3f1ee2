"""The supervisor: one nursery subtree per VM. ``VmFound``/``VmLost`` from discovery come in,
``VmDriver``s go out; one VM's failure never reaches the others.

Layer: trio, structlog, config, registry, logs, discovery's messages, ``drive.vm`` and the
metrics totals. A crash of a VM's driver is logged (``vm.crashed``) with its traceback and the
VM dropped; ``Cancelled`` is never caught. When the daemon stops, its VMs end as "stopped",
which discovery does not count against their ports. Every VM's last line is ``vm.gone`` (with
the reason), the match of its ``vm.found``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

import structlog
import trio

from ddmd.config import Config
from ddmd.drive.found import VmFound, VmLost
from ddmd.drive.ports import VmPorts
from ddmd.drive.streams import aclose_quietly
from ddmd.drive.vm import VmDriver
from ddmd.logs import Event, unbind_vm_identity
from ddmd.registry import VmRegistry

log = structlog.get_logger("ddmd.daemon")


class _TimeoutCounts(Protocol):
    @property
    def requests_timed_out(self) -> int: ...


class CountedVm(Protocol):
    """What the collector reads of a VM actor (``ddmd.drive.vm.VmDriver``)."""

    def bridge_statistics(self) -> dict[str, int]: ...

    def statistics(self) -> _TimeoutCounts: ...


@dataclass(slots=True)
class RelayTotals:
    """Running totals of the counters of VMs that went away (owned by the supervisor)."""

    packets_to_vm: int = 0
    packets_to_debugger: int = 0
    bytes_to_vm: int = 0
    bytes_to_debugger: int = 0
    reconnects: int = 0
    slow_debuggers: int = 0
    requests_timed_out: int = 0
    answered_cache: int = 0  # foresight: debuggers' commands answered from replies kept
    answered_speculation: int = 0  # and from ddmd's own speculative ones
    speculation_wasted: int = 0

    def add(self, vm: CountedVm) -> None:
        """Fold in one VM's final counts (call once, as it leaves the supervisor)."""
        bridge = vm.bridge_statistics()
        for f in fields(self):
            if f.name in bridge:
                setattr(self, f.name, getattr(self, f.name) + int(bridge[f.name]))
        self.requests_timed_out += vm.statistics().requests_timed_out

    def plus(self, vms: Iterable[CountedVm]) -> RelayTotals:
        """A new total: these plus the live counts of ``vms``."""
        total = RelayTotals(*(getattr(self, f.name) for f in fields(self)))
        for vm in vms:
            total.add(vm)
        return total


@dataclass(slots=True)
class Supervisor:
    """Runs one VmDriver per found VM; one VM's failure never reaches the others."""

    config: Config
    registry: VmRegistry
    ports: VmPorts | None = None
    # Told how each VM ended: (discovery key, protocol error?, reason). The scanner uses it to
    # back off from a port whose VM keeps breaking the protocol.
    on_vm_ended: Callable[[object, bool, str], None] | None = None
    held: set[object] = field(default_factory=set)
    refused: set[object] = field(default_factory=set)  # keys refused by [limits] max_vms
    handlers: Sequence[Any] = ()  # chunk handlers (ddmd.ext), the same objects for every VM
    actors: dict[str, VmDriver] = field(default_factory=dict)
    _scopes: dict[str, trio.CancelScope] = field(default_factory=dict)
    _lost: dict[str, str] = field(default_factory=dict)
    # Final counters of the VMs that went away: /metrics adds the live ones to these.
    retired: RelayTotals = field(default_factory=RelayTotals)

    def held_ports(self) -> set[int]:
        return {k for k in self.held if isinstance(k, int)}

    async def run(self, receive: trio.MemoryReceiveChannel[VmFound | VmLost]) -> None:
        async with trio.open_nursery() as nursery, receive:
            async for found in receive:
                if isinstance(found, VmLost):
                    self._lose(found)
                    continue
                if found.key in self.held or found.vm_id in self.actors:
                    await aclose_quietly(found.stream)
                    self._ended(found.key, False, "rejected: already served")
                    continue
                if len(self.actors) >= self.config.limits.max_vms:
                    if found.key not in self.refused:  # once per VM, not at every scan
                        self.refused.add(found.key)
                        log.warning(
                            Event.VM_REJECTED, vm=found.vm_id, reason="limits.max_vms reached"
                        )
                    await aclose_quietly(found.stream)
                    self._ended(found.key, False, "rejected: limits.max_vms reached")
                    continue
                self.refused.discard(found.key)
                self.held.add(found.key)
                nursery.start_soon(self._run_vm, found)

    def _ended(self, key: object, broke: bool, reason: str) -> None:
        if self.on_vm_ended is not None:
            self.on_vm_ended(key, broke, reason)

    def _lose(self, lost: VmLost) -> None:
        """Discovery lost a VM (its pid or device went away): end its actor; an attached
        debugger is told by its connection closing."""
        scope = self._scopes.get(lost.vm_id)
        actor = self.actors.get(lost.vm_id)
        if scope is None or actor is None:
            return
        self._lost[lost.vm_id] = lost.reason
        log.warning(
            Event.VM_LOST, vm=lost.vm_id, reason=lost.reason, debugger=actor.snapshot().debugger
        )
        scope.cancel()

    async def _run_vm(self, found: VmFound) -> None:
        actor = VmDriver(
            vm_id=found.vm_id,
            source=found.source,
            address=found.address,
            config=self.config,
            registry=self.registry,
            device=found.device,
            expected_pid=found.pid,
            process=found.process,
            ports=self.ports,
            handlers=self.handlers,
            files=found.files,
        )
        self.actors[found.vm_id] = actor
        scope = self._scopes[found.vm_id] = trio.CancelScope()
        log.info(Event.VM_FOUND, vm=found.vm_id, address=found.address, source=found.source)
        # Until run() returns, the VM is being stopped: the daemon is shutting down (its
        # nursery is cancelled), which is no fault of the VM's and must not back off its port.
        reason = "stopped"
        try:
            with scope:
                reason = await actor.run(found.stream, found.leftover, found.opener)
            if scope.cancelled_caught:
                reason = f"lost: {self._lost.get(found.vm_id, 'discovery lost it')}"
        except* Exception as group:
            reason = "crashed"
            log.error(Event.VM_CRASHED, vm=found.vm_id, exc_info=group)
            await aclose_quietly(found.stream)
        finally:
            if self.on_vm_ended is not None:
                broke = reason.startswith("protocol error") or reason == "crashed"
                self.on_vm_ended(found.key, broke, reason)
            self._scopes.pop(found.vm_id, None)
            self._lost.pop(found.vm_id, None)
            self.retired.add(actor)
            self.actors.pop(found.vm_id, None)
            self.held.discard(found.key)
            self.registry.remove(found.vm_id)
            log.info(Event.VM_GONE, vm=found.vm_id, reason=reason)
            unbind_vm_identity(found.vm_id)

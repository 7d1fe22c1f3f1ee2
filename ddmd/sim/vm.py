"""`SimVm`: a simulated DDM-speaking VM reached over TCP (run by ``ddmd sim``, ``ddmd demo`` and
tests). How it behaves (flavours, replies, pushes) is described in the package docstring
(`ddmd.sim`).

`SimVm` is the process: its public API, its timers (APNM, GC, thread churn), the thread table
and the plain JDWP commands. It is composed of parts it owns and delegates to: `SimLink`
(`sim.link`: the listening socket, one connection at a time, replies and pushes),
`DdmHandlers` (`sim.ddmhandlers`: the answers to DDM requests, the names HELO and APNM
give), `SimHeap` (`sim.gc`: the heap layout and the GC) and `DdmsFeatures` (`sim.ddms`:
method tracing, heap dumps, the allocation tracker).

Layer: a tool beside the daemon. It imports ``ddmd.protocol`` (JDWP framing, DDM chunks), the
other ``ddmd.sim`` modules, trio and structlog, and nothing else from ddmd; nothing in the
daemon imports it.
"""

from __future__ import annotations

import random
from typing import Final

import structlog
import trio

from ddmd.protocol.ddm import ResolvedAllocation
from ddmd.protocol.jdwp import CommandPacket, ErrorCode
from ddmd.sim.config import PRE_INITIALIZED, SimConfig, SimStatistics
from ddmd.sim.connection import Connection
from ddmd.sim.ddmhandlers import DdmHandlers
from ddmd.sim.ddms import DdmsFeatures
from ddmd.sim.gc import SimHeap
from ddmd.sim.hprof import HeapContent
from ddmd.sim.jdwp import Halt, PlainJdwp
from ddmd.sim.link import DDM_SET, SimLink
from ddmd.sim.threads import ThreadTable
from ddmd.sim.trace import TraceRecording

__all__ = ["SimVm"]

logger = structlog.get_logger()

_DDM_COMMAND: Final = 1  # DDM's one command in its command set (199/1)


class SimVm:
    """One simulated VM. ``await vm.run()`` serves until EXIT or cancellation."""

    def __init__(self, config: SimConfig) -> None:
        self.config = config
        seed = config.seed if config.seed is not None else config.pid
        self._rng = random.Random(seed)
        self._jdwp_requests = 0
        self._threads = ThreadTable(config, self._rng)
        self._link = SimLink(
            config,
            logger.bind(sim_pid=config.pid),
            self._dispatch,
            self._threads.release_suspensions,
        )
        #: Method tracing, heap dumps, the allocation tracker (`sim.ddms`).
        self.ddms = DdmsFeatures(
            config, self._threads, self._link.push, self._link.push_stream, self._log_info
        )
        self._heap = SimHeap(config, self._rng, self._link, self.ddms)
        self._ddm = DdmHandlers(config, self._link, self._threads, self._heap, self.ddms)
        self._jdwp = PlainJdwp(config, self._threads, trio.current_time)

    # ----------------------------------------------------------------------------- public API

    @property
    def port(self) -> int | None:
        """The listening port once known (after ``run`` reported it)."""
        return self._link.port

    @property
    def connections_accepted(self) -> int:
        return self._link.connections_accepted

    @property
    def app_name(self) -> str:
        return self._ddm.app_name

    @property
    def exit_status(self) -> int | None:
        """The status EXIT (or VirtualMachine.Exit) halted the VM with; None while it runs."""
        return self._link.exit_status

    @property
    def device_files(self) -> dict[str, bytes]:
        """Files the VM wrote on its "device" (MPRS/MPRE traces, HPDU dumps): path -> bytes."""
        return self.ddms.device_files

    def recorded_allocations(self) -> tuple[ResolvedAllocation, ...]:
        """What the allocation tracker recorded, newest first, as REAL reports it now."""
        return self.ddms.recorded_allocations()

    def trace_recording(self) -> TraceRecording:
        """What every method trace of this VM holds (calls per method: ``call_counts()``)."""
        return self.ddms.trace_recording()

    def heap_content(self) -> HeapContent:
        """What the heap dump holds (``expected_instances()``: the instances per class)."""
        return self.ddms.heap_content()

    def statistics(self) -> SimStatistics:
        link = self._link
        conn = link.conn
        return SimStatistics(
            port=link.port,
            pid=self.config.pid,
            app_name=self._ddm.app_name,
            listening=link.listening,
            connected=conn is not None,
            exited=link.exited,
            connections_accepted=link.connections_accepted,
            packets_received=link.packets_received,
            ddm_requests=self._ddm.ddm_requests,
            jdwp_requests=self._jdwp_requests,
            thst_requests=self._ddm.thst_requests,
            replies_sent=link.replies_sent,
            replies_received=link.replies_received,
            duplicate_outstanding_ids=link.duplicate_ids,
            pushes_sent=link.pushes_sent,
            gcs=self._heap.gcs,
            live_threads=len(self._threads),
            thread_notify=conn is not None and conn.thread_notify,
            exit_status=link.exit_status,
        )

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen, serve one connection at a time, until EXIT (or cancellation).

        Reports the real port with ``task_status.started(port)`` once listening.
        """
        self._threads.last_evolve = trio.current_time()
        try:
            async with trio.open_nursery() as nursery:
                if self.config.apnm_delay > 0:
                    nursery.start_soon(self._apnm_timer)
                if self.config.gc_interval > 0:
                    nursery.start_soon(self._heap.gc_loop)
                if self.config.churn_interval > 0:
                    nursery.start_soon(self._churn_loop)
                try:
                    await self._link.serve(lambda: self._ddm.app_name, task_status)
                finally:
                    nursery.cancel_scope.cancel()
        finally:
            self._link.listening = False
            self._link.log.info("sim.stopped", exited=self._link.exited)

    async def force_gc(self) -> None:
        """Run a GC now (pushes HPIF/HPSG/NHSG data as the connection enabled them)."""
        await self._heap.gc()

    async def push_wait(self) -> None:
        """Push WAIT now (the app just called ``Debug.waitForDebugger()``)."""
        await self._ddm.push_wait()

    async def rename(self, app_name: str, package_name: str | None = None) -> None:
        """The process is (re)named: later HELO replies use it, and APNM is pushed now."""
        await self._ddm.rename(app_name, package_name)

    async def churn(self) -> None:
        """One thread event now: a thread starts, dies or is renamed (pushed if THEN is on)."""
        await self._churn_once()

    def build_heap(self) -> None:
        """Build the heap layout now rather than at the first heap-info request (hosts running
        hundreds of sims in one thread use it so no VM answers late)."""
        self._heap.pieces()

    # ----------------------------------------------------------------------------- timers

    def _log_info(self, event: str, **kw: object) -> None:
        self._link.log.info(event, **kw)

    async def _apnm_timer(self) -> None:
        await trio.sleep(self.config.apnm_delay)
        if self._ddm.app_name == PRE_INITIALIZED:
            await self.rename(self.config.app_name, self.config.package_name)

    async def _churn_once(self) -> None:
        await self._push_thread_event(self._threads.churn())

    async def _push_thread_event(self, chunk: bytes) -> None:
        conn = self._link.conn
        if conn is not None and conn.thread_notify:
            await self._link.push(chunk, conn)

    async def _churn_loop(self) -> None:
        interval = self.config.churn_interval
        while True:
            await trio.sleep(self._rng.expovariate(1.0 / interval))
            await self._churn_once()

    # ----------------------------------------------------------------------------- commands

    async def _dispatch(self, conn: Connection, packet: CommandPacket) -> None:
        """One command from the client: DDM (199/1) or plain JDWP. Raises ``Halt`` on EXIT."""
        if packet.command_set == DDM_SET and packet.command == _DDM_COMMAND:
            await self._ddm.on_ddm(conn, packet)
        else:
            await self._on_jdwp(conn, packet)

    async def _on_jdwp(self, conn: Connection, packet: CommandPacket) -> None:
        self._jdwp_requests += 1
        self._ddm.note_jdwp_command()
        log = self._link.log
        log.debug(
            "sim.jdwp_received",
            id=packet.id,
            command_set=packet.command_set,
            command=packet.command,
            len=len(packet.data),
        )
        try:
            answer = self._jdwp.respond(conn, packet.command_set, packet.command, packet.data)
        except Halt as halt:
            log.info("sim.exit_requested", status=halt.status)
            await self._link.reply(conn, packet.id, b"")  # VirtualMachine.Exit replies first
            raise
        if answer is None:
            log.debug(
                "sim.jdwp_not_implemented", command_set=packet.command_set, command=packet.command
            )
            await self._link.reply(conn, packet.id, b"", ErrorCode.NOT_IMPLEMENTED)
            return
        error, data = answer
        await self._link.reply(conn, packet.id, data, error)

"""Simulated VMs: tools for users (``ddmd sim``, ``ddmd demo``) and for tests, not part of the
daemon.

* `vm`: `SimVm`, one simulated DDM-speaking VM on a loopback port, composed of `link` (the
  listening socket, one connection at a time, replies and pushes), `ddmhandlers` (the
  answers to DDM requests) and `gc` (the heap layout and the GC); `connection`: one client
  connection (send lock, handshake).
* `config`: `SimConfig`, the flavours, `SimStatistics`.
* `threads`, `heap`, `jdwp`: the VM's thread table, heap layout and plain JDWP handlers.
* `ddms`: method tracing, heap dumps and the allocation tracker (DDMS's profiling buttons);
  `trace`, `hprof`, `allocs`: their deterministic data (the .trace file, the HPROF dump,
  the recorded allocations).
* `cli`: ``ddmd sim``, `serve_many`, `make_configs`.
* `demo`: ``ddmd demo``, the daemon plus three simulated VMs.

Layer: the simulator imports ``ddmd.protocol`` and nothing else of ddmd; nothing in the daemon
imports it. `demo` alone wires the simulator to the daemon, and is not imported here.

``SimVm`` behaves like a debuggable Android VM (protocol.md sections 1-3, peers.md):

- one listening socket on 127.0.0.1; ONE JDWP connection at a time. While a connection is
  open the listening socket is closed, so a second connect is refused (as HotSpot does);
  after the connection ends it listens again on the same port;
- handshake echo (5 s deadline; a bad handshake closes the connection);
- DDM commands (199/1) answered with the same id; pushes carry VM ids ``0x80000000 | n``
  (ART 9+ numbering), one chunk per packet, the whole packet in one send;
- the flavour says which handlers exist and how a request ends when its handler returns
  nothing, there is no handler for its type, or the packet is malformed (protocol.md 2.2,
  3.1, 3.8):

  - ``flavor="art"`` (the default: a current phone, ART on Android 9-11): handlers for HELO
    FEAT THEN THST STKL HPIF HPSG NHSG HPGC EXIT, HPDU HPDS REAE REAQ REAL and MPRS MPRE
    MPSS MPSE SPSS SPSE MPRQ. Requests whose handler returns nothing (THEN, HPIF, HPSG,
    NHSG, HPGC, HPDS, REAE, MPRS, MPSS, MPSE, SPSS, SPSE), DBGD, unknown types and
    malformed DDM get **no reply at all** while the debugger agent is not loaded. The
    first non-DDM command (a debugger) loads the agent, and ART keeps it for the life of
    the process, so from then on, on this and every later connection, they get an empty
    reply; a packet whose chunk runs past its end then gets
    a JDWP error reply (INTERNAL; the document has this from source only).
  - ``flavor="legacy"`` (Dalvik, ART on Android 5-8): the same handlers; every such
    request gets an empty reply. With an ART VM ident (``Dalvik v2.x``) a packet whose first
    chunk is not exactly the rest of the packet is not handled (empty reply), as ART 5-8
    does; Dalvik (``Dalvik v1.x``) handles the first chunk and ignores trailing bytes.
  - ``flavor="modern"`` (Android 12+): only HELO, FEAT, EXIT, method tracing (MPxx, SPxx)
    and the APNM/WAIT pushes; THEN THST STKL HPIF HPSG NHSG HPGC, the heap dumps (HPDU
    HPDS) and the allocation tracker (REAE REAQ REAL) have no handler (protocol.md 3.1,
    3.8), so they go unanswered exactly as in ``art`` (empty replies once the agent is
    loaded). FEAT still lists the heap-dump features, as ART's own list does.

  Types the sim does not implement in any flavour (NHGT, VUxx) are treated as unknown
  types. A handler never returns a zero-length chunk
  here, so the table's last row does not arise (``ack_dbgd`` excepted: its DBGD chunk is
  always sent as a chunk);
- ``fail_types=("HPGC", ...)``: a VM that refuses those features: each request of a listed
  type is answered with a FAIL chunk (code 1, a short message) instead of being handled,
  in every flavour;
- ``ack_dbgd=True``: DBGD is answered with a DBGD chunk (the draft's acknowledgement) and
  the debugger's suspensions are released; no shipped VM does this;
- ``draft=True`` (independent of the flavour) uses the 2007 draft layouts: HELO and APNM
  without trailers, THST in the draft layout, HPIF data in the reply, heap pieces sharing
  one start address with offsets;
- heap figures agree with the heap layout: after every GC the HPIF data's *bytes allocated*
  is exactly the used bytes of the layout the HPST..HPEN dump of that GC describes (units x
  8 of every non-free run) and *objects allocated* is its number of used logical runs (P
  pieces joined), which is what an HPSO decoder counts as objects; *heap size* is the whole
  layout. HPIF with when = 1 reports the same current figures;
- method tracing (`ddms`): MPSS/SPSS start a trace, MPSE/SPSE push it as one ``MPSE``
  chunk (the .trace of :func:`ddmd.sim.trace.default_recording` for the pid: call counts
  ``DEFAULT_CALL_COUNTS``; `SimVm.trace_recording`), MPRS/MPRE write it to a file on the
  "device" instead (`SimVm.device_files`, path -> bytes), MPRQ says what runs;
- heap dumps (`ddms`): HPDS pushes the whole HPROF file (Android 1.0.3) as one ``HPDS``
  chunk, HPDU writes it to `SimVm.device_files`; its classes and instance counts are
  `SimVm.heap_content` (``expected_instances()``). ``hprof_bytes=N`` (``--hprof-bytes``)
  makes HPDS stream a generated dump of exactly N bytes in pieces, never held in memory;
- the allocation tracker (`allocs`): REAE switches it on (off drops the list), REAQ says
  whether it is on, REAL lists the allocations recorded since (one pass of the app's
  allocation sites at the start and after every GC), exactly `SimVm.recorded_allocations`;
- EXIT (and VirtualMachine.Exit): the VM halts: the connection ends without a reply, it
  stops listening, ``run`` returns, and `SimVm.exit_status` keeps the status;
- plain JDWP just deep enough for ``jdb -attach`` (Version, IDSizes, threads and their one
  group, event requests, Suspend/Resume, Dispose, Exit); error 99 for everything else.

Per-request work is small: chunk bytes that do not change are cached, thread status is
packed with one ``struct`` per thread, and the heap layout is built once (lazily, when heap
info or a dump is first needed) and then only lightly mutated at each GC, its used bytes and
object count kept up to date with it.
"""

from ddmd.sim.cli import make_configs, serve_many, sim_command
from ddmd.sim.config import (
    ART_FEATURES,
    FLAVORS,
    PRE_INITIALIZED,
    Flavor,
    SimConfig,
    SimStatistics,
    check_type_name,
)
from ddmd.sim.vm import SimVm

__all__ = [
    "ART_FEATURES",
    "FLAVORS",
    "PRE_INITIALIZED",
    "Flavor",
    "SimConfig",
    "SimStatistics",
    "SimVm",
    "check_type_name",
    "make_configs",
    "serve_many",
    "sim_command",
]

"""The real ``jdb`` attaches to a SimVm, lists its threads and quits cleanly.

jdb prints asynchronously, so it is driven expect-style (peers.md): send one command, wait
for the text it should produce under a deadline, then send the next.
"""

from __future__ import annotations

import subprocess
from functools import partial

import pytest
import trio

from ddmd.protocol.jdwp import HANDSHAKE
from ddmd.sim import SimConfig, SimVm
from tests.e2e.conftest import require_tool

pytestmark = pytest.mark.jvm

CAP = 30  # seconds for a whole session; an attach takes about 1 s


@pytest.fixture
def jdb() -> str:
    # A plain (sync) fixture: skip/fail here reach pytest directly, not through a nursery.
    return require_tool("jdb")


class Expect:
    """Accumulates a process's output; ``expect`` waits until a text shows up after the mark."""

    def __init__(self, stream: trio.abc.ReceiveStream) -> None:
        self.stream = stream
        self.text = ""
        self.mark = 0

    async def expect(self, *needles: str) -> str:
        """Wait until every needle appears after the mark; move the mark past the last one."""
        while True:
            window = self.text[self.mark :]
            if all(n in window for n in needles):
                end = max(window.index(n) + len(n) for n in needles)
                self.mark += end
                return window[:end]
            data = await self.stream.receive_some(65536)
            if not data:
                raise AssertionError(f"jdb output ended before {needles!r}:\n{self.text}")
            self.text += data.decode("utf-8", "replace")


async def test_jdb_attaches_lists_threads_and_quits(jdb):
    config = SimConfig(threads=9, pid=3131, churn_interval=0.0, gc_interval=0.0, seed=3)
    vm = SimVm(config)
    with trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(vm.run)
            run_jdb = partial(
                trio.run_process,
                [jdb, "-attach", f"127.0.0.1:{port}"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                check=False,
            )
            proc = await nursery.start(run_jdb)
            assert proc.stdin is not None
            assert proc.stdout is not None
            out = Expect(proc.stdout)
            await out.expect("Initializing jdb ...", "> ")

            await proc.stdin.send_all(b"threads\n")
            listing = await out.expect("RenderThread", "\n> ")
            for name in (
                "Group main:",
                "main",
                "Signal Catcher",
                "HeapTaskDaemon",
                "Binder:3131_1",
            ):
                assert name in listing, listing
            assert "Internal exception" not in out.text, out.text

            await proc.stdin.send_all(b"classes\n")
            await out.expect("java.lang.Thread", "\n> ")

            await proc.stdin.send_all(b"quit\n")
            assert await proc.wait() == 0, out.text
            assert "Exception" not in out.text, out.text

            # jdb's Dispose closed the connection; the sim listens again.
            while True:
                try:
                    stream = await trio.open_tcp_stream("127.0.0.1", port)
                    break
                except OSError:
                    await trio.sleep(0.01)
            await stream.send_all(HANDSHAKE)
            echo = b""
            while len(echo) < len(HANDSHAKE):
                data = await stream.receive_some(len(HANDSHAKE) - len(echo))
                assert data
                echo += data
            assert echo == HANDSHAKE
            await stream.aclose()
            assert vm.connections_accepted == 2
            nursery.cancel_scope.cancel()

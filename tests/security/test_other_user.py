"""The peer-uid rule against a real other user: clients and a JVM run as uid 65534 (nobody).

Switching users needs root (``setpriv --reuid=65534 --regid=65534 --clear-groups``): without
it these tests skip with the reason, except in CI (``CI=true``), where they must run and fail
instead. The clients are a few lines of Python run by a system interpreter (passed with ``-c``,
so uid 65534 needs to read no file of ours): connect, send a JDWP handshake or an HTTP request,
print what came back.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
import trio

from tests.actors.needs import skip_or_fail
from tests.actors.rawpeers import Harness, free_port_range, monitor, wait_until
from tests.e2e.conftest import COUNTER_SOURCE, START_CAP, CounterJvm, Jdk, require_tool

CAP = 60  # seconds for each test
NOBODY = 65534
HANDSHAKE = b"JDWP-Handshake"
HEALTH = b"GET /api/v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"

CLIENT = r"""
import json, socket, sys
kind, address = sys.argv[1], sys.argv[2]
payload, want = bytes.fromhex(sys.argv[3]), int(sys.argv[4])
out = {"got": "", "error": None}
try:
    if kind == "unix":
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(10)
        s.connect(address)
    else:
        host, port = address.rsplit(":", 1)
        s = socket.create_connection((host, int(port)), timeout=10)
    s.sendall(payload)
    got = b""
    while len(got) < want:
        chunk = s.recv(65536)
        if not chunk:
            break
        got += chunk
    out["got"] = got.hex()
except OSError as exc:
    out["error"] = type(exc).__name__
print(json.dumps(out))
"""


@dataclass(frozen=True, slots=True)
class OtherUser:
    """How to run a command as uid 65534, and a Python that user can run."""

    setpriv: str
    python: str

    def argv(self, *command: str) -> list[str]:
        return [
            self.setpriv,
            f"--reuid={NOBODY}",
            f"--regid={NOBODY}",
            "--clear-groups",
            *command,
        ]


def _system_python() -> str | None:
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3", "/bin/python3"):
        if os.path.exists(candidate):
            return candidate
    return None


@pytest.fixture
def other_user() -> OtherUser:
    # A plain (sync) fixture: skip/fail reach pytest directly.
    if os.geteuid() != 0:
        skip_or_fail("needs root to run clients as another user (setpriv --reuid=65534)")
    setpriv = shutil.which("setpriv")
    python = _system_python()
    if setpriv is None or python is None:
        skip_or_fail("needs setpriv (util-linux) and a system python3 that uid 65534 can run")
    assert setpriv is not None
    assert python is not None
    user = OtherUser(setpriv, python)
    check = subprocess.run(
        user.argv(python, "-c", "import os; print(os.getuid())"),
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if check.returncode != 0 or check.stdout.strip() != str(NOBODY):
        skip_or_fail(f"cannot run {python} as uid {NOBODY}: {check.stderr.strip()}")
    return user


async def client(
    user: OtherUser,
    address: str,
    payload: bytes,
    *,
    other: bool,
    want: int = 1 << 20,
    kind: str = "tcp",
) -> tuple[bytes, str | None]:
    """Run the client (as uid 65534 when `other`); what it received, and its error if any."""
    command = [user.python, "-c", CLIENT, kind, address, payload.hex(), str(want)]
    argv = user.argv(*command) if other else command
    with trio.fail_after(30):
        result = await trio.run_process(argv, capture_stdout=True, capture_stderr=True)
    out = json.loads(result.stdout)
    return bytes.fromhex(out["got"]), out["error"]


@dataclass(frozen=True, slots=True)
class Ports:
    vm: int
    current: int
    control: int


async def ports_of(h: Harness, vm_id: str) -> Ports:
    vm = await h.wait_vm(
        vm_id, lambda v: v.get("debugger_port") is not None and v.get("current"), timeout=10
    )
    control = h.started.control
    assert control is not None
    return Ports(vm["debugger_port"], h.started.current_port, control[1])


async def metric(h: Harness, line_start: str) -> str:
    """The value of the series whose line starts so, once its ``host`` label is left out."""
    text = (await h.client.get("/metrics")).text
    text = re.sub(r'host="[^"]*",?', "", text).replace("{}", "")
    (line,) = [ln for ln in text.splitlines() if ln.startswith(line_start)]
    return line.rsplit(" ", 1)[1]


async def test_another_user_is_refused_on_every_port(other_user, tmp_path) -> None:
    (scan_port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with monitor([scan_port], tmp_path) as h:
            await h.start_sim(scan_port)
            ports = await ports_of(h, f"tcp:{scan_port}")
            checks = [
                (ports.vm, HANDSHAKE, "vm_port"),
                (ports.current, HANDSHAKE, "current_port"),
                (ports.control, HEALTH, "control"),
            ]
            for port, payload, kind in checks:
                address = f"127.0.0.1:{port}"
                # Twice: refused both times, logged once.
                for _ in range(2):
                    got, error = await client(other_user, address, payload, other=True)
                    assert got == b"", f"{kind}: uid {NOBODY} got {got!r}"
                    assert error in (None, "ConnectionResetError"), error
                want = len(HANDSHAKE) if payload == HANDSHAKE else 1 << 20
                got, error = await client(other_user, address, payload, other=False, want=want)
                assert error is None, f"{kind}: ddmd's own user: {error}"
                if payload == HANDSHAKE:
                    assert got == HANDSHAKE, f"{kind}: ddmd's own user got {got!r}"
                else:
                    assert got.startswith(b"HTTP/1.1 200"), got[:80]
                if kind == "vm_port":
                    # The debugger that just left is released before the next one attaches.
                    await h.wait_vm(f"tcp:{scan_port}", lambda v: not v["debuggers"], timeout=10)
            refused = h.events("security.peer_refused", uid=NOBODY)
            assert sorted((e["port_kind"], e["port"]) for e in refused) == sorted(
                [("vm_port", ports.vm), ("current_port", ports.current), ("control", ports.control)]
            )
            assert {e["user"] for e in refused} == {"nobody"}
            for kind in ("vm_port", "current_port", "control"):
                value = await metric(h, f'ddmd_peers_refused_total{{port_kind="{kind}"}}')
                assert float(value) == 2.0
            # The unix control socket is out of reach altogether (0600 in a 0700 directory).
            sock = h.started.control_socket
            assert sock is not None
            got, error = await client(other_user, str(sock), HEALTH, other=True, kind="unix")
            assert (got, error) == (b"", "PermissionError")
            got, error = await client(other_user, str(sock), HEALTH, other=False, kind="unix")
            assert got.startswith(b"HTTP/1.1 200"), (got[:80], error)


async def test_allowed_uids_admit_another_user(other_user, tmp_path) -> None:
    (scan_port,) = free_port_range(1)
    with trio.fail_after(CAP):
        async with monitor([scan_port], tmp_path, security={"allowed_uids": [NOBODY]}) as h:
            await h.start_sim(scan_port)
            ports = await ports_of(h, f"tcp:{scan_port}")
            for port, payload in (
                (ports.vm, HANDSHAKE),
                (ports.current, HANDSHAKE),
                (ports.control, HEALTH),
            ):
                want = len(HANDSHAKE) if payload == HANDSHAKE else 1 << 20
                got, error = await client(
                    other_user, f"127.0.0.1:{port}", payload, other=True, want=want
                )
                assert error is None, error
                assert got.startswith(HANDSHAKE if payload == HANDSHAKE else b"HTTP/1.1 200")
                if port == ports.vm:
                    await h.wait_vm(f"tcp:{scan_port}", lambda v: not v["debuggers"], timeout=10)
            assert h.events("security.peer_refused") == []


# --------------------------------------------------------------------------------------------
# JVMs of another user in the scan range


@pytest.fixture
def world_readable_dir() -> Iterator[Path]:
    base = Path(tempfile.mkdtemp(prefix="ddmd-jvm"))
    os.chmod(base, 0o755)
    yield base
    shutil.rmtree(base, ignore_errors=True)


async def _compile_for_everyone(jdk: Jdk, where: Path) -> Path:
    (where / "Counter.java").write_text(COUNTER_SOURCE)
    classes = where / "classes"
    result = await trio.run_process(
        [jdk.javac, "-d", str(classes), str(where / "Counter.java")],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr.decode()
    for path in [classes, *classes.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    return classes


async def _start_jvm(nursery: trio.Nursery, argv: list[str], port: int, cwd: Path) -> CounterJvm:
    process: trio.Process = await nursery.start(
        partial(
            trio.run_process,
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            check=False,
            cwd=str(cwd),
        )
    )
    jvm = CounterJvm(port, process)
    nursery.start_soon(jvm.read_output)
    with trio.fail_after(START_CAP):
        await jvm.listening.wait()
    return jvm


@pytest.fixture
def java_tools() -> Jdk:
    return Jdk(require_tool("java"), require_tool("javac"), require_tool("jdb"))


@pytest.mark.jvm
async def test_another_users_jvm_is_not_adopted(
    other_user, java_tools, world_readable_dir, tmp_path
) -> None:
    # The scan range: the other user's JVM, ours, and a port where nothing listens (probed at
    # every round, so the probe count shows that rounds went by).
    foreign_port, own_port, empty_port = free_port_range(3)
    jvm_options = ["-XX:-UsePerfData", "-Xshare:auto"]

    def agent(port: int) -> str:
        return f"-agentlib:jdwp=transport=dt_socket,server=y,suspend=n,address=127.0.0.1:{port}"

    with trio.fail_after(CAP + START_CAP):
        classes = await _compile_for_everyone(java_tools, world_readable_dir)
        async with trio.open_nursery() as jvms:
            foreign = await _start_jvm(
                jvms,
                other_user.argv(
                    java_tools.java,
                    *jvm_options,
                    agent(foreign_port),
                    "-cp",
                    str(classes),
                    "Counter",
                ),
                foreign_port,
                world_readable_dir,
            )
            own = await _start_jvm(
                jvms,
                [java_tools.java, *jvm_options, agent(own_port), "-cp", str(classes), "Counter"],
                own_port,
                world_readable_dir,
            )
            try:
                await _check_adoption(other_user, tmp_path, foreign_port, own_port, empty_port)
            finally:
                for jvm in (foreign, own):
                    jvm.process.kill()
                jvms.cancel_scope.cancel()


async def _check_adoption(
    user: OtherUser, tmp_path: Path, foreign_port: int, own_port: int, empty_port: int
) -> None:
    async with monitor([foreign_port, own_port, empty_port], tmp_path) as h:
        vm = await h.wait_vm(f"tcp:{own_port}", lambda v: v["state"] == "ready", timeout=20)
        assert vm["pid"] is not None
        # Let ten more rounds go by: the empty port is probed once per round.
        start = int(float(await metric(h, "ddmd_scan_probes_total")))

        async def rounds_done() -> bool:
            return int(float(await metric(h, "ddmd_scan_probes_total"))) >= start + 10

        await wait_until(rounds_done, 20, what="ten more scan rounds")
        assert await h.vm(f"tcp:{foreign_port}") is None
        skipped = h.events("scan.foreign_vm_skipped")
        assert [(e["port"], e["uid"], e["user"]) for e in skipped] == [
            (foreign_port, NOBODY, "nobody")
        ]
        # ddmd never took the other user's JVM: its one JDWP connection is still free for
        # that user's own debugger.
        got, error = await client(
            user, f"127.0.0.1:{foreign_port}", HANDSHAKE, other=True, want=len(HANDSHAKE)
        )
        assert (got, error) == (HANDSHAKE, None)


FLOODER = r"""
import socket, sys
port = int(sys.argv[1])
held = []
while True:  # until killed: connect, hold the last 200, say when the first 200 are open
    s = socket.socket()
    try:
        s.connect(("127.0.0.1", port))
    except OSError:
        s.close()
        continue
    held.append(s)
    if len(held) > 200:
        held.pop(0).close()
    elif len(held) == 200:
        print("flooding", flush=True)
"""


async def test_another_users_flood_never_crowds_out_ddmds_user(other_user) -> None:
    # Issue 31, item 9: uid 65534 keeps opening connections (and holding the last 200), with
    # the smallest bound on pending checks; ddmd's own user's connections during the flood are
    # admitted all the same, none closed unchecked.
    from ddmd.peers import GuardedListener, PeerGuard, PeerPolicy

    guard = PeerGuard(PeerPolicy(frozenset({os.geteuid(), 0})), max_pending=1)
    (inner,) = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = inner.socket.getsockname()[1]
    send, receive = trio.open_memory_channel[trio.SocketStream](10)

    async def welcome() -> None:
        async for stream in receive:
            await stream.send_all(HANDSHAKE)

    argv = other_user.argv(other_user.python, "-c", FLOODER, str(port))
    with trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(GuardedListener(inner, guard, "front").serve, send.send_nowait)
            nursery.start_soon(welcome)
            flooder = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE)
            try:
                assert flooder.stdout is not None
                assert b"flooding" in await flooder.stdout.receive_some(64)
                for _ in range(5):
                    got, error = await client(
                        other_user, f"127.0.0.1:{port}", b"", other=False, want=len(HANDSHAKE)
                    )
                    assert (got, error) == (HANDSHAKE, None), "ddmd's own user was crowded out"
            finally:
                flooder.kill()
                await flooder.wait()
            nursery.cancel_scope.cancel()
    assert guard.refused_counts()["front"] >= 200

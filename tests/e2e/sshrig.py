"""A real OpenSSH server (Debian ``openssh-server``) on a private loopback port, and ``ssh -N -L``
tunnels through it (``openssh-client``): the link between a developer and a device lab in
docs/lab.md, on one machine.

    async with open_sshd(tools, tmp_path / "ssh") as sshd:
        async with sshd.tunnel(remote_port) as local_port:    # ssh -N -L LOCAL:127.0.0.1:REMOTE
            ... connect to 127.0.0.1:local_port ...

`open_sshd` generates a host key and a client key (``ssh-keygen -t ed25519 -N ''``), puts the
client's public key in an ``authorized_keys`` file, writes an ``sshd_config`` (``Port``,
``ListenAddress 127.0.0.1``, ``HostKey``, ``AuthorizedKeysFile`` by absolute path, ``StrictModes
no``, public keys only, no PAM, root by key only, TCP forwarding on, ``PidFile`` in the
directory) and runs ``sshd -D -e -f CONFIG``, whose log goes to ``sshd.log`` there. The login
user is the one running the tests: as root, sshd runs privileged (it needs ``/run/sshd``,
created when missing); as anyone else it runs unprivileged, which OpenSSH allows for logins as
that same user on a high port.

`Sshd.tunnel` runs ``ssh -N -L LOCAL:HOST:PORT`` (no user config, no known-hosts file, batch
mode, ``ExitOnForwardFailure``) and yields LOCAL once ssh's own process listens there (read off
the kernel's socket table, so no probe connection reaches the far end). ssh opens its forwards
only after logging in, so a listening LOCAL means the tunnel works.

Every wait has a deadline; at exit the ssh clients are killed, then sshd and any session
process it left. A missing program skips the test outside CI and fails it under ``CI=true``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio

from ddmd.host import localproc
from tests.actors.needs import skip_or_fail
from tests.adb.device import pick_port

__all__ = ["SshTools", "Sshd", "listener_pid", "open_sshd", "require_ssh", "ssh_tools"]

START_TIMEOUT = 20.0  # seconds: sshd listening; a tunnel's local end listening
KEYGEN_TIMEOUT = 20.0  # seconds: one ssh-keygen
STOP_TIMEOUT = 5.0  # seconds: a process gone after SIGTERM (then SIGKILL)
PRIVSEP_DIR = Path("/run/sshd")  # sshd's privilege-separation directory, when run as root


@dataclass(frozen=True, slots=True)
class SshTools:
    sshd: str
    ssh: str
    keygen: str


def require_ssh() -> SshTools:
    """The OpenSSH programs; skips (outside CI) or fails (``CI=true``) when one is missing."""
    found: dict[str, str] = {}
    for name, package in (
        ("sshd", "openssh-server"),
        ("ssh", "openssh-client"),
        ("ssh-keygen", "openssh-client"),
    ):
        # sshd lives in /usr/sbin, which is not on every user's PATH.
        path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
        if path is None:
            skip_or_fail(f"the {name!r} program is not installed (Debian: apt install {package})")
        assert path is not None
        found[name] = path
    return SshTools(found["sshd"], found["ssh"], found["ssh-keygen"])


@pytest.fixture
def ssh_tools() -> SshTools:
    # A plain (sync) fixture: skip/fail reach pytest directly, not through a nursery.
    return require_ssh()


def _login_user() -> str:
    return pwd.getpwuid(os.getuid()).pw_name


def listener_pid(port: int) -> int | None:
    """The process holding the LISTEN socket of 127.0.0.1:PORT, None when none listens."""
    owner = localproc.listening_socket("127.0.0.1", port)
    if owner is None:
        return None
    return localproc.process_of_inode(owner.inode, uid=owner.uid)


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (sshd's per-connection processes)."""
    found = []
    for child in localproc.list_pids("/proc"):
        try:
            stat = Path(f"/proc/{child}/stat").read_text()
        except OSError:
            continue
        # "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[1] == str(pid):
            found.append(child)
    return found


async def _stop(process: trio.Process) -> None:
    """SIGTERM, then SIGKILL after STOP_TIMEOUT; waits for the exit."""
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
        with trio.move_on_after(STOP_TIMEOUT):
            await process.wait()
    if process.returncode is None:
        process.kill()
        await process.wait()


async def _keygen(keygen: str, path: Path, comment: str) -> None:
    with trio.fail_after(KEYGEN_TIMEOUT):
        made = await trio.run_process(
            [keygen, "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
            capture_stdout=True,
            capture_stderr=True,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    assert made.returncode == 0, f"ssh-keygen failed: {made.stderr.decode(errors='replace')}"


def _make_dirs(workdir: Path) -> None:
    workdir.mkdir(parents=True, exist_ok=True)
    if os.getuid() == 0 and not PRIVSEP_DIR.is_dir():
        PRIVSEP_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)


def _authorize(workdir: Path) -> None:
    (workdir / "authorized_keys").write_bytes((workdir / "client_key.pub").read_bytes())


def _config(workdir: Path, port: int) -> str:
    return (
        f"Port {port}\n"
        "ListenAddress 127.0.0.1\n"
        f"HostKey {workdir / 'host_key'}\n"
        f"AuthorizedKeysFile {workdir / 'authorized_keys'}\n"
        f"PidFile {workdir / 'sshd.pid'}\n"
        "StrictModes no\n"
        "PubkeyAuthentication yes\n"
        "PasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\n"
        "UsePAM no\n"
        "PermitRootLogin prohibit-password\n"
        f"AllowUsers {_login_user()}\n"
        "AllowTcpForwarding yes\n"
        "GatewayPorts no\n"
        "X11Forwarding no\n"
        "PermitTTY no\n"
        "PrintMotd no\n"
        "UseDNS no\n"
        "LogLevel DEBUG1\n"  # the channels it opens: "target 127.0.0.1 port N"
    )


@dataclass
class Sshd:
    """A running sshd and what a client needs to log in to it."""

    tools: SshTools
    port: int
    user: str
    key: Path  # the client's private key, authorized for ``user``
    workdir: Path
    process: trio.Process

    @property
    def log(self) -> str:
        """What sshd has logged so far (``-e``: its stderr)."""
        try:
            return (self.workdir / "sshd.log").read_text(errors="replace")
        except OSError:
            return ""

    def ssh_argv(self, *forwards: str) -> list[str]:
        """``ssh -N`` with ``forwards`` (e.g. ``-L``, ``SPEC``), as docs/lab.md shows it, plus
        the options that keep a test off the user's own ssh config and known hosts."""
        return [
            self.tools.ssh,
            "-F",
            "/dev/null",
            "-i",
            str(self.key),
            "-o",
            "IdentitiesOnly=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "ExitOnForwardFailure=yes",
            "-o",
            "BatchMode=yes",
            "-o",
            "ConnectTimeout=10",
            "-o",
            "LogLevel=ERROR",
            "-p",
            str(self.port),
            "-N",
            *forwards,
            f"{self.user}@127.0.0.1",
        ]

    @asynccontextmanager
    async def tunnel(self, remote_port: int, remote_host: str = "127.0.0.1") -> AsyncIterator[int]:
        """``ssh -N -L LOCAL:REMOTE_HOST:REMOTE_PORT`` through this sshd; yields LOCAL once ssh
        listens there; kills ssh at exit."""
        errors = ""
        for _attempt in range(3):  # a free port may be taken before ssh binds it
            local = pick_port()
            argv = self.ssh_argv("-L", f"127.0.0.1:{local}:{remote_host}:{remote_port}")
            stderr = self.workdir / f"ssh-{local}.err"
            with stderr.open("wb") as err:
                process = await trio.lowlevel.open_process(
                    argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err
                )
            try:
                if await self._wait_listening(process, local):
                    yield local
                    return
            finally:
                with trio.CancelScope(shield=True):
                    await _stop(process)
            errors = stderr.read_text(errors="replace")
            if "Address already in use" not in errors:
                break
        raise AssertionError(
            f"ssh -L to {remote_host}:{remote_port} did not come up: {errors}\n"
            f"--- sshd log ---\n{self.log}"
        )

    async def _wait_listening(self, process: trio.Process, port: int) -> bool:
        """True once ``process`` holds the LISTEN socket of PORT; False when it exited first."""
        with trio.move_on_after(START_TIMEOUT):
            while process.poll() is None:
                if await trio.to_thread.run_sync(listener_pid, port) == process.pid:
                    return True
                await trio.sleep(0.05)
            return False
        raise AssertionError(
            f"ssh did not listen on 127.0.0.1:{port} within {START_TIMEOUT:g} s\n"
            f"--- sshd log ---\n{self.log}"
        )


@asynccontextmanager
async def open_sshd(tools: SshTools, workdir: Path) -> AsyncIterator[Sshd]:
    """Keys, config and a running ``sshd -D -e`` on a free loopback port; stopped at exit,
    with any session process it left."""
    user = _login_user()
    await trio.to_thread.run_sync(_make_dirs, workdir)
    await _keygen(tools.keygen, workdir / "host_key", "ddmd-test-host")
    await _keygen(tools.keygen, workdir / "client_key", f"ddmd-test-{user}")
    await trio.to_thread.run_sync(_authorize, workdir)
    log_path = workdir / "sshd.log"
    for _attempt in range(3):  # a free port may be taken before sshd binds it
        port = pick_port()
        config = workdir / "sshd_config"
        config.write_text(_config(workdir, port))
        with log_path.open("wb") as log:
            process = await trio.lowlevel.open_process(
                # sshd wants absolute paths: it re-executes itself for every connection.
                [tools.sshd, "-D", "-e", "-f", str(config.resolve())],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        sessions: list[int] = []
        try:
            with trio.move_on_after(START_TIMEOUT) as waited:
                while process.poll() is None:
                    if await trio.to_thread.run_sync(listener_pid, port) == process.pid:
                        break
                    await trio.sleep(0.05)
            said = log_path.read_text(errors="replace")
            if waited.cancelled_caught:
                raise AssertionError(f"sshd did not listen within {START_TIMEOUT:g} s: {said}")
            if process.returncode is not None:
                if "Address already in use" in said:
                    continue
                raise AssertionError(f"sshd exited with {process.returncode}: {said}")
            sshd = Sshd(tools, port, user, workdir / "client_key", workdir, process)
            try:
                yield sshd
            finally:
                sessions = _children(process.pid)
        finally:
            with trio.CancelScope(shield=True):
                await _stop(process)
                for pid in sessions:  # a session whose client is gone exits by itself
                    with suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        return
    raise AssertionError(f"sshd found no free port: {log_path.read_text(errors='replace')}")

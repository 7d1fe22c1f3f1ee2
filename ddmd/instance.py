"""One daemon per control address: `ddmd run` and `ddmd demo` find a running ddmd first.

Layer: beside `cli` (which calls `claim` before it binds anything or starts simulated VMs);
imports config, errors and netaddr, and the standard library only (no trio, no httpx), so the check
costs nothing when no other daemon is there.

Two checks, in this order:

1. **A lock file**, ``$XDG_RUNTIME_DIR/ddmd/control-PORT.lock`` (without that variable:
   ``/tmp/ddmd-UID/control-PORT.lock``), locked with flock(2) for as long as the daemon runs.
   The kernel drops the lock when the process ends, however it ends (``kill -9`` included), so
   a file left behind never blocks the next start; the file only says who holds it (pid and
   control address) for the message. It is keyed by the control port because that is what
   the client commands reach a daemon by: two daemons with different control ports (tests, or
   two configurations) do not block each other.
2. **The control address**: ``GET /api/v1/health``. A ddmd answering there (started with
   another runtime directory, by another user, or before this check existed) counts too; its
   health answer carries its pid.

Either way `claim` raises `AlreadyRunning`, whose message reads
``ddmd is already running (pid 1234, control 127.0.0.1:8710); ...``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import http.client
import json
import os
import stat
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from ddmd.config import Config
from ddmd.config.section import runtime_dir
from ddmd.errors import DdmdError
from ddmd.netaddr import connectable, host_port

__all__ = [
    "AlreadyRunning",
    "Claim",
    "Running",
    "claim",
    "lock_dir",
    "lock_path",
    "private_dir",
    "probe",
]

#: Seconds for the whole health request to the control address (loopback: a refused connection
#: answers at once; this bounds a listener that accepts and never answers).
PROBE_TIMEOUT: Final = 1.0
#: How long to wait for the lock holder to write its pid into the file (it does so right after
#: taking the lock, so an empty file is only ever seen in that short window).
_CONTENT_WAIT: Final = 0.5
_HEALTH_PATH: Final = "/api/v1/health"
_MAX_BODY: Final = 64 * 1024


class AlreadyRunning(DdmdError):
    """Another ddmd already serves this control address; `pid` is None when it is not known."""

    def __init__(self, control: str, pid: int | None) -> None:
        where = f"pid {pid}, control {control}" if pid is not None else f"control {control}"
        super().__init__(
            f"ddmd is already running ({where}); use that one (e.g. 'ddmd clients'), or stop it "
            "first"
        )
        self.control = control
        self.pid = pid


@dataclass(frozen=True, slots=True)
class Running:
    """What the health check learnt about a daemon answering at the control address."""

    pid: int | None


def probe(host: str, port: int, token: str = "", timeout: float = PROBE_TIMEOUT) -> Running | None:
    """Ask host:port for ddmd's health; a `Running` if a ddmd answers there, else None.

    Anything else (nothing listening, another program, no answer in `timeout` seconds) is None:
    then the daemon's own bind reports a port taken by another program as it always has.
    """
    connection = http.client.HTTPConnection(connectable(host), port, timeout=timeout)
    headers = {"Accept": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    try:
        connection.request("GET", _HEALTH_PATH, headers=headers)
        response = connection.getresponse()
        body = response.read(_MAX_BODY)
    except (OSError, http.client.HTTPException):
        return None
    finally:
        connection.close()
    if response.status == 401:
        # A ddmd whose token is not the one in this config: still a ddmd.
        challenge = response.getheader("WWW-Authenticate") or ""
        return Running(pid=None) if 'realm="ddmd"' in challenge else None
    if response.status != 200:
        return None
    try:
        health = json.loads(body)
    except ValueError:
        return None
    if not isinstance(health, dict) or health.get("status") != "ok" or "version" not in health:
        return None
    pid = health.get("pid")
    return Running(pid=pid if isinstance(pid, int) and not isinstance(pid, bool) else None)


def lock_dir(env: Mapping[str, str]) -> Path:
    """``$XDG_RUNTIME_DIR/ddmd``, or ``/tmp/ddmd-UID`` when the variable is unset or relative
    (the directory of the "auto" control socket too)."""
    return runtime_dir(env)


def lock_path(config: Config, env: Mapping[str, str]) -> Path:
    return lock_dir(env) / f"control-{config.control.port}.lock"


def private_dir(directory: Path) -> None:
    """Create `directory` (0700) if needed; refuse one that others could tamper with."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = os.lstat(directory)
    if not stat.S_ISDIR(info.st_mode):
        raise OSError(errno.ENOTDIR, "not a directory", str(directory))
    if info.st_uid != os.getuid() or info.st_mode & 0o022:
        raise OSError(errno.EPERM, "owned by another user or writable by others", str(directory))


def _read_holder(fd: int) -> tuple[int | None, str | None]:
    """(pid, control) written by the lock's holder; waits briefly for a holder still writing."""
    deadline = time.monotonic() + _CONTENT_WAIT
    while True:
        try:
            data = json.loads(os.pread(fd, 4096, 0) or b"null")
        except (OSError, ValueError):
            data = None
        if isinstance(data, dict):
            pid, control = data.get("pid"), data.get("control")
            return (
                pid if isinstance(pid, int) and not isinstance(pid, bool) else None,
                control if isinstance(control, str) else None,
            )
        if time.monotonic() >= deadline:
            return None, None
        time.sleep(0.02)  # not in a trio task: the CLI calls this before trio.run


@dataclass(slots=True)
class Claim:
    """This process's claim on a control address; `release` (or process exit) gives it up.

    `lock` is the lock file, or None when no lock file could be used (`problem` says why);
    then only the health check guarded the start.
    """

    lock: Path | None
    problem: str | None = None
    _fd: int | None = None

    def release(self) -> None:
        # The file stays: removing it could let a starting daemon lock a file that is about to
        # disappear while a third one creates a new one. Closing drops the lock.
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> Claim:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()


def claim(
    config: Config,
    env: Mapping[str, str] | None = None,
    *,
    check: Callable[[str, int, str], Running | None] | None = None,
) -> Claim:
    """Make sure no ddmd serves `config`'s control address, and hold the lock for it.

    Raises `AlreadyRunning` if one does. Binds no port and starts nothing. `check` replaces
    the health request (tests); by default it is `probe`.
    """
    if env is None:
        env = os.environ
    health = probe if check is None else check
    control = config.control
    address = host_port(control.host, control.port)
    path = lock_path(config, env)
    fd: int | None = None
    problem: str | None = None
    try:
        private_dir(path.parent)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        problem = f"cannot use the lock file {path}: {exc.strerror or exc}"
    if fd is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid, held_for = _read_holder(fd)
            os.close(fd)
            if pid is None:
                running = health(control.host, control.port, control.token)
                pid = running.pid if running is not None else None
            raise AlreadyRunning(held_for or address, pid) from None
        except OSError as exc:  # a file system without flock: fall back to the health check
            os.close(fd)
            fd = None
            problem = f"cannot lock {path}: {exc.strerror or exc}"
    try:
        running = health(control.host, control.port, control.token)
        if running is not None:
            raise AlreadyRunning(address, running.pid)
        if fd is not None:
            record = json.dumps({"pid": os.getpid(), "control": address}).encode()
            # The lock is what guards; the record only names the holder (a second start that
            # finds it unreadable asks the control address for the pid instead).
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, record + b"\n", 0)
    except BaseException:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
        raise
    return Claim(lock=None if fd is None else path, problem=problem, _fd=fd)

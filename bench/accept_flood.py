"""A flood of connections to ddmd's adb front: how long does the next ``adb devices`` wait?

Run: ``.venv/bin/python bench/accept_flood.py [--rounds 3] [--flood 1000] [--ref REV]``

Set-up (every piece its own process on 127.0.0.1): a private real adb server
(``rig.adb.AdbServer``) and ``ddmd run`` with scan off, ``[adb]`` on that server and its adb
front on a free port. Each round starts a fresh ddmd, then, in turn (idle first in odd rounds):

- idle: this process opens ``--flood`` connections to the front and keeps them open (they are
  admitted: our own uid), then times ``adb -P FRONT devices``;
- refused: a child running as uid 65534 (``setpriv``; root only, else skipped) opens ``--flood``
  connections to the front and keeps them open (each is refused and closed by ddmd), then this
  process times ``adb -P FRONT devices``.

Also the CPU ddmd spent per admitted connection: whole-tree schedstat run time of the ddmd
process (``rig.proc.schedstat``) from before the idle flood until the last of them was admitted
(the front logs nothing per connection, so "admitted" is: ``adb devices`` after it answered).
With ``--ref REV`` ddmd runs from a snapshot of REV (``rig.daemon.use_tree``): run once with
``--ref`` of the revision before and once without to compare. Reported: medians, min-max.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rig import HOST
from rig.adb import AdbServer
from rig.children import Children
from rig.daemon import json_log, start_ddmd, use_tree, write_config
from rig.ports import Ports
from rig.proc import schedstat
from rig.rounds import span

NOBODY = 65534
HOLDER = r"""
import socket, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
held = []
for _ in range(n):
    s = socket.socket()
    try:
        s.connect(("127.0.0.1", port))
    except OSError:
        s.close()
        continue
    held.append(s)
print(len(held), flush=True)
sys.stdin.read()
"""


def adb_devices(adb: AdbServer, front: int) -> float:
    start = time.perf_counter()
    done = subprocess.run(
        ["adb", "-P", str(front), "devices"],
        env=adb.env,
        check=False,
        capture_output=True,
        timeout=120,
        text=True,
    )
    if done.returncode:
        raise SystemExit(f"accept_flood: adb devices failed: {done.stdout}{done.stderr}")
    return time.perf_counter() - start


def wait_front(front: int, deadline: float) -> None:
    while time.monotonic() < deadline:
        try:
            socket.create_connection((HOST, front), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("accept_flood: the front did not open")


def run_ns(pid: int) -> int:
    return sum(run for run, _ in schedstat(pid).values())


def flood_idle(adb: AdbServer, front: int, pid: int, n: int) -> tuple[float, float]:
    """Seconds of ``adb devices`` after ``n`` idle connections; ddmd's CPU µs per connection."""
    before = run_ns(pid)
    held = [socket.create_connection((HOST, front)) for _ in range(n)]
    try:
        took = adb_devices(adb, front)
        spent = (run_ns(pid) - before) / 1000 / n
    finally:
        for sock in held:
            sock.close()
    return took, spent


def flood_refused(adb: AdbServer, front: int, n: int) -> float | None:
    setpriv = shutil.which("setpriv")
    if setpriv is None or os.getuid() != 0:
        return None
    argv = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    holder = subprocess.Popen(
        [*argv, "/usr/bin/python3", "-c", HOLDER, str(front), str(n)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        holder.stdout.readline()  # all opened
        return adb_devices(adb, front)
    finally:
        if holder.stdin is not None:
            holder.stdin.close()
        holder.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--flood", type=int, default=1000)
    parser.add_argument("--ref", default=None)
    args = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, 4 * args.flood + 256)), hard))
    work = Path(tempfile.mkdtemp(prefix="accept-flood-"))
    said = use_tree(args.ref, work, "accept_flood")
    print(f"ddmd: {said}; {args.flood} connections, {args.rounds} rounds", flush=True)
    children, ports = Children(), Ports()
    (work / "home").mkdir()
    adb = AdbServer(ports.take(), work / "home")
    idle: list[float] = []
    refused: list[float] = []
    cpu: list[float] = []
    try:
        adb.start()
        for r in range(args.rounds):
            control, front = ports.take(), ports.take()
            first, last = ports.take_range(2)
            config = write_config(
                work / f"ddmd-{r}.toml",
                {
                    "scan": {"enabled": False},
                    "adb": {"enabled": "on", "host": HOST, "port": adb.port, "path": work / "x"},
                    "front": {"host": HOST, "port": front},
                    "debugger": {
                        "host": HOST,
                        "ports": f"{first}-{last}",
                        "current_port": ports.take(),
                        "state_file": work / "ports.json",
                    },
                    "control": {"host": HOST, "port": control, "socket": ""},
                    "log": json_log(),
                },
            )
            daemon = start_ddmd(config, work / f"ddmd-{r}.log", control, children=children)
            try:
                wait_front(front, time.monotonic() + 30)
                adb_devices(adb, front)  # warm up
                for kind in ("idle", "refused") if r % 2 == 0 else ("refused", "idle"):
                    if kind == "idle":
                        took, per = flood_idle(adb, front, daemon.child.pid, args.flood)
                        idle.append(took)
                        cpu.append(per)
                        print(f"round {r + 1}: idle {took:.3f} s, {per:.0f} µs CPU/conn")
                    else:
                        got = flood_refused(adb, front, args.flood)
                        if got is not None:
                            refused.append(got)
                            print(f"round {r + 1}: refused {got:.3f} s")
                    time.sleep(1)
            finally:
                daemon.stop(children)
    finally:
        children.stop_all()
        adb.kill()
    print(f"\nadb devices after {args.flood} idle connections: {span(idle, '.3f')} s")
    if refused:
        print(f"adb devices after {args.flood} refused connections: {span(refused, '.3f')} s")
    else:
        print("refused connections: skipped (needs root for setpriv)")
    print(f"ddmd CPU per admitted connection: {span(cpu, '.0f')} µs")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

"""What the benches share about processes: CPU of a whole process tree from
/proc/PID/task/*/schedstat (nanoseconds, every thread of the process and its descendants),
the adb server's pid, and which ddmd code a bench runs (the working tree, or a snapshot of a
revision).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: (pid, tid) -> (run ns, run-queue wait ns): the first two fields of schedstat.
Threads = dict[tuple[int, int], tuple[int, int]]


def tree_tids(pid: int, tree: bool = True) -> Iterator[tuple[int, int]]:
    """(pid, tid) of every thread of ``pid`` and, with ``tree``, of its descendants."""
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tids = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tids:
            yield p, int(tid)
            if tree:
                with contextlib.suppress(OSError):
                    kids = Path(f"/proc/{p}/task/{tid}/children").read_text().split()
                    todo.extend(int(k) for k in kids)


def schedstat(pid: int, tree: bool = True) -> Threads:
    """(run, wait) in ns of every thread of ``pid`` (and its tree), by (pid, tid). The wait
    is time the thread was runnable but had no CPU."""
    out: Threads = {}
    for p, tid in tree_tids(pid, tree):
        with contextlib.suppress(OSError, ValueError, IndexError):
            run, wait = Path(f"/proc/{p}/task/{tid}/schedstat").read_text().split()[:2]
            out[(p, tid)] = (int(run), int(wait))
    return out


def run_ns(pid: int, tree: bool = True) -> dict[tuple[int, int], int]:
    """sum_exec_runtime (ns) of every thread of ``pid``'s tree, by (pid, tid)."""
    return {key: run for key, (run, _) in schedstat(pid, tree).items()}


def find_adb_server(port: int) -> int:
    """The pid of the adb server listening on tcp:``port`` (its command line says so)."""
    mark = f"tcp:{port}"
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            with contextlib.suppress(OSError):
                words = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
                text = [w.decode(errors="replace") for w in words]
                if "fork-server" in text and mark in text:
                    return int(entry)
        time.sleep(0.1)
    raise RuntimeError(f"no adb server process for {mark}")


def code_under_test(ref: str | None, work: Path, program: str) -> tuple[str, Path | None]:
    """Which ddmd code runs: the working tree, or (with ``ref``) a ``git archive`` snapshot
    of that revision extracted under ``work`` (returned; put it first on PYTHONPATH)."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)
        return done.stdout.strip()

    if ref is None:
        dirty = git("status", "--porcelain", "--untracked-files=no", "--", "ddmd")
        changed = len(dirty.splitlines())
        return f"the working tree at {git('rev-parse', '--short', 'HEAD')}" + (
            f" + {changed} changed file(s) under ddmd/" if changed else ""
        ), None
    commit = git("rev-parse", "--verify", f"{ref}^{{commit}}")
    if not commit:
        raise SystemExit(f"{program}: --ref {ref}: not a revision of {ROOT}")
    tree = work / "tree"
    tree.mkdir()
    archive = subprocess.Popen(
        ["git", "-C", str(ROOT), "archive", commit, "ddmd"], stdout=subprocess.PIPE
    )
    subprocess.run(["tar", "-x", "-C", str(tree)], stdin=archive.stdout, check=True)
    if archive.wait():
        raise SystemExit(f"{program}: git archive {commit} failed")
    return f"a snapshot of {ref} = {commit[:7]}", tree

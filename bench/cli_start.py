"""How long a `ddmd` command takes from start to exit (issue 31: "the CLI starts in about
0.2 s"): `ddmd --help`, `ddmd clients`, `ddmd threads APP` and `ddmd logcat -d APP`, each a
whole CLI process, against a `ddmd demo` this bench starts on private ports.

Run: ``.venv/bin/python bench/cli_start.py [--rounds 3] [--runs 10] [--ref REV]``

Set-up: ``ddmd demo --config FILE`` (the working tree's), its three simulated VMs on a free
scan range of its own, adb off, its own control port and state file; the bench waits until the
daemon has named the app (``com.example.mail``) before timing anything. Every command is run
as a user runs it (``python -P -m ddmd ... --config FILE``, stdout and stderr read by this
process), and timed from the start of the process to its exit (wall time). The runs have
their .pyc files, as an installed ddmd has (PYTHONDONTWRITEBYTECODE is not passed on; each
command runs once untimed first, which writes them).

``logcat -d APP``: the demo's VMs here are simulated VMs on local ports (adb is off), which
have no device log, so the command ends with its one-line refusal (exit 1) once the daemon has
answered: the start of the CLI,
its imports and one exchange with the daemon, as for the others. Each command's exit code is
checked against the first run's (a change would mean the runs do not do the same work).

With ``--ref REV`` the same commands also run from a ``git archive`` snapshot of REV (its
ddmd/ on PYTHONPATH; the same demo daemon answers both), interleaved with the working tree's:
in each round, each command runs ``--runs`` times per code, the order alternating (A B B A
...). Printed per command and code: the median wall time over every run (min-max); with
``--ref``, the per-round paired ratio working tree / REV (each round's medians), median over
the rounds (min-max). The machine's load average is printed first: other people's work
changes every figure. Prints figures; asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rig import ROOT
from rig.children import Children
from rig.daemon import code_under_test, ddmd_argv, scan_config, wait_vms, write_config
from rig.ports import Layout
from rig.rounds import alternating, print_report, ratios, rotated, span

APP = "com.example.mail"  # the demo's first app (sim.demo.MAIL)
#: What each command is called with (after ``ddmd``); ``{config}`` is the demo's config file.
COMMANDS: dict[str, tuple[str, ...]] = {
    "--help": ("--help",),
    "clients": ("clients", "--config", "{config}"),
    "threads": ("threads", APP, "--config", "{config}"),
    "logcat -d": ("logcat", "-d", APP, "--config", "{config}"),
}
RUN_TIMEOUT = 60.0  # seconds for one CLI run
NOT_PASSED = ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")  # of this process's environment


@dataclass
class Code:
    """Which ddmd a CLI run uses: the working tree (``tree`` None) or a snapshot."""

    label: str
    said: str
    tree: Path | None
    #: command -> per round -> wall times (s)
    times: dict[str, list[list[float]]] = field(default_factory=dict)

    def env(self) -> dict[str, str]:
        # As an installed ddmd runs: with its .pyc files (pip writes them; an environment that
        # forbids them would time Python compiling ddmd's sources at every start).
        env = {k: v for k, v in os.environ.items() if k not in NOT_PASSED}
        if self.tree is not None:
            env["PYTHONPATH"] = str(self.tree)
        return env


def run_once(code: Code, args: Sequence[str], expected: dict[str, int], name: str) -> float:
    """One CLI run's wall time; its exit code must be the one this command had the first time."""
    started = time.perf_counter()
    done = subprocess.run(
        ddmd_argv(*args),
        cwd=ROOT,
        env=code.env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=RUN_TIMEOUT,
    )
    wall = time.perf_counter() - started
    key = f"{name} ({code.label})"
    first = expected.setdefault(key, done.returncode)
    if done.returncode != first:
        tail = done.stderr.decode(errors="replace").strip()[-500:]
        raise RuntimeError(f"{key}: exit {done.returncode}, first run {first}: {tail}")
    return wall


def measure(codes: Sequence[Code], config: Path, rounds: int, runs: int) -> dict[str, int]:
    """Every command ``runs`` times per code in each round, interleaved; the exit codes."""
    expected: dict[str, int] = {}
    for name, args in COMMANDS.items():  # once each, untimed: the .pyc files are written
        for code in codes:
            run_once(code, [a.format(config=config) for a in args], expected, name)
    for r in range(rounds):
        for name in rotated(list(COMMANDS), r):
            args = [a.format(config=config) for a in COMMANDS[name]]
            walls: dict[str, list[float]] = {code.label: [] for code in codes}
            for code in alternating(rotated(list(codes), r), runs):
                walls[code.label].append(run_once(code, args, expected, name))
            for code in codes:
                code.times.setdefault(name, []).append(walls[code.label])
        print(f"round {r + 1} of {rounds} done", file=sys.stderr, flush=True)
    return expected


def report(codes: Sequence[Code], expected: dict[str, int]) -> list[str]:
    lines = ["", "wall time per run, s: median (min-max) over every run of every round"]
    width = max(len(name) for name in COMMANDS)
    for name in COMMANDS:
        cells = []
        for code in codes:
            every = [t for per_round in code.times[name] for t in per_round]
            exit_code = expected[f"{name} ({code.label})"]
            cells.append(f"{code.label} {span(every, '.3f')} exit {exit_code}")
        lines.append(f"  ddmd {name:<{width}}  " + "   ".join(cells))
    if len(codes) == 2:
        new, ref = codes
        title = f"paired ratio {new.label} / {ref.label} (per-round medians): median (min-max)"
        lines += ["", title]
        for name in COMMANDS:
            a = [statistics.median(t) for t in new.times[name]]
            b = [statistics.median(t) for t in ref.times[name]]
            lines.append(f"  ddmd {name:<{width}}  {span(ratios(a, b), '.2f')}")
    return lines


def start_demo(children: Children, work: Path) -> Path:
    """``ddmd demo`` on private ports (the working tree's code); its config file, once the
    daemon has named the app."""
    layout = Layout.find(scan=3, debugger=8, start=21000)
    sections = scan_config(layout, work / "ports.json", 0.5)
    sections["control"]["socket"] = work / "control.sock"
    config = write_config(work / "demo.toml", sections)
    demo = children.start("ddmd demo", ddmd_argv("demo", "--config", str(config)))

    def named(vms: list[dict[str, object]]) -> bool | None:
        return True if any(vm.get("app") == APP for vm in vms) else None

    wait_vms(layout.control, named, f"{APP} named", demo.check_alive, timeout=60.0)
    return config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    parser.add_argument("--runs", type=int, default=10, help="runs per command, code and round")
    parser.add_argument("--ref", default=None, help="also time a git archive of this revision")
    args = parser.parse_args()
    started = time.monotonic()
    children = Children()
    with tempfile.TemporaryDirectory(prefix="cli-start-") as tmp:
        work = Path(tmp)
        said, _ = code_under_test(None, work, "cli_start")
        codes = [Code("this", said, None)]
        if args.ref is not None:
            ref_said, tree = code_under_test(args.ref, work, "cli_start")
            codes.append(Code("ref", ref_said, tree))
        try:
            config = start_demo(children, work)
            load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
            lines = [f"{code.label}: ddmd from {code.said}" for code in codes]
            lines += [
                f"{os.cpu_count()} CPUs, load average {load}; {args.rounds} rounds x "
                f"{args.runs} runs per command and code; the daemon: ddmd demo (working tree)"
            ]
            print_report(lines)
            expected = measure(codes, config, args.rounds, args.runs)
        finally:
            children.stop_all()
        print_report(report(codes, expected), started)


if __name__ == "__main__":
    main()

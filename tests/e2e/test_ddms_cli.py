"""`ddmd trace`, `ddmd allocs`, `ddmd hprof` and `ddmd kill` as a user runs them: separate
processes against `ddmd demo` (the daemon and its three simulated VMs), judged by the real
tools: Debian's `dmtracedump` reads the trace, `hprof-conv` converts the dump, and ddmd's
own readers count what the simulator recorded. A real SIGINT ends an open-ended trace.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ddmd.cli.words import parameter_words
from ddmd.protocol.hprof import summarise_file
from ddmd.protocol.trace import parse_trace
from ddmd.sim.hprof import sim_heap_content
from ddmd.sim.trace import DEFAULT_CALL_COUNTS
from tests.actors.needs import skip_or_fail
from tests.trace import dmtrace
from tests.web.test_browser import MAIL, MAPS, _vm, _wait_for, demo_daemon

TIMEOUT = 60  # seconds, for each command
HPROF_CONV = Path("/usr/lib/android-sdk/platform-tools/hprof-conv")


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Iterator[tuple[str, Path]]:
    with demo_daemon(tmp_path_factory.mktemp("demo")) as running:
        yield running


def ddmd(
    demo: tuple[str, Path], cwd: Path, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    _, config = demo
    return subprocess.run(
        [sys.executable, "-m", "ddmd", *args, "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=cwd,
        input=stdin if stdin is not None else "",
        env={**os.environ, "DDMD_CONFIG": str(config)},
        check=False,
    )


def test_a_trace_taken_with_ddmd_trace_is_read_by_dmtracedump(demo, tmp_path):
    dmtrace.require_dmtracedump()
    done = ddmd(demo, tmp_path, "trace", MAIL, "--seconds", "0.3")
    assert done.returncode == 0, done.stderr
    (written,) = tmp_path.glob("com.example.mail-*.trace")
    assert f"wrote {written.name} (" in done.stdout
    shown = dmtrace.profile(dmtrace.run(written).stdout)
    calls = {name: c + r for name, (c, r) in shown.calls.items()}
    assert calls == dict(DEFAULT_CALL_COUNTS)
    profile = parse_trace(written.read_bytes())
    assert {m.method.full_name: m.calls for m in profile.methods if m.calls} == dict(
        DEFAULT_CALL_COUNTS
    )
    # The printed report is trace-report's, methods and all, as a Java developer writes them
    # (`onCreate(Bundle)`; the descriptors only with -v).
    for method in DEFAULT_CALL_COUNTS:
        owner_and_name, _, descriptor = method.partition("(")
        params = parameter_words("(" + descriptor)
        assert f"{owner_and_name}({', '.join(params or [])})" in done.stdout, method


def test_ctrl_c_ends_an_open_ended_trace_and_writes_it(demo, tmp_path):
    base, config = demo
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "ddmd",
            "trace",
            MAIL,
            "-o",
            "ctrl-c.trace",
            "--config",
            str(config),
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "DDMD_CONFIG": str(config)},
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # blocks until the trace runs
        assert "press Ctrl-C to stop" in line, line
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
    assert proc.returncode == 0, err
    assert "wrote ctrl-c.trace" in out
    assert parse_trace((tmp_path / "ctrl-c.trace").read_bytes()).records > 0
    vm = _vm(base, MAIL)
    state = httpx.get(f"{base}/api/v1/vms/{vm['id']}/profiling", trust_env=False).json()
    assert state["trace"] == "off"  # stopped on the way out


def test_hprof_with_convert_gives_the_sims_counts_in_both_files(demo, tmp_path):
    if not HPROF_CONV.exists():
        skip_or_fail(f"needs {HPROF_CONV} (apt-get install hprof-conv)")
    done = ddmd(demo, tmp_path, "hprof", MAIL, "--convert", "-o", "mail.hprof")
    assert done.returncode == 0, done.stderr
    assert "converted for standard HPROF tools: mail-conv.hprof" in done.stdout
    expected = sim_heap_content(MAIL).expected_instances()
    for name in ("mail.hprof", "mail-conv.hprof"):
        counts = summarise_file(tmp_path / name).instance_counts()
        assert {k: counts.get(k) for k in expected} == expected, name
    (row,) = [line for line in done.stdout.splitlines() if line.startswith(f"{MAIL}.Message ")]
    assert row.split()[1] == str(expected[f"{MAIL}.Message"])


def test_the_allocation_tracker_through_the_cli(demo, tmp_path):
    started = ddmd(demo, tmp_path, "allocs", MAIL, "--start")
    assert started.returncode == 0, started.stderr
    assert started.stdout.startswith(f"allocation tracking is on for {MAIL} (")
    status = ddmd(demo, tmp_path, "allocs", MAIL, "--status")
    assert status.stdout.startswith(f"allocation tracking is on for {MAIL}")
    shown = ddmd(demo, tmp_path, "allocs", MAIL)
    assert shown.returncode == 0, shown.stderr
    assert "BYTES  CLASS" in shown.stdout
    assert f"{MAIL}.Message" in shown.stdout
    assert "Lcom/" not in shown.stdout
    assert "by class (most bytes first):" in shown.stdout
    assert "by allocation site (most bytes first):" in shown.stdout
    stopped = ddmd(demo, tmp_path, "allocs", MAIL, "--stop")
    assert stopped.stdout.startswith(f"allocation tracking is off for {MAIL}")
    refused = ddmd(demo, tmp_path, "allocs", MAPS, "--start")
    assert refused.returncode == 1
    assert refused.stderr.startswith("ddmd allocs: ")
    assert len(refused.stderr.splitlines()) == 1


def test_kill_needs_yes_without_a_terminal_and_then_ends_the_vm(demo, tmp_path):
    base, _ = demo
    refused = ddmd(demo, tmp_path, "kill", MAPS)
    assert refused.returncode == 2
    assert "pass --yes" in refused.stderr
    vm = _vm(base, MAPS)
    killed = ddmd(demo, tmp_path, "kill", MAPS, "--yes")
    assert killed.returncode == 0, killed.stderr
    assert killed.stdout.startswith(f"killed {MAPS} ({vm['id']}, pid {vm['pid']})")
    _wait_for(
        lambda: (
            not any(
                v["id"] == vm["id"] for v in httpx.get(f"{base}/api/v1/vms", trust_env=False).json()
            )
        ),
        30,
        "the killed VM to leave the list",
    )

"""``ddmd trace-report``: the tables and the JSON agree with what the simulator recorded; bad
files end with one line and exit 2."""

from __future__ import annotations

import json
import re

import pytest
from click.testing import CliRunner

from ddmd.cli.main import main
from ddmd.sim.trace import DEFAULT_CALL_COUNTS, build_trace, default_recording
from tests.trace import traces

# One row of a table: time, percent, other time, calls [(n recursive)], method.
ROW = re.compile(r"^\s+(\d+)\s+([\d.]+%|-)\s+(\d+)\s+(\d+)(?: \((\d+) recursive\))?\s+(\S+)$")


@pytest.fixture
def runner():
    return CliRunner()


@pytest.fixture
def recording():
    return default_recording()


@pytest.fixture(params=[False, True], ids=["mpse-layout", "streaming-layout"])
def trace_file(request, tmp_path, recording):
    path = tmp_path / "app.trace"
    path.write_bytes(build_trace(recording, streaming=request.param))
    return path


def sections(text: str) -> dict[str, list[str]]:
    """Lines of the report grouped under "All threads" and "Thread N ..." headings."""
    found: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith(("All threads", "Thread ")):
            current = line.split(":")[0]
            found[current] = []
        elif current is not None:
            found[current].append(line)
    return found


def inclusive_rows(lines: list[str]) -> dict[str, tuple[int, int]]:
    """method -> (calls, inclusive) from the first table of a section."""
    rows: dict[str, tuple[int, int]] = {}
    for line in lines:
        if "by exclusive time" in line:
            break
        match = ROW.match(line)
        if match:
            rows[match.group(6)] = (int(match.group(4)), int(match.group(1)))
    return rows


def test_report_tables_show_the_recorded_call_counts(runner, trace_file, recording):
    # -v: methods by their descriptors, as the recording names them; --per-thread: each thread.
    args = ["trace-report", str(trace_file), "--top", "50", "-v", "--per-thread"]
    result = runner.invoke(main, args)
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    out = result.stdout
    assert out.startswith(f"{trace_file}: ART method trace, format 3 (dual clock")
    assert "pid 4242, 2 threads, 8 methods, 44 records" in out
    assert "Times are wall-clock microseconds (thread-cpu time in --json)." in out
    parts = sections(out)
    assert set(parts) == {"All threads", "Thread 4263 SyncWorker", "Thread 4242 main"}
    rows = inclusive_rows(parts["All threads"])
    assert {name: calls for name, (calls, _) in rows.items()} == DEFAULT_CALL_COUNTS
    for tid, name in recording.threads:
        rows = inclusive_rows(parts[f"Thread {tid} {name}"])
        assert {m: calls for m, (calls, _) in rows.items()} == recording.call_counts(tid)
    assert "5 (4 recursive)  com.example.mail.Stats.fib(I)I" in out


def test_report_sorts_by_wall_time_and_top_limits_the_rows(runner, trace_file):
    result = runner.invoke(main, ["trace-report", str(trace_file), "--top", "2", "-v"])
    assert result.exit_code == 0, result.output
    rows = inclusive_rows(sections(result.stdout)["All threads"])
    # wall time: the worker's run() (2493 µs) before main's onCreate
    assert list(rows) == ["com.example.mail.SyncWorker.run()V", "com.example.mail.Store.fetch(I)[B"]
    assert rows["com.example.mail.SyncWorker.run()V"] == (1, 2493)
    assert "top 2 of 8 by inclusive time:" in result.stdout
    assert "top 2 of 8 by exclusive time:" in result.stdout


def test_json_shape(runner, trace_file, recording):
    result = runner.invoke(main, ["trace-report", str(trace_file), "--json", "--top", "3"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert set(body) == {
        "file",
        "format",
        "vm",
        "pid",
        "start_usec",
        "elapsed_usec",
        "overflow",
        "records",
        "sort_clock",
        "top",
        "all_threads",
        "threads",
    }
    assert body["format"]["version"] == 3
    assert body["format"]["clock"] == "dual"
    assert body["format"]["clocks"] == ["thread-cpu", "wall"]
    assert (body["vm"], body["pid"], body["records"], body["top"]) == ("art", 4242, 44, 3)
    assert body["sort_clock"] == "wall"
    everything = body["all_threads"]
    assert everything["total_usec"] == {"thread-cpu": 745, "wall": 2989}
    assert everything["methods"] == 8
    assert len(everything["by_inclusive"]) == len(everything["by_exclusive"]) == 3
    first = everything["by_exclusive"][0]
    assert first == {
        "method": "com.example.mail.Store.fetch(I)[B",
        "class": "com.example.mail.Store",
        "name": "fetch",
        "signature": "(I)[B",
        "source": "Store.java",
        "calls": 2,
        "recursive_calls": 0,
        "inclusive_usec": {"thread-cpu": 280, "wall": 2400},
        "exclusive_usec": {"thread-cpu": 280, "wall": 2400},
    }
    assert [(t["tid"], t["name"]) for t in body["threads"]] == [
        (4263, "SyncWorker"),
        (4242, "main"),
    ]
    for thread in body["threads"]:
        assert set(thread) >= {"records", "total_usec", "unmatched_exits", "open_calls"}
        assert thread["methods"] == len(recording.call_counts(thread["tid"]))


def test_json_lists_every_call_count_with_a_big_top(runner, trace_file):
    result = runner.invoke(main, ["trace-report", str(trace_file), "--json", "--top", "100"])
    body = json.loads(result.stdout)
    counts = {m["method"]: m["calls"] for m in body["all_threads"]["by_inclusive"]}
    assert counts == DEFAULT_CALL_COUNTS


def test_hand_built_trace_notes_unmatched_exits_and_open_calls(runner, tmp_path):
    path = tmp_path / "hand.trace"
    path.write_bytes(traces.build(2, "wall"))
    result = runner.invoke(main, ["trace-report", str(path)])
    assert result.exit_code == 0, result.output
    assert "format 2 (wall clock)" in result.stdout
    assert "1 calls were already running when tracing started" in result.stdout
    assert "2 calls were still running when tracing stopped" in result.stdout


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b"", "the file is empty"),
        (b"hello world\n", "not a method trace"),
        (traces.build(3, "dual")[:-3], "cut short"),
        (traces.build(3, "dual").replace(b"SLOW", b"WOLS"), "magic"),
    ],
)
def test_bad_file_is_one_line_and_exit_1(runner, tmp_path, content, words):
    path = tmp_path / "bad.trace"
    path.write_bytes(content)
    result = runner.invoke(main, ["trace-report", str(path)])
    assert result.exit_code == 1  # as hprof-summary: the exit-code table's 1
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"ddmd trace-report: {path}: ")
    assert words in lines[0]


def test_missing_file(runner, tmp_path):
    result = runner.invoke(main, ["trace-report", str(tmp_path / "nope.trace")])
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        f"ddmd trace-report: cannot read {tmp_path / 'nope.trace'}: No such file or directory"
    )


def test_top_zero_lists_every_method_and_negative_is_refused(runner, trace_file):
    result = runner.invoke(main, ["trace-report", str(trace_file), "--json", "--top", "0"])
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.stdout)["all_threads"]["by_exclusive"]) == 8
    result = runner.invoke(main, ["trace-report", str(trace_file), "--top", "-1"])
    assert result.exit_code == 2
    assert "--top" in result.stderr


def test_listed_in_help(runner):
    result = runner.invoke(main, ["--help"])
    assert "trace-report" in result.stdout

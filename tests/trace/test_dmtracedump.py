"""The simulator's traces (``ddmd.sim.trace``) and ddmd's parser, checked against the real
``dmtracedump`` (skipped with the reason when it is not installed; a failure in CI)."""

from __future__ import annotations

import pytest

from ddmd.protocol.trace import Action, parse_trace
from ddmd.sim.trace import (
    DEFAULT_CALL_COUNTS,
    FETCH,
    SimMethod,
    SimTraceRecorder,
    build_trace,
    default_recording,
)
from tests.trace import dmtrace, traces

ACTIONS = {Action.ENTER: "ent", Action.EXIT: "xit", Action.UNROLL: "unr"}


@pytest.fixture
def recording():
    return default_recording()


@pytest.fixture
def sim_file(tmp_path, recording):
    path = tmp_path / "sim.trace"
    path.write_bytes(build_trace(recording))
    return path


def test_dmtracedump_lists_every_recorded_method_with_its_calls(sim_file, recording):
    result = dmtrace.run(sim_file)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    shown = dmtrace.profile(result.stdout)
    expected = recording.call_counts()
    assert expected == DEFAULT_CALL_COUNTS
    assert {name: calls + recursive for name, (calls, recursive) in shown.calls.items()} == expected


def test_dmtracedump_record_dump_is_the_recording(sim_file, recording):
    result = dmtrace.run(sim_file, "-o")
    assert result.returncode == 0, result.stderr
    dumped = dmtrace.records(result.stdout)
    # dmtracedump shows the first clock of a dual-clock trace: thread-CPU time.
    assert dumped == [
        (e.tid, ACTIONS[e.action], e.thread_cpu_usec, e.method.full_name) for e in recording.events
    ]
    assert "Threads (2):" in result.stdout


def test_ddmd_and_dmtracedump_agree_on_every_number(sim_file):
    shown = dmtrace.profile(dmtrace.run(sim_file).stdout)
    profile = parse_trace(sim_file.read_bytes())
    cpu = profile.clocks.index("thread-cpu")
    assert shown.total == profile.total[cpu]
    for stats in profile.methods:
        name = stats.method.full_name
        assert shown.calls[name] == (stats.calls - stats.recursive_calls, stats.recursive_calls)
        assert shown.inclusive[name] == stats.inclusive[cpu]
        assert shown.exclusive.get(name, 0) == stats.exclusive[cpu]


@pytest.mark.parametrize(
    ("version", "clock", "size"),
    [(1, None, None), (2, "wall", None), (3, "thread-cpu", 10), (3, "dual", 14), (3, "dual", 18)],
)
def test_hand_built_traces_read_the_same_by_dmtracedump(tmp_path, version, clock, size):
    # The parser's golden traces, including an exit with no open call, open calls at the end
    # and an unroll: dmtracedump's numbers are the parser's (first clock).
    path = tmp_path / "hand.trace"
    path.write_bytes(traces.build(version, clock, record_size=size))
    result = dmtrace.run(path)
    assert result.returncode == 0, result.stderr
    shown = dmtrace.profile(result.stdout)
    profile = parse_trace(path.read_bytes())
    assert shown.total == profile.total[0] == 65
    for stats in profile.methods:
        name = stats.method.full_name
        assert shown.calls[name] == (stats.calls, 0)
        assert shown.inclusive[name] == stats.inclusive[0]
        assert shown.exclusive.get(name, 0) == stats.exclusive[0]


def test_dmtracedump_rejects_the_mismatched_exit_ddmd_rejects(tmp_path):
    # The same input ddmd refuses (tests/trace/test_parser.py): dmtracedump exits 1.
    path = tmp_path / "bad.trace"
    events = ((traces.MAIN, traces.A, traces.ENTER, 0), (traces.MAIN, traces.B, traces.EXIT, 5))
    path.write_bytes(traces.build(3, "thread-cpu", events=events))
    result = dmtrace.run(path)
    assert result.returncode != 0
    assert "does not match stack" in result.stderr


# --------------------------------------------------------------------------- the recording


def test_both_layouts_give_the_recorded_counts_and_times(recording):
    plain = parse_trace(build_trace(recording))
    streaming = parse_trace(build_trace(recording, streaming=True))
    assert streaming.data.streaming
    assert not plain.data.streaming
    assert streaming.methods == plain.methods
    assert streaming.threads == plain.threads
    assert plain.clocks == ("thread-cpu", "wall")
    counts = {s.method.full_name: s.calls for s in plain.methods}
    assert counts == recording.call_counts()
    for thread in plain.threads:
        assert {s.method.full_name: s.calls for s in thread.methods} == recording.call_counts(
            thread.thread.tid
        )
    fetch = next(s for s in plain.methods if s.method.full_name == FETCH.full_name)
    # two fetches: 200 + 80 µs of CPU, 900 + 1500 µs of wall time, no callees
    assert fetch.exclusive == fetch.inclusive == (280, 2400)
    fib = next(s for s in plain.methods if s.method.name == "fib")
    assert (fib.calls, fib.recursive_calls) == (5, 4)
    assert plain.header is not None
    assert plain.header.pid == recording.pid
    assert plain.header.num_method_calls == len(recording.events)


def test_recording_events_are_well_formed(recording):
    assert [tid for tid, _ in recording.threads] == [4242, 4263]
    assert {e.action for e in recording.events} == set(Action)
    walls = [e.wall_usec for e in recording.events]
    assert walls == sorted(walls)


def test_recorder_refuses_impossible_recordings():
    other = SimMethod("com.example.X", "y", "()V", "X.java")
    recorder = SimTraceRecorder()
    recorder.thread(1, "main")
    recorder.enter(1, FETCH, cpu=5, wall=5)
    with pytest.raises(
        ValueError, match=r"innermost open call is com\.example\.mail\.Store\.fetch"
    ):
        recorder.exit(1, other, cpu=6, wall=6)
    with pytest.raises(ValueError, match="backwards"):
        recorder.enter(1, other, cpu=4, wall=6)
    with pytest.raises(ValueError, match="still open"):
        recorder.recording()
    with pytest.raises(ValueError, match="outside"):
        recorder.thread(40000, "too big")
    with pytest.raises(ValueError, match="not named"):
        recorder.enter(2, other, cpu=0, wall=0)

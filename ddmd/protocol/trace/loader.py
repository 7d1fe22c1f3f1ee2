"""A method trace file read from disk in blocks and profiled: what ``ddmd trace-report`` and
the control API's ``trace/stop`` both report from.

Layer: ``protocol.trace`` and the standard library. The one place in ``protocol.trace`` that
opens a file (as ``protocol.hprof.summarise_file`` does for heap dumps); it blocks, so trio
callers run it in a worker thread.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ddmd.protocol.trace import TraceProfile, read_trace

__all__ = ["load_profile"]

_BLOCK = 1 << 20


def _blocks(path: Path) -> Iterator[bytes]:
    with path.open("rb") as handle:
        while block := handle.read(_BLOCK):
            yield block


def load_profile(path: Path) -> TraceProfile:
    """Read and profile a trace file; raises OSError or TraceFormatError."""
    return read_trace(_blocks(path))

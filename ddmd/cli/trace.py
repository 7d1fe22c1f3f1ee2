"""``ddmd trace-report FILE``: the methods of a method trace (``.trace``) that took the most
time, by inclusive and by exclusive time, with call counts, for all threads (and per thread with
``--per-thread``); ``--json`` prints the same as JSON. Methods read as Java source writes them
(``MainActivity.onCreate(Bundle)``); ``-v`` shows the VM's descriptors instead
(``onCreate(Landroid/os/Bundle;)V``).

Layer: imports ``ddmd.protocol.trace`` (ddmd's own parser; ``protocol.trace.loader`` reads the
file in blocks) and ``cli.format``/``cli.client`` (tables, JSON, the one-line failure); it needs
no daemon. Exit codes (`cli.exits`' table): 0 success; 1 the file cannot be read, or is not a
method trace ddmd can read (one line on stderr saying why), as `hprof-summary` says of a heap
dump; 2 usage. `trace_text` is the report `ddmd trace` (`cli.profiling`) shows of the trace it
brought back.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from ddmd.cli.client import fail
from ddmd.cli.format import print_json
from ddmd.cli.words import method_words
from ddmd.protocol.trace import TraceFormatError
from ddmd.protocol.trace.loader import load_profile
from ddmd.protocol.trace.report import report_json

__all__ = [
    "EXIT_BAD_FILE",
    "format_report",
    "per_thread_option",
    "report_json",
    "trace_report",
    "trace_text",
    "verbose_option",
]

EXIT_BAD_FILE = 1  # work that failed, as every unreadable file (cli.client)
_CLOCK_WORDS = {"wall": "wall-clock", "thread-cpu": "thread-CPU"}


# --------------------------------------------------------------------------- text


def _aligned(headers: Sequence[str], rows: Sequence[Sequence[str]], numeric: int) -> list[str]:
    """Columns two spaces apart; the first ``numeric`` columns right-aligned, the last one
    not padded."""
    cells = [list(headers), *[list(row) for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [
            value.rjust(width) if i < numeric else value.ljust(width)
            for i, (value, width) in enumerate(zip(row[:-1], widths, strict=False))
        ]
        lines.append("  ".join([*padded, row[-1]]).rstrip())
    return lines


def _percent(part: int, whole: int) -> str:
    return f"{100.0 * part / whole:.1f}%" if whole else "-"


def _calls(entry: dict[str, Any]) -> str:
    recursive = entry["recursive_calls"]
    return f"{entry['calls']} ({recursive} recursive)" if recursive else str(entry["calls"])


def _method(entry: dict[str, Any], verbose: bool) -> str:
    full = str(entry["method"])
    if verbose:
        return full
    return method_words(entry.get("class"), entry.get("name"), entry.get("signature"), full)


def _section(ranking: dict[str, Any], clock: str, total: int, verbose: bool = False) -> list[str]:
    lines: list[str] = []
    for key, first, second in (
        ("by_inclusive", "inclusive", "exclusive"),
        ("by_exclusive", "exclusive", "inclusive"),
    ):
        entries = ranking[key]
        if not entries:
            continue
        lines.append(f"  top {len(entries)} of {ranking['methods']} by {first} time:")
        rows = [
            (
                str(e[f"{first}_usec"][clock]),
                _percent(e[f"{first}_usec"][clock], total),
                str(e[f"{second}_usec"][clock]),
                _calls(e),
                _method(e, verbose),
            )
            for e in entries
        ]
        headers = (first.upper()[:4], "%", second.upper()[:4], "CALLS", "METHOD")
        lines += ["    " + line for line in _aligned(headers, rows, numeric=3)]
    if not lines:
        lines.append("  no calls")
    return lines


def _edges(threads: list[dict[str, Any]]) -> list[str]:
    """What the tables count that was cut by the start or the end of the trace."""
    lines = []
    unmatched = sum(t["unmatched_exits"] for t in threads)
    still = sum(t["open_calls"] for t in threads)
    if unmatched:
        lines.append(
            f"  ({unmatched} calls were already running when tracing started; they are counted "
            "from time 0)"
        )
    if still:
        lines.append(
            f"  ({still} calls were still running when tracing stopped; they are counted up to "
            "the thread's last event)"
        )
    return lines


def format_report(body: dict[str, Any], *, per_thread: bool = False, verbose: bool = False) -> str:
    """The readable report, rendered from :func:`report_json`'s data: the tables of all
    threads together, then (``per_thread``) each thread's; ``verbose`` names methods by their
    descriptors."""
    fmt = body["format"]
    clock = body["sort_clock"]
    vm = {"art": "ART", "dalvik": "Dalvik"}.get(body["vm"] or "", body["vm"] or "VM")
    layout = ", streaming layout" if fmt["streaming"] else ""
    pid = f", pid {body['pid']}" if body["pid"] is not None else ""
    threads = body["threads"]
    lines = [
        f"{body['file']}: {vm} method trace, format {fmt['version']} ({fmt['clock']} clock"
        f"{layout}){pid}, {len(threads)} threads, {body['all_threads']['methods']} methods, "
        f"{body['records']} records",
    ]
    others = [c for c in fmt["clocks"] if c != clock]
    also = f" ({', '.join(others)} time in --json)" if others else ""
    lines.append(f"Times are {_CLOCK_WORDS.get(clock, clock)} microseconds{also}.")
    if body["overflow"]:
        lines.append(
            "Note: the VM's trace buffer filled up, so the calls after that point are missing "
            "(start the trace with a bigger buffer)."
        )
    everything = body["all_threads"]
    total = everything["total_usec"][clock]
    lines += ["", f"All threads: {total} usec (the threads' times added together)"]
    if not per_thread:
        lines += _edges(threads)
    lines += _section(everything, clock, total, verbose)
    if not per_thread:
        if len(threads) > 1:
            lines += ["", f"(--per-thread shows the tables of each of the {len(threads)} threads)"]
        return "\n".join(lines)
    for thread in threads:
        total = thread["total_usec"][clock]
        name = f" {thread['name']}" if thread["name"] else ""
        lines += ["", f"Thread {thread['tid']}{name}: {total} usec, {thread['records']} records"]
        if thread["unmatched_exits"]:
            lines.append(
                f"  ({thread['unmatched_exits']} calls were already running when tracing "
                "started; they are counted from time 0)"
            )
        if thread["open_calls"]:
            lines.append(
                f"  ({thread['open_calls']} calls were still running when tracing stopped; "
                "they are counted up to the thread's last event)"
            )
        lines += _section(thread, clock, total, verbose)
    return "\n".join(lines)


# --------------------------------------------------------------------------- the command

#: ``--per-thread`` and ``-v``: shared with ``ddmd trace``.
per_thread_option = click.option(
    "--per-thread", is_flag=True, help="Also give the tables of each thread."
)
verbose_option = click.option(
    "-v",
    "--verbose",
    is_flag=True,
    help="Name methods by their descriptors, as the trace does ((Landroid/os/Bundle;)V).",
)


@click.command("trace-report", short_help="Top methods of a method trace (.trace) file.")
@click.argument("file", type=click.Path(dir_okay=True, path_type=Path))
@click.option(
    "--top",
    type=click.IntRange(min=0),
    default=10,
    show_default=True,
    help="How many methods each table lists (0: all).",
)
@per_thread_option
@verbose_option
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def trace_report(file: Path, top: int, per_thread: bool, verbose: bool, as_json: bool) -> None:
    """Top methods of a method trace FILE (.trace), by inclusive and by exclusive time.

    Reads the files Android Studio, DDMS, `dmtracedump` and `ddmd trace` use (format
    versions 1 to 3, one or two clocks, and ART's streaming layout), with ddmd's own parser;
    no daemon needed. Each table is given for all threads together (--per-thread: then for
    each thread). Inclusive time counts the calls a method makes, exclusive time only its own
    code.
    """
    try:
        profile = load_profile(file)
    except OSError as exc:
        fail("trace-report", f"cannot read {file}: {exc.strerror or exc}", EXIT_BAD_FILE)
    except TraceFormatError as exc:
        fail("trace-report", f"{file}: {exc}", EXIT_BAD_FILE)
    body = report_json(profile, top=top, file=str(file))
    if as_json:
        print_json(body)
    else:
        click.echo(format_report(body, per_thread=per_thread, verbose=verbose))


# --------------------------------------------------------------------------------------------------
# The report of a trace `ddmd trace` brought back


def _trimmed_report(report: Any, top: int, file: str) -> dict[str, Any] | None:
    """The daemon's trace report cut to ``top`` rows a table, or None when it has fewer rows
    than asked for (then the file is read here)."""
    if not isinstance(report, dict):
        return None
    server_top = report.get("top")
    if not isinstance(server_top, int) or (server_top and (not top or server_top < top)):
        return None
    limit = top or None

    def cut(ranking: dict[str, Any]) -> dict[str, Any]:
        return {
            **ranking,
            "by_inclusive": list(ranking["by_inclusive"])[:limit],
            "by_exclusive": list(ranking["by_exclusive"])[:limit],
        }

    try:
        return {
            **report,
            "file": file,
            "top": top,
            "all_threads": cut(report["all_threads"]),
            "threads": [cut(thread) for thread in report["threads"]],
        }
    except (KeyError, TypeError):
        return None


def trace_text(
    stopped: dict[str, Any], dest: Path, top: int, per_thread: bool = False, verbose: bool = False
) -> tuple[str | None, str | None]:
    """What `ddmd trace` shows of the trace it stopped and wrote to ``dest``: the daemon's
    report when it has the rows asked for, else the file's. (the report, None), or (None, why
    it cannot be shown)."""
    body = _trimmed_report(stopped.get("report"), top, str(dest))
    if body is not None:
        try:
            return format_report(body, per_thread=per_thread, verbose=verbose), None
        except (KeyError, TypeError, IndexError):
            pass
    try:
        profile = load_profile(dest)
    except OSError as exc:
        return None, f"cannot read {dest}: {exc.strerror or exc}"
    except TraceFormatError as exc:
        return None, f"{dest}: {exc}"
    report = report_json(profile, top=top, file=str(dest))
    return format_report(report, per_thread=per_thread, verbose=verbose), None

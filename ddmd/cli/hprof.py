"""`ddmd hprof-summary FILE`: the class histogram of an HPROF heap dump file.

Layer: imports `protocol.hprof` (the streaming reader), `cli.client` (the one-line failure)
and `cli.format`. No daemon is involved: the file is read here, in pieces, never whole.
`histogram_text` is the histogram `ddmd hprof` (`cli.profiling`) shows of the dump it brought back.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ddmd.cli.client import fail
from ddmd.cli.format import print_json, size, table
from ddmd.protocol.hprof import (
    DEFAULT_CHUNK_SIZE,
    HprofFormatError,
    HprofSummary,
    summarise_file,
)

__all__ = [
    "EXIT_BAD_FILE",
    "format_histogram",
    "format_histogram_json",
    "histogram_text",
    "hprof_summary",
]

EXIT_BAD_FILE = 1


def _count(n: int) -> str:
    return f"{n:,}"


def format_histogram(summary: HprofSummary, top: int | None, name: str) -> str:
    """The histogram as text: a summary line, then the ``top`` classes by shallow bytes."""
    return format_histogram_json(summary.to_json(top), name)


def format_histogram_json(body: dict[str, Any], name: str) -> str:
    """The same text from the histogram's JSON (``HprofSummary.to_json``: what ``--json``
    prints and the daemon's heap dump route answers), with every row ``body["classes"]`` has."""
    rows_shown: list[dict[str, Any]] = body["classes"]
    class_count: int = body["class_count"]
    heap_columns: list[str] = body["heaps"] if body["heap_info"] else []
    lines = [
        f"{name}: {body['format']}, {body['id_size']}-byte ids, "
        f"{_count(body['instances'])} objects of {_count(class_count)} classes, "
        f"{size(body['shallow_bytes'])} shallow"
    ]
    if not rows_shown:
        lines.append("The dump holds no objects.")
        return "\n".join(lines)
    which = "all classes" if len(rows_shown) == class_count else f"top {len(rows_shown)}"
    note = "; heap columns count instances" if heap_columns else ""
    lines.append(
        f"{which} by shallow bytes (field and element bytes, object headers not counted){note}:"
    )
    headers = ["CLASS", "INSTANCES", "SHALLOW BYTES", *(heap.upper() for heap in heap_columns)]
    rows: list[list[Any]] = []
    for entry in rows_shown:
        shares = entry.get("heaps") or {}
        per_heap = [(shares.get(heap) or {}).get("instances") or None for heap in heap_columns]
        rows.append(
            [
                entry["class"],
                _count(entry["instances"]),
                _count(entry["shallow_bytes"]),
                *(None if n is None else _count(n) for n in per_heap),
            ]
        )
    lines.append(table(headers, rows))
    return "\n".join(lines)


@click.command("hprof-summary", short_help="Show the class histogram of an HPROF heap dump.")
@click.argument("file", type=click.Path(path_type=Path))
@click.option(
    "--top",
    type=click.IntRange(min=0),
    default=20,
    show_default=True,
    help="How many classes to show, largest shallow size first (0: all).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the histogram as JSON.")
def hprof_summary(file: Path, top: int, as_json: bool) -> None:
    """Show the class histogram of the heap dump FILE: instances and shallow bytes per class,
    and per heap (app, image, zygote) for Android dumps.

    Reads standard HPROF 1.0.2 (HotSpot's `jcmd PID GC.heap_dump`) and Android's 1.0.3
    (a DDMS or `am dumpheap` dump) as it is, in pieces: a dump of any size fits.
    """
    try:
        summary = summarise_file(file, chunk_size=DEFAULT_CHUNK_SIZE)
    except HprofFormatError as err:
        fail("hprof-summary", f"{file}: {err}", EXIT_BAD_FILE)
    except IsADirectoryError:
        fail("hprof-summary", f"{file} is a directory, not a heap dump file", EXIT_BAD_FILE)
    except OSError as err:
        fail("hprof-summary", f"cannot read {file}: {err.strerror or err}", EXIT_BAD_FILE)
    limit = top or None
    if as_json:
        print_json({"file": str(file), **summary.to_json(limit)})
    else:
        click.echo(format_histogram(summary, limit, str(file)))


def histogram_text(histogram: Any, dump: Path, top: int) -> tuple[str | None, str | None]:
    """What `ddmd hprof` shows of ``dump``: the daemon's histogram when it has the rows asked
    for, else the file's, read here. (the text, None), or (None, why it cannot be shown)."""
    try:
        if isinstance(histogram, dict):
            rows = list(histogram["classes"])
            whole = len(rows) >= int(histogram["class_count"])
            if whole or (top and len(rows) >= top):
                cut = rows[: top or None]
                return format_histogram_json(
                    {**histogram, "classes": cut, "shown": len(cut)}, str(dump)
                ), None
    except (KeyError, TypeError, ValueError):
        pass
    try:
        summary = summarise_file(dump)
    except HprofFormatError as err:
        return None, f"{dump}: {err}"
    except OSError as err:
        return None, f"cannot read {dump}: {err.strerror or err}"
    return format_histogram(summary, top or None, str(dump)), None

"""The steps the DDMS commands (`cli.profiling`, `cli.allocs`) share: the VM they work on must be a
VM, not another DDM client (`only_a_vm`), and must offer the feature (`refuse_unless_offered`);
and the file a trace stop or a heap dump answers with is brought here (`fetch_capture`): written
to ``FILE.part`` as it arrives, then renamed, so a broken download never leaves a file that
looks whole. ``-o`` is checked before anything is asked of the VM (`check_output`, exit 2).

Layer: imports `cli.client` (the API client, failures, exit codes), `cli.format` and
`cli.progress`; httpx and trio lazily.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote

import click

from ddmd.cli.client import (
    API,
    CONNECT_TIMEOUT,
    EXIT_API_ERROR,
    EXIT_CONFIG,
    READ_TIMEOUT,
    TOKEN_HINT,
    Api,
    Failure,
    fail,
    no_daemon,
)
from ddmd.cli.format import size
from ddmd.cli.progress import Transfer

__all__ = [
    "DOWNLOAD_READ_TIMEOUT",
    "check_output",
    "fetch_capture",
    "only_a_vm",
    "output_option",
    "refuse_unless_offered",
    "with_path",
    "wrote",
]

#: Seconds: the longest pause between two pieces of a download.
DOWNLOAD_READ_TIMEOUT = 60.0

_SAFE_NAME = re.compile(r"[^A-Za-z0-9._-]")

output_option = click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    default=None,
    help="Where to write the file (default: the daemon's name for it, in this directory; "
    "a directory: that name inside it).",
)


async def _kind(api: Api, vm: Mapping[str, Any]) -> str:
    """What the client is: "VM", or what the daemon's list says of a DDM client that is not a
    VM ("system monitor"). A list that cannot be read counts as "VM": the daemon decides then."""
    if isinstance(vm.get("kind"), str):
        return str(vm["kind"])
    if vm.get("ddm") is False or str(vm.get("vm_ident") or "").startswith("Dalvik v"):
        return "VM"  # a plain JVM; an Android VM
    try:
        listed = await api.call("GET", f"{API}/vms")
    except Failure:
        return "VM"
    for other in listed if isinstance(listed, list) else []:
        if isinstance(other, dict) and other.get("id") == vm.get("id"):
            return str(other.get("kind") or "VM")
    return "VM"


#: What a DDM client that is not a VM does not have, by command.
_NOT_A_VM = {
    "allocs": "it has no allocations to track",
    "hprof": "it has no heap to dump",
    "kill": "ddmd does not stop it (stop it where it runs)",
}


async def only_a_vm(api: Api, vm: Mapping[str, Any], command: str) -> None:
    """Refuse a DDM client that is not a VM (``ddmd sysmon``), in its own words (exit 1)."""
    kind = await _kind(api, vm)
    if kind != "VM":
        name = str(vm.get("name") or vm.get("id"))
        who = f"the {kind} is not a VM" if name == kind else f"{name} is a {kind}, not a VM"
        raise Failure(f"{who}: {_NOT_A_VM[command]}", EXIT_API_ERROR)


async def refuse_unless_offered(api: Api, vm: Mapping[str, Any], feature: str) -> None:
    """Ask what the VM offers (``GET .../profiling``) and refuse, with the daemon's sentence,
    before the work is announced: a refusal never follows a "dumping..." line."""
    body = await api.call("GET", api.vm_path(str(vm["id"]), "/profiling"))
    features = body.get("features") if isinstance(body, dict) else None
    offer = features.get(feature) if isinstance(features, dict) else None
    if isinstance(offer, dict) and offer.get("available") is False:
        reason = offer.get("reason") or f"{vm.get('name') or vm['id']} does not offer it"
        raise Failure(str(reason), EXIT_API_ERROR)


def check_output(command: str, output: Path | None) -> None:
    """Refuse an ``-o`` that cannot be written before anything is asked of the VM."""
    if output is None or output.is_dir():
        return
    parent = output.parent
    if not parent.is_dir():
        fail(command, f"cannot write {output}: the directory {parent} does not exist", EXIT_CONFIG)
    if not os.access(parent, os.W_OK):
        fail(command, f"cannot write {output}: no permission in {parent}", EXIT_CONFIG)


def _local_name(name: object, fallback: str) -> str:
    """The daemon's file name as a plain name in this directory (never a path)."""
    text = _SAFE_NAME.sub("_", Path(str(name or "")).name)
    return text if text.strip("._") else fallback


def _destination(output: Path | None, name: str) -> Path:
    if output is None:
        return Path(name)
    if output.is_dir():
        return output / name
    return output


def _download_path(body: Mapping[str, Any], name: str) -> str:
    """Where the daemon serves the file: its ``download`` when that is a path of this API."""
    download = body.get("download")
    if isinstance(download, str) and download.startswith(f"{API}/captures/"):
        return download
    return f"{API}/captures/{quote(name, safe='')}"


def _error_message(status: int, content: bytes) -> str:
    import json

    try:
        body = json.loads(content)
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    message = str(error) if error else f"HTTP {status}"
    return message + TOKEN_HINT if status == 401 else message


async def fetch_capture(
    api: Api,
    answer: dict[str, Any],
    output: Path | None,
    fallback: str,
    what: str,
    tty: TextIO | None,
) -> tuple[Path, int]:
    """Download the file a trace stop or a heap dump answered with; returns where it went and
    its size (its progress drawn on ``tty``, a terminal or None). A failed download says the
    daemon still keeps the file."""
    name = _local_name(answer["file"], fallback)
    dest = _destination(output, name)
    expected = answer.get("bytes")
    try:
        written = await _download(
            api,
            _download_path(answer, name),
            dest,
            expected if isinstance(expected, int) else None,
            tty,
        )
    except Failure as failure:
        raise Failure(
            f"{failure.message} (the daemon keeps the {what} as {answer['file']})",
            failure.code,
            kind=failure.kind,
        ) from None
    return dest, written


async def _download(
    api: Api, path: str, dest: Path, expected: int | None, tty: TextIO | None
) -> int:
    """Write the file at ``path`` to ``dest`` piece by piece; return its size in bytes."""
    import httpx
    import trio

    base = api.address.shown
    part = dest.with_name(dest.name + ".part")
    timeout = httpx.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT, read=DOWNLOAD_READ_TIMEOUT)
    written = 0
    try:
        async with api.client.stream(
            "GET", path, headers={"Accept": "application/octet-stream"}, timeout=timeout
        ) as response:
            if not response.is_success:
                message = _error_message(response.status_code, await response.aread())
                raise Failure(f"downloading {path} failed: {message}", EXIT_API_ERROR)
            try:
                handle = await trio.open_file(part, "wb")
            except OSError as exc:
                raise Failure(
                    f"cannot write {part}: {exc.strerror or exc}", EXIT_API_ERROR
                ) from None
            progress = Transfer(f"downloading {dest.name}", expected, tty)
            async with handle:
                try:
                    async for piece in response.aiter_bytes():
                        await handle.write(piece)
                        written += len(piece)
                        progress.update(written)
                finally:
                    progress.finish()
        if expected is not None and written != expected:
            raise Failure(
                f"the download of {path} ended after {written} of {expected} bytes",
                EXIT_API_ERROR,
            )
        await trio.Path(part).replace(dest)
    except BaseException as exc:
        with trio.CancelScope(shield=True):
            await trio.Path(part).unlink(missing_ok=True)
        if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout)):
            raise no_daemon(base) from None
        if isinstance(exc, httpx.TimeoutException):
            raise Failure(
                f"the daemon at {base} sent nothing for {DOWNLOAD_READ_TIMEOUT:g} s "
                f"while {path} was downloading",
                EXIT_API_ERROR,
            ) from None
        if isinstance(exc, httpx.TransportError):
            raise Failure(
                f"downloading {path} from {base} failed: {type(exc).__name__}: {exc}",
                EXIT_API_ERROR,
            ) from None
        if isinstance(exc, OSError):
            raise Failure(f"cannot write {dest}: {exc.strerror or exc}", EXIT_API_ERROR) from None
        raise
    return written


def wrote(path: Path, written: int) -> str:
    return f"wrote {path} ({size(written)}, {written:,} bytes)"


def with_path(body: Any, **paths: Path) -> dict[str, Any]:
    extra = {key: str(value) for key, value in paths.items()}
    return {**body, **extra} if isinstance(body, dict) else {"answer": body, **extra}

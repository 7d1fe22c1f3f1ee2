"""`ddmd events`: follow the daemon's event stream (server-sent events, ``GET /api/v1/events``).

Layer: imports `cli.client` (address, httpx client, failures), `cli.format` and
`control.sse` (the wire format, standard library only); httpx lazily.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import click

from ddmd.cli.client import (
    API,
    CONNECT_TIMEOUT,
    EXIT_API_ERROR,
    EXIT_OK,
    READ_TIMEOUT,
    TOKEN_HINT,
    Api,
    Failure,
    client_options,
    daemon_address,
    no_daemon,
    run_with_api,
)
from ddmd.cli.format import format_event

__all__ = ["EVENTS_READ_TIMEOUT", "events"]

#: The daemon sends a keepalive comment every 15 s; three missed ones mean it is gone.
EVENTS_READ_TIMEOUT = 45.0


async def _tail_events(api: Api, show: Callable[[dict[str, Any]], None], count: int | None) -> None:
    """Read the stream until it ends (daemon stopping: return; otherwise Failure)."""
    import httpx

    from ddmd.control.sse import SseDecoder

    base = api.address.shown
    timeout = httpx.Timeout(READ_TIMEOUT, connect=CONNECT_TIMEOUT, read=EVENTS_READ_TIMEOUT)
    headers = {"Accept": "text/event-stream"}
    decoder = SseDecoder()
    last = ""
    seen = 0
    try:
        async with api.client.stream(
            "GET", f"{API}/events", headers=headers, timeout=timeout
        ) as response:
            if not response.is_success:
                await response.aread()
                try:
                    body = response.json()
                except ValueError:
                    body = None
                error = body.get("error") if isinstance(body, dict) else None
                message = str(error) if error else f"HTTP {response.status_code}"
                if response.status_code == 401:
                    message += TOKEN_HINT
                raise Failure(message, EXIT_API_ERROR)
            async for line in response.aiter_lines():
                sse_event = decoder.feed(line)
                if sse_event is None:
                    continue
                try:
                    event = json.loads(sse_event.data)
                except ValueError:
                    event = {"event": sse_event.name, "data": sse_event.data}
                if not isinstance(event, dict):
                    event = {"event": sse_event.name, "data": event}
                last = str(event.get("event", sse_event.name))
                show(event)
                seen += 1
                if count is not None and seen >= count:
                    return
    except (httpx.ConnectError, httpx.ConnectTimeout):
        raise no_daemon(base) from None
    except httpx.ReadTimeout:
        raise Failure(
            f"the daemon at {base} sent nothing for {EVENTS_READ_TIMEOUT:g} s "
            "(not even a keepalive)",
            EXIT_API_ERROR,
        ) from None
    except httpx.TransportError as exc:
        raise Failure(
            f"the event stream from {base} broke: {type(exc).__name__}: {exc}", EXIT_API_ERROR
        ) from None
    if last == "daemon.stopping":
        return
    if last == "overflow":
        raise Failure("the daemon dropped this stream: it fell behind", EXIT_API_ERROR)
    raise Failure(f"the daemon at {base} closed the event stream", EXIT_API_ERROR)


@click.command("events", short_help="Print the daemon's events as they happen, until Ctrl-C.")
@click.option("--count", type=click.IntRange(min=1), default=None, hidden=True)
@click.option("--json", "as_json", is_flag=True, help="Print each event as one JSON line.")
@client_options
def events(
    count: int | None,
    as_json: bool,
    config_file: str | None,
    control: str | None,
    device: str | None,
) -> None:
    """Follow the daemon's events (VMs found and gone, debuggers, current VM, threads, heaps)
    until Ctrl-C: one line per event, or one JSON object per line with --json."""
    where = daemon_address("events", config_file, control, None)

    def show(event: dict[str, Any]) -> None:
        if device and event.get("device") not in (None, device):
            return
        if as_json:
            click.echo(json.dumps(event, separators=(",", ":")))
        else:
            click.echo(format_event(event))

    async def work(api: Api) -> None:
        await _tail_events(api, show, count)

    try:
        run_with_api("events", where, work)
    except KeyboardInterrupt:
        raise click.exceptions.Exit(EXIT_OK) from None

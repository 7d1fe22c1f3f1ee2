"""``ddmd extensions``: the chunk-handler plugins the daemon loaded, disabled or could not load.

Layer: click and the CLI's API client (``cli.client``); no daemon code.
"""

from __future__ import annotations

from typing import Any

import click

from ddmd.cli.client import API, Api, client_options, daemon_address, json_option, run_with_api
from ddmd.cli.format import show, table

__all__ = ["extensions", "format_extensions"]


def format_extensions(body: dict[str, Any]) -> str:
    loaded = body.get("loaded") or []
    failed = body.get("failed") or []
    disabled = body.get("disabled") or []
    parts = []
    if loaded:
        parts.append(
            "loaded:\n"
            + table(
                ("NAME", "CHUNK TYPES", "ENTRY POINT"),
                [(h["name"], " ".join(h["chunk_types"]) or "-", h["target"]) for h in loaded],
            )
        )
    else:
        parts.append("no chunk-handler plugins are loaded (entry points in group ddmd.handlers)")
    if failed:
        parts.append(
            "failed to load (the daemon runs without them):\n"
            + table(
                ("NAME", "ENTRY POINT", "ERROR"),
                [(f["name"], f["target"], f["error"]) for f in failed],
            )
        )
    if disabled:
        parts.append("disabled by [extensions] disabled: " + ", ".join(disabled))
    return "\n\n".join(parts)


@click.command("extensions", short_help="List the chunk-handler plugins the daemon loaded.")
@json_option
@client_options
def extensions(
    as_json: bool, config_file: str | None, control: str | None, device: str | None
) -> None:
    """List the chunk-handler plugins (``ddmd.handlers`` entry points): loaded, disabled by
    the config, and those that failed to load, with the error."""
    target = daemon_address("extensions", config_file, control, None)

    async def work(api: Api) -> Any:
        return await api.call("GET", f"{API}/extensions")

    show(run_with_api("extensions", target, work), as_json, format_extensions)

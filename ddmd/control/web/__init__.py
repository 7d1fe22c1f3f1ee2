"""The live web page served by the control API: three static files, no build step, no CDN.

Layer: standard library only. `control.app` serves ``GET /`` and
``GET /static/{name}`` from :func:`load_assets`; the page talks to the JSON API of the same
origin only (``fetch`` with relative URLs; an ``EventSource`` on ``/api/v1/events`` when the
daemon has one, else polling; the Logcat panel has one of its own on the selected VM's
``/logcat/stream``, and draws only the rows in view). Text from VMs (app and thread names,
stack frames) goes into the page with ``textContent`` only.

Files (``static/``):

* ``index.html``: the skeleton (VM table, thread table, stack, heap panel, logcat panel,
  profiling).
* ``app.js``: the behaviour; plain ES2020, no modules, no dependencies.
* ``style.css``: the looks.
* ``favicon.svg``: the tab icon (so the browser does not ask for /favicon.ico).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from types import MappingProxyType
from typing import Final

__all__ = ["ASSET_NAMES", "PAGE_HEADERS", "Asset", "load_assets"]

#: Served files: name -> media type.
ASSET_NAMES: Final = MappingProxyType(
    {
        "index.html": "text/html; charset=utf-8",
        "app.js": "text/javascript; charset=utf-8",
        "style.css": "text/css; charset=utf-8",
        "favicon.svg": "image/svg+xml",
    }
)

#: Headers for every page asset: same-origin only (the Content-Security-Policy forbids any
#: other origin for scripts, styles, images and connections), never framed, always revalidated.
PAGE_HEADERS: Final = MappingProxyType(
    {
        "Content-Security-Policy": (
            "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; "
            "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
        ),
        "X-Content-Type-Options": "nosniff",
        "X-Frame-Options": "DENY",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
    }
)


@dataclass(frozen=True, slots=True)
class Asset:
    name: str
    body: bytes
    media_type: str


def load_assets() -> dict[str, Asset]:
    """Read every page file once (the control app keeps them in memory)."""
    folder = resources.files("ddmd.control.web").joinpath("static")
    return {
        name: Asset(name, folder.joinpath(name).read_bytes(), media_type)
        for name, media_type in ASSET_NAMES.items()
    }

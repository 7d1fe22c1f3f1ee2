"""The control side of the daemon: the HTTP API and what it serves.

* `app`: the Starlette routes over the VM registry, served by hypercorn (`create_app`, `serve`).
* `safety`: Host/Origin/token checks (ASGI middleware).
* `events`: the event hub behind ``GET /api/v1/events`` (its wire format is `protocol.sse`).
* `metrics`: ``GET /metrics`` (Prometheus text).
* `heapimage`: heap segment images drawn as PNG.
* `web/`: the live web page's static files.

Layer: imports `registry`, `config`, `errors`, `logs`, `netaddr`, `ports` and `protocol` value
types; used by `daemon`. This file imports nothing.
"""

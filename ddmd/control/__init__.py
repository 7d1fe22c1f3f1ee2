"""The control side of the daemon: the HTTP API and what it serves.

* `app`: the Starlette routes over the VM registry, served by hypercorn (`create_app`, `serve`).
* `safety`: Host/Origin/token checks (ASGI middleware).
* `events` + `sse`: the event hub behind ``GET /api/v1/events`` and the SSE wire format.
* `metrics`: ``GET /metrics`` (Prometheus text).
* `heapimage`: heap segment images drawn as PNG.
* `web/`: the live web page's static files.

Layer: imports `registry`, `config`, `errors`, `logs`, `netaddr`, `ports` and `protocol` value
types; used by `daemon` (and `sse` by `cli`). This file imports nothing, so `ddmd.control.sse`
stays cheap for the command-line client.
"""

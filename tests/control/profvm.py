"""ProfVm: a `FakeVm` that also answers the DDMS features (trace, allocs, hprof, kill), writing
real files (the simulator's trace and heap dump) where the control API serves captures; and
`Daemon`, the real control API over a registry of such VMs, with every request the CLI sends
recorded. For the CLI tests of issue 20 (tests/control/test_cli_frictions.py,
tests/control/test_exit_codes.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from starlette.routing import BaseRoute

from ddmd.cli import client as cli_client
from ddmd.config import ControlConfig
from ddmd.control.app import create_app
from ddmd.control.safety import control_middleware
from ddmd.drive.captures import CaptureResult
from ddmd.errors import FeatureUnsupported
from ddmd.registry import VmRegistry
from ddmd.sim.hprof import dump_bytes, sim_heap_content
from ddmd.sim.trace import build_trace, default_recording

from .fakes import FakeVm

#: Features a `ProfVm` can lack (`FakeVm.unsupported` names them, beside FakeVm's own).
PROFILING = ("trace", "allocs", "hprof", "kill")


@dataclass
class ProfVm(FakeVm):
    """A FakeVm with method tracing, the allocation tracker, heap dumps and kill."""

    capture_dir: Path | None = None
    tracing: bool = False
    allocs_on: bool = False
    killed: list[int] = field(default_factory=list)

    def _reason(self, feature: str) -> str:
        return f"{self.snap.display_name} does not offer {feature} (this test VM lacks it)"

    def _check(self, feature: str) -> None:
        if feature in self.unsupported:
            raise FeatureUnsupported(self._reason(feature))

    def profiling(self) -> dict[str, Any]:
        features = {f: {"available": f not in self.unsupported, "reason": None} for f in PROFILING}
        for name, feature in features.items():
            if not feature["available"]:
                feature["reason"] = self._reason(name)
        return {"features": features, "trace": "method" if self.tracing else "off"}

    def _capture(self, suffix: str, data: bytes) -> CaptureResult:
        assert self.capture_dir is not None, "create the Daemon with a capture dir"
        name = (self.snap.package or "vm").replace(":", "_")
        path = self.capture_dir / f"{name}-1.{suffix}"
        path.write_bytes(data)
        return CaptureResult(path, len(data))

    async def start_trace(self, sampling_us: int | None = None) -> dict[str, Any]:
        self._check("trace")
        self.tracing = True
        return {"trace": "sampling" if sampling_us else "method", "mode": "streaming"}

    async def stop_trace(self) -> CaptureResult:
        self._check("trace")
        self.tracing = False
        return self._capture("trace", build_trace(default_recording()))

    async def trace_state(self) -> dict[str, Any]:
        return {"trace": "method" if self.tracing else "off"}

    async def alloc_tracker(self, action: str) -> dict[str, Any]:
        self._check("allocs")
        if action in ("start", "stop"):
            self.allocs_on = action == "start"
        return {"enabled": self.allocs_on, "allocations": []}

    async def dump_hprof(self) -> CaptureResult:
        self._check("hprof")
        return self._capture("hprof", dump_bytes(sim_heap_content(self.snap.app or "app")))

    async def kill(self, status: int = 1) -> dict[str, Any]:
        self._check("kill")
        self.killed.append(status)
        return {"status": status}


class Recording(httpx.ASGITransport):
    """The in-process app as the CLI's transport, keeping "METHOD /path" of every request."""

    def __init__(self, app: Any, seen: list[str]) -> None:
        super().__init__(app=app)
        self.seen = seen

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        self.seen.append(f"{request.method} {request.url.path}")
        return await super().handle_async_request(request)


@dataclass
class Daemon:
    """The real control API (`create_app`) over `registry`, routed to the CLI's commands."""

    registry: VmRegistry
    seen: list[str] = field(default_factory=list)

    def route(
        self,
        monkeypatch: Any,
        capture_dir: Path,
        *,
        health: dict[str, Any] | None = None,
        extra_routes: list[BaseRoute] | None = None,
        ports: Any = None,
        token: str = "",
    ) -> Daemon:
        for handle in self.registry.handles():
            if isinstance(handle, ProfVm):
                handle.capture_dir = capture_dir
        # With a token: the daemon's own check (control.safety), as `ddmd run` sets it up.
        config = ControlConfig(host="127.0.0.1", port=8710, token=token)
        app = create_app(
            self.registry,
            capture_dir=capture_dir,
            health=health,
            extra_routes=extra_routes or [],
            ports=ports,
            middleware=control_middleware(config) if token else (),
        )
        monkeypatch.setattr(cli_client, "make_transport", lambda: Recording(app, self.seen))
        return self

    def vm_requests(self) -> list[str]:
        """The requests about one VM (``/api/v1/vms/...``)."""
        return [line for line in self.seen if "/api/v1/vms/" in line]

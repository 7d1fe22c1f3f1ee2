"""``[metrics] listen``: /metrics alone on a port of its own, for a Prometheus on another machine,
without opening the control API (which can stop apps) to it."""

from __future__ import annotations

import httpx
import pytest
import trio

from ddmd.config import parse_config
from ddmd.errors import ConfigError
from ddmd.logs import Event
from tests.actors.rawpeers import free_port_range, monitor


async def test_the_metrics_port_serves_metrics_and_nothing_else(tmp_path):
    (vm_port, metrics_port) = free_port_range(2)
    metrics = {"host": "lab-4", "listen": True, "port": metrics_port}
    with trio.fail_after(30):
        async with monitor([vm_port], tmp_path, metrics=metrics) as h:
            assert h.started.metrics_port == metrics_port
            async with httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{metrics_port}", trust_env=False, timeout=10.0
            ) as client:
                scraped = await client.get("/metrics")
                assert scraped.status_code == 200
                assert 'ddmd_info{host="lab-4"' in scraped.text
                # The control API's routes are not there: only what a scraper may read.
                for path in ("/api/v1/vms", "/api/v1/health", "/"):
                    assert (await client.get(path)).status_code == 404
                refused = await client.post("/api/v1/vms/x/kill")
                assert refused.status_code in (404, 405)
            # The control API still serves /metrics too, the same families.
            assert 'ddmd_info{host="lab-4"' in (await h.client.get("/metrics")).text
            listening = [e for e in h.logs if e["event"] == Event.METRICS_LISTENING]
            assert listening == [{**listening[0], "host": "127.0.0.1", "port": metrics_port}]


async def test_without_listen_there_is_no_metrics_port(tmp_path):
    (vm_port,) = free_port_range(1)
    with trio.fail_after(30):
        async with monitor([vm_port], tmp_path) as h:
            assert h.started.metrics_port is None
            assert not [e for e in h.logs if e["event"] == Event.METRICS_LISTENING]


def test_a_metrics_port_beyond_loopback_needs_allow_non_loopback():
    with pytest.raises(ConfigError) as caught:
        parse_config({"metrics": {"listen": True, "bind": "0.0.0.0"}}, source="t.toml")
    assert "[metrics] bind" in str(caught.value)
    assert "allow_non_loopback" in str(caught.value)
    allowed = parse_config(
        {"metrics": {"listen": True, "bind": "0.0.0.0"}, "security": {"allow_non_loopback": True}},
        source="t.toml",
    )
    assert allowed.metrics.bind == "0.0.0.0"


def test_the_metrics_port_is_a_port():
    with pytest.raises(ConfigError) as caught:
        parse_config({"metrics": {"port": 70000}}, source="t.toml")
    assert "[metrics] port" in str(caught.value)

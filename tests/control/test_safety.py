"""Browser-safety rules of the control API (ddmd.control.safety): Host, Origin, token."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from structlog.testing import capture_logs

from ddmd.config import ControlConfig
from ddmd.control.app import create_app
from ddmd.control.safety import TOKEN_COOKIE, control_middleware, split_host, warn_if_exposed

from .fakes import FakeVm, make_registry

GC = "/api/v1/vms/emulator-5554/1234/gc"
HEALTH = "/api/v1/health"


def client_for(host: str = "127.0.0.1", token: str = "", **kw: object) -> httpx.AsyncClient:
    app = create_app(
        make_registry(FakeVm.android()),
        middleware=control_middleware(ControlConfig(host=host, port=8710, token=token)),
    )
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8710", **kw
    )


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with client_for() as c:
        yield c


# ------------------------------------------------------------------------------ Host


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1:8710",
        "127.0.0.1",
        "localhost:8710",
        "LOCALHOST:1",
        "localhost.:8710",
        "[::1]:8710",
        "[::1]",
        "127.9.9.9:8710",
        "app.localhost:8710",
    ],
)
async def test_loopback_hosts_are_accepted(client, host):
    r = await client.get(HEALTH, headers={"Host": host})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "host",
    [
        "evil.example:8710",
        "evil.example",
        "127.0.0.1.evil.example:8710",
        "localhost.evil.example",
        "192.168.1.5:8710",
        "[::2]:8710",
        "::1",  # IPv6 without brackets is not a Host
        "127.0.0.1:notaport",
        "127.0.0.1:99999",
        "",
    ],
)
async def test_foreign_host_is_refused(client, host):
    with capture_logs() as logs:
        r = await client.get(HEALTH, headers={"Host": host})
    assert r.status_code == 421
    assert "DNS rebinding" in r.json()["error"]
    assert [e["rule"] for e in logs if e["event"] == "control.request_refused"] == ["host"]


async def test_foreign_host_is_refused_even_with_the_token():
    async with client_for(token="s3cret") as c:
        r = await c.get(
            HEALTH, headers={"Host": "evil.example:8710", "Authorization": "Bearer s3cret"}
        )
    assert r.status_code == 421


async def test_explicit_non_loopback_bind_allows_that_host():
    async with client_for(host="192.168.1.5") as c:
        assert (await c.get(HEALTH, headers={"Host": "192.168.1.5:8710"})).status_code == 200
        assert (await c.get(HEALTH, headers={"Host": "localhost:8710"})).status_code == 200
        assert (await c.get(HEALTH, headers={"Host": "192.168.1.6:8710"})).status_code == 421
        assert (await c.get(HEALTH, headers={"Host": "evil.example:8710"})).status_code == 421


async def test_wildcard_bind_allows_ip_hosts_but_no_names():
    async with client_for(host="0.0.0.0") as c:
        assert (await c.get(HEALTH, headers={"Host": "10.0.0.7:8710"})).status_code == 200
        assert (await c.get(HEALTH, headers={"Host": "[fe80::1]:8710"})).status_code == 200
        assert (await c.get(HEALTH, headers={"Host": "evil.example:8710"})).status_code == 421


def test_split_host():
    assert split_host("127.0.0.1:8710") == ("127.0.0.1", 8710)
    assert split_host("[::1]") == ("::1", None)
    assert split_host("LocalHost.") == ("localhost", None)
    assert split_host("[::1") is None
    assert split_host("a:b:c") is None
    assert split_host(":80") is None


# ------------------------------------------------------------------------------ Origin


async def test_same_origin_post_is_accepted(client):
    r = await client.post(GC, headers={"Origin": "http://127.0.0.1:8710"})
    assert r.status_code == 200, r.text
    assert r.json()["gc"] == "done"


async def test_post_without_origin_is_accepted(client):
    """The CLI, curl: no Origin, Host 127.0.0.1:PORT."""
    r = await client.post(GC)
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "origin",
    [
        "http://evil.example",
        "http://evil.example:8710",
        "null",
        "http://localhost:8710",  # another origin than the Host 127.0.0.1:8710
        "http://127.0.0.1:8711",
        "https://127.0.0.1:8710",
        "http://127.0.0.1",
        "not a url",
    ],
)
async def test_cross_origin_post_is_refused(client, origin):
    r = await client.post(GC, headers={"Origin": origin})
    assert r.status_code == 403
    assert "cross-origin" in r.json()["error"]


async def test_cross_origin_get_is_refused_too(client):
    r = await client.get(HEALTH, headers={"Origin": "http://evil.example"})
    assert r.status_code == 403


async def test_default_port_origin(client):
    r = await client.post(GC, headers={"Host": "localhost", "Origin": "http://localhost:80"})
    assert r.status_code == 200, r.text


async def test_cross_site_subresource_is_refused_but_a_link_navigation_is_not(client):
    # <img src="http://127.0.0.1:8710/api/v1/vms/x/heap?segments=1"> on another site: no
    # Origin, but Sec-Fetch-Site says where it came from.
    r = await client.get(
        HEALTH, headers={"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors"}
    )
    assert r.status_code == 403
    r = await client.get(
        HEALTH, headers={"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}
    )
    assert r.status_code == 200
    r = await client.get(
        HEALTH, headers={"Sec-Fetch-Site": "same-origin", "Sec-Fetch-Mode": "cors"}
    )
    assert r.status_code == 200


# ------------------------------------------------------------------------------ token


async def test_token_is_enforced_when_configured():
    async with client_for(token="s3cret") as c:
        r = await c.get(HEALTH)
        assert r.status_code == 401
        assert r.headers["www-authenticate"] == 'Bearer realm="ddmd"'
        assert "Authorization: Bearer TOKEN" in r.json()["error"]
        r = await c.post(GC)
        assert r.status_code == 401
        r = await c.get(HEALTH, headers={"Authorization": "Bearer wrong"})
        assert r.status_code == 401
        assert r.json()["error"] == "wrong token"
        r = await c.get(HEALTH, headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 200
        r = await c.post(GC, headers={"Authorization": "Bearer s3cret"})
        assert r.status_code == 200


async def test_token_cookie_and_query_login():
    async with client_for(token="s3 cret;") as c:
        r = await c.get(HEALTH, params={"token": "wrong"})
        assert r.status_code == 401
        r = await c.get(HEALTH, params={"token": "s3 cret;"})
        assert r.status_code == 200
        cookie = r.headers["set-cookie"]
        assert cookie.startswith(f"{TOKEN_COOKIE}=s3%20cret%3B;")
        assert "HttpOnly" in cookie
        assert "SameSite=Strict" in cookie
        # The client keeps the cookie: later requests (and EventSource) need no token.
        r = await c.post(GC)
        assert r.status_code == 200, r.text
    async with client_for(token="s3cret") as c:
        r = await c.post(GC, params={"token": "s3cret"})  # a query token only logs in a GET
        assert r.status_code == 401
        r = await c.get(HEALTH, headers={"Cookie": f"{TOKEN_COOKIE}=s3cret"})
        assert r.status_code == 200
        assert "set-cookie" not in r.headers


async def test_no_token_configured_means_none_needed(client):
    r = await client.get(HEALTH)
    assert r.status_code == 200


def test_non_loopback_control_host_is_logged():
    with capture_logs() as logs:
        warn_if_exposed("127.0.0.1", 8710)
        warn_if_exposed("0.0.0.0", 8710)
    assert logs == [
        {
            "event": "listener.non_loopback",
            "log_level": "warning",
            "host": "0.0.0.0",
            "port": 8710,
            "key": "control.host",
        }
    ]


# ------------------------------------------------------------------------------ the real daemon


async def test_daemon_applies_every_rule(tmp_path):
    import trio

    from tests.actors.rawpeers import free_port_range, monitor

    with trio.fail_after(15):
        async with monitor(free_port_range(1), tmp_path, control={"token": "s3cret"}) as h:
            for path in ("/api/v1/vms", "/api/v1/events", "/metrics"):
                r = await h.client.get(path)
                assert r.status_code == 401, path
            auth = {"Authorization": "Bearer s3cret"}
            r = await h.client.get("/metrics", headers=auth)
            assert r.status_code == 200
            r = await h.client.get("/api/v1/vms", headers={**auth, "Host": "rebound.example"})
            assert r.status_code == 421
            r = await h.client.post(
                "/api/v1/vms/x/select", headers={**auth, "Origin": "http://rebound.example"}
            )
            assert r.status_code == 403
            # The CLI: Host 127.0.0.1:PORT, no Origin, the token from its config file.
            h.config_file.write_text('[control]\ntoken = "s3cret"\n')
            result = await h.cli("clients", "--json")
            assert result.exit_code == 0, result.output
            assert result.stdout.strip() == "[]"

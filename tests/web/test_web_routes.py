"""The web page and heap picture routes of the control API, in-process (httpx.ASGITransport)."""

from __future__ import annotations

import io
import json
import re
from collections.abc import AsyncIterator

import httpx
import pytest
from PIL import Image

from ddmd.control.app import create_app
from ddmd.control.heapimage import FREE_RGB, legend
from ddmd.control.web import ASSET_NAMES, load_assets
from tests.control.fakes import HPSG_UNITS, FakeVm, heap_image, make_registry

BASE = "http://127.0.0.1:8710"


@pytest.fixture
def vms() -> dict[str, FakeVm]:
    app = FakeVm.android()
    app.images = (heap_image(),)
    return {
        "app": app,
        "fresh": FakeVm.android(
            "emulator-5554/2000", app="com.example.fresh", package="com.example.fresh"
        ),
        "jvm": FakeVm.plain_jvm(),
    }


@pytest.fixture
async def client(vms: dict[str, FakeVm]) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(make_registry(*vms.values()))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE) as c:
        yield c


# ------------------------------------------------------------------------------------ page


async def test_index_is_served(client):
    for path in ("/", "/index.html"):
        r = await client.get(path)
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/html; charset=utf-8"
        assert "<title>ddmd</title>" in r.text
        assert '<script src="/static/app.js"' in r.text
        csp = r.headers["content-security-policy"]
        assert "default-src 'none'" in csp
        assert "connect-src 'self'" in csp
        assert r.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize(
    ("name", "media_type"),
    [
        ("app.js", "text/javascript; charset=utf-8"),
        ("style.css", "text/css; charset=utf-8"),
        ("index.html", "text/html; charset=utf-8"),
        ("favicon.svg", "image/svg+xml"),
    ],
)
async def test_static_files(client, name, media_type):
    r = await client.get(f"/static/{name}")
    assert r.status_code == 200
    assert r.headers["content-type"] == media_type
    assert r.content == load_assets()[name].body
    assert r.headers["cache-control"] == "no-cache"


async def test_unknown_static_file_is_404(client):
    for path in ("/static/nope.js", "/static/..%2Fcontrol.py", "/static/../control.py"):
        r = await client.get(path)
        assert r.status_code == 404, path
    r = await client.get("/static/secret.txt")
    assert r.json()["error"] == "no page file 'secret.txt'"


# Any scheme://, protocol-relative //host, or @import / url() pointing off-site.
_EXTERNAL = re.compile(r"(?i)\b(?:https?|wss?|ftp):|[\"'(=]\s*//[^/\s]")


def test_assets_reference_no_other_origin():
    for name, asset in load_assets().items():
        # The SVG namespace is a name, never fetched.
        text = asset.body.decode().replace('xmlns="http://www.w3.org/2000/svg"', "")
        assert not _EXTERNAL.search(text), (name, _EXTERNAL.search(text))
        assert "@import" not in text, name
        assert "@font-face" not in text, name
    assert set(ASSET_NAMES) == {"index.html", "app.js", "style.css", "favicon.svg"}


def test_page_never_writes_vm_text_as_html():
    js = load_assets()["app.js"].body.decode()
    for unsafe in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
        assert unsafe not in js, unsafe
    # Every request goes to this origin's API.
    for url in re.findall(r"fetch\(([^,)]+)", js):
        assert url.strip().startswith("API +"), url
    assert 'new EventSource(API + "/events")' in js
    html = load_assets()["index.html"].body.decode()
    assert "<script>" not in html
    assert "style=" not in html


# ------------------------------------------------------------------------------------ heap.png


async def test_heap_png(client):
    r = await client.get("/api/v1/vms/emulator-5554/1234/heap.png")
    assert r.status_code == 200
    assert r.headers["content-type"] == "image/png"
    picture = Image.open(io.BytesIO(r.content))
    # 278 units in 8x8 cells, 64 a row: 5 rows.
    assert picture.size == (512, 40)
    assert picture.convert("RGBA").getpixel((4 * 8 + 4, 4)) == (*FREE_RGB, 255)  # units 4-5
    layout = json.loads(r.headers["x-heap-layout"])
    assert layout["width"] == 512
    assert layout["height"] == 40
    assert layout["cell"] == 8
    assert layout["low"] == 0x1000_0000
    assert layout["high"] == 0x1000_0000 + HPSG_UNITS * 8
    assert r.headers["x-heap-id"] == "1"
    assert r.headers["x-heap-complete"] == "1"
    etag = r.headers["etag"]
    assert etag.startswith('"')
    assert etag.endswith('"')

    again = await client.get(
        "/api/v1/vms/emulator-5554/1234/heap.png", headers={"If-None-Match": etag}
    )
    assert again.status_code == 304
    assert again.content == b""
    assert again.headers["etag"] == etag


async def test_heap_png_size_and_heap_parameters(client):
    r = await client.get("/api/v1/vms/emulator-5554/1234/heap.png?width=64&height=2&heap=1")
    assert r.status_code == 200
    assert Image.open(io.BytesIO(r.content)).size == (64, 2)  # 278 units, 3 a pixel
    assert json.loads(r.headers["x-heap-layout"])["units_per_pixel"] == 3
    for query in ("width=8", "width=abc", "height=0", "height=99999", "heap=-1"):
        bad = await client.get(f"/api/v1/vms/emulator-5554/1234/heap.png?{query}")
        assert bad.status_code == 400, query
        assert "query parameter" in bad.json()["error"]
    missing = await client.get("/api/v1/vms/emulator-5554/1234/heap.png?heap=7")
    assert missing.status_code == 404
    assert "of heap 7" in missing.json()["error"]


async def test_heap_png_without_a_dump_is_json_404(client):
    r = await client.get("/api/v1/vms/com.example.fresh/heap.png")
    assert r.status_code == 404
    assert r.headers["content-type"] == "application/json"
    assert "no heap dump" in r.json()["error"]
    r = await client.get("/api/v1/vms/nobody/heap.png")
    assert r.status_code == 404
    assert "candidates" in r.json()


async def test_heap_dump_then_png(client, vms):
    r = await client.post("/api/v1/vms/com.example.fresh/heap/dump")
    assert r.status_code == 200
    body = r.json()
    assert vms["fresh"].segment_requests == 1
    (image,) = body["images"]
    assert "segments" not in image
    assert image["summary"]["bytes_free"] == 56
    assert body["vm"]["id"] == "emulator-5554/2000"
    png = await client.get("/api/v1/vms/com.example.fresh/heap.png")
    assert png.status_code == 200
    assert png.headers["content-type"] == "image/png"


async def test_heap_dump_needs_post_and_support(client):
    r = await client.get("/api/v1/vms/emulator-5554/1234/heap/dump")
    assert r.status_code == 405
    assert r.headers["allow"] == "POST"
    r = await client.post("/api/v1/vms/tcp:8000/heap/dump")
    assert r.status_code == 501


async def test_heap_legend_route(client):
    r = await client.get("/api/v1/heap/legend")
    assert r.status_code == 200
    assert r.json() == legend()

"""The layer rule: importing ddmd.protocol loads none of trio, structlog, adbutils (style.md)."""

from __future__ import annotations

import subprocess
import sys

FORBIDDEN = ("trio", "structlog", "adbutils", "httpx", "hypercorn", "starlette", "socket")


def test_protocol_import_loads_no_io_libraries():
    code = (
        "import sys\n"
        "import ddmd.protocol, ddmd.protocol.jdwp, ddmd.protocol.ddm, ddmd.protocol.heap,"
        " ddmd.protocol.idmap, ddmd.protocol.errors, ddmd.protocol.adbwire,"
        " ddmd.protocol.adbrequests\n"
        f"bad = [m for m in {FORBIDDEN!r} if m in sys.modules]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "", f"ddmd.protocol pulled in: {out.stdout.strip()}"


def test_the_check_can_fail():
    # Guard against a vacuous test: the same probe does see trio once trio is imported.
    code = "import sys, trio\nprint('trio' in sys.modules)\n"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "True"

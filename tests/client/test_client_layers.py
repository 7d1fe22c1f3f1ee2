"""Layer rules of ddmd.client and ddmd.sysmon: a client program loads nothing of the daemon, and
the SMON codec (which the daemon's handler imports) loads no trio."""

from __future__ import annotations

import subprocess
import sys

from tests.test_layers import PACKAGE, ddmd_imports

ALLOWED = {
    "client": ("ddmd.protocol", "ddmd.client", "ddmd.__version__"),
    # the command line reads ddmd's config (its scan range) and sets up ddmd's logs
    "sysmon": (
        "ddmd.protocol",
        "ddmd.client",
        "ddmd.sysmon",
        "ddmd.config",
        "ddmd.logs",
        "ddmd.errors",
        "ddmd.cli.client.config_option",
        # `ddmd sysmon --show` is a client command: the CLI's API plumbing and its output
        "ddmd.cli.client",
        "ddmd.cli.format",
        # the server side (sysmon/handler.py) is a chunk handler built only on ddmd.ext
        "ddmd.ext",
    ),
}


def test_what_the_client_and_sysmon_import():
    offending = {}
    for folder, allowed in ALLOWED.items():
        for path in sorted((PACKAGE / folder).glob("*.py")):
            bad = sorted(n for n in ddmd_imports(path) if not n.startswith(allowed))
            if bad:
                offending[f"{folder}/{path.name}"] = bad
    assert offending == {}


def test_the_scan_sees_imports():
    # The rule above can fail: the monitor does import the client library.
    assert "ddmd.client.DdmClient" in ddmd_imports(PACKAGE / "sysmon" / "client.py")


def _loaded(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return out.stdout.strip()


def test_importing_the_client_loads_nothing_of_the_daemon():
    heavy = "('ddmd.daemon', 'ddmd.session', 'ddmd.drive', 'ddmd.control', 'ddmd.sim', 'ddmd.cli')"
    code = f"import sys, ddmd.client\nprint(','.join(m for m in {heavy} if m in sys.modules))\n"
    assert _loaded(code) == ""


def test_the_report_codec_loads_no_trio():
    code = (
        "import sys, ddmd.sysmon\n"
        "print(','.join(m for m in ('trio', 'structlog', 'ddmd.client') if m in sys.modules))\n"
    )
    assert _loaded(code) == ""

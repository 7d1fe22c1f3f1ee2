"""Layer rules of the folders (style.md section 2) that a moved import could silently break."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import ddmd

PACKAGE = Path(ddmd.__file__).resolve().parent


def ddmd_imports(path: Path) -> set[str]:
    """Every ``ddmd...`` name a file imports (module.name), at the top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("ddmd"))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ddmd"):
            # ``from ddmd import daemon`` imports ddmd.daemon: name what was imported.
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_the_simulator_imports_only_the_protocol():
    # `sim/demo.py` wires the simulator to the daemon: the one exception, by design.
    offending = {
        path.name: sorted(
            name
            for name in ddmd_imports(path)
            if not name.startswith(("ddmd.protocol", "ddmd.sim"))
        )
        for path in sorted((PACKAGE / "sim").glob("*.py"))
        if path.name != "demo.py"
    }
    assert {name: bad for name, bad in offending.items() if bad} == {}


def test_the_import_scan_sees_the_demo_wiring():
    # The scan above can fail: the demo module does import the daemon.
    assert "ddmd.daemon" in ddmd_imports(PACKAGE / "sim" / "demo.py")


def test_importing_the_simulator_loads_nothing_of_the_daemon():
    code = (
        "import sys, ddmd.sim\n"
        "print(','.join(sorted(m for m in sys.modules if m.startswith('ddmd.')"
        " and not m.startswith(('ddmd.sim', 'ddmd.protocol')))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""


def test_client_commands_do_not_load_the_daemon_or_the_simulator():
    code = (
        "import sys, ddmd.cli\n"
        "heavy = ('ddmd.daemon', 'ddmd.sim', 'ddmd.control.app', 'trio', 'starlette')\n"
        "print(','.join(m for m in heavy if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""


def test_the_plugin_api_imports_nothing_of_the_daemon():
    # ddmd.ext is what plugins import: it must stay light and stable (standard library only).
    offending = {
        path.name: sorted(n for n in ddmd_imports(path) if not n.startswith("ddmd.ext"))
        for path in sorted((PACKAGE / "ext").glob("*.py"))
    }
    assert {name: bad for name, bad in offending.items() if bad} == {}
    code = (
        "import sys, ddmd.ext\n"
        "print(','.join(m for m in ('trio', 'structlog', 'ddmd.session', 'ddmd.daemon')"
        " if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == ""

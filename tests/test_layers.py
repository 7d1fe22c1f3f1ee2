"""Layer rules of the folders (style.md section 2) that a moved import could silently break:
every module and package of ``ddmd/`` stands on a floor and imports only from floors below it,
no modules import each other in a circle, and the light parts (the simulator, the plugin API,
the command-line client) stay light."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Final

import ddmd

PACKAGE = Path(ddmd.__file__).resolve().parent

#: The floor of every top-level module and package of ``ddmd/`` (``__init__`` is the package's
#: face: ``ddmd.__version__``). A module imports only from floors below its own (or from its own
#: package): ``protocol`` <- ``session`` <- ``drive`` <- ``discovery``/``control`` <- ``daemon``
#: <- ``cli`` (style.md section 2), with the small modules where their imports put them. A new
#: top-level module or folder fails `test_every_module_stands_on_a_floor` until it is placed here.
FLOORS: Final[Mapping[str, int]] = {
    # The ground: nothing of ddmd.
    "__init__": 1,
    "protocol": 1,  # sans-IO wire formats
    "errors": 1,
    "logs": 1,
    "netaddr": 1,
    "notify": 1,
    "ext": 1,  # the plugin API: standard library only
    # Just above: each takes from the ground only.
    "host": 2,  # this machine's /proc and socket tables
    "session": 2,  # the sans-IO per-VM brain (protocol)
    "config": 2,  # (errors)
    "hotspot": 2,  # HotSpot's Attach API client (protocol.hsattach, errors)
    "client": 2,  # the DDM client library an app embeds (protocol)
    # What the drivers share.
    "registry": 3,  # (session's snapshots)
    "peers": 3,  # the peer-uid rule (host, config)
    "toolnames": 3,  # (host)
    "portbook": 3,  # (config)
    "instance": 3,  # one daemon per control port (config)
    "drive": 4,
    "logcat": 4,  # devices' logs (registry)
    "discovery": 5,  # (drive's messages)
    "control": 5,  # (drive, logcat)
    "front": 6,  # the adb front (discovery's adb server, drive)
    "daemon": 7,  # the wiring
    "cli": 8,  # the command line (starts the daemon by name)
    "sim": 8,  # the simulator; `sim.demo` wires it to the daemon
    "sysmon": 9,  # the system-monitor plugin and its command (cli, client, ext)
    "__main__": 9,  # python -m ddmd (cli)
}


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


def test_the_cli_and_its_help_load_no_command_module_nor_httpx_trio_structlog():
    # `ddmd --help` lists every command from cli.main's table: no command module is imported,
    # and nothing heavy (httpx and trio come with the commands that talk to the daemon).
    code = (
        "import sys, click, ddmd.cli\n"
        "from ddmd.cli.main import main\n"
        "ctx = click.Context(main, info_name='ddmd')\n"
        "text = main.get_help(ctx)\n"
        "assert 'clients' in text and 'logcat' in text and 'sim' in text, text\n"
        "completed = [item.value for item in main.shell_complete(ctx, '')]\n"
        "assert 'threads' in completed and 'trace-report' in completed, completed\n"
        "heavy = ('httpx', 'trio', 'structlog', 'ddmd.config', 'ddmd.cli.client',"
        " 'ddmd.cli.serve', 'ddmd.cli.profiling', 'ddmd.sim', 'ddmd.sysmon')\n"
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


# --------------------------------------------------------------------------------------------------
# Floors and circles


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES: Final = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported_module(name: str) -> str:
    """The module an imported name comes from: the longest start of it that is a module
    (``ddmd.config.Config`` -> ``ddmd.config``, ``ddmd.host.localproc`` -> itself)."""
    module = name
    while module and module not in MODULES:
        module = module.rpartition(".")[0]
    return module or name


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of ddmd it imports (at the top, inside a function, or for types)."""
    return {
        module: {imported_module(name) for name in ddmd_imports(path)} - {module}
        for module, path in MODULES.items()
    }


def top_level(module: str) -> str:
    """The top-level module or package of ``ddmd/`` that a module belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def arrows_up(graph: Mapping[str, Iterable[str]], floors: Mapping[str, int]) -> list[str]:
    """Each import that does not go to a lower floor (or within its own package)."""
    found = []
    for module, imported in sorted(graph.items()):
        for target in sorted(imported):
            here, there = top_level(module), top_level(target)
            if here != there and floors[there] >= floors[here]:
                found.append(f"{module} (floor {floors[here]}) -> {target} (floor {floors[there]})")
    return found


def circles(graph: Mapping[str, Iterable[str]]) -> list[frozenset[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_every_module_stands_on_a_floor():
    children = {path.stem for path in PACKAGE.glob("*.py")} | {
        path.name for path in PACKAGE.iterdir() if path.is_dir() and any(path.rglob("*.py"))
    }
    assert sorted(children - set(FLOORS)) == [], "place each new module or folder in FLOORS"
    assert sorted(set(FLOORS) - children) == [], "FLOORS names a module that is gone"


def test_no_import_goes_up_a_floor():
    assert arrows_up(import_graph(), FLOORS) == []


def test_no_import_circle():
    assert sorted(sorted(c) for c in circles(import_graph())) == []


def test_the_checks_see_an_arrow_up_and_a_circle():
    # A made-up house: the checks above can fail.
    graph = {
        "ddmd.low.a": {"ddmd.high.b"},  # up a floor
        "ddmd.high.b": {"ddmd.high.c"},
        "ddmd.high.c": {"ddmd.high.d"},
        "ddmd.high.d": {"ddmd.high.b", "ddmd.low.a"},  # b -> c -> d -> b
        "ddmd.high.e": {"ddmd.high.b"},  # into the circle, not part of it
    }
    assert arrows_up(graph, {"low": 1, "high": 2}) == [
        "ddmd.low.a (floor 1) -> ddmd.high.b (floor 2)"
    ]
    assert arrows_up(graph, {"low": 2, "high": 2}) == [
        "ddmd.high.d (floor 2) -> ddmd.low.a (floor 2)",
        "ddmd.low.a (floor 2) -> ddmd.high.b (floor 2)",
    ]
    assert circles(graph) == [
        frozenset({"ddmd.low.a", "ddmd.high.b", "ddmd.high.c", "ddmd.high.d"})
    ]
    assert circles({"x": {"y"}, "y": {"z"}, "z": set()}) == []


def test_the_graph_sees_imports_inside_functions_and_for_types():
    graph = import_graph()
    assert "ddmd.discovery.adbserver" in graph["ddmd.daemon"]  # inside run(): adbutils is slow
    assert "ddmd.protocol.sse" in graph["ddmd.cli.events"]  # inside a function: stays light
    assert "ddmd.config" in graph["ddmd.portbook"]  # ``from ddmd.config import``: the face ...
    assert "ddmd.config.schema" in graph["ddmd.config"]  # ... is a module of its own
    assert "ddmd.host.localproc" in graph["ddmd.peers"]  # ``from ddmd.host import localproc``

"""The plugin example of docs/plugins.md, run as written: its handler counts heap-info pushes
and publishes them, on a VM session (no event loop)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ddmd.protocol import ddm
from ddmd.session.commands import Publish, SendToVm
from ddmd.session.vm import SessionSettings, VmSession
from tests.session.test_handlers import ready
from tests.session.test_vm_session import ADDRESS, HEAP_INFO, Vm, push

PLUGINS_DOC = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"


def readme_plugin() -> str:
    text = PLUGINS_DOC.read_text()
    section = text[text.index("## Writing a chunk handler plugin") :]
    match = re.search(r"```python\n# ddmd_gcwatch.py\n(.*?)```", section, re.S)
    assert match, "the plugin example of docs/plugins.md is gone"
    return match.group(1)


def test_the_readme_plugin_counts_gcs_and_publishes() -> None:
    space: dict[str, Any] = {}
    exec(compile(readme_plugin(), "ddmd_gcwatch.py", "exec"), space)
    handler = space["make_handler"]()
    vm = Vm()
    vm.session = VmSession(
        "vm-1", source="tcp", address=ADDRESS, settings=SessionSettings(), handlers=[handler]
    )
    out = ready(vm)
    # Its own request: heap info at every GC, after ddmd's five set-up requests.
    sent = [c for c in out if isinstance(c, SendToVm)]
    assert ddm.raw_chunk(ddm.chunk_type_code("HPIF"), bytes([3])) in sent[-1].data
    commands = vm.session.handle(push(HEAP_INFO), 1.0) + vm.session.handle(push(HEAP_INFO), 2.0)
    published = [c for c in commands if isinstance(c, Publish)]
    # One heap-info push came during ready(), then two more.
    assert published[-1] == Publish("gcwatch", {"GCs seen": 3, "app": "com.example.mail"})

"""The "Writing a DDM client" example of docs/plugins.md, run as it is written (only its port
changed) in a child process, talked to over a raw JDWP connection, then stopped with SIGTERM."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import trio

from ddmd.protocol import ddm
from tests.actors.rawpeers import free_port_range
from tests.client.rawserver import RawServer, open_raw, type_code

PLUGINS_DOC = Path(__file__).resolve().parents[2] / "docs" / "plugins.md"
CAP = 20  # seconds


def example_code() -> str:
    """The first python block of the section "Writing a DDM client" of docs/plugins.md."""
    text = PLUGINS_DOC.read_text()
    section = text.split("\n## Writing a DDM client\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None, "no python example in the section of docs/plugins.md"
    return match.group(1)


def test_the_example_is_short() -> None:
    code = example_code()
    assert len(code.strip().splitlines()) <= 20
    assert "port=8000" in code


async def test_the_readme_example_runs(tmp_path: Path) -> None:
    (port,) = free_port_range(1)
    script = tmp_path / "echo.py"
    script.write_text(example_code().replace("port=8000", f"port={port}"))
    process = await trio.lowlevel.open_process(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},  # print() reaches the pipe at once
    )
    try:
        with trio.fail_after(CAP):
            stream = await open_raw(port)
            async with stream:
                server = RawServer(stream)
                # on_connected pushes a NOTE chunk.
                push = await server.push()
                assert ddm.chunks_of(push, ddm.Direction.FROM_VM) == (
                    ddm.UnknownChunk(type_code("NOTE"), b"hello"),
                )
                # ECHO requests are answered with the data reversed.
                assert await server.reply_chunks("ECHO", b"abc") == (
                    ddm.UnknownChunk(type_code("ECHO"), b"cba"),
                )
                (hello,) = await server.reply_chunks("HELO", b"\x00\x00\x00\x01")
                assert isinstance(hello, ddm.HeloReply)
                assert (hello.app_name, hello.pid) == ("com.example.echo", process.pid)
            assert process.stdout is not None
            out = b""
            while b"the DDM server left" not in out:
                chunk = await process.stdout.receive_some(4096)
                assert chunk, f"the example ended early: {out!r}"
                out += chunk
            process.send_signal(signal.SIGTERM)
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()

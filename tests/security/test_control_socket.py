"""The control API on its unix socket: private (0600 in a 0700 directory), used by the CLI when it
exists, and enough on its own with ``[control] tcp = false``."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest
import trio
from click.testing import CliRunner, Result
from structlog.testing import capture_logs

from ddmd import daemon
from ddmd.cli import main
from ddmd.sim import SimConfig, SimVm
from tests.actors.rawpeers import QUIET_SIM, free_port_range, make_config, wait_until

CAP = 30


@pytest.fixture
def run_dir() -> Iterator[Path]:
    # Short: a unix socket path has at most 107 bytes, and pytest's tmp_path can be long.
    base = Path(tempfile.mkdtemp(prefix="ddmd-s"))
    yield base / "run"
    shutil.rmtree(base, ignore_errors=True)


async def cli(*args: str) -> Result:
    runner = CliRunner()
    return await trio.to_thread.run_sync(partial(runner.invoke, main, list(args)))


def refused(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


async def test_cli_through_the_socket_with_tcp_off(tmp_path, run_dir) -> None:
    path = run_dir / "control.sock"
    (scan_port,) = free_port_range(1)
    config = make_config([scan_port], tmp_path, control={"tcp": False, "socket": str(path)})
    cli_config = tmp_path / "cli.toml"
    cli_config.write_text(
        f'[control]\nport = {config.control.port}\ntcp = false\nsocket = "{path}"\n'
    )
    # Logs captured: the daemon runs in this process, and the CLI runner takes stdout over.
    with capture_logs(), trio.fail_after(CAP):
        async with trio.open_nursery() as nursery, trio.open_nursery() as peers:
            started: daemon.Started = await nursery.start(
                partial(daemon.run, config, install_signal_handlers=False)
            )
            assert started.control is None
            assert started.control_socket == path
            assert stat.S_ISSOCK(os.stat(path).st_mode)
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
            assert stat.S_IMODE(os.stat(run_dir).st_mode) == 0o700
            assert refused(config.control.port), "no TCP listener with [control] tcp = false"
            await peers.start(SimVm(SimConfig(port=scan_port, **QUIET_SIM)).run)

            async def listed() -> list[dict[str, object]] | None:
                result = await cli("clients", "--json", "--config", str(cli_config))
                assert result.exit_code == 0, result.output
                vms = json.loads(result.stdout)
                return vms if vms else None

            vms = await wait_until(listed, 10, what="the VM listed through the socket")
            assert vms[0]["id"] == f"tcp:{scan_port}"
            result = await cli("select", f"tcp:{scan_port}", "--config", str(cli_config))
            assert result.exit_code == 0, result.output
            started.stop()
            peers.cancel_scope.cancel()
    assert not path.exists()
    # No daemon now: the message names the socket it tried.
    result = await cli("clients", "--config", str(cli_config))
    assert result.exit_code == 3
    assert f"unix socket {path}" in result.stderr


async def test_cli_prefers_the_socket_when_it_exists(tmp_path, run_dir) -> None:
    path = run_dir / "control.sock"
    (scan_port,) = free_port_range(1)
    config = make_config([scan_port], tmp_path, control={"socket": str(path)})
    # The CLI's config names a TCP port where nothing listens: only the socket can answer.
    (nothing,) = free_port_range(1)
    cli_config = tmp_path / "cli.toml"
    cli_config.write_text(f'[control]\nport = {nothing}\nsocket = "{path}"\n')
    # Logs captured: the daemon runs in this process, and the CLI runner takes stdout over.
    with capture_logs(), trio.fail_after(CAP):
        async with trio.open_nursery() as nursery:
            started: daemon.Started = await nursery.start(
                partial(daemon.run, config, install_signal_handlers=False)
            )
            assert started.control is not None
            result = await cli("clients", "--config", str(cli_config))
            assert result.exit_code == 0, result.output
            # --control asks for TCP explicitly: that address, not the socket.
            result = await cli(
                "clients", "--config", str(cli_config), "--control", f"127.0.0.1:{nothing}"
            )
            assert result.exit_code == 3
            started.stop()
    # The socket is gone with the daemon: the CLI goes to TCP (and finds nobody there).
    result = await cli("clients", "--config", str(cli_config))
    assert result.exit_code == 3
    assert f"127.0.0.1:{nothing}" in result.stderr

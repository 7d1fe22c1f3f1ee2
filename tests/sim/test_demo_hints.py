"""Issue 31, items 1 and 7: what ``ddmd demo`` says about its VMs and its simulated device.

The demo's own VMs are described as what they are, "simulated VMs on local ports: they have no
device log", never as workstation JVMs; with the device, the hints go through ddmd's adb front
(``adb -P FRONT devices``, a crash on request, ``jdb`` through a front forward) and name the
app to follow with ``ddmd logcat``.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import replace

from ddmd.config import load_config
from ddmd.sim import demo
from ddmd.sim.demodevice import DeviceInfo

DEVICE = DeviceInfo(
    adb_port=41001,
    serial="127.0.0.1:41002",
    apps=("com.example.chat", "com.example.shop", "com.example.counter"),
    jvm_app="com.example.counter",
)


def config(monkeypatch):
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    base = load_config(None, env=os.environ)
    return demo.device_config(base, DEVICE)


def test_the_demo_vms_are_simulated_vms_on_local_ports_without_a_device_log(monkeypatch):
    lines = demo.hint_lines(config(monkeypatch), 18700, device=DEVICE)
    text = "\n".join(lines)
    assert "# The VMs above are simulated VMs on local ports: they have no device log" in text
    assert "workstation" not in text.lower()


def test_the_device_hints_go_through_the_front_on_its_own_port(monkeypatch):
    cfg = config(monkeypatch)
    front = cfg.front.port
    assert front not in (5037, 5038)
    assert cfg.adb.port == DEVICE.adb_port
    assert cfg.adb.enabled == "on"
    lines = demo.hint_lines(cfg, 18700, device=DEVICE)
    assert f"adb -P {front} devices" in lines
    assert "ddmd logcat com.example.chat" in lines
    assert "ddmd events --type app.crashed" in lines
    crash = next(line for line in lines if " shell demo crash " in line)
    assert shlex.split(crash, comments=True) == [
        "adb", "-P", str(front), "shell", "demo", "crash", "com.example.chat"
    ]  # fmt: skip
    forward = next(line for line in lines if " forward tcp:" in line)
    local = forward.split("tcp:")[1].split()[0]
    assert forward.endswith(f"jdwp:{demo.JVM_PID}")
    jdb = lines[lines.index(forward) + 1]
    assert jdb.startswith(f"jdb -attach localhost:{local} ")
    commands = [line for line in lines if not line.startswith("#")]
    assert all(shlex.split(c, comments=True)[0] in ("ddmd", "jdb", "adb") for c in commands)


def test_without_the_device_there_are_no_device_hints(monkeypatch):
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    base = load_config(None, env=os.environ)
    lines = demo.hint_lines(replace(base), 18700)
    assert not [line for line in lines if line.startswith("adb ")]

"""Every device's log: one ``DeviceLogcat`` per online device, made when a viewer first asks
for it (or for every device with ``[logcat] keep``), each running in the hub's nursery.

Layer: trio, structlog, the registry (which devices are online, which pids are which apps)
and ``device.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import trio

from ddmd.logcat.device import DeviceCounts, DeviceLogcat, LogcatSettings, Opener
from ddmd.registry import VmRegistry

__all__ = ["LogcatHub", "NoLog"]

ONLINE = "device"


class NoLog(Exception):
    """There is no log to show: a sentence for users (not an Android device, not online)."""


class LogcatHub:
    def __init__(
        self,
        registry: VmRegistry,
        opener: Opener,
        settings: LogcatSettings,
        publish: Callable[[str, dict[str, Any]], None],
    ) -> None:
        self._registry = registry
        self._opener = opener
        self.settings = settings
        self._publish = publish
        self._devices: dict[str, DeviceLogcat] = {}
        self._nursery: trio.Nursery | None = None

    def statistics(self) -> dict[str, dict[str, Any]]:
        return {
            serial: {
                "streaming": d.streaming,
                "viewers": d.viewers,
                "entries": d.stats.entries,
                "opens": d.stats.opens,
                "problems": dict(d.stats.problems),
            }
            for serial, d in self._devices.items()
        }

    def counts(self, apps: Mapping[str, Iterable[str]]) -> list[DeviceCounts]:
        """Every device log's counts for /metrics, by serial; ``apps``: serial -> the apps of
        ddmd's VMs on it now (counted from now on, ``DeviceLogcat.counts``)."""
        now = time.monotonic()
        return [
            self._devices[serial].counts(apps.get(serial, ()), now)
            for serial in sorted(self._devices)
        ]

    async def run(self) -> None:
        """Serve devices' logs until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            try:
                if self.settings.keep:
                    with self._registry.subscribe(self._on_registry):
                        for device in self._registry.devices():
                            self._on_registry("device", device.serial)
                        await trio.sleep_forever()
                await trio.sleep_forever()
            finally:
                self._nursery = None

    def _on_registry(self, kind: str, key: str) -> None:
        if kind == "device" and self._online(key):
            self.device(key)

    def _online(self, serial: str) -> bool:
        return any(d.serial == serial and d.state == ONLINE for d in self._registry.devices())

    def device(self, serial: str) -> DeviceLogcat:
        """The log of ``serial`` (started on first use); NoLog when it cannot be shown."""
        found = self._devices.get(serial)
        if found is not None:
            return found
        if self._nursery is None:
            raise NoLog("ddmd is not reading device logs (it is stopping)")
        if not self._online(serial):
            raise NoLog(f"device {serial} is not online (see `ddmd devices`)")
        device = DeviceLogcat(
            serial, self._opener, self.settings, lambda: self._apps_on(serial), self._publish
        )
        self._devices[serial] = device
        self._nursery.start_soon(device.run)
        return device

    def _apps_on(self, serial: str) -> dict[int, str]:
        """pid -> package (or app) of ddmd's VMs on ``serial`` now."""
        out: dict[int, str] = {}
        for snap in self._registry.snapshots():
            if snap.device == serial and snap.pid is not None:
                name = snap.package or snap.app
                if name and not name.startswith("<"):
                    out[snap.pid] = name
        return out

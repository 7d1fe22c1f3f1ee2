"""``ddmd demo``: the daemon plus three simulated VMs, for a first look without a device.

Layer: imports daemon, config, errors and the simulator (`sim.config`, `sim.vm`): the one
module of `ddmd.sim` that knows the daemon, wiring both into one trio run. The simulated
VMs listen on free ports inside the configured scan range, so the daemon finds them exactly as
it finds real VMs: an app on ART 9+ (the sim's default flavour: requests with nothing to say
get no reply at all), a Dalvik-era app in the 2007 draft formats (empty replies), and an
Android 12+ app whose thread and heap handlers are gone (ddmd shows that plainly). All three
can be method-traced; the first two also give heap dumps and allocation lists, and the
Android 12+ app lacks those handlers, as a current phone does (`ddmd.sim.ddms`).

What it prints (stderr): one line naming the VMs' ports, then, once the daemon has found and
named the three VMs (at most `HINTS_WAIT` seconds), the commands to try and the web page's
address, last, so that they do not scroll away. The log stays at warning level unless ``-v``
(``ddmd demo`` in ``cli.main``).

adb: the demo needs no device of the user's and never touches the user's adb server. When the
``adb`` program is there and ``[adb] enabled`` is ``"auto"`` (the default) it runs a simulated
Android device (`ddmd.sim.demodevice`: a private adb server on a free port that adopts a
`FakeDevice` with three debuggable apps) and its daemon with ``[adb]`` at that server and the
adb front on a free port of its own (`device_config`); the hints then show the device's
commands. Without adb (or when the device cannot start) adb is off, and the first line says
how to get the device. With ``"off"`` the demo runs no adb at all. With ``"on"`` the user's
adb server is used, with no simulated device, and one that did not answer before the demo
but answers when it ends was started by it: the demo stops it (``host:kill``, what ``adb
kill-server`` sends).
"""

from __future__ import annotations

import os
import shlex
import shutil
import socket
from dataclasses import replace
from pathlib import Path

import click
import trio

from ddmd import daemon
from ddmd.config import Config, find_config_file, is_loopback_host
from ddmd.errors import ConfigError
from ddmd.protocol.adbrequests import request
from ddmd.registry import VmRegistry
from ddmd.sim.config import SimConfig
from ddmd.sim.demodevice import JVM_APP, DemoDevice, DeviceInfo, pick_port
from ddmd.sim.vm import SimVm

MAIL = "com.example.mail"
#: Seconds to wait for the daemon to name the demo's VMs before the hints are printed anyway.
HINTS_WAIT = 15.0
#: Seconds for one exchange with the adb server (is one there? stop it).
ADB_TIMEOUT = 2.0
_UNNAMED = ("", "<pre-initialized>")
JVM_PID = JVM_APP[1]
#: What the demo's own VMs are (not workstation JVMs, not on a device).
LOCAL_VMS = "simulated VMs on local ports: they have no device log"

DEMO_VMS = (
    # ART 9+ (flavor "art", the default)
    SimConfig(pid=3101, app_name=MAIL, package_name=MAIL),
    # Dalvik, speaking the 2007 draft formats
    SimConfig(
        pid=3102,
        app_name="com.example.notes",
        package_name="com.example.notes",
        vm_ident="Dalvik v1.6.0",
        flavor="legacy",
        draft=True,
        abi="32-bit (arm)",
        apnm_delay=2.0,
    ),
    SimConfig(
        pid=3103,
        app_name="com.example.maps:remote",
        package_name="com.example.maps",
        flavor="modern",  # Android 12+
        abi="64-bit (arm64)",
    ),
)


def free_scan_ports(config: Config, count: int) -> list[int]:
    """The first ``count`` ports of the scan range where nothing listens yet."""
    found: list[int] = []
    for port in config.scan.ports:
        with socket.socket() as probe:
            try:
                probe.bind((config.scan.host, port))
            except OSError:
                continue
        found.append(port)
        if len(found) == count:
            return found
    raise click.ClickException(
        f"the scan range {config.scan.ports} has fewer than {count} free ports for the demo VMs; "
        "set [scan] ports in the config file to a range with free ports"
    )


def demo_config(config: Config) -> Config:
    """The config the demo runs: adb off unless the config file turns it on explicitly."""
    if config.adb.enabled == "auto":
        return replace(config, adb=replace(config.adb, enabled="off"))
    return config


async def run_demo(
    config: Config,
    *,
    install_signal_handlers: bool = True,
    task_status: trio.TaskStatus[daemon.Started] = trio.TASK_STATUS_IGNORED,
) -> None:
    """The demo until the daemon stops (SIGINT/SIGTERM, unless ``install_signal_handlers`` is
    false: then the caller stops it with the `daemon.Started` it is given, as `daemon.run`)."""
    # The simulated device only with adb "auto" (the default): "off" means no adb at all.
    wanted = config.adb.enabled == "auto"
    adb = shutil.which(config.adb.path or "adb") if wanted else None
    config = demo_config(config)
    adb_was_up = await adb_server_answers(config) if _uses_local_adb(config) else None
    try:
        await _run(config, install_signal_handlers, task_status, (wanted, adb))
    finally:
        if adb_was_up is False:
            with trio.CancelScope(shield=True):
                await _stop_adb_server_if_up(config)


async def _run(
    config: Config,
    install_signal_handlers: bool,
    ready: trio.TaskStatus[daemon.Started],
    device_adb: tuple[bool, str | None],
) -> None:
    """``device_adb``: whether the simulated device is wanted, and the adb program for it."""
    wanted, adb = device_adb
    ports = free_scan_ports(config, len(DEMO_VMS))
    sims = [
        SimVm(replace(c, host=config.scan.host, port=p))
        for c, p in zip(DEMO_VMS, ports, strict=True)
    ]
    async with trio.open_nursery() as nursery:
        for sim in sims:
            await nursery.start(sim.run)
        device: DeviceInfo | None = None
        if adb is not None:
            failure: BaseException | None = None
            try:
                device = await nursery.start(DemoDevice(adb, shutil.which("java")).run)
            except* (OSError, trio.TooSlowError) as group:
                failure = _first_leaf(group)
            if failure is not None:
                said = str(failure) or "adb did not answer in time"
                click.echo(f"ddmd demo: no simulated Android device: {said}", err=True)
            if device is not None:
                config = device_config(config, device)

        async def daemon_then_stop(
            task_status: trio.TaskStatus[daemon.Started] = trio.TASK_STATUS_IGNORED,
        ) -> None:
            await daemon.run(
                config, install_signal_handlers=install_signal_handlers, task_status=task_status
            )
            # The daemon returns after SIGINT/SIGTERM; the simulated VMs go with it.
            nursery.cancel_scope.cancel()

        started: daemon.Started = await nursery.start(daemon_then_stop)
        ready.started(started)
        words = _device_words(device, wanted=wanted, adb=adb)
        click.echo(
            f"ddmd demo: {len(sims)} simulated VMs on {config.scan.host} ports "
            f"{', '.join(map(str, ports))} (no device log){words}; the commands to try follow "
            "once ddmd has found them",
            err=True,
        )
        # The hints come last: after the daemon has found and named every VM (its log lines
        # about them, if any are shown, come first).
        await _until_named(started.registry, [f"tcp:{port}" for port in ports], HINTS_WAIT)
        web = None
        if started.control is not None:
            host, port = started.control
            web = f"http://{f'[{host}]' if ':' in host else host}:{port}/"
        for line in hint_lines(config, started.current_port, web=web, device=device):
            click.echo(line, err=True)


def _first_leaf(error: BaseException) -> BaseException:
    while isinstance(error, BaseExceptionGroup):
        error = error.exceptions[0]
    return error


def device_config(config: Config, device: DeviceInfo) -> Config:
    """The demo's config with its device: [adb] on, at the private server; the adb front on
    a port of its own."""
    front = config.front
    if front.enabled:
        front = replace(front, host="127.0.0.1", port=pick_port())
    return replace(
        config,
        adb=replace(config.adb, enabled="on", host="127.0.0.1", port=device.adb_port),
        front=front,
    )


def _device_words(device: DeviceInfo | None, *, wanted: bool, adb: str | None) -> str:
    """The first line's words about the simulated device (or why there is none)."""
    if device is not None:
        return (
            f"; a simulated Android device {device.serial} with {len(device.apps)} apps, in a "
            f"private adb server on port {device.adb_port}"
        )
    if not wanted:
        return ""
    if adb is None:
        return (
            "; no simulated Android device: it needs adb (Debian/Ubuntu: apt install adb; "
            "or Android's platform-tools)"
        )
    return ""  # adb is there but the device did not start: said already


async def _until_named(registry: VmRegistry, ids: list[str], limit: float) -> None:
    """Until the registry knows every VM of ``ids`` ready and named, or ``limit`` s passed."""
    wake = [trio.Event()]

    def noticed(_kind: str, _key: str) -> None:
        wake[0].set()

    with registry.subscribe(noticed), trio.move_on_after(limit):
        while not _all_named(registry, ids):
            await wake[0].wait()
            wake[0] = trio.Event()


def _all_named(registry: VmRegistry, ids: list[str]) -> bool:
    for vm_id in ids:
        handle = registry.get(vm_id)
        if handle is None:
            return False
        snapshot = handle.snapshot()
        if snapshot.state != "ready" or (snapshot.app or "") in _UNNAMED:
            return False
    return True


def hint_lines(
    config: Config,
    current_port: int,
    *,
    web: str | None = None,
    device: DeviceInfo | None = None,
) -> list[str]:
    """What to try next: one command per line, ready to paste into a shell; the web page's
    address (``web``) last.

    The only other lines are comments starting with '#'. The client commands name the
    config file when they would not find the demo's one by themselves.
    """
    option = _config_option(config)
    if web is not None:
        last = f"# Or open the web page: {web}  (Ctrl-C here stops the demo)"
    else:
        last = "# No web page: [control] tcp is off (Ctrl-C here stops the demo)"
    return [
        "# In another terminal, try:",
        f"ddmd clients{option}",
        f"ddmd threads {MAIL}{option}",
        f"ddmd heap {MAIL}{option} --segments",
        f"ddmd stack {MAIL} 1{option}",
        f"ddmd gc {MAIL}{option}",
        f"ddmd attach {MAIL}{option}",
        # Three VMs and none selected: the current-VM port turns a debugger away until then.
        f"# port {current_port}: no current VM \u2014 'ddmd select TARGET', e.g.:",
        f"ddmd select {MAIL}{option}",
        f"jdb -attach localhost:{current_port}",
        *device_hint_lines(config, device, option),
        last,
    ]


def device_hint_lines(config: Config, device: DeviceInfo | None, option: str) -> list[str]:
    """The simulated Android device's commands: adb through ddmd's front, the log of an app,
    a crash on request, its event, and jdb on the device's JVM app through a front forward."""
    if device is None or not config.front.enabled:
        return []
    front = config.front.port
    app = device.apps[0]
    lines = [
        f"# The VMs above are {LOCAL_VMS}; the device's apps have one.",
        f"# The simulated Android device, through ddmd's adb front (port {front}):",
        f"adb -P {front} devices",
        f"ddmd logcat {app}{option}",
        f"adb -P {front} shell demo crash {app}    # or native-crash, anr, restart",
        f"ddmd events --type app.crashed{option}",
    ]
    if device.jvm_app is not None:
        local = pick_port()
        lines += [
            f"# {device.jvm_app} is a real JVM: its pid is in 'adb -P {front} jdwp'",
            f"adb -P {front} forward tcp:{local} jdwp:{JVM_PID}",
            f"jdb -attach localhost:{local}    # then: stop in DemoCounter.tick",
        ]
    return lines


# ------------------------------------------------------------------------------ adb server


def _uses_local_adb(config: Config) -> bool:
    """adb is on, for a server ddmd may start (only ever on a loopback host)."""
    return config.adb.enabled != "off" and is_loopback_host(config.adb.host)


async def _adb_exchange(config: Config, service: str) -> bytes | None:
    """Send one host request to the adb server; its 4-byte status, None when none answers."""
    try:
        with trio.fail_after(ADB_TIMEOUT):
            stream = await trio.open_tcp_stream(config.adb.host, config.adb.port)
            async with stream:
                await stream.send_all(request(service))
                status = b""
                while len(status) < 4:
                    data = await stream.receive_some(4 - len(status))
                    if not data:
                        break
                    status += data
                return status
    except (OSError, trio.TooSlowError, trio.BrokenResourceError):
        return None


async def adb_server_answers(config: Config) -> bool:
    """Whether an adb server answers ``host:version`` at ``[adb] host:port``."""
    return await _adb_exchange(config, "host:version") == b"OKAY"


async def _stop_adb_server_if_up(config: Config) -> None:
    """No adb server answered when the demo started: one that answers now was started by it
    (ddmd's discovery, logcat or adb front); stop it as ``adb kill-server`` would."""
    if not await adb_server_answers(config):
        return
    status = await _adb_exchange(config, "host:kill")
    where = f"{config.adb.host}:{config.adb.port}"
    if status == b"OKAY":
        click.echo(f"ddmd demo: stopped the adb server it started ({where})", err=True)
    else:
        click.echo(f"ddmd demo: could not stop the adb server it started ({where})", err=True)


def _config_option(config: Config) -> str:
    """The ``--config FILE`` option (with a leading space) when the client commands would
    otherwise read another config file than the demo's, else ""."""
    source = config.source
    if source is None or source.startswith("<"):  # the built-in defaults
        return ""
    try:
        found = find_config_file(None, os.environ)
    except ConfigError:
        found = None
    path = Path(source).resolve()
    if found is not None and found.resolve() == path:
        return ""
    return f" --config {shlex.quote(str(path))}"

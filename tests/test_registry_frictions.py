"""Issue 20, part 2 (the frictions a new user hit), the registry's share, without I/O:

* item 1: exactly one VM known is the current VM (a selection of an app that is not running
  does not stand in its way); several and none selected: no current VM;
* item 5: a scan-range port is a target ("8001" means tcp:8001), beside the pid rule;
* item 6: ``--device nosuch`` says there is no such device (not "no VM matches 'mail'"
  followed by com.example.mail), and a VM without stack traces says so once, for a thread name
  as for an id (never "give a thread id" first);
* the adb server's state the API reports for ``ddmd devices``, and the current-VM port.
"""

from __future__ import annotations

import pytest

from ddmd.errors import FeatureUnsupported, TargetError
from ddmd.registry import VmRegistry, VmSnapshot, no_stack_traces, resolve_thread
from tests.control.fakes import FakeVm, make_registry, make_snapshot, sample_threads

MAIL = "com.example.mail"
MAPS = "com.example.maps:remote"
THREAD_HANDLERS_GONE = "no answer within 5 s; newer Android versions removed the thread handlers"


def app(vm_id: str, name: str, **fields: object) -> FakeVm:
    return FakeVm.android(vm_id, app=name, package=name.partition(":")[0], **fields)


def current_id(registry: VmRegistry) -> str | None:
    handle = registry.current()
    return None if handle is None else handle.vm_id


# ------------------------------------------------------------------------------ 1: the only VM


def test_the_only_vm_is_current_without_a_selection() -> None:
    registry = make_registry(app("tcp:8000", MAIL))
    assert registry.selected_key is None
    assert current_id(registry) == "tcp:8000"
    assert registry.is_current("tcp:8000")


def test_several_vms_and_none_selected_means_no_current_vm() -> None:
    registry = make_registry(app("tcp:8000", MAIL), app("tcp:8001", "com.example.notes"))
    assert current_id(registry) is None


def test_when_the_others_go_the_last_vm_becomes_current_and_is_announced() -> None:
    registry = make_registry(app("tcp:8000", MAIL), app("tcp:8001", "com.example.notes"))
    notices: list[tuple[str, str]] = []
    with registry.subscribe(lambda kind, vm: notices.append((kind, vm))):
        registry.remove("tcp:8001")
    assert current_id(registry) == "tcp:8000"
    assert ("current", "tcp:8000") in notices


def test_a_selected_app_that_is_not_running_does_not_hide_the_only_vm() -> None:
    registry = make_registry(app("tcp:8000", MAIL), app("tcp:8001", "com.example.notes"))
    registry.select("tcp:8001")
    registry.remove("tcp:8001")  # the chosen app is gone; the choice stays with its name
    assert registry.selected_key is not None
    assert current_id(registry) == "tcp:8000"


def test_the_current_port_is_unknown_until_the_daemon_sets_it() -> None:
    registry = VmRegistry()
    assert registry.current_port is None
    registry.current_port = 8700
    assert registry.current_port == 8700


# ------------------------------------------------------------------------------ 5: port targets


def test_a_scan_port_is_a_target() -> None:
    registry = make_registry(app("tcp:8000", MAIL, pid=3101), app("tcp:8001", MAPS, pid=3103))
    assert registry.resolve("8001").vm_id == "tcp:8001"
    assert registry.resolve(" 8000 ").vm_id == "tcp:8000"
    # The pid still works, and an adb VM's id is not a port.
    assert registry.resolve("3101").vm_id == "tcp:8000"
    adb = make_registry(FakeVm.android("emulator-5554/8001"))
    assert adb.resolve("8001").vm_id == "emulator-5554/8001"  # its pid, not a port


def test_a_port_and_another_vms_pid_are_ambiguous() -> None:
    registry = make_registry(app("tcp:8000", MAIL, pid=8001), app("tcp:8001", MAPS, pid=3103))
    with pytest.raises(TargetError) as err:
        registry.resolve("8001")
    assert err.value.ambiguous
    assert len(err.value.candidates) == 2


def test_select_by_port() -> None:
    registry = make_registry(app("tcp:8000", MAIL), app("tcp:8001", MAPS))
    registry.select(registry.resolve("8001").vm_id)
    assert current_id(registry) == "tcp:8001"


# ------------------------------------------------------------------------------ 6: --device


def test_an_unknown_device_is_named_as_such() -> None:
    registry = make_registry(app("tcp:8000", MAIL), app("emulator-5554/1234", MAIL))
    registry.set_device("R58M", "device")
    with pytest.raises(TargetError) as err:
        registry.resolve("mail", device="nosuch")
    assert err.value.message == "no device nosuch (devices: R58M, emulator-5554)"
    assert err.value.candidates == ()  # not com.example.mail of another device


def test_an_unknown_device_without_any_device() -> None:
    registry = make_registry(app("tcp:8000", MAIL))
    with pytest.raises(TargetError) as err:
        registry.resolve("mail", device="nosuch")
    assert err.value.message == "no device nosuch (no adb device is known)"


def test_a_known_device_without_the_vm_lists_that_devices_vms() -> None:
    registry = make_registry(app("emulator-5554/1234", "com.example.other"), app("R58M/77", MAIL))
    with pytest.raises(TargetError) as err:
        registry.resolve("mail", device="emulator-5554")
    assert err.value.message == "no VM matches 'mail' on device emulator-5554"
    assert err.value.candidates == ("emulator-5554/1234 (pid 1234, com.example.other)",)
    registry.set_device("emulator-5556", "device")  # listed by adb, no VM on it
    with pytest.raises(TargetError) as err:
        registry.resolve("mail", device="emulator-5556")
    assert err.value.message == (
        "no VM matches 'mail' on device emulator-5556 (ddmd knows no debuggable VM on it)"
    )


def test_the_device_narrows_a_match_as_before() -> None:
    registry = make_registry(app("emulator-5554/1234", MAIL), app("R58M/1234", MAIL))
    assert registry.resolve("mail", device="R58M").vm_id == "R58M/1234"
    assert registry.resolve("R58M/1234", device="nosuch").vm_id == "R58M/1234"  # exact id


# ------------------------------------------------------------------------------ 6: stacks


def android_12(**fields: object) -> VmSnapshot:
    """An Android 12+ VM as ddmd knows it once its thread request went unanswered."""
    defaults: dict[str, object] = {
        "app": MAPS,
        "package": "com.example.maps",
        "threads": None,
        "unsupported": ("THST",),
        "unsupported_reasons": (("THST", THREAD_HANDLERS_GONE),),
    }
    defaults.update(fields)
    return make_snapshot("tcp:8002", **defaults)


@pytest.mark.parametrize("thread", ["main", "1"])
def test_a_vm_without_thread_handlers_has_no_stack_traces_for_names_and_ids(thread: str) -> None:
    with pytest.raises(FeatureUnsupported) as err:
        resolve_thread(android_12(), thread)
    assert str(err.value) == (
        f"{MAPS} does not report stack traces (newer Android versions removed the thread handlers)"
    )
    assert "thread id" not in str(err.value)


def test_a_vm_whose_stkl_went_unanswered_says_it_in_its_own_sentence() -> None:
    snapshot = android_12(
        unsupported=("THST", "STKL"),
        unsupported_reasons=(("THST", THREAD_HANDLERS_GONE), ("STKL", THREAD_HANDLERS_GONE)),
    )
    message = f"{MAPS} does not report stack traces ({THREAD_HANDLERS_GONE})"
    assert no_stack_traces(snapshot) == message
    with pytest.raises(FeatureUnsupported, match="does not report stack traces"):
        resolve_thread(snapshot, "1")


def test_a_plain_jvm_has_no_stack_traces() -> None:
    snapshot = make_snapshot("tcp:8000", ddm=False, pid=4242, threads=sample_threads())
    with pytest.raises(FeatureUnsupported) as err:
        resolve_thread(snapshot, "main")
    assert str(err.value) == (
        "JVM pid 4242 does not speak DDM (a plain JVM has none), so it has no stack traces"
    )


def test_a_vm_with_threads_and_stacks_resolves_as_before() -> None:
    snapshot = make_snapshot("tcp:8000", app=MAIL, threads=sample_threads())
    assert no_stack_traces(snapshot) is None
    assert resolve_thread(snapshot, "main") == 1
    # A thread list not known yet, and nothing known missing: an id is sent as it is.
    fresh = make_snapshot("tcp:8002", app=MAPS, threads=None)
    assert resolve_thread(fresh, "5") == 5
    # THST missing but a thread list from THCR pushes: STKL may still answer.
    pushed = make_snapshot("tcp:8003", app=MAIL, threads=sample_threads(), unsupported=("THST",))
    assert resolve_thread(pushed, "main") == 1


# ------------------------------------------------------------------------------ adb server


def test_the_adb_servers_state_is_unknown_until_tried() -> None:
    registry = VmRegistry()
    assert registry.adb_server() is None
    registry.set_adb_server("127.0.0.1:5037", connected=True)
    assert registry.adb_server() == {"server": "127.0.0.1:5037", "connected": True}
    registry.set_adb_server("127.0.0.1:5037", connected=False)
    assert registry.adb_server() == {"server": "127.0.0.1:5037", "connected": False}

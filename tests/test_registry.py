"""VmRegistry without I/O: the current VM following the VM it was chosen as, target matching,
and thread arguments. The VMs are `FakeVm`s whose selection key the tests change by hand, the
way a VM actor's key changes when HELO or APNM names it."""

from __future__ import annotations

import pytest

from ddmd.errors import FeatureUnsupported, TargetError
from ddmd.registry import ThreadSnapshot, VmRegistry, VmSnapshot, resolve_thread
from tests.control.fakes import FakeVm, make_registry, make_snapshot, sample_threads

# ------------------------------------------------------------------------------ helpers


def unnamed(vm_id: str, **fields: object) -> FakeVm:
    """A DDM VM whose name is not known yet (selection key None), like one that sent WAIT
    before its HELO reply or APNM named it."""
    vm = FakeVm.android(vm_id, app="<pre-initialized>", package=None, **fields)
    assert vm.selection_key() is None
    return vm


def named(vm_id: str, name: str) -> FakeVm:
    return FakeVm.android(vm_id, app=name, package=name)


def rename(registry: VmRegistry, vm: FakeVm, name: str) -> None:
    """What the VM actor does when HELO/APNM names or renames its VM."""
    vm.update(app=name, package=name)
    registry.key_changed(vm.vm_id)


def current_id(registry: VmRegistry) -> str | None:
    handle = registry.current()
    return None if handle is None else handle.vm_id


class Notices:
    """Records the registry's change notices; `currents` are the "current" ones in order."""

    def __init__(self) -> None:
        self.all: list[tuple[str, str]] = []

    def __call__(self, kind: str, vm_id: str) -> None:
        self.all.append((kind, vm_id))

    @property
    def currents(self) -> list[str]:
        return [vm for kind, vm in self.all if kind == "current"]


# ------------------------------------------------------------------------------ the current VM


def test_waiting_vm_stays_current_when_helo_names_it() -> None:
    waiting = unnamed("emu/100")
    other = named("emu/200", "com.example.other")
    registry = make_registry(waiting, other)
    notices = Notices()
    with registry.subscribe(notices):
        registry.select("emu/100", reason="waiting for a debugger")
        assert registry.selected_key == "id|emu/100"
        assert current_id(registry) == "emu/100"

        rename(registry, waiting, "com.example.mail")  # the HELO reply names it

        assert current_id(registry) == "emu/100"
        assert registry.selected_key == "emu|com.example.mail"
    # It became current once and never stopped being current on the way.
    assert notices.currents == ["emu/100"]


def test_selection_follows_a_rename_by_apnm() -> None:
    vm = unnamed("emu/100")
    registry = make_registry(vm, named("emu/200", "com.example.other"))
    registry.select("emu/100")
    rename(registry, vm, "com.example.mail")
    rename(registry, vm, "com.example.mail:sync")  # APNM: renamed from one name to another
    assert current_id(registry) == "emu/100"
    assert registry.selected_key == "emu|com.example.mail:sync"


def test_key_changes_of_other_vms_leave_the_selection_alone() -> None:
    chosen = named("emu/100", "com.example.mail")
    later = unnamed("emu/200")
    registry = make_registry(chosen, later)
    registry.select("emu/100")
    rename(registry, later, "com.example.other")
    assert current_id(registry) == "emu/100"
    assert registry.selected_key == "emu|com.example.mail"


def test_selection_sticks_to_the_app_across_a_restart_with_a_new_pid() -> None:
    first = unnamed("emu/100")
    bystanders = [named("emu/300", "org.one"), named("emu/400", "org.two")]
    registry = make_registry(first, *bystanders)
    registry.select("emu/100", reason="waiting for a debugger")
    rename(registry, first, "com.example.mail")

    registry.remove("emu/100")  # the app exits
    assert current_id(registry) is None
    assert registry.selected_key == "emu|com.example.mail"  # the choice is kept

    again = unnamed("emu/500")  # it starts again: a new pid, no name yet
    registry.add(again)
    assert current_id(registry) is None
    rename(registry, again, "com.example.mail")
    assert current_id(registry) == "emu/500"

    # From now on the new process is the chosen VM: its own renames carry the selection.
    rename(registry, again, "com.example.mail:sync")
    assert current_id(registry) == "emu/500"
    assert registry.selected_key == "emu|com.example.mail:sync"


def test_a_new_app_reusing_the_vm_id_does_not_inherit_the_selection() -> None:
    # Workstation VMs are known by their port: after the chosen app exits, another program
    # can show up under the same id. The choice belongs to the app, not to the id.
    chosen = named("tcp:8000", "com.example.mail")
    registry = make_registry(chosen, named("tcp:8001", "org.one"))
    registry.select("tcp:8000")
    registry.remove("tcp:8000")
    newcomer = unnamed("tcp:8000")
    registry.add(newcomer)
    rename(registry, newcomer, "org.stranger")
    assert current_id(registry) is None
    assert registry.selected_key == "local|com.example.mail"


def test_user_choice_replaces_the_automatic_one() -> None:
    waiting = unnamed("emu/100")
    registry = make_registry(waiting, named("emu/200", "com.example.other"))
    registry.select("emu/100", reason="waiting for a debugger")
    registry.select("emu/200")
    rename(registry, waiting, "com.example.mail")
    assert current_id(registry) == "emu/200"
    assert registry.selected_key == "emu|com.example.other"


# ------------------------------------------------------------------------------ targets


@pytest.fixture
def targets() -> VmRegistry:
    return make_registry(
        named("emu/100", "com.example.mail"),
        named("emu/101", "com.example.mailer"),
        FakeVm.android("emu/102", app="com.example.app:remote", package="com.example.app"),
        named("R58/100", "org.other.app"),
        named("emu/103", "com.example.v104"),
        FakeVm.android("emu/104", app="com.example.v105", package="com.example.v105"),
        unnamed("emu/105"),
        FakeVm.plain_jvm("tcp:8000"),
    )


@pytest.mark.parametrize(
    ("target", "device", "expected", "rule"),
    [
        ("emu/100", None, "emu/100", "exact id"),
        ("tcp:8000", "R58", "tcp:8000", "an exact id needs no device"),
        ("4242", None, "tcp:8000", "pid"),
        ("104", None, "emu/104", "pid before any name containing it (com.example.v104)"),
        ("100", "R58", "R58/100", "pid on one device"),
        ("com.example.mail", None, "emu/100", "exact name, although mailer contains it"),
        ("com.example.app", None, "emu/102", "exact package"),
        ("com.example.app:remote", None, "emu/102", "exact app"),
        ("mail", None, "emu/100", "last dotted component"),
        (".mail", None, "emu/100", "suffix with its dot"),
        ("example.mail", None, "emu/100", "dotted suffix"),
        ("MAIL", None, "emu/100", "suffix ignoring case"),
        ("remote", None, "emu/102", "after the colon of a process name"),
        ("mailer", None, "emu/101", "suffix"),
        ("other", None, "R58/100", "part of a name"),
        ("Other.App", None, "R58/100", "part ignoring case"),
        ("v10", None, None, "ambiguous part: v104 and v105"),
    ],
)
def test_resolve_rules(
    targets: VmRegistry, target: str, device: str | None, expected: str | None, rule: str
) -> None:
    if expected is None:
        with pytest.raises(TargetError) as err:
            targets.resolve(target, device=device)
        assert err.value.ambiguous, rule
        return
    assert targets.resolve(target, device=device).vm_id == expected, rule


def test_the_first_rule_that_matches_decides(targets: VmRegistry) -> None:
    # "100" is a pid on two devices: ambiguous, even though no name contains it.
    with pytest.raises(TargetError) as err:
        targets.resolve("100")
    assert err.value.ambiguous
    assert err.value.message == "'100' matches several VMs"
    assert [c.split()[0] for c in err.value.candidates] == ["R58/100", "emu/100"]


def test_ambiguous_part_lists_only_the_matches(targets: VmRegistry) -> None:
    with pytest.raises(TargetError) as err:
        targets.resolve("exam")
    assert err.value.ambiguous
    ids = {c.split()[0] for c in err.value.candidates}
    assert ids == {"emu/100", "emu/101", "emu/102", "emu/103", "emu/104"}


def test_unknown_target_lists_every_vm(targets: VmRegistry) -> None:
    with pytest.raises(TargetError) as err:
        targets.resolve("zzz")
    assert not err.value.ambiguous
    assert err.value.message == "no VM matches 'zzz'"
    assert len(err.value.candidates) == len(targets)


def test_a_vm_without_a_name_is_never_matched_by_a_part(targets: VmRegistry) -> None:
    with pytest.raises(TargetError) as err:
        targets.resolve("pre-init")
    assert not err.value.ambiguous


def test_device_narrows_name_rules(targets: VmRegistry) -> None:
    with pytest.raises(TargetError):
        targets.resolve("mail", device="R58")
    assert targets.resolve("app", device="R58").vm_id == "R58/100"


# ------------------------------------------------------------------------------ threads

THREADS = (
    *sample_threads(),  # 1 main, 2 HeapTaskDaemon, 9 Binder:1234_1
    ThreadSnapshot(12, "Worker-2"),
    ThreadSnapshot(13, "Worker-3"),
    ThreadSnapshot(14, "main-loop"),
    ThreadSnapshot(15, "7"),
)


def snapshot(threads: tuple[ThreadSnapshot, ...] | None = THREADS) -> VmSnapshot:
    return make_snapshot("emu/100", threads=threads)


@pytest.mark.parametrize(
    ("thread", "expected"),
    [
        ("1", 1),
        ("9", 9),
        (" 13 ", 13),
        ("main", 1),  # exact name first, although "main-loop" contains it
        ("main-loop", 14),
        ("heap", 2),  # part of a name, ignoring case
        ("binder", 9),
        ("7", 15),  # no thread 7, but one is called "7"
    ],
)
def test_resolve_thread(thread: str, expected: int) -> None:
    assert resolve_thread(snapshot(), thread) == expected


def test_unknown_thread_id_lists_the_known_ids() -> None:
    with pytest.raises(TargetError) as err:
        resolve_thread(snapshot(), "77")
    assert err.value.message == "no thread 77 in VM emu/100"
    assert not err.value.ambiguous
    assert err.value.candidates[:3] == ("1 main", "2 HeapTaskDaemon", "9 Binder:1234_1")
    assert len(err.value.candidates) == len(THREADS)


def test_ambiguous_thread_name_lists_id_and_name() -> None:
    with pytest.raises(TargetError) as err:
        resolve_thread(snapshot(), "worker")
    assert err.value.ambiguous
    assert err.value.candidates == ("12 Worker-2", "13 Worker-3")


def test_unknown_thread_name() -> None:
    with pytest.raises(TargetError) as err:
        resolve_thread(snapshot(), "nope")
    assert err.value.message == "no thread named 'nope' in VM emu/100"
    assert not err.value.ambiguous


def test_without_a_thread_list_ids_pass_and_names_cannot_be_looked_up() -> None:
    assert resolve_thread(snapshot(None), "5") == 5
    with pytest.raises(FeatureUnsupported, match="does not report its threads"):
        resolve_thread(snapshot(None), "main")


@pytest.mark.parametrize("thread", ["4294967296", "99999999999999999999"])
def test_thread_id_out_of_range(thread: str) -> None:
    with pytest.raises(ValueError, match=r"not a number in 0\.\.4294967295"):
        resolve_thread(snapshot(None), thread)

"""Issue 31, item 6: one name and one label for each VM, from the daemon's snapshot, so the CLI
and the web page say the same: ART VMs are "ART", a plain JVM "OpenJDK 17.0.15", and a JVM
behind adb is "JVM pid N" as one on this computer is (never the JDWP banner's first line in
one place and an id in another)."""

from __future__ import annotations

from ddmd.cli.format import format_clients
from ddmd.cli.words import short_vm_name
from ddmd.session.model import VmSnapshot

HOTSPOT = (
    "Java Debug Wire Protocol (Reference Implementation) version 17.0\n"
    "JVM Debug Interface version 17.0\n"
    "JVM version 17.0.15 (OpenJDK 64-Bit Server VM, mixed mode, sharing)"
)
BANNER_ONLY = "Java Debug Wire Protocol (Reference Implementation) version 17.0"


def test_art_dalvik_and_openjdk_labels_come_with_the_snapshot():
    art = VmSnapshot("tcp:8000", "tcp", "127.0.0.1:8000", "ready", True, vm_ident="Dalvik v2.1.0")
    old = VmSnapshot("tcp:8001", "tcp", "127.0.0.1:8001", "ready", True, vm_ident="Dalvik v1.6.0")
    jvm = VmSnapshot("tcp:8002", "tcp", "127.0.0.1:8002", "ready", False, description=HOTSPOT)
    assert [s.to_json()["vm_label"] for s in (art, old, jvm)] == [
        "ART",
        "Dalvik",
        "OpenJDK 17.0.15",
    ]
    # `ddmd clients` prints the daemon's label, the one the web page shows.
    assert short_vm_name({**jvm.to_json(), "vm_label": "from the daemon"}) == "from the daemon"


def test_a_jvm_behind_adb_has_one_name_and_no_banner_for_a_label():
    behind = VmSnapshot(
        "emulator-5554/4242", "adb", "emulator-5554 jdwp:4242", "ready", False, pid=4242,
        description=BANNER_ONLY, device="emulator-5554",
    )  # fmt: skip
    body = behind.to_json()
    assert body["name"] == "JVM pid 4242"
    assert body["vm_label"] == "JVM (JDWP 17.0)"
    table = format_clients([{**body, "debuggers": []}])
    assert "Java Debug Wire Protocol" not in table
    assert "JVM pid 4242" in table

"""ddmd.toolnames: the program at the other end of a connection, by its command line."""

from __future__ import annotations

import os

import pytest
import trio

from ddmd.toolnames import peer_process, tool_name


@pytest.mark.parametrize(
    ("cmdline", "exe", "tool"),
    [
        (["/opt/android-studio/bin/studio"], None, "Android Studio"),
        (["/opt/android-studio/bin/studio.sh"], None, "Android Studio"),
        (
            ["/opt/android-studio/jbr/bin/java", "-Didea.platform.prefix=AndroidStudio", "x.Main"],
            None,
            "Android Studio",
        ),
        (["java", "-cp", "/x/com.android.tools.idea.jar", "Main"], None, "Android Studio"),
        (["/opt/idea/bin/idea", "--android"], None, "Android Studio"),
        (["/opt/jadx/bin/jadx-gui"], None, "jadx"),
        (["java", "-cp", "lib/jadx-1.5.0-all.jar", "jadx.gui.JadxGUI"], None, "jadx"),
        (["jdb", "-attach", "localhost:8700"], None, "jdb"),
        (["/usr/lib/jvm/java-17/bin/jdb", "-attach", "8700"], None, "jdb"),
        (["/proc/self/exe", "-attach", "8700"], "/usr/lib/jvm/java-17/bin/jdb", "jdb"),
        (["/usr/share/code/code", "--type=utility"], None, "VS Code"),
        (["node", "/home/u/.vscode/extensions/adelphes.android-dev-ext/out/x.js"], None, "VS Code"),
        (
            ["java", "-cp", "/usr/share/java/com.android.tools.ddms.ddmlib-25.2.2.jar:.", "Probe"],
            None,
            "java (ddmlib)",
        ),
        (["/usr/lib/android-sdk/platform-tools/adb", "-P", "5038", "kill-server"], None, "adb"),
        (["adb", "forward", "--list"], None, "adb"),
        (["java", "-jar", "/x/app.jar"], None, "java (app.jar)"),
        (["java", "com.example.Main"], None, "java (Main)"),
        (["/usr/bin/python3", "tool.py"], None, "python3"),
        ([], None, None),
        ([""], None, None),
    ],
)
def test_tool_names(cmdline, exe, tool):
    assert tool_name(cmdline, exe=exe) == tool


async def test_the_process_at_the_other_end_is_found():
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    async with trio.open_nursery() as nursery:
        client = await trio.open_tcp_stream("127.0.0.1", port)
        server = await listeners[0].accept()
        async with client, server:
            found = await peer_process(server)
            assert found is not None
            assert found.pid == os.getpid()
            assert found.uid == os.getuid()
            assert found.cmdline
            assert found.describe(20).endswith("...") or len(found.describe()) <= 20
        nursery.cancel_scope.cancel()
    await listeners[0].aclose()


async def test_a_gone_peer_is_none():
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    client = await trio.open_tcp_stream("127.0.0.1", port)
    server = await listeners[0].accept()
    await client.aclose()
    await server.aclose()
    assert await peer_process(server) is None  # closed socket: no addresses
    await listeners[0].aclose()

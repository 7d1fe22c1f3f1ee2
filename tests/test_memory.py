"""The daemon's one-malloc-arena setting (ddmd/memory.py), checked in a child process.

glibc's ``malloc_info`` lists one ``<heap nr=...>`` per arena: with the setting, threads that
allocate at the same time still share the one heap; without it, each new thread gets its own.
"""

from __future__ import annotations

import ctypes.util
import os
import subprocess
import sys
import textwrap

import pytest

from ddmd.memory import share_one_malloc_arena

CHILD = textwrap.dedent(
    """
    import ctypes, ctypes.util, re, sys, tempfile, threading
    from ddmd.memory import share_one_malloc_arena
    took = share_one_malloc_arena() if sys.argv[1] == "share" else False
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
    start = threading.Barrier(4)
    done = threading.Barrier(4)
    def work():
        start.wait()
        held = [bytearray(4096) for _ in range(200)]  # malloc'd in this thread's arena
        done.wait()
        del held
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with tempfile.NamedTemporaryFile(suffix=".xml") as out:
        fp = libc.fopen(out.name.encode(), b"w")
        libc.malloc_info(0, fp)
        libc.fclose(fp)
        heaps = len(re.findall(r'<heap nr="', open(out.name).read()))
    print(took, heaps)
    """
)


def _arenas(mode: str) -> tuple[str, int]:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_ARENA_MAX"}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, mode],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        env=env,
    ).stdout.split()
    return out[0], int(out[1])


glibc_only = pytest.mark.skipif(
    not sys.platform.startswith("linux") or ctypes.util.find_library("c") is None,
    reason="the setting is glibc's (Linux); elsewhere it does nothing",
)


@glibc_only
def test_threads_share_one_arena_with_the_setting_and_not_without() -> None:
    assert _arenas("share") == ("True", 1)
    took, heaps = _arenas("plain")
    assert took == "False"
    assert heaps > 1  # the control: without the setting each thread had an arena of its own


def test_a_users_malloc_arena_max_wins() -> None:
    assert share_one_malloc_arena({"MALLOC_ARENA_MAX": "4"}) is False

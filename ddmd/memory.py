"""The daemon's malloc setting: one arena for every thread (glibc only).

ddmd's event loop runs on one thread, but short jobs go to trio's worker threads: the scan's
/proc lookups, the peer-uid check on every accepted connection, file writes. glibc gives each
new thread its own malloc arena (up to eight per core), and memory freed in a worker's arena
mostly stays there, so over a day of VMs and debuggers coming and going the daemon's resident
size swings up by several MB per arena while its Python heap stays flat (bench/soak.py showed
the swing, all of it in the worker threads' arenas). One shared arena trims like the main heap
does; the workers are few and brief, so they do not contend for its lock.

``MALLOC_ARENA_MAX`` in the environment, when set, wins: this never overrides a user's choice.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Mapping

M_ARENA_MAX = -8  # mallopt parameter number (glibc malloc.h)


def share_one_malloc_arena(env: Mapping[str, str] | None = None) -> bool:
    """Ask glibc's malloc to use a single arena for all threads; True when it took effect.

    Call it before any thread starts. Does nothing (False) when ``MALLOC_ARENA_MAX`` is set, when
    the C library is not glibc, or when ``mallopt`` refuses.
    """
    env = os.environ if env is None else env
    if "MALLOC_ARENA_MAX" in env:
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_ARENA_MAX, 1))

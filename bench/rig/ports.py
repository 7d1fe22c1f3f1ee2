"""Free loopback ports for the benches, always below Linux's ephemeral range (32768-60999): a
probe of a port in that range can connect to itself, and the kernel hands those out.

``Ports`` gives single ports and runs of them, never the same one twice in a run;
``free_block`` finds ``count`` consecutive free ports from a fixed start.
"""

from __future__ import annotations

import random
import socket
import time
from dataclasses import dataclass

from . import HOST
from .children import Child

EPHEMERAL = 32768


def port_free(port: int, *, reuse: bool = True) -> bool:
    """Whether ``port`` can be bound on 127.0.0.1. With ``reuse`` (SO_REUSEADDR), TIME_WAIT
    leftovers count as free (trio's and ddmd's listeners reuse them); only a listener or a
    bound socket makes it busy."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        if reuse:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def free_block(count: int, start: int) -> int:
    """The first of ``count`` consecutive free ports at or above ``start``."""
    base = start
    while base + count <= EPHEMERAL:
        busy = next((p for p in range(base, base + count) if not port_free(p)), None)
        if busy is None:
            return base
        base = busy + 1
    raise RuntimeError(f"no {count} consecutive free ports between {start} and {EPHEMERAL - 1}")


@dataclass(frozen=True)
class Layout:
    """ddmd's ports around a scan range: the ports scanned, the per-VM debugger ports, the
    current-VM port and the control port."""

    scan: range
    debugger: range
    current: int
    control: int

    @classmethod
    def find(cls, scan: int, debugger: int, start: int) -> Layout:
        """``scan`` free ports at or above ``start``, then ``debugger`` more, then the current-VM
        and the control port, each block the first free one after the previous."""
        base = free_block(scan, start)
        first = free_block(debugger, base + scan)
        current = free_block(1, first + debugger)
        control = free_block(1, current + 1)
        return cls(range(base, base + scan), range(first, first + debugger), current, control)


def spec(ports: range) -> str:
    """A range as ddmd's config writes it: "PORT" or "FIRST-LAST"."""
    if len(ports) == 1:
        return str(ports.start)
    return f"{ports.start}-{ports.stop - 1}"


class Ports:
    """Free loopback ports from a random start in 20000-30000, never the same one twice."""

    def __init__(self) -> None:
        self._next = random.randrange(20000, 30000)
        self._given: set[int] = set()

    def take(self) -> int:
        return self.take_range(1)[0]

    def take_range(self, n: int) -> tuple[int, int]:
        """``n`` consecutive free ports: (first, last)."""
        while self._next + n <= EPHEMERAL:
            first = self._next
            span = range(first, first + n)
            self._next += 1
            if all(p not in self._given and port_free(p, reuse=False) for p in span):
                self._given.update(span)
                self._next = first + n
                return first, first + n - 1
        raise RuntimeError(f"no {n} consecutive free ports left below {EPHEMERAL}")


def wait_listening(port: int, child: Child, timeout: float = 10.0) -> None:
    """Wait until something listens on ``port`` (seen as "cannot bind"; never connects)."""
    deadline = time.monotonic() + timeout
    while port_free(port, reuse=False):
        child.check_alive()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{child.name} does not listen on {port} after {timeout:g} s")
        time.sleep(0.02)

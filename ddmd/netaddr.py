"""Network addresses as ddmd shows and uses them: ``host:port`` text, and the address a client
uses to reach a server bound to every address.

Layer: standard library only (nothing imported), so the command-line client can use it without
loading anything heavy; used by `cli`, `instance`, `control`, `discovery`.
"""

from __future__ import annotations

__all__ = ["connectable", "host_port"]

_WILDCARD_TO_LOOPBACK = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def host_port(host: str, port: int | str) -> str:
    """``host:port``, with an IPv6 address in brackets: ``127.0.0.1:8710``, ``[::1]:8710``.

    The same text serves in messages, in URLs (``http://`` + it) and for hypercorn's bind.
    """
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def connectable(host: str) -> str:
    """Where a client reaches a server bound to ``host``: a wildcard bind (every address) is
    reached on loopback; any other host as it is."""
    return _WILDCARD_TO_LOOPBACK.get(host, host)

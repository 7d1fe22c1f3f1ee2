"""Protocol errors (the h11 model). Standard library only.

ProtocolError                 anything wrong with bytes or messages of JDWP/DDM
├── LocalProtocolError        we misused the API (built an impossible packet or chunk)
└── RemoteProtocolError       the peer sent bytes that break the protocol
"""

from __future__ import annotations


class ProtocolError(Exception):
    """Base of every error raised by ddmd.protocol."""


class LocalProtocolError(ProtocolError):
    """The caller asked for something the protocol cannot express (a bug on our side)."""


class RemoteProtocolError(ProtocolError):
    """The peer sent something that breaks the protocol."""

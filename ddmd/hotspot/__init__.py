"""The HotSpot Attach API, spoken by ddmd itself (what jstack and jcmd use), for plain JVMs on
this computer: ``client.AttachClient``. The wire format and the readers of its answers are
``ddmd.protocol.hsattach`` (sans-IO)."""

from ddmd.hotspot.client import AttachClient, AttachUnavailable

__all__ = ["AttachClient", "AttachUnavailable"]

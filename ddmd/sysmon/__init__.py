"""``ddmd sysmon``: a system monitor that is a DDM client, not a VM (the 2007 design's "system
monitors for virtual memory usage and load average").

* `chunk`: the ``SMON`` chunk (`SystemReport`, `encode_report`, `decode_report`): sans-IO,
  standard library only, for the server-side handler as much as for the client.
* `proc`: reading ``/proc/loadavg``, ``/proc/meminfo`` and ``/proc/stat`` into reports.
* `client`: `SystemMonitor`, built only on `ddmd.client`: pushes a report every interval while
  a DDM server is connected, and answers an ``SMON`` request with one.
* `cli`: the ``ddmd sysmon`` command.

Importing this package loads only `chunk` (no trio): ``from ddmd.sysmon import decode_report``.
"""

from ddmd.sysmon.chunk import (
    CHUNK_TYPE,
    CHUNK_TYPE_CODE,
    LAYOUT_VERSION,
    SystemReport,
    decode_report,
    encode_report,
)

__all__ = [
    "CHUNK_TYPE",
    "CHUNK_TYPE_CODE",
    "LAYOUT_VERSION",
    "SystemReport",
    "decode_report",
    "encode_report",
]

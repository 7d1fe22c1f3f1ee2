"""This machine as the kernel shows it: blocking readers of ``/proc`` and of the socket tables.

Layer: standard library only, the floor just above ``protocol``; imported by ``peers``,
``toolnames`` and ``discovery``. Nothing here logs, raises on missing or malformed ``/proc``
content, or knows about VMs: "not found" is an ordinary answer. Every call blocks (file reads,
``readlink``, one netlink exchange), so trio callers run it in a worker thread.

Modules: `localproc` (who owns a TCP socket, and the ``jps`` name of a local process),
`sockdiag` (the listening sockets, asked over netlink), `fdindex` (one walk of every process's
open sockets, for many lookups).
"""

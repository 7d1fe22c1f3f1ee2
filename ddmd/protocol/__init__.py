"""ddmd.protocol: the sans-IO core (JDWP framing, DDM chunks, heap segments, id rewriting).

Layer rule: standard library only. No trio, no structlog, no adbutils, no sockets, no clock,
no threads. Everything here is bytes in, events out, so it can be tested with bytes alone.
"""

"""Logcat by app: one log stream per device, read through the adb server in logcat's binary
format, each entry attributed to the app whose process wrote it, across restarts.

Sans-IO (standard library and ``ddmd.protocol`` only): ``lines.py`` (the records, filters, the
ring), ``apps.py`` (which app a pid is, restarts, pid reuse), ``crashes.py`` (Java crashes,
tombstones, ANRs). Trio: ``device.py`` (one device's stream, its viewers, reconnects) and
``hub.py`` (every device's).
"""

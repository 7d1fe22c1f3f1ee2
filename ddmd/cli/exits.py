"""The exit codes of every `ddmd` command: one table (docs/cli.md's "Exit codes"; each command and
situation is checked by tests/control/test_exit_codes.py), whatever the output format:

    0  done; also an empty list, a GC the VM did not confirm, and Ctrl-C ending --watch,
       `events` or `logcat` (and the daemon stopping during `events`), and a closed stdout
       (``| head``: no message, `cli.main`)
    1  the VM or the daemon refused, or could not do it: the feature is not available for this
       VM (`threads`, `heap` and `allocs --status` too, though they print the reason as their
       answer), the VM went away, no answer in time, a bad token; or a file could not be read
       or written (`hprof-summary`, `trace-report`, a download, hprof-conv)
    2  the command line names nothing usable: usage errors and bad option values, an unknown or
       ambiguous TARGET, THREAD, APP or --device (the candidates follow, one per line), no
       TARGET while no VM is current, a bad config file
    3  no daemon is answering at the control address
    4  `run`/`demo` only: a ddmd already runs for this control address (`cli.main`)

Why this split: it is the table the client commands always had (the most commands), click's own
2 for usage errors, and `cli.main`'s 4; "not available" joins the other refusals (a script that
asks for threads learns that it got none), and a file that cannot be read is work that failed
(1), while an `-o` into a missing directory is refused with the command line, before any work
(2).

With ``--json`` an error is also one JSON line on stdout, ``{"error": {"kind", "message",
"candidates"}}`` (`cli.api.fail`, `ERROR_KINDS`), with the same exit code.

Layer: imports nothing; `cli.client` re-exports these names (where the other modules take them).
"""

from __future__ import annotations

__all__ = ["EXIT_API_ERROR", "EXIT_CONFIG", "EXIT_NO_DAEMON", "EXIT_OK", "EXIT_TARGET"]

EXIT_OK = 0
EXIT_API_ERROR = 1
EXIT_TARGET = 2
EXIT_CONFIG = 2
EXIT_NO_DAEMON = 3

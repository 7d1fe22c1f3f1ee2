"""Wire contracts the tests check in several places, written down once.

CLIENT_KEYS: the keys every object of `ddmd clients --json` (and GET /api/v1/vms) carries at
least, as issue 3 fixes them.
"""

CLIENT_KEYS = frozenset(
    {
        "id",
        "source",
        "address",
        "pid",
        "app",
        "package",
        "vm_ident",
        "ddm",
        "features",
        "waiting_for_debugger",
        "threads",
        "debugger_port",
        "debugger",
        "current",
    }
)

"""The `ddmd` command line.

* `main`: the click group (`ddmd = "ddmd.cli:main"`) and its table of commands: each command's
  module is imported when the command runs (`ddmd --help` imports none of them).
* `serve`: `check-config`, `run`, `demo`.
* `client`: the control-API VM commands and `run_with_api`; `api`: the plumbing they share
  (the daemon's address, httpx, TARGET or the current VM); `exits`: the exit-code table.
* `ports`, `events`: the `ddmd ports` and `ddmd events` commands.
* `profiling` (trace, hprof, kill), `allocs`, `capture` (their shared steps): the DDMS commands.
* `format`: tables, labels and JSON printing (pure functions over the API's JSON).

Layer: the top of the tree; see each module.
"""

from ddmd.cli.main import main

__all__ = ["main"]

"""The `ddmd` command line.

* `main`: the click group (`ddmd = "ddmd.cli:main"`), `check-config`, `run`, `demo`.
* `client`: the control-API client commands and their shared plumbing (httpx, exit codes).
* `ports`, `events`: the `ddmd ports` and `ddmd events` commands.
* `format`: tables, labels and JSON printing (pure functions over the API's JSON).

Layer: the top of the tree; see each module.
"""

from ddmd.cli.main import main

__all__ = ["main"]

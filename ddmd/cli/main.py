"""The `ddmd` command line's group: every command by name, imported when it runs.

`ddmd --help`, `ddmd --version` and shell completion of a command name import nothing but click:
each command's short help is in `COMMANDS` (tests check that it is the command's own), and a
command's module is imported by `_Group.get_command` only when that command is invoked (or its
own help or completion is asked for). httpx and trio are imported by the client commands when
they talk to the daemon (`cli.client.run_with_api`), the daemon by `ddmd run` (`cli.serve`).

Layer: the top; imports click and `cli.exits` only, the command modules by name.
Exit codes: `cli.exits`'s table; `run`/`demo`'s own 4 (a ddmd already runs) and 130 (Ctrl-C)
are in `cli.serve`.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import os
import sys
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final

import click

from ddmd import __version__

if TYPE_CHECKING:
    from click.shell_completion import CompletionItem

__all__ = [
    "CLIENT_COMMANDS",
    "COMMANDS",
    "EXIT_ALREADY_RUNNING",
    "EXIT_CONFIG",
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "main",
]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_CONFIG = 2
EXIT_ALREADY_RUNNING = 4
EXIT_INTERRUPTED = 130  # `run`/`demo` ended by Ctrl-C (SIGINT), as a shell reports it

_CONTEXT_SETTINGS: dict[str, Any] = {"help_option_names": ["-h", "--help"]}

#: Every command: name -> (module, attribute, short help). The short help is what `ddmd --help`
#: and shell completion show, so that listing the commands imports none of them; it is the
#: command's own ``short_help`` (tests/test_cli.py checks each).
COMMANDS: Final[Mapping[str, tuple[str, str, str]]] = {
    "allocs": (
        "ddmd.cli.allocs",
        "allocs",
        "The allocation tracker: start, stop, status, show.",
    ),
    "attach": (
        "ddmd.cli.debuggers",
        "attach",
        "Show how jdb or an IDE attaches to a VM (--jdb: run jdb).",
    ),
    "check-config": (
        "ddmd.cli.serve",
        "check_config",
        "Check a config file and show the ports it sets.",
    ),
    "clients": (
        "ddmd.cli.client",
        "clients",
        "List the VMs the daemon knows, with their debugger ports.",
    ),
    "demo": (
        "ddmd.cli.serve",
        "demo",
        "Run the daemon with three simulated VMs, no device needed.",
    ),
    "devices": (
        "ddmd.cli.client",
        "devices",
        "List the Android devices and emulators seen through adb.",
    ),
    "events": (
        "ddmd.cli.events",
        "events",
        "Print the daemon's events as they happen, until Ctrl-C.",
    ),
    "extensions": (
        "ddmd.cli.ext",
        "extensions",
        "List the chunk-handler plugins the daemon loaded.",
    ),
    "gc": ("ddmd.cli.client", "gc", "Ask a VM to run a garbage collection."),
    "heap": ("ddmd.cli.client", "heap", "Show a VM's heap sizes and heap segment summaries."),
    "hprof": (
        "ddmd.cli.profiling",
        "hprof",
        "Dump a VM's heap (HPROF) and show its class histogram.",
    ),
    "hprof-summary": (
        "ddmd.cli.hprof",
        "hprof_summary",
        "Show the class histogram of an HPROF heap dump.",
    ),
    "kill": ("ddmd.cli.profiling", "kill", "Stop a VM's process (DDMS's 'Stop Process')."),
    "logcat": (
        "ddmd.cli.logcat",
        "logcat",
        "Follow an app's log (pidcat-style), across its restarts.",
    ),
    "ports": (
        "ddmd.cli.ports",
        "ports",
        "List the remembered debugger ports, or forget one.",
    ),
    "run": (
        "ddmd.cli.serve",
        "run",
        "Run the daemon in the foreground until Ctrl-C or SIGTERM.",
    ),
    "select": (
        "ddmd.cli.client",
        "select",
        "Make a VM current: debuggers on port 8700 reach it.",
    ),
    "sim": (
        "ddmd.sim.cli",
        "sim_command",
        "Run simulated DDM-speaking VMs for experiments and tests.",
    ),
    "stack": (
        "ddmd.cli.client",
        "stack",
        "Show a VM's stacks: every thread (like jstack) or one.",
    ),
    "sysmon": (
        "ddmd.sysmon.cli",
        "sysmon_command",
        "Report this machine's load, memory and CPU use to ddmd.",
    ),
    "threads": (
        "ddmd.cli.client",
        "threads",
        "Show a VM's threads and their states (--watch: live).",
    ),
    "trace": (
        "ddmd.cli.profiling",
        "trace",
        "Method-trace a VM for N seconds or until Ctrl-C.",
    ),
    "trace-report": (
        "ddmd.cli.trace",
        "trace_report",
        "Top methods of a method trace (.trace) file.",
    ),
}

#: The commands that talk to the daemon's control API about VMs and take the client options
#: (--config, --control, --device, --json), in the order the tests list them.
CLIENT_COMMANDS: Final[tuple[str, ...]] = (
    "clients",
    "devices",
    "threads",
    "heap",
    "gc",
    "select",
    "stack",
    "ports",
    "events",
    "extensions",
    "trace",
    "allocs",
    "hprof",
    "kill",
)

_WHOLE = 1_000  # a summary length limit no summary reaches: never cut


class _Group(click.Group):
    """A group that imports a command's module when the command is used (`COMMANDS`), and
    shows each command's summary whole.

    click cuts a summary taken from the docstring at about 45 characters ("..."); here the
    short help of `COMMANDS` is shown as it is (wrapped if it is long). The command list and the
    completion of a command name come from that table, without importing any command.
    """

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *COMMANDS})

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        with _closed_stdout_ends_quietly():  # `ddmd --help | head`
            return super().make_context(info_name, args, parent, **extra)

    def invoke(self, ctx: click.Context) -> Any:
        with _closed_stdout_ends_quietly():
            result = super().invoke(ctx)
            sys.stdout.flush()  # what is still buffered meets a closed pipe here, not at exit
            return result

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)
        if command is None and cmd_name in COMMANDS:
            module, attribute, _ = COMMANDS[cmd_name]
            command = getattr(importlib.import_module(module), attribute)
            assert isinstance(command, click.Command)
            self.add_command(command, cmd_name)
        return command

    def _short_help(self, ctx: click.Context, name: str) -> str | None:
        """A command's summary (None: hidden or unknown), imported only if not in the table."""
        if name in COMMANDS and name not in self.commands:
            return COMMANDS[name][2]
        command = self.get_command(ctx, name)
        if command is None or command.hidden:
            return None
        return command.get_short_help_str(limit=_WHOLE)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            summary = self._short_help(ctx, name)
            if summary is not None:
                rows.append((name, summary))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)

    def shell_complete(self, ctx: click.Context, incomplete: str) -> list[CompletionItem]:
        from click.shell_completion import CompletionItem

        results = []
        for name in self.list_commands(ctx):
            if name.startswith(incomplete):
                summary = self._short_help(ctx, name)
                if summary is not None:
                    results.append(CompletionItem(name, help=summary))
        # The group's own options (--help, --version): click.Command's completion.
        results.extend(click.Command.shell_complete(self, ctx, incomplete))
        return results


def _broken_pipe(exc: BaseException) -> bool:
    """A write to a closed pipe, alone or as every exception of a (nested) group (trio's)."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_broken_pipe(inner) for inner in exc.exceptions)
    return isinstance(exc, BrokenPipeError) or (
        isinstance(exc, OSError) and exc.errno == errno.EPIPE
    )


@contextlib.contextmanager
def _closed_stdout_ends_quietly() -> Iterator[None]:
    """A reader that went away (``ddmd ... | head``) ends any command with 0 and no message,
    as ``head`` expects of ``seq``: stdout goes to /dev/null (what is still buffered is dropped
    there at exit, instead of a second error) and the command exits 0."""
    try:
        yield
    except BaseException as exc:
        if not _broken_pipe(exc):
            raise
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):  # no real file descriptor (a test's capture)
            pass
        finally:
            os.close(devnull)
        raise click.exceptions.Exit(EXIT_OK) from None


@click.group(cls=_Group, context_settings=_CONTEXT_SETTINGS)
@click.version_option(__version__, "--version", prog_name="ddmd", message="%(prog)s %(version)s")
def main() -> None:
    """ddmd: a debug monitor for Java and Android VMs.

    It keeps one JDWP connection per VM and lets debuggers in through per-VM ports and the
    current-VM port.
    """

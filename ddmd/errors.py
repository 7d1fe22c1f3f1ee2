"""The errors ddmd raises across module boundaries.

Layer: imported by everything above `protocol/` and `session/` (config, registry, ports, drive,
control, daemon, cli); imports nothing from ddmd. The sans-IO core has its own tree in
`ddmd.protocol.errors`.

Catch by meaning, as with httpx's exceptions::

    DdmdError                 anything ddmd reports to its user
    ├── ConfigError           a config file or setting is wrong: names file, key and value
    │   └── ConfigProblems    several of those at once (`problems`), from one config file
    ├── PortInUse             a listening port is taken: names the port and the config key to change
    ├── VmRequestError        something asked of a VM produced no usable answer
    │   ├── VmGone            the VM went away while something was waiting on it
    │   ├── FeatureUnsupported  the VM does not speak DDM, or lacks this handler
    │   ├── RequestTimedOut   the VM did not answer in time
    │   └── DdmFailed         the VM answered with a DDM FAIL chunk or a malformed reply
    └── TargetError           a CLI target (pid, name, port) matched no VM, or several

Edges translate them: the CLI prints one line and picks an exit code, the control API answers
with an HTTP status and a JSON `error`, the supervisor logs `vm.crashed`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

__all__ = [
    "ConfigError",
    "ConfigProblems",
    "DdmFailed",
    "DdmdError",
    "FeatureUnsupported",
    "PortInUse",
    "RequestTimedOut",
    "TargetError",
    "VmGone",
    "VmRequestError",
]

# Reprs longer than this are cut in messages: a whole table pasted into one line helps nobody.
_MAX_VALUE_REPR = 80
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+", re.ASCII)


def _short_repr(value: object) -> str:
    # Booleans as TOML writes them; everything else as Python's repr (strings in single quotes).
    text = ("true" if value else "false") if isinstance(value, bool) else repr(value)
    if len(text) > _MAX_VALUE_REPR:
        text = text[: _MAX_VALUE_REPR - 3] + "..."
    return text


def _toml_key(name: str) -> str:
    # A bare TOML key as it is; anything else quoted, so a stray newline or space stays visible.
    return name if _BARE_KEY.fullmatch(name) else json.dumps(name)


def format_key(key: str) -> str:
    """Show a dotted config key as TOML has it: "debugger.ports" -> "[debugger] ports"."""
    section, dot, name = key.partition(".")
    return f"[{_toml_key(section)}] {_toml_key(name)}" if dot else f"[{_toml_key(section)}]"


class DdmdError(Exception):
    """Base class of every error ddmd reports to its user."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class ConfigError(DdmdError):
    """A config file or setting is wrong.

    `path` is the file (or another source such as "<defaults>"), `key` the dotted key ("scan.ports";
    a bare section name for section-level problems), `value` the offending value as read.
    None means "not known" for each of them. str() reads like
    ``config.toml: [scan] ports = '9000-8000': start port is above end port``.
    """

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        key: str | None = None,
        value: object = None,
    ) -> None:
        super().__init__(message)
        self.path = path
        self.key = key
        self.value = value

    def __str__(self) -> str:
        parts = []
        if self.path is not None:
            parts.append(self.path)
        if self.key is not None:
            where = format_key(self.key)
            if self.value is not None:
                where += f" = {_short_repr(self.value)}"
            parts.append(where)
        elif self.value is not None:
            parts.append(_short_repr(self.value))
        parts.append(self.message)
        return ": ".join(parts)

    @property
    def problems(self) -> tuple[ConfigError, ...]:
        """Every problem this error stands for: just itself (`ConfigProblems` holds several)."""
        return (self,)


class ConfigProblems(ConfigError):
    """Several problems found in one config, each a `ConfigError`, in the order they were checked.

    Its own `path`, `key`, `value` and message are those of the first problem, so code written
    for a single ConfigError still reads something sensible; str() is the first problem's text
    plus how many more there are. Show `problems` to list them all.
    """

    def __init__(self, problems: Sequence[ConfigError]) -> None:
        if len(problems) < 2:
            raise ValueError("ConfigProblems needs at least two problems")
        first = problems[0]
        super().__init__(first.message, path=first.path, key=first.key, value=first.value)
        self._problems = tuple(problems)

    @property
    def problems(self) -> tuple[ConfigError, ...]:
        return self._problems

    def __str__(self) -> str:
        more = len(self._problems) - 1
        return f"{self._problems[0]} (and {more} more problem{'s' if more > 1 else ''})"


class PortInUse(DdmdError):
    """A port ddmd must listen on is already taken by another program.

    `key` is the dotted config key to change ("debugger.current_port"); a key already written as
    "[debugger] current_port" is shown as it is.
    """

    def __init__(self, port: int, key: str, host: str | None = None) -> None:
        where = f"{host} port {port}" if host else f"port {port}"
        shown = key if key.startswith("[") else format_key(key)
        super().__init__(
            f"{where} is already in use by another program; "
            f"set {shown} in the config file to a free port"
        )
        self.port = port
        self.key = key
        self.host = host


class VmRequestError(DdmdError):
    """Something asked of a VM produced no usable answer; the subclasses say why."""


class VmGone(VmRequestError):
    """The VM went away (connection closed, process died) while something waited on it."""

    def __init__(self, message: str = "the VM is gone", *, vm: str | None = None) -> None:
        super().__init__(f"vm={vm}: {message}" if vm is not None else message)
        self.vm = vm


class FeatureUnsupported(VmRequestError):
    """The VM cannot do this: it does not speak DDM, or it has no handler for the request."""


class RequestTimedOut(VmRequestError):
    """The VM did not answer within the configured timeout."""


class DdmFailed(VmRequestError):
    """The VM refused a DDM request (a FAIL chunk) or answered with something malformed."""


class WrongState(VmRequestError):
    """The request does not fit what the VM is doing now (already tracing, a dump under way)."""


class TargetError(DdmdError):
    """A target given on the command line matched no VM, or more than one (`candidates`)."""

    def __init__(
        self, message: str, *, candidates: tuple[str, ...] = (), ambiguous: bool = False
    ) -> None:
        super().__init__(message)
        self.candidates = candidates
        self.ambiguous = ambiguous  # True: several VMs matched; False: none did

    def __str__(self) -> str:
        if not self.candidates:
            return self.message
        return f"{self.message} (candidates: {', '.join(self.candidates)})"

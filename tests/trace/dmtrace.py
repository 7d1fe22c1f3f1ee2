"""Running the real ``dmtracedump`` (Debian package ``dmtracedump``) and reading its output.

Missing program: the test is skipped with the reason, except in CI (``CI=true``) where it
fails, as for the JDK tests.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.actors.needs import skip_or_fail

TIMEOUT = 60  # seconds; dmtracedump reads a small file in milliseconds


def require_dmtracedump() -> str:
    path = shutil.which("dmtracedump")
    if path is None:
        reason = "'dmtracedump' is not on PATH (install Debian's dmtracedump package)"
        skip_or_fail(reason)
    return path


def run(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_dmtracedump(), *args, str(path)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def ddmd_name(shown: str) -> str:
    """dmtracedump's ``class.method sig[<TAB>File.java]`` as ddmd's ``class.methodsig``."""
    return shown.split("\t", 1)[0].replace(" ", "", 1)


@dataclass(frozen=True)
class Profile:
    calls: dict[str, tuple[int, int]]  # name -> (calls, recursive calls)
    inclusive: dict[str, int]
    exclusive: dict[str, int]
    total: int


_TOTAL = re.compile(r"^Total cycles: (\d+)$", re.MULTILINE)
_EXCLUSIVE = re.compile(r"^\s*(\d+)\s+[\d.]+\s+[\d.]+\s+\[\d+\] (.+)$")
_INCLUSIVE = re.compile(r"^\[\d+\]\s+[\d.]+%\s+(\d+)\+(\d+)\s+(\d+) (.+)$")


def profile(stdout: str) -> Profile:
    """The exclusive table (first section) and the method lines of the inclusive section."""
    sections = stdout.split("=" * 70)
    exclusive: dict[str, int] = {}
    for line in sections[1].splitlines():
        match = _EXCLUSIVE.match(line)
        if match:
            exclusive[ddmd_name(match.group(2))] = int(match.group(1))
    calls: dict[str, tuple[int, int]] = {}
    inclusive: dict[str, int] = {}
    for line in sections[2].splitlines():
        match = _INCLUSIVE.match(line)
        if match and match.group(4) != "(toplevel)":
            name = ddmd_name(match.group(4))
            calls[name] = (int(match.group(1)), int(match.group(2)))
            inclusive[name] = int(match.group(3))
    found = _TOTAL.search(stdout)
    assert found, stdout
    return Profile(calls, inclusive, exclusive, int(found.group(1)))


_RECORD = re.compile(r"^\s*(\d+) (ent|xit|unr)(.) +(\d+).\.*(\S+) (.*)$")


def records(stdout: str) -> list[tuple[int, str, int, str]]:
    """``dmtracedump -o``: (thread, ent|xit|unr, time, name) per record."""
    found = []
    for line in stdout.splitlines():
        match = _RECORD.match(line)
        if match:
            name = ddmd_name(f"{match.group(5)} {match.group(6)}")
            found.append((int(match.group(1)), match.group(2), int(match.group(4)), name))
    return found

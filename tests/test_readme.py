"""Issue 20, friction 12: the README opens with a one-screen quick start (demo, select, jdb, web
page), keeps exactly its two set-up commands, documents shell completion (which works), and the
design and protocol material it moved lives in docs/ (its links resolve)."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from ddmd.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
INSTALL_AND_RUN = "python3 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/ddmd run"
TEST = (
    "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && .venv/bin/python -m pytest"
)
SCREEN = 40  # lines: what a terminal shows without scrolling


def text() -> str:
    return README.read_text()


def section(title: str, body: str | None = None) -> str:
    """The text of the ``## title`` section, up to the next ``## `` heading."""
    body = text() if body is None else body
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", body, re.S | re.M)
    assert match is not None, f"no section {title!r}"
    return match.group(1)


def code_lines(body: str) -> list[str]:
    """The lines of the fenced code blocks of ``body``."""
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", body, re.S | re.M)
    return [line for block in blocks for line in block.splitlines() if line.strip()]


def test_the_readme_opens_with_a_one_screen_quick_start():
    lines = text().splitlines()
    headings = [line for line in lines if line.startswith("## ")]
    assert headings[0] == "## Quick start"
    start = lines.index("## Quick start")
    end = lines.index(headings[1])
    assert start < 10
    assert end <= SCREEN, f"the quick start ends on line {end}"
    quick = "\n".join(lines[start:end])
    steps = ["ddmd demo", "ddmd select ", "jdb -attach localhost:8700", "http://127.0.0.1:8710/"]
    where = [quick.find(step) for step in steps]
    assert all(i >= 0 for i in where), dict(zip(steps, where, strict=True))
    assert where == sorted(where), "demo, select, jdb, then the web page"


def test_the_two_set_up_commands_are_kept_unchanged():
    setup = section("Set-up")
    commands = [line for line in code_lines(setup) if "pip install" in line]
    assert commands == [INSTALL_AND_RUN, TEST]
    # And nowhere else does the README create the virtualenv.
    assert text().count("python3 -m venv") == 2


def test_shell_completion_is_documented_and_works():
    assert "_DDMD_COMPLETE=bash_source ddmd" in text()
    result = CliRunner().invoke(main, [], prog_name="ddmd", env={"_DDMD_COMPLETE": "bash_source"})
    assert result.exit_code == 0, result.output
    assert "_ddmd_completion" in result.output
    assert "complete -o nosort -F _ddmd_completion ddmd" in result.output


def test_design_and_protocol_material_lives_in_docs():
    readme = text()
    links = re.findall(r"\]\((docs/[^)#]+)(?:#([^)]*))?\)", readme)
    assert {path for path, _ in links} >= {"docs/design.md", "docs/protocol-notes.md"}
    for path, anchor in links:
        target = ROOT / path
        assert target.is_file(), path
        if anchor:
            headings = [
                re.sub(r"[^a-z0-9 -]", "", line[3:].strip().lower()).replace(" ", "-")
                for line in target.read_text().splitlines()
                if line.startswith("## ")
            ]
            assert anchor in headings, (path, anchor)
    design = (ROOT / "docs" / "design.md").read_text()
    notes = (ROOT / "docs" / "protocol-notes.md").read_text()
    assert "## Layout" in design
    assert "## Layout" not in readme
    assert "| 61 | u4 | CPU sample period" in notes  # the SMON layout
    assert "| 61 | u4 | CPU sample period" not in readme
    assert "NOT_IMPLEMENTED (99)" in notes

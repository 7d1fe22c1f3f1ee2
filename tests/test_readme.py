"""Issue 20, friction 12: the README opens with a one-screen quick start (demo, select, jdb, web
page), keeps exactly its two set-up commands, and the design and protocol material it moved
lives in docs/ (its links resolve). Issue 29: the README stays short (the reference lives in
docs/, every link there resolves), shell completion is documented in docs/cli.md (and works),
and Android Studio's set-up is explained in one place only."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from ddmd.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CLI_DOC = DOCS / "cli.md"
INSTALL_AND_RUN = "python3 -m venv .venv && .venv/bin/pip install -q -e . && .venv/bin/ddmd run"
TEST = (
    "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && .venv/bin/python -m pytest"
)
SCREEN = 40  # lines: what a terminal shows without scrolling
MAX_LINES = 320  # a README read in five minutes
#: The reference pages the README's task sections link to.
REFERENCE_PAGES = {
    "docs/cli.md",
    "docs/configuration.md",
    "docs/api.md",
    "docs/security.md",
    "docs/android-tools.md",
    "docs/profiling.md",
    "docs/plugins.md",
}
#: Words that make a passage naming Android Studio a set-up instruction: its adb port setting,
#: the environment variable it reads, its debug configuration, ddmd's ports.
STUDIO_SETUP_TERMS = (
    "5038",
    "manually managed",
    "ANDROID_ADB_SERVER_PORT",
    "Remote JVM Debug",
    "Edit Configurations",
    "8700",
)
#: The one section that explains how Android Studio is set up.
STUDIO_SECTION = ("README.md", "Share an app with Android Studio, jadx and adb")


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


def test_the_readme_opens_with_a_one_screen_quick_start() -> None:
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


def test_the_two_set_up_commands_are_kept_unchanged() -> None:
    setup = section("Set-up")
    commands = [line for line in code_lines(setup) if "pip install" in line]
    assert commands == [INSTALL_AND_RUN, TEST]
    # And nowhere else does the README create the virtualenv.
    assert text().count("python3 -m venv") == 2


def test_shell_completion_is_documented_and_works() -> None:
    assert "_DDMD_COMPLETE=bash_source ddmd" in CLI_DOC.read_text()
    assert "docs/cli.md#shell-completion" in text()
    result = CliRunner().invoke(main, [], prog_name="ddmd", env={"_DDMD_COMPLETE": "bash_source"})
    assert result.exit_code == 0, result.output
    assert "_ddmd_completion" in result.output
    assert "complete -o nosort -F _ddmd_completion ddmd" in result.output


def anchors(path: Path) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown file (code blocks skipped)."""
    out: set[str] = set()
    fenced = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"#{1,6} ", line):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^a-z0-9 _-]", "", title).replace(" ", "-"))
    return out


def relative_links(path: Path) -> list[tuple[Path, str]]:
    """The links of a Markdown file to files of this repository: (target, anchor)."""
    found: list[tuple[Path, str]] = []
    for target, anchor in re.findall(r"\]\(([^)#\s:]*)(?:#([^)\s]*))?\)", path.read_text()):
        found.append(((path.parent / target).resolve() if target else path, anchor))
    return found


def test_design_and_protocol_material_lives_in_docs() -> None:
    readme = text()
    links = re.findall(r"\]\((docs/[^)#]+)(?:#([^)]*))?\)", readme)
    assert {path for path, _ in links} >= {"docs/design.md", "docs/protocol-notes.md"}
    for path, anchor in links:
        target = ROOT / path
        assert target.is_file(), path
        if anchor:
            assert anchor in anchors(target), (path, anchor)
    design = (ROOT / "docs" / "design.md").read_text()
    notes = (ROOT / "docs" / "protocol-notes.md").read_text()
    assert "## Layout" in design
    assert "## Layout" not in readme
    assert "| 61 | u4 | CPU sample period" in notes  # the SMON layout
    assert "| 61 | u4 | CPU sample period" not in readme
    assert "NOT_IMPLEMENTED (99)" in notes


def test_the_readme_is_short_and_links_every_reference_page() -> None:
    lines = text().splitlines()
    assert len(lines) <= MAX_LINES, f"the README has {len(lines)} lines"
    links = set(re.findall(r"\]\((docs/[^)#]+\.md)", text()))
    assert links >= REFERENCE_PAGES, REFERENCE_PAGES - links
    for path in links:
        assert (ROOT / path).is_file(), path


def test_every_link_in_the_readme_and_docs_resolves() -> None:
    for page in [README, *sorted(DOCS.glob("*.md"))]:
        for target, anchor in relative_links(page):
            assert target.exists(), (page.name, str(target))
            if anchor and target.suffix == ".md":
                assert anchor in anchors(target), (page.name, target.name, anchor)


def passages(body: str) -> list[tuple[str, str]]:
    """(section title, passage) pairs: prose paragraphs, list items and table rows joined into
    one line each, code blocks line by line (a comment in a block says nothing about the
    prose)."""
    out: list[tuple[str, str]] = []
    section, fenced = "", False
    paragraph: list[str] = []

    def flush() -> None:
        if paragraph:
            out.append((section, " ".join(paragraph)))
            paragraph.clear()

    for line in body.splitlines():
        if line.startswith("```"):
            flush()
            fenced = not fenced
        elif fenced or line.startswith("|"):
            flush()
            out.append((section, line))
        elif line.startswith("## "):
            flush()
            section = line[3:].strip()
        elif not line.strip():
            flush()
        else:
            if re.match(r"(- |\d+\. )", line):
                flush()  # a list item is a passage of its own
            paragraph.append(line.strip())
    flush()
    return out


def test_android_studio_set_up_is_explained_in_one_place() -> None:
    """Android Studio used to be explained in three places that answered differently (Remote
    JVM Debug on 8700; debug through ddmd, not the device; the adb front's port). It is the adb
    front, in one section: no other passage of the README or docs/ names Android Studio with
    one of its settings or ddmd's ports."""
    where: set[tuple[str, str]] = set()
    for page in [README, *sorted(DOCS.glob("*.md"))]:
        for title, passage in passages(page.read_text()):
            if "Android Studio" in passage and any(t in passage for t in STUDIO_SETUP_TERMS):
                where.add((page.name, title))
    assert where == {STUDIO_SECTION}, where
    studio = section(STUDIO_SECTION[1])
    assert "Use existing manually managed server" in studio
    assert "**5038**" in studio
    assert "Remote JVM Debug" not in studio  # the adb front, not a second way


def test_the_quick_start_says_the_adb_server_ddmd_may_start_outlives_it():
    quick = section("Quick start")
    assert "keeps running after ddmd stops" in quick
    assert "adb kill-server" in quick


def test_the_readme_says_how_to_link_to_one_vm_on_the_web_page() -> None:
    """The page opens the VM a ``#vm=ID`` address names (tests/web/test_jvm_page.py)."""
    text = README.read_text()
    assert "`#vm=ID`" in text
    assert "http://127.0.0.1:8710/#vm=tcp:8000" in text

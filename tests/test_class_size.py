"""Size and shape rules for classes (style.md section 2: "a class you cannot hold in your head is
two classes"): no class in ddmd/ over MAX_CLASS_LINES lines, and the session is composed of
parts it owns, not stacked from mixins."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import ddmd

PACKAGE = Path(ddmd.__file__).resolve().parent
MAX_CLASS_LINES = 450


def classes(root: Path) -> list[tuple[str, ast.ClassDef]]:
    """Every class (nested ones too) in the .py files under ``root``: (path from the
    repository root, node)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        rel = path.relative_to(PACKAGE.parent).as_posix()
        found.extend((rel, node) for node in ast.walk(tree) if isinstance(node, ast.ClassDef))
    return found


def size(node: ast.ClassDef) -> int:
    assert node.end_lineno is not None
    return node.end_lineno - node.lineno + 1


def base_names(node: ast.ClassDef) -> list[str]:
    """The bases' names as written: ``Foo``, ``pkg.Foo`` and ``Foo[T]`` all give "Foo"."""
    names = []
    for base in node.bases:
        while isinstance(base, ast.Subscript):
            base = base.value
        if isinstance(base, ast.Name):
            names.append(base.id)
        elif isinstance(base, ast.Attribute):
            names.append(base.attr)
    return names


def test_no_class_is_longer_than_the_limit():
    scanned = classes(PACKAGE)
    assert len(scanned) > 50  # the scan sees the package (guards against a wrong root)
    too_long = sorted(
        ((size(node), path, node) for path, node in scanned if size(node) > MAX_CLASS_LINES),
        key=lambda item: (-item[0], item[1]),
    )
    report = "\n".join(
        f"  {path}:{node.lineno} class {node.name}: {n} lines (limit {MAX_CLASS_LINES})"
        for n, path, node in too_long
    )
    if too_long:
        pytest.fail(
            f"{len(too_long)} class(es) over {MAX_CLASS_LINES} lines; split each into parts it "
            f"owns and delegates to (not mixins):\n{report}",
            pytrace=False,
        )


def test_no_session_class_is_built_from_mixins():
    mixed = [
        f"  {path}:{node.lineno} class {node.name}({', '.join(base_names(node))})"
        for path, node in classes(PACKAGE / "session")
        if any(name.endswith("Mixin") for name in base_names(node))
    ]
    report = "\n".join(mixed)
    if mixed:
        pytest.fail(
            "the session is composed of parts it owns, not mixed in; these classes inherit "
            f"from a *Mixin base:\n{report}",
            pytrace=False,
        )


def test_the_checks_see_what_they_look_for():
    # The rules above can fail: the scan measures a class and reads every form of base.
    tree = ast.parse(
        "class A(FooMixin, pkg.BarMixin, Generic[T], mod.Baz[int]):\n    x = 1\n\n    y = 2\n"
    )
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef))
    assert size(node) == 4
    assert base_names(node) == ["FooMixin", "BarMixin", "Generic", "Baz"]

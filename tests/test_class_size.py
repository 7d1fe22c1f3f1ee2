"""Size and shape rules for classes (style.md sections 2 and 2.1: "a class you cannot hold in your
head is two classes"): no class in ddmd/ over MAX_CLASS_LINES lines; every composed object is made
of parts it owns, not stacked from mixins, whatever their names; and no code reaches into another
object's private state (``self._s._out``): a part sees its owner through a narrow host."""

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


def mixins(scanned: list[tuple[str, ast.ClassDef]]) -> list[str]:
    """Classes stacked from mixins, whatever the names: a class with two or more bases defined
    in ddmd/, or a class used as a base that declares private attributes it never sets itself
    (it declares its host's state: one class in disguise)."""
    defined = {node.name: (path, node) for path, node in scanned}
    used_as_base = {name for _, node in scanned for name in base_names(node) if name in defined}
    found = []
    for path, node in scanned:
        ours = [name for name in base_names(node) if name in defined and name != node.name]
        if len(ours) >= 2:
            found.append(f"  {path}:{node.lineno} class {node.name}({', '.join(ours)})")
    for name in sorted(used_as_base):
        path, node = defined[name]
        declared = {
            item.target.id
            for item in node.body
            if isinstance(item, ast.AnnAssign)
            and item.value is None
            and isinstance(item.target, ast.Name)
            and item.target.id.startswith("_")
            and not item.target.id.startswith("__")
        }
        assigned = {
            n.attr
            for n in ast.walk(node)
            if isinstance(n, ast.Attribute)
            and isinstance(n.ctx, ast.Store)
            and isinstance(n.value, ast.Name)
            and n.value.id == "self"
        }
        if declared - assigned:
            names = ", ".join(sorted(declared - assigned))
            found.append(f"  {path}:{node.lineno} class {name} declares what others set: {names}")
    return found


def test_no_class_is_built_from_mixins():
    found = mixins(classes(PACKAGE))
    if found:
        report = "\n".join(found)
        pytest.fail(
            f"compose parts the object owns instead of mixing classes in (style.md 2.1):\n{report}",
            pytrace=False,
        )


#: Attributes that look private but are public API of the standard library.
PUBLIC_UNDERSCORED = frozenset({"_replace", "_asdict", "_fields", "_make", "_field_defaults"})


def private_reaches(tree: ast.AST) -> list[tuple[int, str]]:
    """Every ``x._name`` where ``x`` is not ``self``/``cls``, an imported module or a class of the
    same module: another object's private state (``self._s._out``, ``session._calls``)."""
    modules = {
        (alias.asname or alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
    }
    # A class's private member named from its own module (a table of decoders) stays inside.
    modules |= {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        attr = node.attr
        if not attr.startswith("_") or attr.startswith("__") or attr in PUBLIC_UNDERSCORED:
            continue
        owner = node.value
        if isinstance(owner, ast.Name) and (owner.id in ("self", "cls") or owner.id in modules):
            continue
        found.append((node.lineno, f"{ast.unparse(owner)}.{attr}"))
    return found


def test_nothing_reaches_into_another_object_s_private_state():
    reaches = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).as_posix()
        tree = ast.parse(path.read_text(), str(path))
        reaches += [f"  {rel}:{line} {what}" for line, what in private_reaches(tree)]
    if reaches:
        report = "\n".join(reaches)
        pytest.fail(
            f"{len(reaches)} reach(es) into another object's private state; give the part a "
            f"narrow host or a public method with a name (style.md 2.1):\n{report}",
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


def test_the_shape_checks_catch_a_mixin_and_a_reach():
    code = (
        "import os\n"
        "class Side:\n    _nursery: object\n    def go(self):\n        return self._nursery\n"
        "class Other:\n    pass\n"
        "class Driver(Side, Other):\n"
        "    def __init__(self, s):\n        self._nursery = None\n        self._s = s\n"
        "    def run(self):\n        os._exit(0)\n        self._s._out.append(1)\n"
        "        return self._s.public, t._asdict()\n"
    )
    tree = ast.parse(code)
    scanned = [("x.py", n) for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    found = mixins(scanned)
    assert any("class Driver(Side, Other)" in row for row in found)
    assert any("class Side declares what others set: _nursery" in row for row in found)
    assert private_reaches(tree) == [(14, "self._s._out")]

"""The public surface of ``dpgate``: what ``__all__`` exports, that it is documented, that it is tested.

* ``dpgate.__all__`` lists exactly the public names of the package (httpx's
  ``test_all_imports_are_exported``): nothing public is left out, nothing listed
  is missing.
* Every name in ``__all__`` is documented: classes, functions and modules by
  their own docstring, constants by a ``#:`` comment or a string right after
  their assignment where they are defined.
* Every public module (no leading underscore anywhere in its dotted name) is
  named by at least one test module; ``UNTESTED`` lists those that are not yet,
  and may only shrink.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import re
from pathlib import Path
from types import ModuleType

import dpgate

TESTS = Path(__file__).resolve().parent

# Public modules that no test module names yet. Write their tests and remove them from here;
# the test below fails when an entry is tested, so the list can only shrink.
UNTESTED: frozenset[str] = frozenset()


def public_names(module: ModuleType) -> set[str]:
    """Names a user finds on ``module``: no leading underscore, no submodule that is not re-exported.

    Importing ``dpgate.x`` sets the attribute ``x`` on ``dpgate`` whether or not
    it is meant as API, so a submodule counts only when ``__all__`` lists it;
    ``annotations`` is ``from __future__ import annotations``.
    """
    names = set()
    for name, value in vars(module).items():
        if name.startswith("_") or name == "annotations":
            continue
        if inspect.ismodule(value) and name not in module.__all__:
            continue
        names.add(name)
    return names


def test_all_lists_exactly_the_public_names() -> None:
    assert len(dpgate.__all__) == len(set(dpgate.__all__)), "dpgate.__all__ lists a name twice"
    for name in dpgate.__all__:  # imported on first use (PEP 562): each resolves, then is a module attribute
        getattr(dpgate, name)
    assert set(dpgate.__all__) == public_names(dpgate)


def test_reexported_modules_are_dpgate_modules() -> None:
    for name in dpgate.__all__:
        value = getattr(dpgate, name)
        if inspect.ismodule(value):
            assert value.__name__ == f"dpgate.{name}", name


def _defining_module(module: ModuleType, name: str) -> ModuleType:
    """The module whose source assigns ``name``, following ``from x import name`` from ``module`` on."""
    for node in ast.walk(ast.parse(inspect.getsource(module))):  # also under ``if TYPE_CHECKING:`` (lazy names)
        if isinstance(node, ast.ImportFrom) and node.module and any(a.name == name for a in node.names):
            return _defining_module(importlib.import_module(node.module), name)
    return module


def _assignment_is_documented(module: ModuleType, name: str) -> bool:
    """A ``#:`` comment on the line just above the assignment, or a string just after it (Sphinx's two forms)."""
    source = inspect.getsource(module)
    lines = source.splitlines()
    body = ast.parse(source).body
    for i, node in enumerate(body):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        if not any(isinstance(t, ast.Name) and t.id == name for t in targets):
            continue
        above = lines[node.lineno - 2].strip() if node.lineno >= 2 else ""
        after = body[i + 1] if i + 1 < len(body) else None
        string_after = (
            isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)
        )
        return above.startswith("#:") or string_after
    return False


def test_every_exported_name_is_documented() -> None:
    undocumented = []
    for name in dpgate.__all__:
        value = getattr(dpgate, name)
        if inspect.isclass(value) or inspect.isfunction(value) or inspect.ismodule(value):
            # A class's own docstring, not one inherited from its base (inspect.getdoc would inherit).
            doc = vars(value).get("__doc__") if inspect.isclass(value) else value.__doc__
            if not (doc and doc.strip()):
                undocumented.append(name)
        elif not _assignment_is_documented(_defining_module(dpgate, name), name):
            undocumented.append(name)
    assert not undocumented, f"document these exported names: {undocumented}"


def public_modules() -> set[str]:
    """Every module and package under ``dpgate`` with no leading underscore in its dotted name."""
    found = pkgutil.walk_packages(dpgate.__path__, prefix="dpgate.")
    return {m.name for m in found if not any(part.startswith("_") for part in m.name.split("."))}


def _dotted(node: ast.expr) -> str | None:
    """``dpgate.a.b`` for the attribute chain ``dpgate.a.b``; None for anything else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return ".".join([node.id, *reversed(parts)]) if isinstance(node, ast.Name) else None


def mentioned_modules() -> set[str]:
    """``dpgate`` modules that the test modules import or use, read from their code (comments do not count).

    ``import dpgate.a``, ``from dpgate.a import b`` (``dpgate.a`` and ``dpgate.a.b``),
    ``dpgate.a.f(...)`` after ``import dpgate``, and, in a string (code or a
    command run in a subprocess), ``import dpgate.a`` or exactly ``"dpgate.a"``
    (``python -m dpgate.a``) all mention ``dpgate.a``.  Every prefix of
    a dotted name counts, and names that are not modules are ignored by the caller.
    """
    dotted: set[str] = set()
    for path in TESTS.rglob("test_*.py"):
        if path.name == Path(__file__).name:
            continue  # this file names every module; it tests none of them
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                dotted.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                dotted.update(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Attribute) and (name := _dotted(node)):
                dotted.add(name)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                if re.fullmatch(r"dpgate(?:\.\w+)+", node.value):  # python -m dpgate.cli
                    dotted.add(node.value)
                dotted.update(re.findall(r"\b(?:import|from)\s+(dpgate(?:\.\w+)+)", node.value))
    names = set()
    for name in dotted:
        parts = name.split(".")
        if parts[0] == "dpgate":
            names.update(".".join(parts[:k]) for k in range(2, len(parts) + 1))
    return names


def test_every_public_module_has_a_test() -> None:
    untested = public_modules() - mentioned_modules()
    assert untested <= UNTESTED, f"no test module names {sorted(untested - UNTESTED)}: add tests"
    assert UNTESTED <= untested, f"{sorted(UNTESTED - untested)} are tested (or gone) now: remove them from UNTESTED"


def test_pep249_type_objects_are_at_top_level() -> None:
    """PEP 249 asks for the type objects and constructors on the module that has ``connect``."""
    for name in ("STRING", "NUMBER", "DATETIME", "BINARY", "ROWID", "Date", "Time", "Timestamp",
                 "DateFromTicks", "TimeFromTicks", "TimestampFromTicks", "Binary"):
        assert name in dpgate.__all__ and getattr(dpgate, name) is getattr(dpgate.dbapi, name), name
    assert dpgate.NUMBER == "DOUBLE" and dpgate.STRING == "VARCHAR" and dpgate.NUMBER != "VARCHAR"
    assert dpgate.Date(2024, 1, 2).year == 2024 and dpgate.Binary(b"x") == b"x"
    assert dpgate.DateFromTicks(0).year in (1969, 1970)

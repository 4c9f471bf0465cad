"""The code's shape (issue 26): packages by stage, module sizes, layer contracts.

The layer contracts themselves are checked by import-linter from the test command
(``make test`` runs ``lint-imports``, configured in ``pyproject.toml``); here, what
import-linter does not check.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import dpgate

PACKAGE = Path(dpgate.__file__).parent
ROOT = PACKAGE.parent
#: A module may pass 500 lines only if its docstring's first lines say why; none may pass 650.
SOFT_LINES, HARD_LINES = 500, 650
WHY = "Why one module of"


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_module_over_the_hard_limit() -> None:
    big = {str(p.relative_to(ROOT)): n for p in _modules() if (n := len(p.read_text().splitlines())) > HARD_LINES}
    assert not big, f"modules over {HARD_LINES} lines: {big}; split them by what they do"


def test_modules_over_the_soft_limit_say_why() -> None:
    silent = [str(p.relative_to(ROOT)) for p in _modules()
              if len((text := p.read_text()).splitlines()) > SOFT_LINES and WHY not in "\n".join(text.splitlines()[:8])]
    assert not silent, f"over {SOFT_LINES} lines with no '{WHY} …' in their first lines: {silent}"


def test_every_package_has_a_docstring_naming_its_modules() -> None:
    for init in PACKAGE.rglob("__init__.py"):
        doc = ast.get_docstring(ast.parse(init.read_text()))
        assert doc, f"{init.relative_to(ROOT)} has no docstring"


def test_top_level_holds_packages_and_few_modules() -> None:
    """The pipeline is read from the package names; the top level keeps only the thin
    interfaces and the shared base, not families of private modules."""
    modules = sorted(p.stem for p in PACKAGE.glob("*.py"))
    assert modules == ["__init__", "_blas", "_progress", "_rowhash", "_validate", "_version", "accessor", "cli",
                       "datasets", "errors"], modules


def test_layer_contract_names_every_top_level_module_and_package() -> None:
    """A new top-level module or package must be placed in a layer, or import-linter ignores it."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    layers = next(c for c in config if c["id"] == "layers")["layers"]
    named = {name.strip() for layer in layers for name in layer.split("|")}
    present = {p.stem for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    present |= {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert present == named, f"not in a layer: {sorted(present - named)}; gone: {sorted(named - present)}"


def test_no_import_cycles_between_modules() -> None:
    """No two modules import each other, directly or through others — lazy imports and
    ``TYPE_CHECKING`` imports included (a tie hidden from the interpreter is still a tie).
    The layer contract forbids cycles across packages; this forbids them inside one too."""
    import grimp  # import-linter's graph builder

    graph = grimp.build_graph("dpgate", cache_dir=None)
    cycles = sorted({tuple(sorted((module, imported)))
                     for module in graph.modules for imported in graph.find_modules_directly_imported_by(module)
                     if graph.chain_exists(importer=imported, imported=module)})
    assert not cycles, f"modules that import each other (directly or through others): {cycles}"

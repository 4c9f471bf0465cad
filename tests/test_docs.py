"""Every module's doctests, run as tests (sqlglot's ``tests/test_docs.py``).

One test per module of the ``dpgate`` package, private modules included, so a
docstring example that stops working fails ``make test`` like any other test,
and a plain ``pytest`` runs them too (no ``--doctest-modules`` flag to forget).
A module without examples passes.  A module that cannot be imported fails,
unless what is missing is an optional package listed in ``OPTIONAL_PACKAGES``:
then it is skipped, with the reason, when that package is not installed.
"""

from __future__ import annotations

import doctest
import importlib
import io
import pkgutil
from types import ModuleType

import pytest

import dpgate

# Packages outside the core install (extras: demo, console): a module that needs one is skipped when it is absent.
OPTIONAL_PACKAGES = frozenset({"matplotlib", "starlette", "uvicorn", "altair"})

# pytest's own doctest default: ``...`` in an expected output matches anything.
OPTIONFLAGS = doctest.ELLIPSIS


def module_names() -> list[str]:
    """``dpgate`` and every module and package below it, by dotted name.

    A package that fails to import is still listed (its own test then fails, or
    skips for an optional package); only its submodules cannot be listed.
    """
    found = pkgutil.walk_packages(dpgate.__path__, prefix="dpgate.", onerror=lambda name: None)
    return ["dpgate", *sorted(info.name for info in found)]


def _import(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing in OPTIONAL_PACKAGES:
            pytest.skip(f"{name} needs the optional package {missing}, which is not installed")
        raise


@pytest.mark.parametrize("name", module_names())
def test_doctests(name: str) -> None:
    module = _import(name)
    runner = doctest.DocTestRunner(optionflags=OPTIONFLAGS)
    report = io.StringIO()
    for test in doctest.DocTestFinder().find(module, name):
        runner.run(test, out=report.write)
    assert runner.failures == 0, f"{runner.failures} of {runner.tries} examples failed in {name}:\n{report.getvalue()}"

"""The exception tree (dpgate.errors) and the translation of lower-layer errors."""

from __future__ import annotations

import sqlite3

import pytest

import dpgate
from dpgate import errors
from dpgate.errors import (
    DPGateInternalError,
    Error,
    InvalidArgument,
    InvalidArgumentType,
    LedgerError,
    OperationalError,
    QuerySyntaxError,
    map_exceptions,
)

CLASSES = [getattr(errors, name) for name in errors.__all__ if isinstance(getattr(errors, name), type)]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_error_class_is_a_dpgate_error(cls: type) -> None:
    if cls is errors.Warning:
        assert issubclass(cls, Warning) and not issubclass(cls, Error)  # PEP 249: apart from Error
    else:
        assert issubclass(cls, Error)


def _package_exceptions() -> list[type]:
    """Every exception class a dpgate module defines (the whole package, imported)."""
    import importlib
    import inspect
    import pkgutil

    found = set()
    for info in pkgutil.walk_packages(dpgate.__path__, prefix="dpgate."):
        module = importlib.import_module(info.name)
        found |= {cls for _, cls in inspect.getmembers(module, inspect.isclass)
                  if cls.__module__ == info.name and issubclass(cls, BaseException)}
    return sorted(found, key=lambda c: f"{c.__module__}.{c.__qualname__}")


def test_every_exception_the_package_defines_is_a_dpgate_error() -> None:
    from dpgate.server._protocol import ProtocolError
    from dpgate.server._scram import ScramError
    from dpgate.server._session import SqlError

    classes = _package_exceptions()
    assert {SqlError, ScramError, ProtocolError} <= set(classes)  # the walk reaches the server
    strays = [f"{c.__module__}.{c.__qualname__}" for c in classes
              if not issubclass(c, Error) and not issubclass(c, Warning)]  # warnings: PEP 249 keeps them apart
    assert strays == []
    assert SqlError("25P02", "aborted").code == "25P02"  # the server still sends the code it carries


def test_the_package_exports_the_tree() -> None:
    for cls in CLASSES:
        assert getattr(dpgate, cls.__name__) is cls


def test_errors_all_is_the_one_list_of_the_exception_classes() -> None:
    """``errors.__all__`` lists every exception class of the module and nothing else;
    ``dpgate`` and ``dpgate.dbapi`` extend their ``__all__`` with it."""
    defined = {name for name, value in vars(errors).items()
               if isinstance(value, type) and issubclass(value, BaseException) and value.__module__ == errors.__name__}
    assert sorted(errors.__all__) == sorted(defined) and len(CLASSES) == len(errors.__all__)
    for module in (dpgate, dpgate.dbapi):
        assert set(errors.__all__) <= set(module.__all__)
        assert all(getattr(module, name) is getattr(errors, name) for name in errors.__all__)


def test_scipy_style_arguments_errors_are_builtin_errors_too() -> None:
    assert issubclass(InvalidArgument, ValueError)
    assert issubclass(InvalidArgumentType, ValueError) and issubclass(InvalidArgumentType, TypeError)
    assert issubclass(errors.InvalidRequirement, ValueError)
    assert issubclass(QuerySyntaxError, errors.UnsupportedQuery)


def test_the_tree_drawn_in_the_docstring_names_every_class() -> None:
    doc = errors.__doc__ or ""
    for cls in CLASSES:
        assert cls.__name__ in doc


def test_internal_errors_say_it_is_a_bug() -> None:
    assert str(DPGateInternalError("x went wrong")).endswith("this is a bug in dpgate")


def test_map_exceptions_translates_and_chains() -> None:
    with pytest.raises(LedgerError, match=r"^Cannot read the ledger: disk I/O error\.$") as info:
        with map_exceptions({sqlite3.OperationalError: LedgerError}, "Cannot read the ledger: {exc}."):
            raise sqlite3.OperationalError("disk I/O error")
    assert isinstance(info.value.__cause__, sqlite3.OperationalError)


def test_map_exceptions_matches_subclasses_and_takes_the_first_match() -> None:
    mapping = {sqlite3.OperationalError: LedgerError, sqlite3.Error: OperationalError}
    with pytest.raises(LedgerError):
        with map_exceptions(mapping):
            raise sqlite3.OperationalError("locked")
    with pytest.raises(OperationalError) as info:
        with map_exceptions(mapping):
            raise sqlite3.IntegrityError("constraint")
    assert type(info.value) is OperationalError and str(info.value) == "constraint"


def test_map_exceptions_lets_other_errors_through() -> None:
    with pytest.raises(KeyError):
        with map_exceptions({sqlite3.Error: LedgerError}):
            raise KeyError("k")
    # A dpgate error raised inside is never re-wrapped, even if it matches a key.
    with pytest.raises(InvalidArgument) as info:
        with map_exceptions({ValueError: OperationalError}):
            raise InvalidArgument("bad")
    assert info.value.__cause__ is None
    with map_exceptions({sqlite3.Error: LedgerError}):
        pass  # no exception: nothing happens


def test_map_exceptions_message_forms() -> None:
    # Only the literal {exc} is replaced, so paths and SQL with braces are safe.
    with pytest.raises(LedgerError, match=r"^'/tmp/\{x\}' is not a dpgate ledger \(boom\)\.$"):
        with map_exceptions({RuntimeError: LedgerError}, "'/tmp/{x}' is not a dpgate ledger ({exc})."):
            raise RuntimeError("boom")
    with pytest.raises(QuerySyntaxError, match="at line 3"):
        with map_exceptions({ValueError: QuerySyntaxError}, lambda exc: f"SQL does not parse {exc}."):
            raise ValueError("at line 3")


#: Built-in exceptions dpgate may raise, each for a protocol that names it (never for a user's mistake).
ALLOWED_BUILTIN_RAISES = {
    ("dbapi/_cursor.py", "StopIteration"),  # the iterator protocol of a PEP 249 cursor
    ("server/_protocol.py", "EOFError"),  # a client closed the socket; the handler ends the connection
    ("server/_admission.py", "TimeoutError"),  # a socket's deadline passed (socket.timeout's class)
    ("inference/_factors.py", "IndexError"),  # a sequence's __getitem__ past its end
    ("backends/_dbapi.py", "NotImplementedError"),  # an abstract method of a backend subclass
    ("cli.py", "FileNotFoundError"),  # the CLI's exit code 3 for a missing file
    ("backends/__init__.py", "FileNotFoundError"),  # the same, for `dpgate serve --data`
    ("__init__.py", "AttributeError"),  # a package's __getattr__ (PEP 562) for a name it does not have
    ("server/__init__.py", "AttributeError"),
    ("console/__init__.py", "AttributeError"),
    ("console/_cli.py", "FileNotFoundError"),  # `dpgate console --ledger` naming no file: the CLI's exit code 3
}


def test_every_raise_is_a_dpgate_error_or_a_named_protocol_exception() -> None:
    """A raise of a built-in exception class is in :data:`ALLOWED_BUILTIN_RAISES`; every other
    error dpgate raises is a ``dpgate.Error`` (which a caller catches with one ``except``)."""
    import ast
    import builtins
    from pathlib import Path

    package = Path(dpgate.__file__).parent
    found = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                target = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
                name = target.id if isinstance(target, ast.Name) else None
                if name and isinstance(getattr(builtins, name, None), type):
                    found.add((path.relative_to(package).as_posix(), name))
    assert found <= ALLOWED_BUILTIN_RAISES, sorted(found - ALLOWED_BUILTIN_RAISES)

"""The analysts of ``dpgate serve``: a YAML users file of SCRAM verifiers and budget caps.

Format (written by ``dpgate user add USERS_FILE NAME --budget B``)::

    users:
      alice:
        budget: 0.5
        scram: SCRAM-SHA-256$4096:<salt>$<StoredKey>:<ServerKey>

``budget`` caps the privacy budget charged for the fresh releases made for that
analyst; the gateway's global per-cell budget still bounds everyone together
(see :mod:`dpgate.server`).  ``scram`` is PostgreSQL's verifier text: the
password itself is never stored.  The file is written owner-only (0o600) and
atomically (a temporary file renamed over the old one).
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import yaml

from dpgate.errors import InvalidRequirement, SchemaError
from dpgate.server._scram import ScramError, Verifier, make_verifier

__all__ = ["Analyst", "load_users", "add_user"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.@-]{0,62}$")


@dataclass(frozen=True)
class Analyst:
    """One analyst: name, SCRAM verifier, budget cap ε."""

    name: str
    verifier: Verifier
    budget: float


def _check_budget(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InvalidRequirement(f"{where}: budget must be a finite number ≥ 0, got {value!r}.")
    return float(value)


def _check_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise InvalidRequirement(
            f"{where}: analyst name {name!r} must start with a letter or _ and use letters, digits, _ . @ - "
            "(at most 63 characters, like a PostgreSQL role)."
        )
    return name


def load_users(path: str | os.PathLike[str]) -> dict[str, Analyst]:
    """Read a users file.  A missing file is an error; an empty one has no analysts.

    Raises:
        SchemaError: the file is not a users file (bad YAML, a bad verifier or budget).
    """
    where = os.fspath(path)
    with open(where, encoding="utf-8") as fh:
        try:
            doc = yaml.safe_load(fh) or {}
        except yaml.YAMLError as exc:
            raise SchemaError(f"{where}: not valid YAML ({exc}).") from None
    entries = doc.get("users") if isinstance(doc, Mapping) else None
    if entries is None:
        entries = {}
    if not isinstance(entries, Mapping):
        raise SchemaError(f"{where}: expected a mapping 'users: {{name: {{budget: B, scram: ...}}}}'.")
    out: dict[str, Analyst] = {}
    for name, entry in entries.items():
        try:
            _check_name(name, where)
            if not isinstance(entry, Mapping) or set(entry) - {"budget", "scram"}:
                raise SchemaError(f"{where}: user {name!r} must have exactly the keys budget and scram.")
            out[name] = Analyst(name, Verifier.parse(str(entry.get("scram", ""))),
                                _check_budget(entry.get("budget"), f"{where}, user {name!r}"))
        except (ScramError, InvalidRequirement) as exc:
            raise SchemaError(f"{where}, user {name!r}: {exc}") from None
    return out


def add_user(path: str | os.PathLike[str], name: str, password: str, budget: float) -> Analyst:
    """Add (or replace) analyst ``name`` in the users file, creating the file if needed.

    Raises:
        InvalidRequirement: a bad name, an empty password or a bad budget.
        SchemaError: the existing file is not a users file.
    """
    where = os.fspath(path)
    _check_name(name, where)
    budget = _check_budget(budget, where)
    if not password:
        raise InvalidRequirement("the password must not be empty.")
    doc: dict[str, Any] = {"users": {}}
    if os.path.exists(where):
        load_users(where)  # validate before rewriting
        with open(where, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh) or {}
        doc["users"] = dict(doc.get("users") or {})
    analyst = Analyst(name, make_verifier(password), budget)
    doc["users"][name] = {"budget": budget, "scram": str(analyst.verifier)}
    directory = os.path.dirname(os.path.abspath(where))
    fd, tmp = tempfile.mkstemp(prefix=".users-", dir=directory)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            yaml.safe_dump(doc, fh, sort_keys=True)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, where)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return analyst

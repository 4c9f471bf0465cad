"""The seam between the gateway and its extensions, and the one requirement resolver.

* ``Gateway.locked_view`` gives a frozen snapshot of a table's history
  (:class:`dpgate.plan.state.TableView`): later releases and refinements do not show
  in it, its arrays are read-only, and it agrees with the ledger and the BLUE.
* No module of the package reads a gateway's private attributes; the extensions
  (``dpgate.model``, ``dpgate.warmstart``) never import ``dpgate.gateway``, nor the
  server ``dpgate.cli``.
* ``resolve_requirement`` keeps each caller's precedence (``Gateway.query``:
  argument > hint; DB-API: hint > session SET > connect argument) and validates once.
"""

from __future__ import annotations

import ast
import math
import pathlib

import numpy as np
import pytest

import dpgate
import dpgate.datasets
from dpgate import dbapi
from dpgate.errors import InvalidRequirement, ProgrammingError
from dpgate.plan.requirement import Requirement, hinted, resolve_accuracy, resolve_confidence, resolve_requirement
from dpgate.plan.state import TableView

PACKAGE = pathlib.Path(dpgate.__file__).parent


@pytest.fixture
def gw():  # type: ignore[no-untyped-def]
    df, schema = dpgate.datasets.load_pums()
    g = dpgate.Gateway(df, schema, budget=5.0, seed=3)
    yield g
    g.close()


# -- the frozen view ------------------------------------------------------------------------------
def test_view_is_a_frozen_snapshot(gw) -> None:  # type: ignore[no-untyped-def]
    gw.query("SELECT COUNT(*) FROM pums WHERE age < 30", accuracy=30)
    with gw.locked_view("pums") as view:
        assert isinstance(view, TableView)
    m, atoms, values = view.m, view.atoms.n_atoms, view.values.copy()
    assert m >= 1 and view.rows.shape == (m, atoms)
    for arr in (view.rows, view.values, view.scales, view.lattice, view.alphas, view.sensitivities):
        assert not arr.flags.writeable
    # Later releases (which also refine the gateway's atoms) do not reach the snapshot.
    gw.query("SELECT COUNT(*) FROM pums WHERE age BETWEEN 40 AND 49 AND educ > 12", accuracy=30)
    assert view.m == m and view.atoms.n_atoms == atoms and np.array_equal(view.values, values)
    with gw.locked_view("pums") as later:
        assert later.m > m and later.atoms.n_atoms > atoms


def test_view_matches_ledger_and_blue(gw) -> None:  # type: ignore[no-untyped-def]
    gw.query("SELECT COUNT(*) FROM pums WHERE age < 30", accuracy=30)
    gw.query("SELECT COUNT(*) FROM pums WHERE age >= 30", accuracy=30)
    (q,) = dpgate.compile_sql("SELECT COUNT(*) FROM pums WHERE age < 30", gw.schema)
    with gw.locked_view("pums", [q]) as view:
        est = view.estimate(q)
    recs = [r for r in gw.ledger.records() if r.table == "pums"]
    assert view.record_ids == tuple(r.id for r in recs)
    assert np.allclose(view.values, [r.value for r in recs])
    assert np.allclose(view.alphas, [r.alpha for r in recs])
    assert np.allclose(view.scales, [r.scale for r in recs])
    assert [v.to_json() for v in view.queries] == [r.query for r in recs]
    # The view's BLUE is the gateway's: a free answer from history has the same value.
    a = gw.query("SELECT COUNT(*) FROM pums WHERE age < 30", accuracy=1e6).answer
    assert a.source == "history" and est.estimable and math.isclose(a.value, est.value, rel_tol=1e-12)


def test_view_of_an_unknown_table_is_refused(gw) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(dpgate.SchemaError):
        with gw.locked_view("nope"):
            pass


def test_compile_refuses_set_statements(gw) -> None:  # type: ignore[no-untyped-def]
    assert gw.compile("SELECT COUNT(*) FROM pums").table == "pums"
    with pytest.raises(ProgrammingError, match="SET dpgate"):
        gw.compile("SET dpgate.accuracy = 5")


def _private_gateway_reads(tree: ast.AST) -> list[str]:
    """``gw._x`` / ``gateway._x`` / ``self._gateway._x`` attribute reads."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            base = node.value
            name = base.id if isinstance(base, ast.Name) else base.attr if isinstance(base, ast.Attribute) else ""
            if name in ("gw", "gateway", "_gateway"):
                out.append(f"{name}.{node.attr}")
    return out


def test_no_module_reads_private_gateway_attributes() -> None:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name == "gateway.py":
            continue
        hits = _private_gateway_reads(ast.parse(path.read_text(encoding="utf-8")))
        if hits:
            found[str(path.relative_to(PACKAGE))] = hits
    assert found == {}


def _imported_modules(tree: ast.AST) -> set[str]:
    """Every module an ``import`` / ``from … import`` names (at any depth, lazy ones included)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


@pytest.mark.parametrize(("package", "above"), [
    ("model", "dpgate.gateway"),  # the extensions use a gateway through dpgate.plan.seam.GatewaySeam
    ("warmstart", "dpgate.gateway"),
    ("server", "dpgate.cli"),  # the command line registers the server's commands, never the reverse
])
def test_lower_layers_never_import_higher_ones(package: str, above: str) -> None:
    found = {}
    for path in (PACKAGE / package).rglob("*.py"):
        hits = sorted(m for m in _imported_modules(ast.parse(path.read_text(encoding="utf-8")))
                      if m == above or m.startswith(above + "."))
        if hits:
            found[str(path.relative_to(PACKAGE))] = hits
    assert found == {}


def test_gateway_has_every_member_of_the_seam(gw) -> None:  # type: ignore[no-untyped-def]
    from dpgate.plan.seam import GatewaySeam

    members = sorted(n for n in vars(GatewaySeam) if not n.startswith("_"))
    assert members == ["budget", "compile", "locked_view", "release_measurements", "schema", "spent"]
    assert [n for n in members if not hasattr(gw, n)] == []  # mypy checks the signatures


def test_release_measurements_states_its_privacy_guarantee() -> None:
    doc = dpgate.Gateway.release_measurements.__doc__ or ""
    for words in ("Spends budget", "Neighbouring relation", "Sensitivity", "Noise law and scale", "Cost charged"):
        assert words in doc


# -- one requirement resolver ------------------------------------------------------------------------
def test_first_level_that_gives_a_value_wins() -> None:
    args = {"accuracy": None, "confidence": 0.9, "allow_partial": None}
    hints = hinted({"accuracy": "25", "confidence": "0.99", "allow_partial": "ON"})
    assert hints == {"accuracy": 25.0, "confidence": 0.99, "allow_partial": True}
    assert resolve_requirement(args, hints, missing="") == Requirement(25.0, 0.9, True)
    assert resolve_requirement(hints, args, missing="") == Requirement(25.0, 0.99, True)
    assert resolve_requirement({"accuracy": 3}, missing="") == Requirement(3.0, 0.95, False)
    assert resolve_requirement(hinted({"accuracy": "3", "allow_partial": "no"}), missing="").allow_partial is False


@pytest.mark.parametrize("level", [
    {"accuracy": 0}, {"accuracy": -1}, {"accuracy": math.inf}, {"accuracy": math.nan}, {"accuracy": True},
    {"accuracy": "10"}, {"accuracy": 5, "confidence": 1.0}, {"accuracy": 5, "confidence": 0},
    {"accuracy": 5, "confidence": "high"},
])
def test_bad_values_raise_invalid_requirement(level) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidRequirement):
        resolve_requirement(level, missing="")


def test_a_hint_that_is_not_a_number_is_refused() -> None:
    with pytest.raises(InvalidRequirement, match="hint accuracy='many' is not a number"):
        hinted({"accuracy": "many"})


def test_missing_accuracy_uses_the_callers_message() -> None:
    with pytest.raises(InvalidRequirement, match="say where"):
        resolve_requirement({"accuracy": None}, {}, missing="say where")
    assert resolve_accuracy({"accuracy": None}) is None
    assert resolve_confidence({}) == 0.95


def test_gateway_argument_beats_hint(gw) -> None:  # type: ignore[no-untyped-def]
    sql = "SELECT /*+ dpgate accuracy=1000 confidence=0.5 */ COUNT(*) FROM pums WHERE age < 30"
    a = gw.query(sql, accuracy=40, confidence=0.9).answer
    assert a.accuracy == 40 and a.confidence == 0.9
    b = gw.query(sql).answer
    assert b.accuracy == 1000 and b.confidence == 0.5


def test_dbapi_hint_beats_session_beats_connection() -> None:
    df, schema = dpgate.datasets.load_pums()
    with dbapi.connect(df, schema=schema, budget=5.0, accuracy=50, confidence=0.9, seed=0) as con:
        cur = con.cursor()
        cur.execute("SELECT COUNT(*) FROM pums WHERE age < 30")
        assert (cur.answers[0].accuracy, cur.answers[0].confidence) == (50, 0.9)
        cur.execute("SET dpgate.accuracy = 60")
        cur.execute("SELECT COUNT(*) FROM pums WHERE age < 40")
        assert (cur.answers[0].accuracy, cur.answers[0].confidence) == (60, 0.9)
        cur.execute("SELECT /*+ dpgate accuracy=70 confidence=0.8 */ COUNT(*) FROM pums WHERE age < 50")
        assert (cur.answers[0].accuracy, cur.answers[0].confidence) == (70, 0.8)

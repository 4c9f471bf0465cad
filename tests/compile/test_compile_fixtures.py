"""The compiler's SQL fixtures: input/expected pairs in ``tests/fixtures/compile/*.sql``.

One runner for every case (sqlglot's ``tests/fixtures/optimizer`` idea): refused SQL
must raise the named ``dpgate.errors`` class with a message matching a regex;
compiled SQL must give exactly the hand-written weights over cells, offset and
sensitivity (per group for GROUP BY).  The file format is described in
``tests/fixtures/compile/README.md``.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import dpgate.errors as errors
from dpgate.compile import CompiledStatement, compile_statement
from dpgate.compile.query import LinearQuery
from dpgate.errors import ProgrammingError
from dpgate.schema.domains import Column, Schema, Table

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "compile"
SCHEMA = Schema.load(str(FIXTURES / "schema.yaml"))
_HEADER = re.compile(r"-- (\w+):(.*)$")
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)$")


@dataclass(frozen=True)
class Case:
    file: str
    name: str
    sql: str
    meta: dict[str, str]
    weights: tuple[str, ...] = field(default=())

    @property
    def id(self) -> str:
        return f"{self.file}::{self.name}"


def _load() -> list[Case]:
    cases = []
    for path in sorted(FIXTURES.glob("*.sql")):
        text = path.read_text(encoding="utf-8")
        for block in re.split(r"(?m)^-- name: ", text)[1:]:
            lines = block.split("\n")
            meta: dict[str, str] = {}
            weights: list[str] = []
            body: list[str] = []
            for line in lines[1:]:
                m = _HEADER.match(line)
                if m and not body:
                    key, value = m.group(1), m.group(2).strip()
                    if key == "weights":
                        weights.append(value)
                    else:
                        assert key not in meta, f"{path.name}: {lines[0]}: {key} given twice"
                        meta[key] = value
                else:
                    body.append(line)
            sql = "\n".join(body).strip("\n")
            cases.append(Case(path.stem, lines[0].strip(), sql, meta, tuple(weights)))
    return cases


CASES = _load()
REFUSED = [c for c in CASES if "error" in c.meta]
COMPILED = [c for c in CASES if "error" not in c.meta]


def test_fixtures_are_many_and_names_unique():
    names = [c.name for c in CASES]
    assert len(set(names)) == len(names)
    assert len(REFUSED) >= 40
    assert len(COMPILED) >= 40
    for c in COMPILED:
        assert {"cells", "offset", "sensitivity"} <= set(c.meta), c.id
        assert set(c.meta) <= {"cells", "offset", "sensitivity", "output", "groups", "keys"}, c.id
        assert ("groups" in c.meta) == ("keys" in c.meta), c.id


# -- refused SQL -------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", REFUSED, ids=[c.id for c in REFUSED])
def test_refused(case: Case):
    cls = getattr(errors, case.meta["error"])
    with pytest.raises(cls) as info:
        compile_statement(case.sql, SCHEMA)
    msg = str(info.value)
    assert re.search(case.meta["match"], msg, re.IGNORECASE | re.DOTALL), msg
    # Every refusal is a PEP 249 ProgrammingError the gateway turns into a refusal.
    assert isinstance(info.value, ProgrammingError)
    assert msg.strip().endswith((".", ")", "]")) or len(msg) > 20


# -- compiled SQL: the expected weights, built from the fixture alone ---------------------------------
def _labels(col: Column, text: str) -> list[int]:
    """Cell indices of ``col`` that a selector's label (or inclusive integer range) names."""
    labels = col.labels()
    m = _RANGE.match(text)
    if m:
        lo, hi = int(m.group(1)), int(m.group(2))
        cells = [i for i, lab in enumerate(labels) if isinstance(lab, int) and not isinstance(lab, bool)
                 and lo <= lab <= hi]
        assert len(cells) == hi - lo + 1, f"{text} is not inside {col.name}'s domain"
        return cells
    value = eval(text, {"__builtins__": {}})  # a Python literal: 30, '1', None, True
    assert value in labels, f"{value!r} is not a label of {col.name}: {labels}"
    return [labels.index(value)]


def _exact(label: Any) -> Any:
    return Fraction(label) if isinstance(label, int) and not isinstance(label, bool) else label


def expected_weights(case: Case, table: Table, cols: list[Column]) -> np.ndarray:
    """The fixture's weights on every cell of ``cols`` (declaration order), computed cell by cell."""
    shape = tuple(c.n_cells for c in cols)
    w = np.zeros(shape, dtype=object)
    w[...] = Fraction(0)
    names = [c.name for c in cols]
    for line in case.weights:
        selector, _, value = line.partition("->")
        assert value.strip(), f"{case.id}: weight line {line!r} lacks '-> value'"
        picks: list[list[int]] = [list(range(c.n_cells)) for c in cols]
        if selector.strip() != "*":
            for term in selector.split(" & "):
                name, _, label = term.strip().partition("=")
                assert name in names, f"{case.id}: {name} is not listed in cells"
                ax = names.index(name)
                picks[ax] = _labels(cols[ax], label.strip())
        for idx in itertools.product(*picks):
            env = {c.name: _exact(c.labels()[i]) for c, i in zip(cols, idx, strict=True)}
            w[idx] = Fraction(eval(value, {"__builtins__": {}, "abs": abs}, env))
    return w


def dense(q: LinearQuery, table: Table, cols: list[Column]) -> np.ndarray:
    """The compiled weights on every cell of ``cols`` (which must hold the query's columns)."""
    names = [c.name for c in cols]
    assert set(q.columns) <= set(names), (q.columns, names)
    full = q.expand(table, names, [range(c.n_cells) for c in cols])
    return np.asarray(full, dtype=object) * Fraction(1, q.denominator)


def _columns(table: Table, text: str) -> list[Column]:
    wanted = {n.strip() for n in text.split(",") if n.strip()}
    cols = [c for c in table.columns if c.name in wanted]
    assert len(cols) == len(wanted), f"unknown columns in {text!r}"
    return cols


@pytest.mark.parametrize("case", COMPILED, ids=[c.id for c in COMPILED])
def test_compiled(case: Case):
    st = compile_statement(case.sql, SCHEMA)
    assert isinstance(st, CompiledStatement)
    table = SCHEMA.table(st.table)
    cols = _columns(table, case.meta["cells"])
    want = expected_weights(case, table, cols)
    output = int(case.meta.get("output", 0))
    offset = Fraction(case.meta["offset"])
    sensitivity = Fraction(case.meta["sensitivity"])

    if "groups" not in case.meta:
        assert st.group_columns == () and st.group_keys == ((),)
        q = st.query(0, output)
        assert np.array_equal(dense(q, table, cols), want), case.id
        assert q.offset == offset
        assert q.sensitivity == pytest.approx(float(sensitivity), abs=1e-12)
        return

    groups = [n.strip() for n in case.meta["groups"].split(",")]
    keys = eval(case.meta["keys"], {"__builtins__": {}, "range": range})
    assert st.group_columns == tuple(groups)
    assert list(st.group_keys) == [tuple(k) for k in keys]
    names = [c.name for c in cols]
    assert set(groups) <= set(names), f"{case.id}: list the group columns in cells"
    worst = Fraction(0)
    for g, key in enumerate(st.group_keys):
        q = st.query(g, output)
        assert q.group == tuple(zip(groups, key, strict=True))
        mask = np.ones(want.shape, dtype=bool)
        for name, label in zip(groups, key, strict=True):
            ax = names.index(name)
            hit = np.array([lab == label and type(lab) is type(label) for lab in cols[ax].labels()])
            mask &= hit.reshape([-1 if a == ax else 1 for a in range(len(cols))])
        mine = np.where(mask, want, Fraction(0))
        assert np.array_equal(dense(q, table, cols), mine), (case.id, key)
        assert q.offset == offset
        top = max((abs(x) for x in mine.flat), default=Fraction(0))
        assert q.sensitivity == pytest.approx(float(top), abs=1e-12), (case.id, key)
        worst = max(worst, top)
    assert worst == sensitivity, case.id

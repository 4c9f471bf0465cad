"""Accounting per privacy unit, by brute force (docs/privacy_unit.md states and proves it).

On small domains (2–4 cells) and bounds ``k = 1..3``: a real :class:`dpgate.Gateway` over unit
tables makes releases (random weights and ``α`` through ``release_measurements``, and SQL through
``query``); then, for EVERY way one unit's bounded rows can sit in the cells (each multiset of at
most ``k`` cells, per table), the exact privacy loss of everything released — under the noise law
dpgate actually drew from (the discrete Laplace parameter ``t`` of each draw, captured, and the
lattice of each ledger record) — is checked against what dpgate recorded: ``gw.spent`` and each
record's ``cost_after``.  The worst unit (``k`` rows in the most-charged cell, in every table)
attains the charge.  That adding a unit changes the bounded table by exactly its kept rows, and
nothing else, is checked on DuckDB through the cube's own SQL.
"""

from __future__ import annotations

import itertools
import warnings
from collections import Counter
from collections.abc import Iterator, Sequence
from fractions import Fraction
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dpgate
from dpgate.compile.query import LinearQuery
from dpgate.plan import cost_grid
from dpgate.release.cube import Cube
from dpgate.release.noise import SeededNoise
from dpgate.schema.domains import Schema


class RecordingNoise(SeededNoise):
    """:class:`SeededNoise` that remembers the parameter ``t`` of every integer it draws, in order."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.ts: list[float] = []

    def discrete_laplace(self, t: float) -> int:
        self.ts.append(t)
        return super().discrete_laplace(t)

    def discrete_laplace_many(self, t: float, n: int) -> list[int]:
        self.ts += [t] * n
        return super().discrete_laplace_many(t, n)


def spec(tables: dict[str, tuple[int, int]]) -> dict[str, Any]:
    """Unit tables ``name: (cells, k)``: one integer column ``c`` of ``cells`` cells (``0 .. cells-2``, NULL)."""
    return {"tables": {name: {"privacy_unit": "uid", "max_rows_per_unit": k, "columns": {
        "c": {"type": "integer", "min": 0, "max": m - 2, "nullable": True}}} for name, (m, k) in tables.items()}}


def base_rows(m: int, seed: int = 0) -> pd.DataFrame:
    """A fixed small table: units with fewer, as many and more rows than any k ≤ 3, NULLs, an unknown unit."""
    rng = np.random.default_rng(seed)
    sizes = [1, 2, 3, 5, 7]
    uid = np.repeat(np.arange(len(sizes)), sizes).astype(object)
    c = rng.integers(0, m, uid.size).astype(object)
    c[c == m - 1] = None  # the last cell is NULL's
    uid[0] = None
    return pd.DataFrame({"uid": pd.array(uid, dtype="Int64"), "c": pd.array(c, dtype="Int64")})


def with_unit(df: pd.DataFrame, cells: Sequence[int], m: int) -> pd.DataFrame:
    """``df`` plus a new unit whose rows are in ``cells``."""
    uid = int(df["uid"].max()) + 1
    rows = pd.DataFrame({"uid": pd.array([uid] * len(cells), dtype="Int64"),
                         "c": pd.array([None if j == m - 1 else j for j in cells], dtype="Int64")})
    return pd.concat([df, rows], ignore_index=True)


def placements(m: int, k: int) -> Iterator[tuple[int, ...]]:
    """Every multiset of at most ``k`` of ``m`` cells: where one unit's bounded rows can sit."""
    for size in range(k + 1):
        yield from itertools.combinations_with_replacement(range(m), size)


# -- the exact loss of what was released -------------------------------------------------------
class Released:
    """A table's releases as the mechanism made them: per release, the integer numerators per
    cell ``n``, the lattice multiplier ``M`` (the integer ``N(x)·M + Z`` is released, ``Z`` discrete
    Laplace of parameter ``t``), the ``t`` drawn with, and the record's ``cost_after``."""

    def __init__(self, table: Any, records: Sequence[Any], ts: Sequence[float]) -> None:
        self.n: list[np.ndarray] = []
        self.law: list[tuple[int, Fraction]] = []
        self.cost_after: list[float] = []
        for rec, t in zip(records, ts, strict=True):
            q = LinearQuery.from_json(rec.query)
            cols = [c.name for c in table.columns]
            full = q.expand(table, cols, [range(c.n_cells) for c in table.columns])
            self.n.append(np.asarray(full, dtype=np.int64).ravel())  # per cell, in the histogram's flat order
            mult = round(1 / (rec.lattice * q.denominator))
            assert mult & (mult - 1) == 0 and 1 / (q.denominator * mult) == rec.lattice  # γ = 1/(d·2^k)
            assert rec.noise == "discrete_laplace"
            self.law.append((mult, Fraction(t)))
            self.cost_after.append(rec.cost_after)

    def losses(self, cells: Sequence[int]) -> list[Fraction]:
        """Per release, the exact loss of adding a unit whose bounded rows are in ``cells``."""
        return [release_loss(int(sum(n[j] for j in cells)) * mult, t) for n, (mult, t) in zip(self.n, self.law,
                                                                                              strict=True)]


def release_loss(shift: int, t: Fraction) -> Fraction:
    """``sup_y |log p(y | a) − log p(y | a + shift)|`` for ``p(y | a) ∝ exp(−|y − a|/t)`` on the integers.

    The normalising constants are equal, so the log ratio is ``(|y − a − shift| − |y − a|)/t``:
    constant below ``min(a, a + shift)`` and above the max, monotone between; its extremes are at
    those two points (taking ``a = 0``)."""
    lo, hi = min(0, shift), max(0, shift)
    return max(abs(Fraction(abs(y - shift) - abs(y), 1) / t) for y in (lo - 1, lo, hi, hi + 1))


def gateway(frames: dict[str, pd.DataFrame], schema: Schema) -> tuple[dpgate.Gateway, RecordingNoise]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # seeded noise: a test
        gw = dpgate.Gateway(frames, schema, budget=1e9, seed=0)
    noise = gw._noise = RecordingNoise(0)  # the same law as seed=0; remembers each draw's t
    return gw, noise


def released(gw: dpgate.Gateway, noise: RecordingNoise, schema: Schema) -> dict[str, Released]:
    records = gw.ledger.records()
    assert len(records) == len(noise.ts)  # one draw per record, in record order
    out = {}
    for t in schema.tables:
        mine = [(r, ts) for r, ts in zip(records, noise.ts, strict=True) if r.table == t.name]
        out[t.name] = Released(t, [r for r, _ in mine], [ts for _, ts in mine])
    return out


def check_every_unit(gw: dpgate.Gateway, noise: RecordingNoise, schema: Schema, *, attained: bool = True) -> None:
    """Every placement of one unit's bounded rows (in every table at once) costs at most what was
    recorded, after every release; the worst one — ``k`` rows in each table's top cell — costs it
    (when ``attained``: each table charged on one block)."""
    tables = released(gw, noise, schema)
    per_release = {t.name: {cells: tables[t.name].losses(cells) for cells in placements(t.n_cells, t.bound())}
                   for t in schema.tables}

    def worst(name: str, upto: int) -> Fraction:
        """The largest loss of one unit's rows in table ``name`` over its first ``upto`` releases."""
        return max(sum(ls[:upto], Fraction(0)) for ls in per_release[name].values())

    # After each release (in ledger order), within that record's cost_after (a float sum, hence the ulp).
    cursor = dict.fromkeys(tables, 0)
    for rec in gw.ledger.records():
        cursor[rec.table] += 1
        assert sum((worst(n, i) for n, i in cursor.items()), Fraction(0)) <= Fraction(rec.cost_after) * (1 + Fraction(1, 2**50))
    total = Fraction(0)
    for t in schema.tables:
        losses = {cells: sum(ls, Fraction(0)) for cells, ls in per_release[t.name].items()}
        top = max(range(t.n_cells), key=lambda j: losses[(j,)])
        assert max(losses.values()) == losses[(top,) * t.bound()]  # attained by k rows in the top cell
        for cells, loss in losses.items():  # each row costs at most the top cell's row
            assert loss <= len(cells) * losses[(top,)]
        total += max(losses.values())
    spent = Fraction(gw.spent)
    assert total <= spent  # the unit's rows in every table add up, and so do the tables' charges
    assert not attained or total >= spent * (1 - Fraction(1, 10**9))  # attained, up to the charges' rounding up


# -- random releases through release_measurements ----------------------------------------------
@st.composite
def histories(draw: Any) -> tuple[int, int, list[tuple[list[Fraction], float]]]:
    m, k = draw(st.integers(2, 4)), draw(st.integers(1, 3))
    weight = st.builds(Fraction, st.integers(-4, 4), st.sampled_from([1, 1, 1, 2, 3]))
    release = st.tuples(st.lists(weight, min_size=m, max_size=m).filter(any),
                        st.floats(0.01, 3.0, allow_nan=False, allow_infinity=False))
    return m, k, draw(st.lists(release, min_size=1, max_size=5))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(histories())
def test_no_unit_loses_more_than_the_charge_and_the_worst_loses_it(history: tuple[int, int, list[Any]]) -> None:
    m, k, releases = history
    schema = Schema.from_dict(spec({"t": (m, k)}))
    table = schema.table("t")
    gw, noise = gateway({"t": base_rows(m)}, schema)
    with gw:
        queries = [(LinearQuery.from_grid(table, ["c"], [list(range(m))], np.array([float(w) for w in ws])), a)
                   for ws, a in releases]
        gw.release_measurements("t", queries)
        check_every_unit(gw, noise, schema)


def test_sql_releases_on_two_unit_tables_add_up() -> None:
    """The planner's own α and S (GROUP BY, SUM, filters) on two tables a unit has rows in."""
    schema = Schema.from_dict(spec({"visits": (4, 3), "orders": (3, 2)}))
    frames = {"visits": base_rows(4, 1), "orders": base_rows(3, 2)}
    gw, noise = gateway(frames, schema)
    with gw:
        gw.query("SELECT c, COUNT(*) FROM visits GROUP BY c", accuracy=3)
        gw.query("SELECT SUM(c) FROM visits WHERE c >= 1", accuracy=2)
        gw.query("SELECT COUNT(*) FROM orders WHERE c IS NULL", accuracy=4)
        gw.query("SELECT SUM(c) - COUNT(*) FROM orders", accuracy=1)
        gw.query("SELECT c, COUNT(*) FROM visits GROUP BY c", accuracy=1)
        assert len(gw.ledger.records()) >= 6
        check_every_unit(gw, noise, schema)


def test_side_grids_charge_at_least_every_unit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two columns, a main cost grid of at most 4 boxes: releases that cut across it are charged
    on side grids (``k · Σ_b max B_b``), which must still cover every placement of a unit's rows."""
    monkeypatch.setattr(cost_grid, "COST_MAX_BOXES", 4)
    columns = {name: {"type": "integer", "min": 0, "max": 1, "nullable": True} for name in ("a", "b")}
    schema = Schema.from_dict({"tables": {"t": {"privacy_unit": "uid", "max_rows_per_unit": 2, "columns": columns}}})
    rows = base_rows(3)
    gw, noise = gateway({"t": rows.assign(a=rows["c"], b=rows["c"][::-1].to_numpy()).drop(columns="c")}, schema)
    with gw:
        for sql in ("SELECT a, COUNT(*) FROM t GROUP BY a", "SELECT b, COUNT(*) FROM t GROUP BY b",
                    "SELECT a, b, COUNT(*) FROM t GROUP BY a, b", "SELECT SUM(a) - SUM(b) FROM t WHERE a IS NOT NULL"):
            gw.query(sql, accuracy=2)
        assert len(gw._history.tables["t"].costs.starts) > 1  # side grids were used
        check_every_unit(gw, noise, schema, attained=False)


# -- the neighbours of the bounded table: through the cube's own SQL ----------------------------
@pytest.mark.parametrize(("m", "k"), [(3, 2), (2, 3), (4, 1)])
def test_adding_a_unit_adds_only_its_kept_rows(m: int, k: int) -> None:
    """For every unit of up to ``k + 1`` rows added to a fixed table: the bounded histogram grows by
    ``min(rows, k)`` of the unit's own rows and changes nowhere else, and every query's true
    numerator moves by its weights on those rows — the shift the loss above is computed from."""
    schema = Schema.from_dict(spec({"t": (m, k)}))
    table = schema.table("t")
    df = base_rows(m)
    qs = [LinearQuery.from_grid(table, ["c"], [list(range(m))], np.array(w, dtype=float))
          for w in ([1] * m, list(range(m)), [(-1) ** j * (j + 1) for j in range(m)])]
    secret = b"k" * 32
    with Cube(df, schema, row_order=secret) as cube:
        before, truths = cube.histogram("t"), cube.true_numerators(qs)
    for cells in itertools.chain.from_iterable(
            itertools.combinations_with_replacement(range(m), n) for n in range(1, k + 2)):
        with Cube(with_unit(df, cells, m), schema, row_order=secret) as cube:
            added, moved = cube.histogram("t") - before, np.subtract(cube.true_numerators(qs), truths)
        own = np.bincount(cells, minlength=m)
        assert (added >= 0).all() and (added <= own).all() and added.sum() == min(len(cells), k), (cells, added)
        kept = [j for j in range(m) for _ in range(added[j])]
        for q, shift in zip(qs, moved, strict=True):
            n = q.expand(table, ["c"], [range(m)])
            assert shift == sum(int(n[j]) for j in kept)
        if len(cells) <= k:  # at most k rows: all kept
            assert Counter(kept) == Counter(cells)


def test_the_loss_of_one_release_is_its_shift_over_t() -> None:
    """:func:`release_loss` against the log-likelihood ratio evaluated at every output of a window."""
    for shift, t in [(3, Fraction(2)), (-5, Fraction(7, 3)), (0, Fraction(1)), (1024, Fraction(3072))]:
        ratio = [Fraction(abs(y - shift) - abs(y)) / t for y in range(-abs(shift) - 3, abs(shift) + 4)]
        assert release_loss(shift, t) == max(abs(r) for r in ratio) == abs(shift) / t


def test_an_unpriced_release_is_charged_k_times_its_alpha() -> None:
    """A per-analyst charge whose query or table the schema does not know (a ledger written by
    hand) is charged α on every cell — k times on a unit table (the largest k when the table is
    unknown), not once."""
    from dpgate.ledger._provenance import _AnalystCosts
    from dpgate.plan.accounting import UNITS_PER_EPSILON

    schema = Schema.from_dict(spec({"t": (3, 3), "u": (2, 2)}))
    for table, k, known in [("t", 3, schema), ("U", 2, schema), ("elsewhere", 3, schema), ("t", 1, None)]:
        costs = _AnalystCosts()
        costs.pending.append((table, "not a query", 0.5, 1.0))
        assert costs.units(known) == k * UNITS_PER_EPSILON // 2

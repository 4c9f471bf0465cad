"""dpgate's DB-API driver: SQL-level settings, intervals, binding, errors, budget, pandas interop.

PEP 249 conformance proper is in ``test_dbapi20.py``; this module checks the
dpgate-specific behaviour, end to end on the embedded PUMS data.
"""

from __future__ import annotations

import threading
import warnings

import duckdb
import pandas as pd
import pytest

import dpgate.datasets
import dpgate.dbapi as dbapi
from dpgate.answer.result import Answer, Result
from dpgate.errors import (
    BudgetExhausted,
    InterfaceError,
    InvalidRequirement,
    LedgerError,
    NotSupportedError,
    OperationalError,
    ProgrammingError,
    SchemaError,
    UnsupportedQuery,
)
from dpgate.gateway import Gateway

PUMS, PUMS_SCHEMA = dpgate.datasets.load_pums()
COUNT_SEX = "SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex"
SEX_KEYS = ["0", "1"]  # the declared keys: pums.yaml declares neither other nor nullable


@pytest.fixture
def con():
    c = dbapi.connect(PUMS, schema=PUMS_SCHEMA, budget=10.0, seed=1, policy="paper")
    yield c
    c.close()


def read_sql(sql, con, **kw):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*SQLAlchemy.*", category=UserWarning)
        return pd.read_sql_query(sql, con, **kw)


# -- end to end on PUMS --------------------------------------------------------------------------
def test_pums_end_to_end_default_policy():
    with dbapi.connect(PUMS, schema=PUMS_SCHEMA, budget=1.0, accuracy=10, seed=3) as con:
        cur = con.cursor()
        cur.execute(COUNT_SEX)
        rows = cur.fetchall()
        assert [r[0] for r in rows] == SEX_KEYS
        true = PUMS["sex"].value_counts()
        for (key, n), a in zip(rows, cur.answers, strict=True):
            assert isinstance(a, Answer) and a.value == n and a.source == "fresh"
            assert a.low <= n <= a.high and a.confidence == 0.95
            assert abs(n - true.get(int(key), 0) if key in ("0", "1") else n) < 60
        spent = con.spent
        assert 0 < spent <= 1.0
        # The same question again is answered from history, free.
        cur.execute("SELECT COUNT(*) FROM pums WHERE sex = '1' /*+ dpgate accuracy=12 */")
        (a,) = cur.answers
        assert a.source == "history" and a.epsilon_spent == 0
        assert con.spent == pytest.approx(spent)
        assert len(con.history) == 2  # one release per declared key


def test_read_sql_query_scalar_and_group_by(con):
    con.execute("SET dpgate.accuracy = 15")
    scalar = read_sql("SELECT COUNT(*) AS n FROM pums WHERE age < ?", con, params=(30,))
    assert list(scalar.columns) == ["n"] and len(scalar) == 1
    assert abs(scalar["n"][0] - (PUMS["age"] < 30).sum()) < 60
    grouped = read_sql("SELECT married, COUNT(*) AS n FROM pums GROUP BY married ORDER BY married", con)
    assert list(grouped.columns) == ["married", "n"]
    assert grouped["married"].tolist() == [False, True] and len(grouped) == 2
    con.execute("SET dpgate.intervals = on")
    wide = read_sql(COUNT_SEX, con)
    assert list(wide.columns) == ["sex", "n", "n_low", "n_high", "n_source"]
    assert (wide["n_low"] <= wide["n"]).all() and (wide["n"] <= wide["n_high"]).all()
    assert set(wide["n_source"]) <= {"fresh", "history"}


# -- accuracy / confidence: connection < session < statement --------------------------------------
def test_no_accuracy_is_a_clear_error_and_costs_nothing(con):
    cur = con.cursor()
    with pytest.raises(InvalidRequirement, match=r"SET dpgate\.accuracy.*accuracy=25") as exc:
        cur.execute(COUNT_SEX)
    assert isinstance(exc.value, dbapi.DataError)
    assert con.spent == 0 and cur.description is None


def test_precedence_statement_over_session_over_connection():
    with dbapi.connect(PUMS, schema=PUMS_SCHEMA, budget=10.0, accuracy=40, confidence=0.9, seed=2,
                       policy="paper") as con:
        cur = con.cursor()
        q = "SELECT COUNT(*) FROM pums WHERE educ = {}"
        cur.execute(q.format(1))
        (a,) = cur.answers
        assert (a.accuracy, a.confidence) == (40, 0.9)  # connection
        cur.execute("SET dpgate.accuracy = 30")
        cur.execute(q.format(2))
        (a,) = cur.answers
        assert (a.accuracy, a.confidence) == (30, 0.9)  # session beats connection
        cur.execute("SET dpgate.confidence = 0.8")
        cur.execute(q.format(3))
        (a,) = cur.answers
        assert (a.accuracy, a.confidence) == (30, 0.8)
        cur.execute("SELECT /*+ dpgate accuracy=20 confidence=0.99 */ COUNT(*) FROM pums WHERE educ = 4")
        (a,) = cur.answers
        assert (a.accuracy, a.confidence) == (20, 0.99)  # statement beats session
        cur.execute("SELECT /*+ dpgate confidence=0.95 */ COUNT(*) FROM pums WHERE educ = 5")
        (a,) = cur.answers
        assert (a.accuracy, a.confidence) == (30, 0.95)  # hints override key by key
        cur.execute(q.format(6))
        (a,) = cur.answers
        assert (a.accuracy, a.confidence) == (30, 0.8)  # a hint does not change the session
        assert dict(con.settings) == {"accuracy": 30.0, "confidence": 0.8, "intervals": False,
                                      "allow_partial": False, "round": False, "method": None}
        # Settings are per connection.
        with dbapi.connect(con.gateway, accuracy=50) as other:
            other.execute(q.format(7))
            assert other.settings["accuracy"] == 50


def test_set_statements_round_trip_and_bad_values(con):
    cur = con.cursor()
    for sql, key, value in [
        ("SET dpgate.accuracy = 25", "accuracy", 25.0),
        ("set DPGATE.Accuracy TO 12.5", "accuracy", 12.5),
        ("SET dpgate.confidence = 0.99", "confidence", 0.99),
        ("SET dpgate.intervals = on", "intervals", True),
        ("SET dpgate.intervals = 'off'", "intervals", False),
        ("SET dpgate.allow_partial = true", "allow_partial", True),
        ("SET dpgate.accuracy = ?", "accuracy", 7.0),
    ]:
        cur.execute(sql, (7,) if "?" in sql else None)
        assert con.settings[key] == value, sql
        assert cur.rowcount == -1 and cur.description is None
    before = dict(con.settings)
    for bad, err in [
        ("SET dpgate.accuracy = -1", InvalidRequirement),
        ("SET dpgate.accuracy = 'wide'", InvalidRequirement),
        ("SET dpgate.confidence = 1.5", InvalidRequirement),
        ("SET dpgate.intervals = maybe", InvalidRequirement),
        ("SET dpgate.epsilon = 3", UnsupportedQuery),
        ("SET search_path = 'main'", UnsupportedQuery),
        ("SELECT /*+ dpgate accuracy=0 */ COUNT(*) FROM pums", InvalidRequirement),
        ("SELECT /*+ dpgate accuracy=5 epsilon=3 */ COUNT(*) FROM pums", UnsupportedQuery),
    ]:
        with pytest.raises(err):
            cur.execute(bad)
    assert dict(con.settings) == before
    assert con.spent == 0


def test_connect_validates_requirements():
    for kw in ({"accuracy": 0}, {"accuracy": float("nan")}, {"confidence": 1.0}, {"confidence": "high"},
               {"intervals": "yes"}):
        with pytest.raises(InvalidRequirement):
            dbapi.connect(PUMS, schema=PUMS_SCHEMA, **kw)
    with pytest.raises(InterfaceError, match="schema="):
        dbapi.connect(PUMS)
    with pytest.raises(InterfaceError):
        dbapi.connect(42, schema=PUMS_SCHEMA)
    with pytest.raises(InterfaceError, match="budget"):
        with Gateway(PUMS, PUMS_SCHEMA) as gw:
            dbapi.connect(gw, budget=2.0)


# -- rows, intervals and answers --------------------------------------------------------------------
def test_rows_follow_select_items_having_order_limit(con):
    cur = con.cursor()
    cur.execute("SET dpgate.accuracy = 10")
    cur.execute(
        "SELECT COUNT(*) AS n, sex, COUNT(*) FILTER (WHERE married) AS m FROM pums "
        "GROUP BY sex HAVING n > 100 ORDER BY n DESC LIMIT 1"
    )
    assert [d[0] for d in cur.description] == ["n", "sex", "m"]
    assert [d[1] for d in cur.description] == ["DOUBLE", "VARCHAR", "DOUBLE"]
    ((n, sex, m),) = cur.fetchall()
    assert sex in ("0", "1") and n > 400 and 0 < m < n
    # answers follow the returned rows; result holds every released answer (2 groups × 2).
    assert [(a.label, dict(a.group)["sex"]) for a in cur.answers] == [("n", sex), ("m", sex)]
    assert (cur.answers[0].value, cur.answers[1].value) == (n, m)
    assert isinstance(cur.result, Result) and len(cur.result.answers) == 4


def test_intervals_columns_and_types(con):
    cur = con.cursor()
    cur.execute("SET dpgate.intervals = on")
    cur.execute("SELECT married, COUNT(*) AS n FROM pums GROUP BY married /*+ dpgate accuracy=20 */")
    names = [d[0] for d in cur.description]
    assert names == ["married", "n", "n_low", "n_high", "n_source"]
    assert [d[1] for d in cur.description] == ["BOOLEAN", "DOUBLE", "DOUBLE", "DOUBLE", "VARCHAR"]
    assert all(len(d) == 7 for d in cur.description)
    rows = cur.fetchall()
    assert [r[0] for r in rows] == [False, True]
    for (_key, n, lo, hi, src), a in zip(rows, cur.answers, strict=True):
        assert (n, lo, hi, src) == (a.value, a.low, a.high, a.source)
        assert type(n) is float and type(src) is str
    cur.execute("SET dpgate.intervals = off")
    cur.execute("SELECT age, COUNT(*) AS n FROM pums WHERE age BETWEEN 30 AND 32 GROUP BY age "
                "/*+ dpgate accuracy=20 */")
    assert [d[1] for d in cur.description] == ["BIGINT", "DOUBLE"]
    keys = [r[0] for r in cur.fetchall()]
    assert keys == [30, 31, 32] and all(type(k) is int for k in keys)  # only the keys WHERE can reach


def test_interval_name_collision_is_refused(con):
    con.execute("SET dpgate.intervals = on")
    with pytest.raises(ProgrammingError, match="_low"):
        con.execute("SELECT COUNT(*) AS n, COUNT(*) AS n_low FROM pums /*+ dpgate accuracy=20 */")


# -- parameters -----------------------------------------------------------------------------------------
def test_parameters_cannot_inject(con):
    cur = con.cursor()
    con.execute("SET dpgate.accuracy = 20")
    payload = "1'; DROP TABLE pums; --"
    with pytest.raises(UnsupportedQuery, match="not a declared value"):
        cur.execute("SELECT COUNT(*) FROM pums WHERE sex = ?", (payload,))
    cur.execute("SELECT COUNT(*) FROM pums WHERE sex <> ? OR sex IS NULL", ("1",))
    assert cur.rowcount == 1
    # A value that would be SQL if pasted stays one literal (not a second statement, not a comment).
    with pytest.raises(UnsupportedQuery, match="DROP TABLE"):
        cur.execute("SELECT COUNT(*) FROM pums WHERE sex = ?", ("1; DROP TABLE pums",))
    with pytest.raises(UnsupportedQuery, match="'40 OR 1=1' is not a number"):
        cur.execute("SELECT COUNT(*) FROM pums WHERE age < ?", ("40 OR 1=1",))  # a string stays a string
    cur.execute("SELECT COUNT(*) FROM pums WHERE age < ? /*+ dpgate accuracy=30 */", (40,))
    assert cur.answers[0].accuracy == 30
    # Numeric / named / $n styles bind too.
    cur.execute("SELECT COUNT(*) FROM pums WHERE age < :a AND educ > :e", {"a": 40, "e": 10})
    cur.execute("SELECT COUNT(*) FROM pums WHERE age < $1 AND educ > $2", [40, 10])
    for bad in [("a", "b"), 5, "40"]:
        with pytest.raises(ProgrammingError):
            cur.execute("SELECT COUNT(*) FROM pums WHERE age < ?", bad)
    with pytest.raises(ProgrammingError):
        cur.execute("SELECT COUNT(*) FROM pums WHERE age < ?", [object()])
    assert PUMS_SCHEMA.table("pums")  # the data source is untouched: the next query still works
    cur.execute("SELECT COUNT(*) FROM pums")
    assert cur.fetchone()[0] > 900


# -- read-only, refused statements ----------------------------------------------------------------------
@pytest.mark.parametrize(
    "sql",
    [
        "INSERT INTO pums VALUES (1, '1', 1, '1', 1, true)",
        "DELETE FROM pums",
        "UPDATE pums SET age = 0",
        "DROP TABLE pums",
        "CREATE TABLE t AS SELECT * FROM pums",
        "COPY pums TO 'out.csv'",
        "ATTACH 'x.duckdb'",
        "SELECT COUNT(*) FROM pums; DROP TABLE pums",
        "SELECT * FROM pums",
        "SELECT COUNT(*) FROM read_csv('x.csv')",
        "PRAGMA database_list",
    ],
)
def test_writes_and_raw_reads_are_refused(con, sql):
    con.execute("SET dpgate.accuracy = 20")
    with pytest.raises(ProgrammingError) as exc:
        con.cursor().execute(sql)
    assert isinstance(exc.value, (UnsupportedQuery, SchemaError))
    assert con.spent == 0


def test_rollback_not_supported_commit_noop(con):
    con.commit()
    with pytest.raises(NotSupportedError, match="cannot be taken back"):
        con.rollback()


# -- closed objects -------------------------------------------------------------------------------------
def test_everything_after_close_raises_interface_error():
    con = dbapi.connect(PUMS, schema=PUMS_SCHEMA, accuracy=20, seed=0, policy="paper")
    cur = con.cursor()
    cur.execute(COUNT_SEX)
    cur2 = con.cursor()
    cur2.close()
    cur2.close()  # twice is fine
    for op in (lambda: cur2.execute(COUNT_SEX), cur2.fetchone, cur2.fetchall, lambda: cur2.fetchmany(2),
               lambda: cur2.executemany(COUNT_SEX, []), cur2.nextset, lambda: cur2.setinputsizes(()),
               lambda: next(iter(cur2))):
        with pytest.raises(InterfaceError):
            op()
    con.close()
    assert con.closed
    for op in (con.cursor, con.commit, con.rollback, lambda: con.execute(COUNT_SEX), cur.fetchall,
               lambda: cur.execute(COUNT_SEX), lambda: con.spent, lambda: con.__enter__()):
        with pytest.raises(InterfaceError):
            op()
    con.close()


def test_context_managers_close():
    with dbapi.connect(PUMS, schema=PUMS_SCHEMA, accuracy=20, seed=0, policy="paper") as con:
        with con.cursor() as cur:
            assert cur.execute(COUNT_SEX) is cur
        with pytest.raises(InterfaceError):
            cur.fetchall()
    assert con.closed


def test_closing_does_not_close_a_borrowed_gateway_or_connection():
    duck = duckdb.connect()
    duck.register("pums", PUMS)
    with Gateway(duck, PUMS_SCHEMA, budget=1.0, seed=0, policy="paper") as gw:
        with dbapi.connect(gw, accuracy=20) as con:
            con.execute(COUNT_SEX)
        assert gw.spent > 0  # still usable
    assert duck.execute("SELECT 1").fetchone() == (1,)
    with dbapi.connect(duck, schema=PUMS_SCHEMA, accuracy=20, seed=0) as con:
        assert len(con.execute(COUNT_SEX).fetchall()) == 2
    assert duck.execute("SELECT 1").fetchone() == (1,)


def test_dict_of_frames():
    data = {"pums": PUMS, "other": pd.DataFrame({"k": pd.Categorical(["a", "b", "a"])})}
    schema = {"tables": {**PUMS_SCHEMA.to_dict()["tables"],
                         "other": {"columns": {"k": {"type": "categorical", "values": ["a", "b"]}}}}}
    with dbapi.connect(data, schema=schema, accuracy=20, seed=0, policy="paper") as con:
        assert [r[0] for r in con.execute("SELECT k, COUNT(*) FROM other GROUP BY k").fetchall()] == [
            "a", "b"]
        assert con.execute("SELECT COUNT(*) FROM pums").rowcount == 1


# -- budget -----------------------------------------------------------------------------------------
def test_budget_exhausted_is_operational_error_and_spends_nothing():
    with dbapi.connect(PUMS, schema=PUMS_SCHEMA, budget=0.05, accuracy=5, seed=0, policy="paper") as con:
        cur = con.cursor()
        with pytest.raises(con.OperationalError) as exc:
            cur.execute("SELECT COUNT(*) FROM pums")
        err = exc.value
        assert isinstance(err, BudgetExhausted) and isinstance(err, OperationalError)
        assert err.needed > err.remaining == pytest.approx(0.05)
        assert "remains" in str(err)
        assert con.spent == 0 and cur.description is None
        # A looser requirement fits; afterwards the partial mode gives history's estimate.
        cur.execute("SELECT COUNT(*) FROM pums /*+ dpgate accuracy=100 */")
        spent = con.spent
        cur.execute("SET dpgate.allow_partial = on")
        cur.execute("SELECT COUNT(*) AS n FROM pums")  # ±5 is unaffordable: history's wider answer
        (a,) = cur.answers
        assert a.source == "history" and not a.meets_requirement and a.high - a.value > 5
        assert cur.fetchone() == (a.value,)
        cur.execute("SELECT COUNT(*) AS n FROM pums WHERE age < 30")  # history knows nothing: NULL
        assert cur.fetchone() == (None,) and cur.answers[0].source == "unavailable"
        assert con.spent == pytest.approx(spent)


def test_ledger_shares_budget_between_connections(tmp_path):
    ledger = tmp_path / "ledger.db"
    kw = dict(schema=PUMS_SCHEMA, budget=1.0, ledger=str(ledger), accuracy=15, seed=0, policy="paper")
    with dbapi.connect(PUMS, **kw) as a:
        a.execute(COUNT_SEX)
        spent = a.spent
    with dbapi.connect(PUMS.sample(frac=1.0, random_state=0), **kw) as b:  # same data, other row order
        assert b.spent == pytest.approx(spent)
        b.execute("SELECT COUNT(*) FROM pums WHERE sex = '0'")
        assert b.execute("SELECT COUNT(*) FROM pums WHERE sex = '0'").answers[0].source == "history"
    with pytest.raises(dbapi.OperationalError):  # a ledger is bound to its data
        dbapi.connect(PUMS.iloc[1:], **kw)


# -- executemany / threads ----------------------------------------------------------------------------
def test_executemany_result_sets_and_failure(con):
    cur = con.cursor()
    cur.execute("SET dpgate.accuracy = 20")
    cur.executemany("SELECT COUNT(*) AS n FROM pums WHERE educ = ?", [(9,), (10,), (11,)])
    seen = [cur.fetchall()]
    while cur.nextset():
        seen.append(cur.fetchall())
    assert [len(s) for s in seen] == [1, 1, 1]
    assert cur.executemany("SELECT COUNT(*) FROM pums WHERE educ = ?", []).description is None
    with pytest.raises(ProgrammingError):
        cur.executemany("SELECT COUNT(*) FROM pums WHERE educ = ?", [(9,), ("x", "y")])
    with pytest.raises(ProgrammingError):
        cur.executemany("SELECT COUNT(*) FROM pums WHERE educ = ?", "12")


def test_threads_share_a_connection_without_overspending():
    with dbapi.connect(PUMS, schema=PUMS_SCHEMA, budget=0.5, accuracy=20, seed=0, policy="paper") as con:
        errors: list[BaseException] = []
        results: list[int] = []

        def work(i: int) -> None:
            cur = con.cursor()
            try:
                cur.execute("SELECT COUNT(*) FROM pums WHERE age < ?", (20 + i,))
                results.append(i)
            except BudgetExhausted:
                pass
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert 1 <= len(results) < 12 and con.spent <= 0.5 + 1e-9


def test_connect_passes_the_ledger_key_and_the_new_ledger_flag(tmp_path):
    """An operator-held key opens the ledger again; another key is a different binding; a
    deleted ledger restarts only with new_ledger=True."""
    path, key = tmp_path / "session.ledger", b"k" * 32
    with dbapi.connect(PUMS, schema=PUMS_SCHEMA, ledger=str(path), ledger_key=key, accuracy=40, seed=0) as con:
        con.cursor().execute("SELECT COUNT(*) FROM pums")
        spent = con.spent
    assert not (tmp_path / "session.ledger.key").exists()  # the operator's key is not written next to it
    with dbapi.connect(PUMS, schema=PUMS_SCHEMA, ledger=str(path), ledger_key=key, accuracy=40) as con:
        assert con.spent == spent
    with pytest.raises(LedgerError, match="different data source"):
        dbapi.connect(PUMS, schema=PUMS_SCHEMA, ledger=str(path), ledger_key=b"x" * 32)
    path.unlink()
    with pytest.raises(LedgerError):
        dbapi.connect(PUMS, schema=PUMS_SCHEMA, ledger=str(path), ledger_key=key)
    with dbapi.connect(PUMS, schema=PUMS_SCHEMA, ledger=str(path), ledger_key=key, new_ledger=True) as con:
        assert con.spent == 0
    with pytest.raises(InterfaceError, match="new_ledger"):
        dbapi.connect(Gateway(PUMS, PUMS_SCHEMA), new_ledger=True)

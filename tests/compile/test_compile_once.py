"""One compile per statement: the DB-API and ``dpgate serve`` compile each statement once and
hand the compiled value on (the server's cap check quotes the very statement it then runs)."""

from __future__ import annotations

import pickle
import sys
from decimal import Decimal
from pathlib import Path

import psycopg
import pytest
from _dpserve import dsn, thread_server

import dpgate
import dpgate.compile
import dpgate.server._session  # noqa: F401 - imported before the spy replaces its names
from dpgate import datasets
from dpgate.compile import CompiledStatement, compile_statement
from dpgate.compile import cache as compile_cache

SQL = "SELECT COUNT(*) FROM pums WHERE age < ?"


@pytest.fixture
def compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The SQL text of every call of ``compile_statement``, wherever dpgate looks it up; the
    gateway's compile cache starts empty."""
    original = dpgate.compile.compile_statement
    calls: list[str] = []

    def counted(sql, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(sql)
        return original(sql, *args, **kwargs)

    for name, module in list(sys.modules.items()):
        if name.split(".")[0] == "dpgate" and getattr(module, "compile_statement", None) is original:
            monkeypatch.setattr(module, "compile_statement", counted)
    assert compile_cache.compile_statement is counted
    monkeypatch.setattr(compile_cache, "_COMPILED", {})
    return calls


@pytest.fixture(scope="module")
def pums():  # type: ignore[no-untyped-def]
    return datasets.load_pums()


def test_dbapi_compiles_each_statement_once(pums, compiles: list[str]) -> None:  # type: ignore[no-untyped-def]
    df, schema = pums
    with dpgate.connect(df, schema=schema, budget=1.0, seed=0, accuracy=25) as con:
        cur = con.cursor()
        cur.execute(SQL, (30,))  # fresh: compiled, planned, measured
        assert len(compiles) == 1 and cur.result is not None
        cur.execute(SQL, (30,))  # a repeat: the gateway's cache, no compile at all
        assert len(compiles) == 1
        cur.execute("EXPLAIN " + SQL, (40,))
        assert [c.strip() for c in compiles[1:]] == [SQL]  # the SELECT after EXPLAIN, once
        assert con.explain(SQL, (50,)).epsilon > 0 and len(compiles) == 3
        # A parameter that is not a plain value is not cached: still compiled once per run.
        cur.execute(SQL, (Decimal(45),))
        cur.execute(SQL, (Decimal(45),))
        assert len(compiles) == 5
        cur.execute("SET dpgate.confidence = 0.9")
        assert len(compiles) == 6
        # The statement reaches the gateway compiled: query and explain are not called.
        calls: list[str] = []
        for name in ("query", "explain", "compile"):
            inner = getattr(con.gateway, name)
            setattr(con.gateway, name, lambda *a, _n=name, _f=inner, **k: (calls.append(_n), _f(*a, **k))[1])
        cur.execute("SELECT sex, COUNT(*) FROM pums WHERE age < ? GROUP BY sex", (35,))
        assert calls == [] and len(compiles) == 7


def test_gateway_query_and_explain_compile_once(pums, compiles: list[str]) -> None:  # type: ignore[no-untyped-def]
    df, schema = pums
    with dpgate.Gateway(df, schema, budget=1.0, seed=0) as gw, pytest.warns(dpgate.Warning):
        stmt = gw.compile("SELECT COUNT(*) FROM pums WHERE age < 20")
        quoted = gw.quote(stmt, 25)
        assert gw.run(stmt, 25).epsilon_spent == pytest.approx(quoted.epsilon)
        assert gw.explain("SELECT COUNT(*) FROM pums WHERE age < 20", 25).epsilon == 0.0  # cached, free now
        gw.query("SELECT COUNT(*) FROM pums WHERE age < ?", 25, params=[Decimal(21)])
        assert len(compiles) == 2


def test_server_compiles_each_statement_once(tmp_path: Path, compiles: list[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    quoted: list[CompiledStatement] = []
    ran: list[CompiledStatement] = []
    quote, run = dpgate.Gateway.quote, dpgate.Gateway.run
    monkeypatch.setattr(dpgate.Gateway, "quote", lambda self, s, *a, **k: (quoted.append(s), quote(self, s, *a, **k))[1])
    monkeypatch.setattr(dpgate.Gateway, "run", lambda self, s, *a, **k: (ran.append(s), run(self, s, *a, **k))[1])
    # alice's cap (0.5) is below the global budget left (1.0): every new statement is quoted first.
    with thread_server(tmp_path) as s, psycopg.connect(dsn(s.port), autocommit=True) as con:
        simple = psycopg.ClientCursor(con)  # the simple query protocol: parameters bound by the client
        simple.execute("SELECT COUNT(*) FROM pums WHERE age < %s", [30])
        assert compiles == ["SELECT COUNT(*) FROM pums WHERE age < 30"]
        assert len(quoted) == 1 and ran == quoted  # the cap check quoted the very statement that ran
        # The extended protocol without parameters: Describe compiles, the run reuses it.
        con.execute("SELECT COUNT(*) FROM pums WHERE age < 40").fetchone()
        assert compiles[1:] == ["SELECT COUNT(*) FROM pums WHERE age < 40"]
        assert len(quoted) == 2 and ran == quoted
        simple.execute("EXPLAIN SELECT COUNT(*) FROM pums WHERE age < 50")
        assert len(compiles) == 3 and len(ran) == 2 and len(quoted) == 3


def test_a_compiled_statement_is_a_frozen_value() -> None:
    _, schema = datasets.load_pums()
    stmt = compile_statement("/*+ dpgate accuracy=25 */ SELECT sex, COUNT(*) FROM pums GROUP BY sex", schema)
    assert isinstance(stmt, CompiledStatement)
    with pytest.raises(TypeError):
        stmt.hints["accuracy"] = "1"  # type: ignore[index]
    with pytest.raises(AttributeError):
        stmt.hints.update(accuracy="1")  # type: ignore[attr-defined]
    assert stmt.hints == {"accuracy": "25"} and repr(stmt.hints) == "{'accuracy': '25'}"
    again = pickle.loads(pickle.dumps(stmt))
    assert again == stmt and again.hints == {"accuracy": "25"}

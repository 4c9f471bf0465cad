"""The scripts in examples/ run and print what they promise (they are documentation)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

EXAMPLES_DIR = Path(__file__).resolve().parents[2] / "examples"

EXAMPLES = {  # each script in examples/ and lines its output must contain
    "quickstart.py": ["history", "fresh", "refused:", "after a restart"],
    "sql_dbapi.py": ["refused:", "releases recorded in"],
    "pandas_accessor.py": ["SELECT race, COUNT(*)"],
    "warehouse.py": ["warehouse unchanged: True", "a new session sees spent"],
    "averages_and_quotes.py": ["charge equals quote: True", "AVG(age) again:", "from history, ε=0.0",
                               "declared educ codes:", "cost 0.0", "measured"],
    "postgres_backend.py": ["identical to DuckDB: True", "same answers with the ledger in PostgreSQL: True",
                            "ledger reopened: 17 releases", "from history, ε=0.0"],
    "spark_backend.py": ["spark: spent ε", "income ≥ 50 000:", "race", "identical to DuckDB: True"],
    "warehouse_with_people.py": ["flights   unit-level: privacy unit tailnum, at most 250", "airlines  public",
                                 "history", "monthly counts again: ε=0.0", "every charge ×250",
                                 "synthesize refused:", "by manufacturer", "undeclared join refused:",
                                 "releases recorded:"],
    "serve_and_connect.py": ["alice EXPLAIN:", "bob budget: analyst=bob", "analyst_spent=0,", "married",
                             "server exited with 0"],
}


def test_every_example_is_checked():
    scripts = {p.name for p in EXAMPLES_DIR.glob("*.py")}
    assert scripts == set(EXAMPLES), "add the new example to EXAMPLES"


def _pums_in_postgres(pg_server: Any) -> str:
    """The embedded PUMS as table ``pums`` in a fresh database; its URL."""
    import psycopg

    from dpgate.datasets import load_pums

    df, _ = load_pums()
    with psycopg.connect(pg_server.url(), autocommit=True) as con:
        con.execute("DROP DATABASE IF EXISTS dpgate_examples")
        con.execute("CREATE DATABASE dpgate_examples")
    with psycopg.connect(pg_server.url("dpgate_examples")) as con:
        con.execute("CREATE TABLE pums (age integer, sex text, educ smallint, race integer, income integer, "
                    "married boolean)")
        with con.cursor().copy("COPY pums FROM STDIN") as copy:
            for age, sex, educ, race, income, married in df.itertuples(index=False):
                copy.write_row((int(age), str(sex), int(educ), int(race), int(income), bool(married)))
    return str(pg_server.url("dpgate_examples"))


@pytest.mark.parametrize("script", sorted(EXAMPLES))
def test_example_runs(script: str, request: pytest.FixtureRequest) -> None:
    """examples/ are documentation: each runs in a fresh interpreter and prints what it promises."""
    path = EXAMPLES_DIR / script
    args = [_pums_in_postgres(request.getfixturevalue("pg_server"))] if script == "postgres_backend.py" else []
    proc = subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for needle in EXAMPLES[script]:
        assert needle in proc.stdout, (needle, proc.stdout[-2000:])

"""The scripts in examples/ run and print what they promise (they are documentation)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples"

EXAMPLES = {  # each script in examples/ and lines its output must contain
    "quickstart.py": ["history", "fresh", "refused:", "after a restart"],
    "sql_dbapi.py": ["refused:", "releases recorded in"],
    "pandas_accessor.py": ["SELECT race, COUNT(*)"],
    "warehouse.py": ["warehouse unchanged: True", "a new session sees spent"],
    "averages_and_quotes.py": ["charge equals quote: True", "AVG(age) again:", "from history, ε=0.0",
                               "declared educ codes:", "cost 0.0", "measured"],
    "serve_and_connect.py": ["alice EXPLAIN:", "bob budget: analyst=bob", "analyst_spent=0,", "married",
                             "server exited with 0"],
}


def test_every_example_is_checked():
    scripts = {p.name for p in EXAMPLES_DIR.glob("*.py")}
    assert scripts == set(EXAMPLES), "add the new example to EXAMPLES"


@pytest.mark.parametrize("script", sorted(EXAMPLES))
def test_example_runs(script: str) -> None:
    """examples/ are documentation: each runs in a fresh interpreter and prints what it promises."""
    path = EXAMPLES_DIR / script
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for needle in EXAMPLES[script]:
        assert needle in proc.stdout, (needle, proc.stdout[-2000:])

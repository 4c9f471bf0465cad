"""``dpgate serve`` caps that mean what they say (issue 27): an analyst pays the per-cell cost of the
releases made for them, whatever others released on the same cells, and the provenance their caps
are read from is chained under the ledger's key."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import psycopg  # the test extra: a missing client fails, never skips
import pytest
from _dpserve import dsn, ledger_records, thread_server

from dpgate.server import _session

YOUNG = "SELECT COUNT(*) FROM pums WHERE age < 40"
OLD = "SELECT COUNT(*) FROM pums WHERE age >= 60"  # other cells: below the global per-cell maximum



@pytest.mark.parametrize("precheck", [True, False], ids=["before-reading", "at-record-time"])
def test_cap_zero_gets_no_fresh_release_below_the_global_maximum(tmp_path: Path, precheck: bool,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The review's reproduction: after alice's release, a fresh release on other cells raises no
    global per-cell maximum, and was handed to carol (cap 0) charged 0.  Now it is refused, both by
    the check before the statement runs and by the authoritative record-time hook."""
    if not precheck:
        monkeypatch.setattr(_session.Session, "_check_cap", lambda self, sql, params, statement: None)
    with thread_server(tmp_path, caps={"alice": 1.0, "carol": 0.0}) as s:
        with psycopg.connect(dsn(s.port, "alice"), autocommit=True) as alice:
            alice.execute(YOUNG).fetchone()
            quoted = alice.execute("EXPLAIN " + OLD).fetchone()
        assert quoted[2] == "fresh" and quoted[3] == 0.0  # fresh, and free for the global accounting
        with psycopg.connect(dsn(s.port, "carol"), autocommit=True) as carol:
            with pytest.raises(psycopg.errors.ConfigurationLimitExceeded) as err:
                carol.execute(OLD).fetchone()
            assert "carol" in str(err.value) and "cap 0" in str(err.value)
            assert carol.execute("SHOW dpgate.budget").fetchone()[2] == 0.0
            assert carol.execute(YOUNG).fetchone()[0] > 0  # history stays free for her
    assert ledger_records(tmp_path) == 1


def test_an_analyst_pays_their_own_per_cell_cost(tmp_path: Path) -> None:
    with thread_server(tmp_path, budget=1.0, caps={"alice": 1.0, "bob": 0.2}) as s:
        with psycopg.connect(dsn(s.port, "alice"), autocommit=True) as alice:
            alice.execute(YOUNG).fetchone()
            first = alice.execute("SHOW dpgate.budget").fetchone()
        with psycopg.connect(dsn(s.port, "bob"), autocommit=True) as bob:
            bob.execute(OLD).fetchone()
            mine = bob.execute("SHOW dpgate.budget").fetchone()
            # bob pays α for his count although the global cost did not move
            assert mine[5] == pytest.approx(first[5]) and mine[2] == pytest.approx(first[2]) and mine[2] > 0.1
            with pytest.raises(psycopg.errors.ConfigurationLimitExceeded, match="bob"):
                bob.execute("SELECT COUNT(*) FROM pums WHERE age >= 50").fetchone()  # 2 α on his cells > 0.2
            # per cell, not a sum: a count on cells he has not paid for yet costs him no more
            assert bob.execute("SELECT COUNT(*) FROM pums WHERE age BETWEEN 40 AND 49").fetchone()[0] > 0
            assert bob.execute("SHOW dpgate.budget").fetchone()[2] == pytest.approx(mine[2])
    assert ledger_records(tmp_path) == 3


def _tamper(tmp: Path, statement: str) -> None:
    con = sqlite3.connect(tmp / "ledger.db")
    try:
        con.execute("DROP TRIGGER dpgate_provenance_no_update")
        con.execute("DROP TRIGGER dpgate_provenance_no_delete")
        con.execute(statement)
        con.commit()
    finally:
        con.close()


@pytest.mark.parametrize("change", [
    "DELETE FROM dpgate_provenance WHERE id = (SELECT MIN(id) FROM dpgate_provenance)",
    "DELETE FROM dpgate_provenance",
    "DELETE FROM dpgate_provenance WHERE id >= (SELECT MAX(id) FROM dpgate_provenance WHERE kind = 'charge')",
    "UPDATE dpgate_provenance SET epsilon = 0 WHERE kind = 'charge'",
    "UPDATE dpgate_provenance SET analyst = 'bob' WHERE kind = 'charge'",
], ids=["delete-first", "delete-all", "delete-last-charge", "edit-epsilon", "move-to-another"])
def test_tampered_provenance_is_refused_when_caps_are_read(tmp_path: Path, change: str) -> None:
    """A running server reads caps from the rows it verified (edits of those cannot lower a cap) and
    notices the last one deleted; a restarted one verifies the whole chain, up to the last charge
    anchored next to the ledger's key (so deleting every row, or the last ones, is noticed too)."""
    with thread_server(tmp_path, caps={"alice": 0.5, "bob": 0.5}) as s:
        with psycopg.connect(dsn(s.port, "alice"), autocommit=True) as alice:
            alice.execute(YOUNG).fetchone()
            alice.execute("SELECT COUNT(*) FROM pums WHERE age < 30").fetchone()
            spent = alice.execute("SHOW dpgate.budget").fetchone()[2]  # verified up to here
            _tamper(tmp_path, change)
            if change.startswith("DELETE FROM dpgate_provenance") and "MIN" not in change:  # the head row went
                for statement in ("SHOW dpgate.budget", "SELECT COUNT(*) FROM pums WHERE age >= 60"):
                    with pytest.raises(psycopg.errors.SystemError) as err:
                        alice.execute(statement).fetchone()
                    assert "provenance" in str(err.value) and "tampered" in str(err.value)
            else:
                assert alice.execute("SHOW dpgate.budget").fetchone()[2] == pytest.approx(spent)
    before = ledger_records(tmp_path)
    with thread_server(tmp_path, caps={"alice": 0.5, "bob": 0.5}) as s:
        for who in ("alice", "bob"):
            with psycopg.connect(dsn(s.port, who), autocommit=True) as con:
                for statement in ("SHOW dpgate.budget", "SELECT COUNT(*) FROM pums WHERE age >= 60",
                                  "SHOW dpgate.history"):
                    with pytest.raises(psycopg.errors.SystemError, match="tampered"):
                        con.execute(statement).fetchone()
    assert ledger_records(tmp_path) == before

"""A statement's deadline for compiling and planning (issue 27): refused with 54000 / QueryTooComplex,
nothing read or spent, and the gateway's lock given up for the other sessions."""

from __future__ import annotations

import threading
from pathlib import Path

import psycopg
import pytest
from _dpserve import dsn, thread_server

import dpgate
from dpgate.compile.bounds import check_deadline, deadline
from dpgate.datasets import load_pums

GROUP_BY = "SELECT age, sex, COUNT(*) FROM pums GROUP BY age, sex"


def test_no_deadline_and_a_generous_one_never_refuse() -> None:
    check_deadline()
    with deadline(None):
        check_deadline()
    with deadline(60.0):
        check_deadline()


def test_a_passed_deadline_refuses_and_says_so() -> None:
    with deadline(0.0), pytest.raises(dpgate.QueryTooComplex, match="deadline of 0 s"):
        check_deadline()
    check_deadline()  # the deadline ends with its block


def test_a_statement_past_its_deadline_spends_nothing_and_frees_the_gateway() -> None:
    df, schema = load_pums()
    with dpgate.Gateway(df, schema, budget=1.0, seed=7) as gw:
        with deadline(0.0), pytest.raises(dpgate.QueryTooComplex, match="nothing was read or spent"):
            gw.query(GROUP_BY, accuracy=50)
        assert gw.spent == 0.0 and len(gw.history) == 0
        answered: list[float] = []
        other = threading.Thread(target=lambda: answered.append(gw.query(
            "SELECT COUNT(*) FROM pums", accuracy=50).answer.value))
        other.start()
        other.join(30)
        assert answered, "the gateway's lock was not given up"
        assert gw.query(GROUP_BY, accuracy=50).epsilon_spent > 0  # without the deadline: answered


def test_dpgate_serve_refuses_a_statement_past_its_deadline_with_54000(tmp_path: Path) -> None:
    with thread_server(tmp_path, budget=1.0, caps={"alice": 1.0}, statement_deadline=1e-9) as s:
        with psycopg.connect(dsn(s.port), autocommit=True) as c:
            with pytest.raises(psycopg.Error) as info:
                c.execute(GROUP_BY)
            assert info.value.sqlstate == "54000" and "deadline" in str(info.value)
        assert s.gateway.spent == 0.0


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "10"])
def test_a_bad_deadline_is_refused_before_the_server_starts(tmp_path: Path, bad: object) -> None:
    with pytest.raises(dpgate.InvalidArgument, match="statement_deadline"):
        with thread_server(tmp_path, statement_deadline=bad):
            pass

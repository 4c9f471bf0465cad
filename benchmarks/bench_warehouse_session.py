"""A 100-statement analyst session on the 20.8 M-row warehouse through one gateway (issue 28's target).

The table is ``bench_warehouse.py``'s (``income`` 0..4095 from NETTRACE × ``scale``, a
50-value ``region``, ``age`` 0..99, the views ``w317`` / ``w1025`` over income bins), built by
its ``build`` with four more columns drawn inside DuckDB by a re-mixed ``hash`` of (cell,
unit, seed): ``sex`` (categorical ``'1'``, ``'2'``), ``race`` (``'1'`` … ``'9'``), ``educ``
(integer 1..16) and ``married`` (``'0'``, ``'1'``).  It is a separate file,
``$TMPDIR/dpgate-bench-cache/warehouse_session_x<scale>.duckdb`` (built once, never
committed), so ``bench_warehouse.py``'s file is untouched.  (The new columns are re-mixed,
``hash(xor(hash(cell, unit), seed + k))``: DuckDB combines ``hash(a, b, c)``'s arguments by
XOR, so columns drawn from ``hash(cell, unit, seed + k)`` for several ``k`` are functions of
one another's bits — as ``region``'s and ``age``'s parities are in ``bench_warehouse.py``.)

``SESSION`` is a fixed list of 100 statements written as an analyst would: GROUP BYs over
region, age, income bins (the ``w317`` view), region × sex, region × race, educ, married × sex,
AVG(age) by region, SUM(income) by sex, counts with ranges and IN lists over 1–3 columns,
filtered GROUP BYs and about 15 exact repeats and rephrasings.  Accuracies are fractions of the
table's rows (so they scale with ``--rows``): ±0.1–0.2 % of the rows for a total, a few per
cent of a group's expected size for a GROUP BY; confidence 0.95, budget 1e9 (nothing is
refused for budget), seeded noise (``seed=0``).

The session runs through ONE ``dpgate.Gateway`` with a file ledger in a temporary directory,
in a child process whose address space is capped (``resource.RLIMIT_AS`` at
``--memory-limit-gb``, default 8): a runaway fails with ``MemoryError`` in that process instead
of taking the (shared) machine down.  The parent sends the statements one by one over a pipe
and gets one result per statement back, so a child that dies (or passes
``--statement-timeout``) still leaves every earlier result and names the statement it died on.
Per statement: wall and CPU seconds of ``gw.query``, the answers' sources (``fresh`` /
``history`` / …, see ``dpgate.answer.result``), outputs, isolated outputs, ε spent, a refusal
(``dpgate.Error``: type and message; the session goes on) or a memory failure (with the
innermost frames of its traceback), and after it the child's RSS (``VmRSS``) and the
statement's own peak (``VmHWM``, reset before each statement through ``/proc/self/clear_refs``
when the kernel allows it, else the process's peak so far).  The same statement's hand-written
DuckDB SQL (the text itself, or its raw form for the ``w317`` view) is timed by the parent on
its own read-only connection, median of 3, interleaved (once before the statement, twice after).

After the session, in the child: five distinct fresh COUNTs never asked before (``AFTER``), each
on the session's gateway and on a new gateway (own file ledger; construction not timed),
interleaved, medians over those answered; then the session's gateway is closed (its checkpoint
written).  Then, in a new process capped alike (also when the session's process died), the
constructor ``Gateway(...)`` on the session's ledger is timed three times (median), and once more
with the checkpoint moved aside (the re-open after a crash; reported, not a target).

Prints a line per statement and a summary, and writes ``benchmarks/results/warehouse_session.json``
(rewritten after every statement, ``"complete": false`` until the end): the rows, the summary
(answered / refused / memory failures, peak RSS, fresh p50 of the first and of the last 20
fresh statements, absolute and as a ratio to raw, p95, the fresh COUNT after the session ÷ on a
new gateway, the re-open time, total ε, share answered from history) and issue 28's targets
with pass / fail.

Usage::

    python benchmarks/bench_warehouse_session.py [--rows N] [--quick] [--memory-limit-gb 8]
        [--statement-timeout 900] [--statements K] [--out FILE]

``--quick`` is ``--rows 200000`` (numbers not for reporting); ``--statements K`` runs the
first K statements only.
"""

from __future__ import annotations

import argparse
import collections
import json
import multiprocessing as mp
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import duckdb
from bench_warehouse import SCHEMA as WAREHOUSE_SCHEMA
from bench_warehouse import UNITS, build

import dpgate

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "warehouse_session.json"
CONFIDENCE = 0.95
BUDGET = 1e9
GIB = 2**30
#: The four columns added to ``bench_warehouse``'s table, as ``build``'s extra SELECT items.
EXTRA_COLUMNS = (
    "CAST(hash(xor(hash(h.v, r.i), {seed} + 3)) % 2 + 1 AS VARCHAR) AS sex",
    "CAST(hash(xor(hash(h.v, r.i), {seed} + 4)) % 9 + 1 AS VARCHAR) AS race",
    "CAST(hash(xor(hash(h.v, r.i), {seed} + 5)) % 16 + 1 AS BIGINT) AS educ",
    "CAST(hash(xor(hash(h.v, r.i), {seed} + 6)) % 2 AS VARCHAR) AS married",
)
SCHEMA: dict[str, Any] = json.loads(json.dumps(WAREHOUSE_SCHEMA))
SCHEMA["tables"]["warehouse"]["columns"].update({
    "sex": {"type": "categorical", "values": ["1", "2"]},
    "race": {"type": "categorical", "values": [str(i) for i in range(1, 10)]},
    "educ": {"type": "integer", "min": 1, "max": 16},
    "married": {"type": "categorical", "values": ["0", "1"]},
})


@dataclass(frozen=True)
class Step:
    """One statement of the session.

    ``accuracy`` is a fraction of the table's rows (times ``unit``, the scale of a summed
    value: income units for SUM(income)); ``raw`` is the hand-written DuckDB SQL when the
    statement's own text does not run on DuckDB as meant (the ``w317`` view's bins)."""

    sql: str
    accuracy: float
    kind: str
    raw: str | None = None
    unit: float = 1.0


W = "FROM warehouse"
R3 = "('region_01', 'region_02', 'region_03')"
W317_RAW = "SELECT income // 13, COUNT(*) FROM warehouse GROUP BY 1"
SESSION: tuple[Step, ...] = (
    Step(f"SELECT COUNT(*) {W}", 0.001, "first"),
    Step(f"SELECT region, COUNT(*) {W} GROUP BY region", 0.0004, "group by"),
    Step(f"SELECT sex, COUNT(*) {W} GROUP BY sex", 0.002, "group by"),
    Step(f"SELECT age, COUNT(*) {W} GROUP BY age", 0.0002, "group by"),
    Step(f"SELECT COUNT(*) {W} WHERE age BETWEEN 18 AND 64", 0.002, "range"),
    Step(f"SELECT COUNT(*) {W} WHERE age >= 65", 0.002, "range"),
    Step(f"SELECT COUNT(*) {W} WHERE age < 18", 0.002, "range"),
    Step(f"SELECT region, sex, COUNT(*) {W} GROUP BY region, sex", 0.0002, "group by 2"),
    Step("SELECT income, COUNT(*) FROM w317 GROUP BY income", 0.0001, "group by bins", W317_RAW),
    Step(f"SELECT COUNT(*) {W} WHERE income < 100", 0.002, "range"),
    # 11
    Step(f"SELECT COUNT(*) {W} WHERE income BETWEEN 100 AND 999", 0.002, "range"),
    Step(f"SELECT COUNT(*) {W} WHERE income >= 1000", 0.002, "range"),
    Step(f"SELECT race, COUNT(*) {W} GROUP BY race", 0.0005, "group by"),
    Step(f"SELECT region, race, COUNT(*) {W} GROUP BY region, race", 0.0001, "group by 2"),
    Step(f"SELECT educ, COUNT(*) {W} GROUP BY educ", 0.0005, "group by"),
    Step(f"SELECT married, sex, COUNT(*) {W} GROUP BY married, sex", 0.001, "group by 2"),
    Step(f"SELECT region, AVG(age) {W} GROUP BY region", 0.0004, "avg"),
    Step(f"SELECT sex, SUM(income) {W} GROUP BY sex", 0.002, "sum", unit=1000),
    Step(f"SELECT COUNT(*) {W} WHERE region = 'region_07'", 0.0004, "repeat (group)"),
    Step(f"SELECT COUNT(*) {W} WHERE age BETWEEN 18 AND 64", 0.002, "exact repeat"),
    # 21
    Step(f"SELECT race, COUNT(*) {W} WHERE age BETWEEN 18 AND 64 GROUP BY race", 0.0005, "filtered group by"),
    Step(f"SELECT COUNT(*) {W} WHERE race IN ('1', '2')", 0.001, "IN"),
    Step(f"SELECT COUNT(*) {W} WHERE sex = '2' AND age BETWEEN 18 AND 64", 0.001, "2 columns"),
    Step(f"SELECT COUNT(*) {W} WHERE region IN {R3}", 0.001, "IN"),
    Step(f"SELECT COUNT(*) {W} WHERE region IN {R3} AND sex = '1'", 0.0005, "2 columns"),
    Step(f"SELECT educ, COUNT(*) {W} WHERE age >= 25 GROUP BY educ", 0.0005, "filtered group by"),
    Step(f"SELECT COUNT(*) {W} WHERE educ >= 13", 0.001, "range"),
    Step(f"SELECT COUNT(*) {W} WHERE educ BETWEEN 9 AND 12 AND age >= 25", 0.001, "2 columns"),
    Step(f"SELECT sex, COUNT(*) {W} GROUP BY sex", 0.002, "exact repeat"),
    Step(f"SELECT COUNT(*) {W} WHERE NOT (sex = '1')", 0.002, "rephrasing"),
    # 31
    Step(f"SELECT married, COUNT(*) {W} GROUP BY married", 0.001, "coarsening"),
    Step(f"SELECT COUNT(*) {W} WHERE married = '1' AND age BETWEEN 18 AND 64", 0.001, "2 columns"),
    Step(f"SELECT region, COUNT(*) {W} WHERE age >= 65 GROUP BY region", 0.0002, "filtered group by"),
    Step(f"SELECT age, COUNT(*) {W} WHERE sex = '2' GROUP BY age", 0.0001, "filtered group by"),
    Step(f"SELECT COUNT(*) {W} WHERE age >= 18 AND age <= 64", 0.002, "rephrasing"),
    Step(f"SELECT COUNT(*) {W} WHERE income < 500 AND age >= 65", 0.0005, "2 columns"),
    Step(f"SELECT COUNT(*) {W} WHERE income BETWEEN 10 AND 20 AND region = 'region_10'", 0.0002, "2 columns"),
    Step(f"SELECT race, sex, COUNT(*) {W} GROUP BY race, sex", 0.0003, "group by 2"),
    Step(f"SELECT region, AVG(age) {W} WHERE sex = '1' GROUP BY region", 0.0004, "avg"),
    Step(f"SELECT sex, AVG(income) {W} GROUP BY sex", 0.001, "avg"),
    # 41
    Step(f"SELECT race, AVG(age) {W} GROUP BY race", 0.0005, "avg"),
    Step(f"SELECT COUNT(*) {W} WHERE race IN ('3', '4', '5') AND age < 30", 0.0005, "2 columns"),
    Step(f"SELECT COUNT(*) {W} WHERE race NOT IN ('1', '2')", 0.001, "NOT IN"),
    Step(f"SELECT region, COUNT(*) {W} GROUP BY region", 0.0004, "exact repeat"),
    Step("SELECT income, COUNT(*) FROM w317 GROUP BY income", 0.0002, "repeat, looser", W317_RAW),
    Step(f"SELECT COUNT(*) {W} WHERE income BETWEEN 0 AND 12", 0.0005, "range"),
    Step(f"SELECT educ, sex, COUNT(*) {W} GROUP BY educ, sex", 0.0002, "group by 2"),
    Step(f"SELECT COUNT(*) {W} WHERE educ IN (12, 14, 16)", 0.001, "IN"),
    Step(f"SELECT married, COUNT(*) {W} WHERE age BETWEEN 25 AND 44 GROUP BY married", 0.0005, "filtered group by"),
    Step(f"SELECT COUNT(*) {W} WHERE age BETWEEN 25 AND 44 AND married = '1' AND sex = '2'", 0.0003, "3 columns"),
    # 51
    Step(f"SELECT region, sex, COUNT(*) {W} GROUP BY region, sex", 0.0002, "exact repeat"),
    Step(f"SELECT COUNT(*) {W} WHERE region = 'region_07' AND sex = '2'", 0.0002, "repeat (group)"),
    Step(f"SELECT age, COUNT(*) {W} WHERE age BETWEEN 18 AND 64 GROUP BY age", 0.0002, "repeat (groups)"),
    Step(f"SELECT race, COUNT(*) {W} WHERE region IN {R3} GROUP BY race", 0.0002, "filtered group by"),
    Step(f"SELECT sex, SUM(income) {W} WHERE age BETWEEN 18 AND 64 GROUP BY sex", 0.002, "sum", unit=1000),
    Step(f"SELECT COUNT(*) {W} WHERE income >= 2048", 0.001, "range"),
    Step(f"SELECT COUNT(*) {W} WHERE income < 64 AND age < 10", 0.0002, "2 columns"),
    Step(f"SELECT COUNT(*) {W} WHERE (income < 200 AND region = 'region_02') OR age = 7", 0.0003, "OR"),
    Step(f"SELECT region, COUNT(*) {W} WHERE income < 100 GROUP BY region", 0.0002, "filtered group by"),
    Step(f"SELECT age, COUNT(*) {W} WHERE race = '1' GROUP BY age", 0.0001, "filtered group by"),
    # 61
    Step(f"SELECT educ, AVG(age) {W} GROUP BY educ", 0.0005, "avg"),
    Step(f"SELECT region, race, COUNT(*) {W} WHERE age BETWEEN 18 AND 64 GROUP BY region, race", 0.0001,
         "filtered group by 2"),
    Step(f"SELECT COUNT(*) {W} WHERE sex = '1' AND race = '2' AND educ >= 13", 0.0003, "3 columns"),
    Step(f"SELECT married, sex, COUNT(*) {W} GROUP BY married, sex", 0.002, "repeat, looser"),
    Step(f"SELECT COUNT(*) {W} WHERE married = '0'", 0.001, "repeat (groups)"),
    Step(f"SELECT race, COUNT(*) {W} WHERE age BETWEEN 18 AND 64 GROUP BY race", 0.0005, "exact repeat"),
    Step(f"SELECT COUNT(*) {W} WHERE age BETWEEN 18 AND 64 AND race IN ('1', '2')", 0.001, "repeat (groups)"),
    Step(f"SELECT region, AVG(age) {W} GROUP BY region", 0.0004, "exact repeat"),
    Step(f"SELECT COUNT(*) {W} WHERE region NOT IN {R3}", 0.001, "NOT IN"),
    Step(f"SELECT COUNT(*) {W} WHERE age BETWEEN 30 AND 49 AND region IN {R3} AND educ < 9", 0.0003, "3 columns"),
    # 71
    Step(f"SELECT sex, COUNT(*) {W} WHERE educ >= 13 GROUP BY sex", 0.0005, "filtered group by"),
    Step(f"SELECT educ, COUNT(*) {W} WHERE sex = '2' AND age >= 25 GROUP BY educ", 0.0003, "filtered group by"),
    Step("SELECT income, COUNT(*) FROM w317 GROUP BY income", 0.00005, "repeat, tighter", W317_RAW),
    Step(f"SELECT COUNT(*) {W} WHERE income BETWEEN 1000 AND 1999", 0.001, "range"),
    Step(f"SELECT COUNT(*) {W} WHERE income BETWEEN 2000 AND 2999", 0.001, "range"),
    Step(f"SELECT COUNT(*) {W} WHERE income BETWEEN 3000 AND 4095", 0.001, "range"),
    Step(f"SELECT COUNT(*) {W} WHERE income >= 1000", 0.002, "exact repeat"),
    Step(f"SELECT region, sex, AVG(age) {W} GROUP BY region, sex", 0.0002, "avg"),
    Step(f"SELECT race, sex, COUNT(*) {W} WHERE age >= 65 GROUP BY race, sex", 0.0002, "filtered group by 2"),
    Step(f"SELECT age, COUNT(*) {W} GROUP BY age", 0.0002, "exact repeat"),
    # 81
    Step(f"SELECT COUNT(*) {W} WHERE age IN (20, 30, 40, 50, 60)", 0.0005, "repeat (groups)"),
    Step(f"SELECT COUNT(*) {W} WHERE age BETWEEN 0 AND 17", 0.002, "rephrasing"),
    Step(f"SELECT married, race, COUNT(*) {W} GROUP BY married, race", 0.0003, "group by 2"),
    Step(f"SELECT sex, SUM(income) {W} GROUP BY sex", 0.002, "exact repeat", unit=1000),
    Step(f"SELECT region, SUM(income) {W} GROUP BY region", 0.0005, "sum", unit=1000),
    Step(f"SELECT COUNT(*) {W} WHERE region = 'region_42' AND age BETWEEN 18 AND 64 AND sex = '1'", 0.0002,
         "3 columns"),
    Step(f"SELECT educ, COUNT(*) {W} GROUP BY educ", 0.0005, "exact repeat"),
    Step(f"SELECT COUNT(*) {W} WHERE educ BETWEEN 1 AND 8", 0.001, "repeat (groups)"),
    Step(f"SELECT region, COUNT(*) {W} WHERE race = '9' GROUP BY region", 0.0001, "repeat (groups)"),
    Step(f"SELECT COUNT(*) {W} WHERE sex = '2' AND married = '1' AND race IN ('1', '2', '3')", 0.0003, "3 columns"),
    # 91
    Step(f"SELECT age, COUNT(*) {W} WHERE married = '1' GROUP BY age", 0.0001, "filtered group by"),
    Step(f"SELECT COUNT(*) {W} WHERE income BETWEEN 100 AND 999 AND age BETWEEN 18 AND 64", 0.0005, "2 columns"),
    Step(f"SELECT race, AVG(income) {W} GROUP BY race", 0.0005, "avg"),
    Step(f"SELECT COUNT(*) {W} WHERE income < 100", 0.002, "exact repeat"),
    Step(f"SELECT COUNT(*) {W} WHERE age BETWEEN 50 AND 64 AND region IN "
         "('region_10', 'region_20', 'region_30', 'region_40')", 0.0003, "2 columns"),
    Step(f"SELECT region, COUNT(*) {W} WHERE sex = '2' AND age BETWEEN 18 AND 64 GROUP BY region", 0.0002,
         "filtered group by"),
    Step(f"SELECT educ, married, COUNT(*) {W} GROUP BY educ, married", 0.0002, "group by 2"),
    Step(f"SELECT COUNT(*) {W} WHERE region = 'region_07'", 0.0004, "exact repeat"),
    Step(f"SELECT COUNT(*) {W} WHERE age >= 65 AND sex = '1' AND educ >= 13", 0.0003, "3 columns"),
    Step(f"SELECT COUNT(*) {W}", 0.001, "exact repeat"),
)
#: Fresh COUNTs never asked in the session (income cuts no statement made), for after it.
AFTER = tuple(f"SELECT COUNT(*) {W} WHERE age BETWEEN {21 + k} AND {57 + k} AND educ <= {7 + k}" for k in range(5))
AFTER_ACCURACY = 0.0005


# -- the child: one gateway, the session, then the measurements after it --------------------
def _status() -> dict[str, float]:
    """VmRSS, VmHWM and VmSize of this process, in MB."""
    out = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM", "VmSize"):
                out[key] = round(int(rest.split()[0]) / 1024, 1)
    return out


def _reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux ``clear_refs`` 5); False when not allowed."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _where(exc: BaseException, frames: int = 6) -> list[str]:
    """The innermost ``frames`` frames of ``exc``'s traceback, as ``file:line function``."""
    tb = traceback.extract_tb(exc.__traceback__)[-frames:]
    return [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in tb]


def _gateway(path: str, ledger: Path) -> dpgate.Gateway:
    ledger.parent.mkdir(parents=True, exist_ok=True)
    return dpgate.Gateway(path, SCHEMA, budget=BUDGET, ledger=str(ledger), seed=0)


def _ask(gw: dpgate.Gateway, sql: str, accuracy: float) -> dict[str, Any]:
    """One statement, timed, with what it released or why it failed."""
    peak_reset = _reset_peak()
    row: dict[str, Any] = {}
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        res = gw.query(sql, accuracy=accuracy, confidence=CONFIDENCE)
    except dpgate.Error as e:
        row.update(outcome="refused", error=type(e).__name__, message=str(e)[:500])
    except MemoryError as e:
        row.update(outcome="memory", error=type(e).__name__, message=str(e)[:500], where=_where(e))
    except Exception as e:  # noqa: BLE001 - a benchmark records any failure and goes on
        kind = "memory" if "memory" in f"{type(e).__name__} {e}".lower() else "error"
        row.update(outcome=kind, error=type(e).__name__, message=str(e)[:500], where=_where(e))
    else:
        sources = collections.Counter(a.source for a in res.answers)
        row.update(outcome="answered", outputs=len(res.answers), sources=dict(sources),
                   isolated=sum(a.isolated for a in res.answers), epsilon=res.epsilon_spent,
                   meets_requirement=all(a.meets_requirement for a in res.answers))
    row["seconds"] = round(time.perf_counter() - t0, 4)
    row["cpu_seconds"] = round(time.process_time() - c0, 3)
    status = _status()
    row.update(rss_mb=status["VmRSS"], hwm_mb=status["VmHWM"], vm_mb=status["VmSize"],
               hwm_is_statement_peak=peak_reset)
    return row


def _after(held: list[dpgate.Gateway], path: str, rows: int, workdir: Path) -> dict[str, Any]:
    """Fresh COUNTs on the session's gateway (taken from ``held``) and on new ones, then its close
    (which writes its checkpoint)."""
    gw = held.pop()
    out: dict[str, Any] = {"after_session": [], "new_gateway": []}
    acc = AFTER_ACCURACY * rows
    for k, sql in enumerate(AFTER):
        out["after_session"].append({"sql": sql, **_ask(gw, sql, acc)})
        with _gateway(path, workdir / f"new{k}" / "ledger.db") as fresh:
            out["new_gateway"].append({"sql": sql, **_ask(fresh, sql, acc)})
    out["epsilon_total"] = gw.spent
    t0 = time.perf_counter()
    gw.close()
    out["close_seconds"] = round(time.perf_counter() - t0, 3)
    out.update(_status())
    return out


def reopen_main(conn: Connection, path: str, ledger: str, memory_limit_gb: float) -> None:
    """A new process (capped as the session's): time ``Gateway(...)`` on the session's ledger three
    times, then once with its checkpoint moved aside (a re-open after a crash)."""
    limit = int(memory_limit_gb * GIB)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    warnings.simplefilter("ignore", dpgate.Warning)
    state = Path(ledger + ".state")
    files = [Path(ledger + suffix) for suffix in ("", "-wal")]  # SQLite: records not yet in the main file
    out: dict[str, Any] = {"ledger_bytes": sum(f.stat().st_size for f in files if f.exists()),
                           "checkpoint_bytes": state.stat().st_size if state.exists() else None}

    def timed(key: str) -> float | None:
        try:
            t0 = time.perf_counter()
            again = _gateway(path, Path(ledger))
            seconds = time.perf_counter() - t0
            again.close()
            return round(seconds, 3)
        except Exception as e:  # noqa: BLE001 - reported
            out[f"{key}_error"] = f"{type(e).__name__}: {e}"[:300]
            return None

    out["reopen_seconds"] = [timed("reopen") for _ in range(3)]
    out["reopen_rss_mb"] = _status()["VmRSS"]
    if state.exists():
        aside = state.with_suffix(".aside")
        state.rename(aside)
        try:
            out["reopen_without_checkpoint_seconds"] = timed("reopen_without_checkpoint")
        finally:  # the checkpoint that re-open wrote gives way to the session's
            state.unlink(missing_ok=True)
            aside.rename(state)
    out.update(_status())
    conn.send(out)


def child_main(conn: Connection, path: str, rows: int, memory_limit_gb: float, workdir: str) -> None:
    """The session's process: cap the address space, open one gateway, answer what the parent sends."""
    limit = int(memory_limit_gb * GIB)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    warnings.simplefilter("ignore", dpgate.Warning)  # seeded noise, announced once per gateway
    work = Path(workdir)
    t0 = time.perf_counter()
    held = [_gateway(path, work / "session" / "ledger.db")]
    conn.send({"event": "ready", "open_seconds": round(time.perf_counter() - t0, 3), **_status()})
    while True:
        msg = conn.recv()
        if msg[0] == "stmt":
            step = SESSION[msg[1]]
            conn.send(_ask(held[0], step.sql, step.accuracy * rows * step.unit))
        elif msg[0] == "after":
            try:
                conn.send(_after(held, path, rows, work))
            except BaseException as e:  # noqa: BLE001 - report, then stop
                conn.send({"error": f"{type(e).__name__}: {e}"[:500], "where": _where(e)})
            return
        else:
            held[0].close()
            return


# -- the parent: the file, the raw timings, the summary -----------------------------------
def _raw_seconds(con: duckdb.DuckDBPyConnection, sql: str) -> float:
    t0 = time.perf_counter()
    con.execute(sql).fetchall()
    return time.perf_counter() - t0


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _p(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def _growth(rows: list[dict[str, Any]], ready_rss: float) -> list[dict[str, Any]]:
    """Each statement's RSS after it minus the RSS before it."""
    out, before = [], ready_rss
    for r in rows:
        if "rss_mb" in r:
            out.append({"index": r["index"], "mb": round(r["rss_mb"] - before, 1), "sql": r["sql"]})
            before = r["rss_mb"]
    return out


def summarise(rows: list[dict[str, Any]], after: dict[str, Any] | None, reopen: dict[str, Any] | None,
              n_session: int, ready_rss: float) -> dict[str, Any]:
    """The summary of the rows so far, with issue 28's targets (``ready_rss``: RSS before statement 1)."""
    answered = [r for r in rows if r.get("outcome") == "answered"]
    fresh = [r for r in answered if r["sources"].get("fresh")]
    first, last = fresh[:20], fresh[-20:]

    def stats(part: list[dict[str, Any]]) -> dict[str, Any]:
        secs = [r["seconds"] for r in part]
        ratios = [r["ratio_to_raw"] for r in part]
        return {"statements": [r["index"] for r in part], "p50_seconds": _r(_median(secs), 4),
                "p50_raw_seconds": _r(_median([r["raw_seconds"] for r in part]), 4),
                "p50_ratio_to_raw": _r(_median(ratios))}

    outputs = sum(r["outputs"] for r in answered)
    from_history = sum(r["sources"].get("history", 0) for r in answered)
    s: dict[str, Any] = {
        "statements": n_session, "run": len(rows), "answered": len(answered),
        "refused": sum(r.get("outcome") == "refused" for r in rows),
        "memory_failures": [r["index"] for r in rows if r.get("outcome") == "memory"],
        "other_failures": [r["index"] for r in rows if r.get("outcome") in ("error", "died", "timeout")],
        "first_memory_failure": next(({k: r.get(k) for k in ("index", "sql", "message", "where")}
                                      for r in rows if r.get("outcome") == "memory"), None),
        "rss_mb_after_every_10th_statement": [r.get("rss_mb") for r in rows[9::10]],
        "first_statement_over_1_5_gb": next((r["index"] for r in rows if r.get("hwm_mb", 0) > 1.5 * 1024), None),
        "largest_rss_growth": sorted(_growth(rows, ready_rss), key=lambda x: -x["mb"])[:5],
        "peak_rss_mb": max((r.get("hwm_mb", 0) for r in rows), default=None),
        "final_rss_mb": rows[-1].get("rss_mb") if rows else None,
        "fresh_statements": len(fresh), "first_20_fresh": stats(first), "last_20_fresh": stats(last),
        "fresh_p95_ratio_to_raw": _r(_p([r["ratio_to_raw"] for r in fresh], 0.95)),
        "fresh_p95_seconds": _r(_p([r["seconds"] for r in fresh], 0.95), 4),
        "slowest": sorted(({"index": r["index"], "seconds": r["seconds"], "sql": r["sql"]} for r in rows
                           if "seconds" in r), key=lambda x: -x["seconds"])[:5],
        "session_seconds": round(sum(r.get("seconds", 0) for r in rows), 2),
        "outputs": outputs, "outputs_from_history_share": _r(from_history / outputs if outputs else None),
        "statements_all_history": sum(set(r["sources"]) == {"history"} for r in answered),
        "isolated_outputs": sum(r.get("isolated", 0) for r in answered),
        "epsilon_sum_of_statements": _r(sum(r.get("epsilon", 0.0) for r in answered), 6),
    }
    if last and first and s["first_20_fresh"]["p50_ratio_to_raw"]:
        s["last_over_first_p50"] = _r(s["last_20_fresh"]["p50_ratio_to_raw"] / s["first_20_fresh"]["p50_ratio_to_raw"])
    if after and "after_session" in after:  # medians over the statements answered
        a = _median([r["seconds"] for r in after["after_session"] if r["outcome"] == "answered"])
        n = _median([r["seconds"] for r in after["new_gateway"] if r["outcome"] == "answered"])
        raw = _median(after.get("raw_seconds", []))
        s.update(fresh_count_after_seconds=_r(a, 4), fresh_count_new_gateway_seconds=_r(n, 4),
                 fresh_count_raw_seconds=_r(raw, 4),
                 fresh_count_after_over_new=_r(a / n if a and n else None),
                 fresh_count_after_over_raw=_r(a / raw if a and raw else None),
                 fresh_count_outcomes=[r.get("sources") or r["outcome"] for r in after["after_session"]],
                 close_seconds=after["close_seconds"], epsilon_total=_r(after["epsilon_total"], 6))
    if reopen and "reopen_seconds" in reopen:
        times = [t for t in reopen["reopen_seconds"] if t is not None]
        s.update(reopen_seconds=_r(_median(times)) if len(times) == 3 else None,
                 reopen_without_checkpoint_seconds=reopen.get("reopen_without_checkpoint_seconds"),
                 ledger_bytes=reopen["ledger_bytes"], checkpoint_bytes=reopen["checkpoint_bytes"])
    s["targets"] = _targets(s, n_session)
    return s


def _targets(s: dict[str, Any], n_session: int) -> dict[str, Any]:
    def verdict(value: Any, ok: bool | None) -> dict[str, Any]:
        return {"value": value, "pass": ok}

    last, first = s["last_20_fresh"]["p50_ratio_to_raw"], s["first_20_fresh"]["p50_ratio_to_raw"]
    after_over_new, reopen = s.get("fresh_count_after_over_new"), s.get("reopen_seconds")
    peak = s["peak_rss_mb"]
    return {
        "every statement answered": verdict(f"{s['answered']}/{n_session}", s["answered"] == n_session),
        "peak RSS <= 1.5 GB": verdict(peak, None if peak is None else peak <= 1.5 * 1024),
        "last-20 fresh p50 <= 1.5x first-20": verdict(
            s.get("last_over_first_p50"), None if last is None or first is None else last <= 1.5 * first),
        "last-20 fresh p50 <= 2x raw": verdict(last, None if last is None else last <= 2.0),
        "fresh COUNT after <= 1.5x new gateway": verdict(
            after_over_new, None if after_over_new is None else after_over_new <= 1.5),
        "reopen <= 1 s": verdict(reopen, None if reopen is None else reopen <= 1.0),
    }


def _file(rows: int, cache: Path) -> tuple[Path, int]:
    scale = max(1, round(rows / UNITS))
    cache.mkdir(parents=True, exist_ok=True)
    path = cache / f"warehouse_session_x{scale}.duckdb"
    if not path.exists():
        t0 = time.perf_counter()
        build(path, scale, EXTRA_COLUMNS)
        print(f"built {path} in {time.perf_counter() - t0:.1f} s", flush=True)
    return path, scale


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=None, help="about this many rows (default 809 × 25 714 = 20.8 M)")
    ap.add_argument("--quick", action="store_true", help="--rows 200000 (numbers not for reporting)")
    ap.add_argument("--memory-limit-gb", type=float, default=8.0, help="the session process's address-space cap")
    ap.add_argument("--statement-timeout", type=float, default=900.0,
                    help="seconds one statement may take before the session process is stopped")
    ap.add_argument("--statements", type=int, default=len(SESSION), help="run the first K statements only")
    ap.add_argument("--raw-repeat", type=int, default=3)
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "dpgate-bench-cache")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    rows_wanted = args.rows or (200_000 if args.quick else 809 * UNITS)
    path, scale = _file(rows_wanted, args.cache)
    raw = duckdb.connect(str(path), read_only=True)
    n_rows = raw.execute("SELECT COUNT(*) FROM warehouse").fetchone()[0]
    session = SESSION[: args.statements]
    workdir = Path(tempfile.mkdtemp(prefix="dpgate-wsession-"))
    out: dict[str, Any] = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "python": platform.python_version(),
                    "duckdb": duckdb.__version__, "dpgate": dpgate.__file__, "load_avg_1m": os.getloadavg()[0]},
        "rows": n_rows, "scale": scale, "memory_limit_gb": args.memory_limit_gb, "confidence": CONFIDENCE,
        "budget": BUDGET, "complete": False, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    rows: list[dict[str, Any]] = []
    after: dict[str, Any] | None = None
    reopen: dict[str, Any] | None = None

    def write() -> None:
        out["summary"] = summarise(rows, after, reopen, len(session), out["gateway_open"]["VmRSS"])
        out["statements"] = rows
        out["after"] = after
        out["reopen"] = reopen
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(out, indent=1))

    ctx = mp.get_context("spawn")
    ledger = workdir / "session" / "ledger.db"
    parent_end, child_end = ctx.Pipe()
    child = ctx.Process(target=child_main, args=(child_end, str(path), n_rows, args.memory_limit_gb, str(workdir)))
    child.start()
    child_end.close()
    print(f"{n_rows} rows ({path}), session process {child.pid} capped at {args.memory_limit_gb:g} GB, "
          f"load {os.getloadavg()[0]:.2f}", flush=True)

    def receive(timeout: float) -> dict[str, Any] | str:
        """The child's next message, or why there is none ("died" / "timeout")."""
        try:
            if parent_end.poll(timeout):
                return parent_end.recv()  # type: ignore[no-any-return]
        except (EOFError, ConnectionError, OSError):
            return "died"
        if not child.is_alive():
            return "died"
        child.kill()
        return "timeout"

    ready = receive(600)
    if not isinstance(ready, dict):
        shutil.rmtree(workdir, ignore_errors=True)
        sys.exit(f"the session process did not start: {ready} (exit code {child.exitcode})")
    out["gateway_open"] = ready
    print(f"{'#':>3s} {'kind':20s} {'gw s':>8s} {'raw ms':>8s} {'gw/raw':>7s} {'RSS MB':>7s} {'peak MB':>8s}  sources")
    try:
        for i, step in enumerate(session):
            raw_sql = step.raw or step.sql
            raw_times = [_raw_seconds(raw, raw_sql)]
            parent_end.send(("stmt", i))
            got = receive(args.statement_timeout)
            row: dict[str, Any] = {"index": i + 1, "kind": step.kind, "sql": step.sql, "raw_sql": raw_sql,
                                   "accuracy": step.accuracy * n_rows * step.unit}
            if not isinstance(got, dict):
                row.update(outcome=got, exit_code=child.exitcode)
                rows.append(row)
                write()
                print(f"{i + 1:3d} {step.kind:20s} session process {got} (exit code {child.exitcode}): {step.sql}")
                break
            raw_times += [_raw_seconds(raw, raw_sql) for _ in range(max(0, args.raw_repeat - 1))]
            row.update(got)
            row["raw_seconds"] = round(statistics.median(raw_times), 5)
            row["ratio_to_raw"] = round(row["seconds"] / row["raw_seconds"], 3)
            rows.append(row)
            write()
            what = (", ".join(f"{k} {v}" for k, v in row["sources"].items()) if row["outcome"] == "answered"
                    else f"{row['outcome'].upper()} {row['error']}: {row['message'][:120]}")
            print(f"{i + 1:3d} {step.kind:20s} {row['seconds']:8.3f} {row['raw_seconds'] * 1e3:8.1f} "
                  f"{row['ratio_to_raw']:7.2f} {row['rss_mb']:7.0f} {row['hwm_mb']:8.0f}  {what}", flush=True)
        else:
            parent_end.send(("after",))
            got = receive(args.statement_timeout * 4)
            after = got if isinstance(got, dict) else {"error": got}
            if "after_session" in after:
                after["raw_seconds"] = [statistics.median(_raw_seconds(raw, sql) for _ in range(args.raw_repeat))
                                       for sql in AFTER]
            out["complete"] = True
    finally:
        if child.is_alive():
            if after is None:
                try:
                    parent_end.send(("stop",))
                except OSError:
                    pass
            child.join(60)
            if child.is_alive():
                child.kill()
        child.join()
        out["session_exit_code"] = child.exitcode
        write()
        if ledger.exists():  # also after a session process that died: its ledger is what a restart reads
            parent_end, child_end = ctx.Pipe()
            child = ctx.Process(target=reopen_main, args=(child_end, str(path), str(ledger), args.memory_limit_gb))
            child.start()
            child_end.close()
            got = receive(max(600.0, args.statement_timeout))
            reopen = got if isinstance(got, dict) else {"error": got}
            child.join(60)
            if child.is_alive():
                child.kill()
            child.join()
            write()
        raw.close()
        shutil.rmtree(workdir, ignore_errors=True)
    summary = out["summary"]
    skip = ("targets", "slowest", "largest_rss_growth", "first_20_fresh", "last_20_fresh")
    print(json.dumps({k: v for k, v in summary.items() if k not in skip}))
    for key in skip[1:]:
        print(f"{key}: {json.dumps(summary[key])}")
    for name, t in summary["targets"].items():
        mark = {True: "PASS", False: "FAIL", None: "n/a"}[t["pass"]]
        print(f"{mark:4s}  {name}: {t['value']}")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

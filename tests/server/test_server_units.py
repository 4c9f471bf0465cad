"""``dpgate serve`` over a table with a privacy unit: the unit column is never queryable, and a
source without it (or a unit without its bound) is refused — with a real server and psql."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from _dpserve import ROOT, ledger_records, psql, users_file

COLUMNS = {"status": {"type": "categorical", "values": ["paid", "refunded"]},
           "amount": {"type": "integer", "min": 0, "max": 99}}


def _files(tmp: Path, table: dict[str, object], *, with_unit: bool = True) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    n = 400
    df = pd.DataFrame({"uid": rng.integers(0, 30, n), "status": rng.choice(["paid", "refunded"], n),
                       "amount": rng.integers(0, 100, n)})
    data, schema = tmp / "orders.csv", tmp / "orders.yaml"
    (df if with_unit else df.drop(columns="uid")).to_csv(data, index=False)
    schema.write_text(yaml.safe_dump({"tables": {"orders": {**table, "columns": COLUMNS}}}))
    users_file(tmp, {"alice": 5.0})
    return data, schema


def _serve(tmp: Path, data: Path, schema: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "dpgate.cli", "serve", "--data", str(data), "--schema", str(schema),
         "--ledger", str(tmp / "ledger.db"), "--budget", "5", "--users", str(tmp / "users.yaml"),
         "--port", "0", "--accuracy", "25"],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)


def _port(proc: subprocess.Popen[str]) -> int:
    assert proc.stderr is not None
    for line in proc.stderr:
        m = re.search(r"listening on [\d.]+:(\d+)", line)
        if m:
            return int(m.group(1))
    raise RuntimeError(f"the server did not start (exit code {proc.wait(timeout=60)})")


def test_the_unit_column_is_refused_over_the_wire_and_counts_are_answered(tmp_path: Path) -> None:
    data, schema = _files(tmp_path, {"privacy_unit": "uid", "max_rows_per_unit": 4})
    proc = _serve(tmp_path, data, schema)
    try:
        port = _port(proc)
        for sql in ("SELECT uid, COUNT(*) FROM orders GROUP BY uid", "SELECT COUNT(*) FROM orders WHERE uid = 7"):
            out = psql(port, sql)
            assert out.returncode != 0 and "privacy unit" in out.stderr, out
        assert ledger_records(tmp_path) == 0  # refusals spend nothing
        out = psql(port, "SELECT COUNT(*) FROM orders")
        assert out.returncode == 0, out.stderr
        assert abs(float(out.stdout.strip()) - 30 * 4) < 60  # 4 rows of each of 30 customers count, not 400
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize(("table", "with_unit", "message"), [
    ({"privacy_unit": "uid", "max_rows_per_unit": 4}, False, "privacy_unit 'uid'.*no column of that name"),
    ({"privacy_unit": "uid", "max_rows_per_unit": 0}, True, "max_rows_per_unit must be an integer"),
    ({"max_rows_per_unit": 4}, True, "needs 'privacy_unit"),
])
def test_a_bad_unit_declaration_stops_the_server_with_its_message(tmp_path: Path, table: dict[str, object],
                                                                   with_unit: bool, message: str) -> None:
    data, schema = _files(tmp_path, table, with_unit=with_unit)
    proc = _serve(tmp_path, data, schema)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode != 0 and re.search(message, " ".join(err.split())), err

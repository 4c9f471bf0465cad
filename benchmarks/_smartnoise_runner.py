"""Runs statements through SmartNoise SQL; executed by SmartNoise's own interpreter.

Called by ``bench_smartnoise.py`` as ``/work/sn-venv/bin/python _smartnoise_runner.py``
with a JSON request on stdin: ``{"csv": path, "delta": δ, "statements": [{"sql": …,
"epsilon": ε}, …]}``.  Prints one JSON object: per statement its wall time of
``reader.execute`` (readers are built before timing, one per distinct ε, since
SmartNoise fixes ε per reader), the ε and δ its odometer recorded, or the error
SmartNoise raised; and the session's total cost from SmartNoise's own
``OdometerHeterogeneous`` (every mechanism of every statement) beside the basic
composition (the sum of per-mechanism ε).

Imports only what SmartNoise's virtualenv has (snsql, pandas, numpy, yaml): it must
not import dpgate.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
import time
import warnings
from typing import Any

#: SmartNoise's published PUMS metadata shape, typed as dpgate's schema declares
#: (educ an integer 1..16, married a boolean; sex/race text).  ``censor_dims: false``:
#: dpgate answers declared keys without thresholding, so SmartNoise spends no δ on it.
METADATA: dict[str, Any] = {"PUMS": {
    "PUMS": {
        "PUMS": {
            "row_privacy": True,
            "max_ids": 1,
            "rows": 1000,
            "censor_dims": False,
            "age": {"type": "int", "lower": 0, "upper": 100},
            "sex": {"type": "string"},
            "educ": {"type": "int", "lower": 1, "upper": 16},
            "race": {"type": "string"},
            "income": {"type": "int", "lower": 0, "upper": 500000},
            "married": {"type": "boolean"},
        }
    }
}}


def main() -> int:
    import pandas as pd
    import snsql
    from snsql import Privacy
    from snsql.sql.odometer import OdometerHeterogeneous

    warnings.simplefilter("ignore")
    req = json.load(sys.stdin)
    raw = pd.read_csv(req["csv"])
    df = pd.DataFrame({
        "age": raw["age"].astype("int64"), "sex": raw["sex"].astype(str), "educ": raw["educ"].astype("int64"),
        "race": raw["race"].astype(str), "income": raw["income"].astype("int64"),
        "married": raw["married"].astype(bool),
    })
    delta = float(req["delta"])
    readers: dict[float, Any] = {}
    for st in req["statements"]:
        eps = float(st["epsilon"])
        if eps not in readers:
            readers[eps] = snsql.from_df(df, privacy=Privacy(epsilon=eps, delta=delta), metadata=METADATA)
    # warm-up on a throwaway reader (imports, parser and engine start-up are not per statement)
    snsql.from_df(df, privacy=Privacy(epsilon=1.0, delta=delta), metadata=METADATA).execute(
        "SELECT sex, COUNT(*) FROM PUMS.PUMS GROUP BY sex")
    total = OdometerHeterogeneous(Privacy(epsilon=1.0, delta=delta))
    out = []
    for st in req["statements"]:
        reader = readers[float(st["epsilon"])]
        before = len(reader.odometer.steps)
        t0 = time.perf_counter()
        try:
            rows = reader.execute(st["sql"])
        except Exception as e:  # noqa: BLE001 - any refusal is recorded, not raised
            out.append({"seconds": time.perf_counter() - t0, "error": f"{type(e).__name__}: {e}"[:300]})
            continue
        dt = time.perf_counter() - t0
        steps = reader.odometer.steps[before:]
        for eps, d in steps:
            total.spend(Privacy(epsilon=eps, delta=d))
        out.append({"seconds": dt, "rows": max(len(rows) - 1, 0), "mechanisms": len(steps),
                    "epsilon": float(sum(e for e, _ in steps)), "delta": float(sum(d for _, d in steps))})
    spent = total.spent if total.steps else (0.0, 0.0)
    print(json.dumps({
        "statements": out,
        "basic_epsilon": float(sum(e for e, _ in total.steps)),
        "odometer_epsilon": float(spent[0]),
        "odometer_delta": float(spent[1]),
        "snsql_version": importlib.metadata.version("smartnoise-sql"),
        "opendp_version": importlib.metadata.version("opendp"),
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Runs statements through SmartNoise SQL; executed by SmartNoise's own interpreter.

Called by ``bench_smartnoise.py`` as ``/work/sn-venv/bin/python _smartnoise_runner.py``
with a JSON request on stdin: ``{"csv": path, "delta": δ, "statements": [{"sql": …,
"epsilon": ε}, …]}``.  Prints one JSON object: per statement its wall time of
``reader.execute`` (readers are built before timing, one per distinct ε, since
SmartNoise fixes ε per reader), the ε and δ its odometer recorded, or the error
SmartNoise raised; and the session's total cost from SmartNoise's own
``OdometerHeterogeneous`` (every mechanism of every statement) beside the basic
composition (the sum of per-mechanism ε).

Optional fields, for ``bench_composition.py``: ``"mechanism": "gaussian"`` maps every
count and sum to SmartNoise's ``Mechanism.gaussian`` (its default is discrete Laplace);
a statement may then give ``"gaussian_scale"`` (σ per unit of sensitivity) instead of
``"epsilon"``, converted to the ε that OpenDP's zCDP → (ε, δ) conversion gives that
scale at the request's δ (what SmartNoise's ``Gaussian`` searches its scale for);
``"sql": null`` with ``"mechanisms": k`` spends k mechanisms without running SQL (for
statements SmartNoise cannot express); ``"odometer_tol"`` is the slack δ' of the
session's odometer (default: SmartNoise's own, 10⁻¹⁵ when δ = 0); ``"checkpoints"``
lists statement counts after which the odometer's total is reported.

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


def _privacy(epsilon: float, delta: float, gaussian: bool) -> Any:
    from snsql import Privacy
    from snsql.sql.privacy import Mechanism, Mechanisms, Stat

    if not gaussian:
        return Privacy(epsilon=epsilon, delta=delta)
    mechanisms = Mechanisms()
    for stat in (Stat.count, Stat.sum_int, Stat.sum_large_int, Stat.sum_float, Stat.sum_large_float):
        mechanisms.map[stat] = Mechanism.gaussian
    return Privacy(epsilon=epsilon, delta=delta, mechanisms=mechanisms)


def _gaussian_epsilon(scale: float, delta: float) -> float:
    """ε of OpenDP's Gaussian mechanism of ``scale`` (sensitivity 1), zCDP converted to (ε, ``delta``)."""
    import opendp.prelude as dp

    dp.enable_features("contrib", "floating-point")
    meas = dp.m.make_gaussian(dp.atom_domain(T=float, nan=False), dp.absolute_distance(T=float), scale)
    return float(dp.c.make_fix_delta(dp.c.make_zCDP_to_approxDP(meas), delta=delta).map(1.0)[0])


def _total(odometer: Any) -> dict[str, float]:
    """The odometer's total (its Kairouz et al. bound, the minimum with the basic sum) and the basic sum."""
    eps, delta = odometer.spent if odometer.steps else (0.0, 0.0)
    return {"odometer_epsilon": float(eps), "odometer_delta": float(delta),
            "basic_epsilon": float(sum(e for e, _ in odometer.steps)), "mechanisms": len(odometer.steps)}


def main() -> int:
    import pandas as pd
    import snsql
    from snsql import Privacy
    from snsql.sql._mechanisms.gaussian import Gaussian
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
    gaussian = req.get("mechanism") == "gaussian"
    checkpoints = set(req.get("checkpoints", ()))
    readers: dict[float, Any] = {}
    epsilons = [_gaussian_epsilon(float(st["gaussian_scale"]), delta) if "gaussian_scale" in st
                else float(st["epsilon"]) for st in req["statements"]]
    for st, eps in zip(req["statements"], epsilons, strict=True):
        if eps not in readers and st["sql"] is not None:
            readers[eps] = snsql.from_df(df, privacy=_privacy(eps, delta, gaussian), metadata=METADATA)
    # warm-up on a throwaway reader (imports, parser and engine start-up are not per statement)
    snsql.from_df(df, privacy=_privacy(1.0, delta, gaussian), metadata=METADATA).execute(
        "SELECT sex, COUNT(*) FROM PUMS.PUMS GROUP BY sex")
    tol = req.get("odometer_tol")
    total = OdometerHeterogeneous(Privacy(epsilon=1.0, delta=delta if tol is None else 2 * float(tol)))
    out = []
    totals = {}
    for i, (st, eps) in enumerate(zip(req["statements"], epsilons, strict=True)):
        if i in checkpoints:
            totals[i] = _total(total)
        if st["sql"] is None:  # accounted only: the mechanisms SmartNoise would run
            for _ in range(int(st["mechanisms"])):
                total.spend(Privacy(epsilon=eps, delta=delta if gaussian else 0.0))
            out.append({"seconds": 0.0, "mechanisms": int(st["mechanisms"]), "epsilon": eps * int(st["mechanisms"]),
                        "delta": (delta if gaussian else 0.0) * int(st["mechanisms"]), "accounted_only": True})
            continue
        reader = readers[eps]
        before = len(reader.odometer.steps)
        t0 = time.perf_counter()
        try:
            rows = reader.execute(st["sql"])
        except Exception as e:  # noqa: BLE001 - any refusal is recorded, not raised
            out.append({"seconds": time.perf_counter() - t0, "error": f"{type(e).__name__}: {e}"[:300]})
            continue
        dt = time.perf_counter() - t0
        steps = reader.odometer.steps[before:]
        for step_eps, step_delta in steps:
            total.spend(Privacy(epsilon=step_eps, delta=step_delta))
        out.append({"seconds": dt, "rows": max(len(rows) - 1, 0), "mechanisms": len(steps),
                    "epsilon": float(sum(e for e, _ in steps)), "delta": float(sum(d for _, d in steps))})
    spent = total.spent if total.steps else (0.0, 0.0)
    n = len(req["statements"])
    if n in checkpoints:
        totals[n] = _total(total)
    calibration = []
    if gaussian:  # SmartNoise's own scale for a few of the ε used, beside the scale asked for
        seen = sorted({(e, float(st["gaussian_scale"])) for st, e in zip(req["statements"], epsilons, strict=True)
                       if "gaussian_scale" in st})
        for eps, scale in seen[:: max(1, len(seen) // 6)]:
            mech = Gaussian(eps, delta=delta, sensitivity=1)
            calibration.append({"epsilon": eps, "asked_scale": scale, "smartnoise_scale": float(mech.scale)})
    print(json.dumps({
        "checkpoints": totals,
        "calibration": calibration,
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

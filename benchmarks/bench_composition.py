"""Total ε at δ = 10⁻⁶ against the number of statements: pure ε, zCDP and SmartNoise SQL (issue 31).

Two statement streams, each cut at 10, 50, 200 and 1 000 statements (``--quick``: 10 and 50):

* ``pums`` — the PUMS analyst session: ``bench_smartnoise.PUMS200`` (its first 200
  statements, unchanged) extended to 1 000 by :func:`pums1000`, deterministically (a
  seeded ``random.Random``): new ranges, filters and GROUP BYs in ``PUMS200``'s mix
  (counts over 1–3 columns, ``IN`` lists, plain and filtered 1- and 2-column
  ``GROUP BY``s, ``SUM``/``AVG`` of age and income with and without ``WHERE`` / ``GROUP
  BY``) and an exact repeat of an earlier statement after every third fresh one (25 %),
  at ``PUMS200``'s accuracies, confidence 0.95;
* ``workload`` — the paper's online workload (``bench_workload.py``; Xiao & Xiong (2012),
  §6.4): weighted counts over NETTRACE's 4 096 cells, the unbounded setting's
  requirements (``2ε ~ U[50, 1000]``, δ = 0.2, i.e. confidence 0.8), workload seed 0,
  *without* the setting's initial tree (a constant 0.3 in pure ε that is not a
  statement), SQL in the ``CASE`` form.

Columns, with the same statements, accuracies and confidences everywhere:

* **pure** — ``dpgate.Gateway(..., budget=10⁴)`` (default policy, seeded noise): ``gw.spent``.
  A pure ε-DP guarantee is an (ε, δ) guarantee for every δ, so this is its ε at δ = 10⁻⁶.
* **zCDP** — ``dpgate.Gateway(..., privacy="zcdp", budget=ρ large)``: ``gw.spent_as(delta=1e-6)``
  (ρ, ``gw.spent``, is reported beside it).  Runs only when the installed dpgate has the
  ``privacy=`` argument (issue 31's ``zcdp`` branch); otherwise the column says so.
* **SmartNoise Laplace** — SmartNoise SQL's own accounting of the same statements, in its
  own virtualenv through ``_smartnoise_runner.py``, calibrated as ``bench_smartnoise.py``
  does (its default mechanism, discrete Laplace, at ε = ln(1/α)·Δ/accuracy per mechanism,
  so that its half-width at confidence 1 − α is the accuracy asked of dpgate): its
  ``OdometerHeterogeneous`` (Kairouz et al. heterogeneous composition, the minimum of the
  basic sum and the advanced bounds) with its slack δ' = 10⁻⁶, which is then its total δ.
* **SmartNoise Gaussian** — the same with ``Mechanism.gaussian`` mapped for counts and sums
  (SmartNoise's opt-in; its default at any δ stays discrete Laplace): each mechanism's
  noise scale is the Gaussian one whose half-width at 1 − α is the accuracy (σ =
  accuracy/z₁₋α/₂), its (ε, δᵢ) is OpenDP's zCDP → approximate-DP conversion of that scale
  (what SmartNoise's ``Gaussian`` itself searches for), and δᵢ = δ' = 10⁻⁶/(M + 1) for the
  M mechanisms of the session, so that the odometer's total δ is 10⁻⁶.  One run per
  length (δᵢ depends on M).

The workload's weighted counts (``SUM(CASE … THEN 2 …)``) are not expressible in SmartNoise
SQL (it refuses aggregates over expressions and ``FILTER``), so for the workload its
odometer is given the mechanism it would need per query — one count of sensitivity
S = max weight at the calibration above — without executing SQL.  On PUMS every statement
runs through ``reader.execute`` and the odometer gets what SmartNoise recorded.

Honest intervals: per dpgate mode, the share of answers whose ``[low, high]`` holds the
true value (PUMS: DuckDB on the raw frame, ``bench_session``'s brute force; workload: the
histogram), pooled over seeded sessions (workload: ``--coverage-seeds``, 5; PUMS: ``--seed``
only, it is the slow stream), checked against confidence − 3 SE (SE the larger of the
binomial and the between-seed one).  Decisions and ε never depend on the noise, so the
extra seeds only add intervals.

``--max-gb`` caps the process's address space (10 GB; dpgate's memory grows along the PUMS
session, which holds many sums of income, 500 001 weights each): a stream that hits the
cap stops there and the table says so.  ``--pums-lengths`` runs the PUMS stream to fewer
statements than the workload.

Writes ``benchmarks/results/composition.json`` and ``composition.md`` (``composition_quick.*``
with ``--quick``) and prints the table.

Usage::

    python benchmarks/bench_composition.py [--quick] [--seed 1] [--smartnoise-python PATH]
        [--streams pums,workload] [--lengths 10,50,200,1000] [--pums-lengths ...]
        [--coverage-seeds 5] [--max-gb 10] [--progress]
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import multiprocessing
import os
import platform
import random
import resource
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
sys.path.insert(0, HERE)
from bench_session import _truth_connection, _truths  # noqa: E402
from bench_smartnoise import CONFIDENCE as PUMS_CONFIDENCE  # noqa: E402
from bench_smartnoise import (  # noqa: E402
    DEFAULT_SN_PYTHON,
    PUMS200,
    _smartnoise_sql,
    run_runner,
    smartnoise_epsilon,
)
from bench_workload import CONFIDENCE as WORKLOAD_CONFIDENCE  # noqa: E402
from bench_workload import W  # noqa: E402

#: δ at which every total is stated.
DELTA = 1e-6
LENGTHS = (10, 50, 200, 1000)
QUICK_LENGTHS = (10, 50)
#: Budgets large enough that nothing is refused for budget (pure ε; ρ).
PURE_BUDGET = 1e4
ZCDP_BUDGET = 1e6
#: The paper's workload as used here: data set, setting (its requirements), workload seed.
WORKLOAD = ("nettrace", "unbounded", 0)


# -- the PUMS session, extended to 1 000 statements -------------------------------------------
def _filters(rng: random.Random) -> dict[str, Callable[[], str]]:
    """One predicate per column, drawn afresh each call (SmartNoise parses all of them)."""

    def age() -> str:
        form = rng.randrange(3)
        if form == 0:
            lo = rng.randrange(0, 90)
            return f"age BETWEEN {lo} AND {min(100, lo + rng.choice((4, 9, 14, 19, 29)))}"
        return f"age >= {rng.randrange(18, 80)}" if form == 1 else f"age < {rng.randrange(20, 80)}"

    def income() -> str:
        cut = 5000 * rng.randrange(1, 40)
        form = rng.randrange(3)
        if form == 0:
            return f"income BETWEEN {cut} AND {cut + 5000 * rng.randrange(2, 12) - 1}"
        return f"income < {cut}" if form == 1 else f"income > {cut}"

    def educ() -> str:
        lo = rng.randrange(1, 15)
        form = rng.randrange(3)
        if form == 0:
            return f"educ BETWEEN {lo} AND {rng.randrange(lo + 1, 17)}"
        return f"educ >= {lo}" if form == 1 else f"educ < {lo + 1}"

    def race() -> str:
        races = sorted(rng.sample("123456", rng.randrange(1, 4)))
        return f"race = '{races[0]}'" if len(races) == 1 else "race IN (" + ", ".join(f"'{r}'" for r in races) + ")"

    def sex() -> str:
        return f"sex = '{rng.randrange(2)}'"

    def married() -> str:
        return rng.choice(("married", "NOT married", "married = TRUE", "married = FALSE"))

    return {"age": age, "income": income, "educ": educ, "race": race, "sex": sex, "married": married}


def _where(rng: random.Random, filters: dict[str, Callable[[], str]], k: int, avoid: Sequence[str] = ()) -> str:
    cols = rng.sample([c for c in filters if c not in avoid], k)
    return " AND ".join(filters[c]() for c in cols)


def _fresh_statement(rng: random.Random, filters: dict[str, Callable[[], str]]) -> tuple[str, float, str]:
    """One first-time statement, in ``PUMS200``'s mix of kinds (weights: its fresh statements)."""
    groups = ("sex", "race", "married", "educ")
    kind = rng.choices(
        ("count range", "count 2 cols", "count 3 cols", "filtered group by", "filtered group by 2", "group by",
         "sum where", "avg where", "sum where group by", "avg where group by"),
        weights=(27, 19, 6, 25, 2, 9, 11, 11, 11, 14))[0]
    if kind.startswith("count"):
        k = {"count range": 1, "count 2 cols": 2, "count 3 cols": 3}[kind]
        return f"SELECT COUNT(*) FROM pums WHERE {_where(rng, filters, k)}", rng.choice((10, 12, 15, 20)), kind
    if kind == "group by":
        cols = sorted(rng.sample(groups, rng.randrange(1, 3)), key=groups.index)
        g = ", ".join(cols)
        return f"SELECT {g}, COUNT(*) FROM pums GROUP BY {g}", rng.choice((10, 12, 15)), kind
    if kind.startswith("filtered group by"):
        cols = sorted(rng.sample(groups, 2 if kind.endswith("2") else 1), key=groups.index)
        g = ", ".join(cols)
        where = _where(rng, filters, rng.randrange(1, 3), avoid=cols)
        return f"SELECT {g}, COUNT(*) FROM pums WHERE {where} GROUP BY {g}", rng.choice((10, 12, 15)), kind
    agg = "SUM" if kind.startswith("sum") else "AVG"
    col = rng.choice(("age", "income", "income"))  # PUMS200: about 7 in 10 sums and averages are of income
    if agg == "AVG":
        acc: float = rng.choice((15, 20))
    else:
        acc = rng.choice((900, 1000, 1500)) if col == "age" else rng.choice((1_000_000, 1_500_000, 2_000_000))
    # An aggregate of income has 500 001 weights: dpgate's query grid (2²³ boxes) holds it beside
    # at most ~16 slabs of other columns, so its WHERE has one predicate and its groups are two.
    if kind.endswith("group by"):
        g = rng.choice(("sex", "married") if col == "income" else groups[:3])
        where = _where(rng, filters, 1, avoid=(g, col))
        return f"SELECT {g}, {agg}({col}) FROM pums WHERE {where} GROUP BY {g}", acc, kind
    where = _where(rng, filters, 1 if col == "income" else rng.randrange(1, 3), avoid=(col,))
    return f"SELECT {agg}({col}) FROM pums WHERE {where}", acc, kind


def pums1000(n: int = 1000, seed: int = 31) -> tuple[tuple[str, float, str], ...]:
    """``PUMS200`` then fresh statements in its mix, an exact repeat after every third (deterministic)."""
    out = list(PUMS200[:n])
    seen = {sql for sql, _, _ in out}
    rng = random.Random(seed)
    filters = _filters(rng)
    fresh = 0
    while len(out) < n:
        stmt = _fresh_statement(rng, filters)
        if stmt[0] in seen:  # only first-time statements here; repeats come below
            continue
        seen.add(stmt[0])
        out.append(stmt)
        fresh += 1
        if fresh % 3 == 0 and len(out) < n:
            sql, acc, _ = out[rng.randrange(len(out))]
            out.append((sql, acc, "repeat"))
    return tuple(out)


# -- one statement stream, as both systems see it ---------------------------------------------
@dataclass(frozen=True)
class Statement:
    """A statement of a stream: SQL, requirement, and what SmartNoise needs to account for it.

    ``sn_sql`` is SmartNoise's spelling (``None``: not expressible there, accounted only);
    ``laplace_epsilon`` the per-mechanism ε of SmartNoise's Laplace calibration; ``alpha``
    is 1 − confidence; ``truth`` (workload only) the exact answer.
    """

    sql: str
    accuracy: float
    confidence: float
    kind: str
    sn_sql: str | None
    laplace_epsilon: float
    truth: float | None = None

    @property
    def gaussian_scale(self) -> float:
        """σ per unit of sensitivity whose half-width at ``confidence`` is the accuracy.

        SmartNoise's Laplace calibration has half-width (Δ/ε)·ln(1/α); the Gaussian one
        z₁₋α/₂·σ: so σ/Δ = ln(1/α) / (z₁₋α/₂ · ε_Laplace).
        """
        alpha = 1 - self.confidence
        return math.log(1 / alpha) / (NormalDist().inv_cdf(1 - alpha / 2) * self.laplace_epsilon)


def pums_stream(n: int) -> list[Statement]:
    return [Statement(sql, acc, PUMS_CONFIDENCE, kind, _smartnoise_sql(sql), smartnoise_epsilon(sql, acc))
            for sql, acc, kind in pums1000(n)]


def workload_stream(n: int) -> tuple[list[Statement], Any]:
    """The workload's first ``n`` queries and its loaded data (frame, schema, histogram, table)."""
    dataset, setting, seed = WORKLOAD
    loaded = W.load_histogram(dataset)
    _, _, hist, table = loaded
    wl = W.generate(n=len(hist), queries=n, setting=setting, seed=seed)  # type: ignore[arg-type]
    out = []
    for q in wl.queries:
        eps = q.sensitivity * math.log(1 / (1 - q.confidence)) / q.accuracy
        out.append(Statement(q.sql(table), q.accuracy, q.confidence, f"weighted count S={q.sensitivity}", None, eps,
                             q.truth(hist)))
    return out, loaded


# -- dpgate -----------------------------------------------------------------------------------
def run_dpgate_apart(*args: Any, max_bytes: int) -> dict[str, Any]:
    """:func:`run_dpgate` in a fresh process capped at ``max_bytes`` of address space: one run's
    memory (dpgate's grows along the PUMS session) neither lingers into the next nor takes the machine."""
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(1, mp_context=ctx, initializer=_cap_memory, initargs=(max_bytes,)) as ex:
        return ex.submit(run_dpgate, *args).result()


def _cap_memory(max_bytes: int) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (max_bytes, resource.getrlimit(resource.RLIMIT_AS)[1]))


def zcdp_available() -> bool:
    import dpgate

    return "privacy" in inspect.signature(dpgate.Gateway).parameters


def run_dpgate(stream: str, statements: Sequence[Statement], mode: str, seed: int, lengths: Sequence[int],
               progress: bool = False) -> dict[str, Any]:
    """One seeded gateway in ``mode`` ("pure" | "zcdp") through the statements; totals at each length."""
    import dpgate
    from dpgate.datasets import load_pums

    warnings.simplefilter("ignore")  # seeded noise warns; expected in a benchmark
    df, schema = load_pums() if stream == "pums" else W.load_histogram(WORKLOAD[0])[:2]
    con = _truth_connection() if stream == "pums" else None
    opts: dict[str, Any] = {"budget": PURE_BUDGET} if mode == "pure" else {"budget": ZCDP_BUDGET, "privacy": "zcdp"}
    warm = dpgate.Gateway(df, schema, seed=seed, **opts)  # warm-up on a throwaway gateway (imports, JIT)
    warm.query(statements[0].sql, accuracy=statements[0].accuracy, confidence=statements[0].confidence)
    warm.close()
    gw = dpgate.Gateway(df, schema, seed=seed, **opts)
    checkpoints: dict[int, dict[str, float]] = {}
    rows: list[dict[str, Any]] = []
    t_start = time.perf_counter()
    stopped = None
    for i, st in enumerate(statements):
        before = gw.spent
        t0 = time.perf_counter()
        try:
            res = gw.query(st.sql, accuracy=st.accuracy, confidence=st.confidence)
        except MemoryError:  # the address-space cap of --max-gb: the stream stops here, reported
            stopped = {"statement": i + 1, "sql": st.sql, "error": "MemoryError",
                       "max_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6}
            break
        except dpgate.Error as e:
            rows.append({"seconds": time.perf_counter() - t0, "refused": f"{type(e).__name__}: {e}"[:300]})
        else:
            dt = time.perf_counter() - t0
            if st.truth is not None:
                truths = [st.truth]
            else:
                truths = _truths(con, st.sql.replace("FROM PUMS.PUMS", "FROM pums"), res.answers)
            rows.append({"seconds": dt, "spent": gw.spent - before, "answers": len(res.answers),
                         "covered": sum(a.low <= t <= a.high for a, t in zip(res.answers, truths, strict=True)),
                         "free": sum(a.source == "history" for a in res.answers)})
        if progress:
            print(f"  {stream} {mode} #{i + 1}: {rows[-1]['seconds']:.2f} s, "
                  f"max RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6:.2f} GB  {st.sql[:90]}",
                  file=sys.stderr, flush=True)
        if i + 1 in lengths:
            point = {"spent": float(gw.spent), "seconds": time.perf_counter() - t_start}
            point["epsilon_at_delta"] = point["spent"] if mode == "pure" else float(gw.spent_as(delta=DELTA))
            done = [r for r in rows if "refused" not in r]
            point["answers"] = sum(r["answers"] for r in done)
            point["covered"] = sum(r["covered"] for r in done)
            point["refused"] = len(rows) - len(done)
            checkpoints[i + 1] = point
    gw.close()
    return {"mode": mode, "checkpoints": checkpoints, "statements": rows, "stopped": stopped,
            "max_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6}


# -- SmartNoise ---------------------------------------------------------------------------------
def run_smartnoise(python: str, statements: Sequence[Statement], mechanism: str, delta: float,
                   lengths: Sequence[int], mechanisms_per_statement: Sequence[int] | None = None) -> dict[str, Any]:
    """SmartNoise's odometer over the statements (see the module docstring); totals at ``lengths``.

    ``mechanism="laplace"``: its default mechanism, odometer slack ``delta``; SQL executed
    where SmartNoise can express it.  ``mechanism="gaussian"``: per-mechanism δ and slack
    both ``delta``; accounted only, ``mechanisms_per_statement`` (from the Laplace run) each.
    """
    def request(csv: str) -> dict[str, Any]:
        req: dict[str, Any] = {"csv": csv, "delta": delta if mechanism == "gaussian" else 0.0,
                               "mechanism": mechanism, "odometer_tol": delta, "checkpoints": list(lengths),
                               "statements": []}
        for i, st in enumerate(statements):
            item: dict[str, Any] = {"sql": None if mechanism == "gaussian" else st.sn_sql}
            if mechanism == "gaussian":
                item["gaussian_scale"] = st.gaussian_scale
            else:
                item["epsilon"] = st.laplace_epsilon
            if item["sql"] is None:
                item["mechanisms"] = 1 if mechanisms_per_statement is None else mechanisms_per_statement[i]
            req["statements"].append(item)
        return req

    return run_runner(python, request)


def smartnoise_columns(python: str, statements: Sequence[Statement], lengths: Sequence[int]) -> dict[str, Any]:
    """Laplace (one run, all lengths) and Gaussian (one run per length, δᵢ = 10⁻⁶/(M + 1))."""
    lap = run_smartnoise(python, statements, "laplace", DELTA, lengths)
    mechs = [s.get("mechanisms", 0) for s in lap["statements"]]  # a refused statement spends nothing
    refused = [{"index": i + 1, "sql": statements[i].sql, "error": s["error"]}
               for i, s in enumerate(lap["statements"]) if "error" in s]
    gauss: dict[int, Any] = {}
    for n in lengths:
        m = sum(mechs[:n])
        g = run_smartnoise(python, statements[:n], "gaussian", DELTA / (m + 1), [n], mechs[:n])
        gauss[n] = {"mechanisms": m, "per_mechanism_delta": DELTA / (m + 1), **g["checkpoints"][str(n)],
                    "calibration": g.get("calibration")}
    return {"laplace": {n: {"mechanisms": sum(mechs[:n]), **lap["checkpoints"][str(n)]} for n in lengths},
            "gaussian": gauss, "refused": refused,
            "versions": (lap.get("snsql_version"), lap.get("opendp_version"))}


def coverage(per_seed: Sequence[tuple[int, int]], confidence: float) -> dict[str, Any]:
    """Pooled share of intervals holding the truth over seeds, and its check against
    ``confidence − 3 SE`` (SE the larger of the binomial one at the nominal confidence and the
    between-seed one: answers of one session share history noise), as ``bench_workload`` does."""
    covered, answers = sum(c for c, _ in per_seed), sum(n for _, n in per_seed)
    pooled = covered / answers if answers else math.nan
    se = math.sqrt(confidence * (1 - confidence) / answers) if answers else math.nan
    shares = [c / n for c, n in per_seed if n]
    if len(shares) > 1:
        mean = sum(shares) / len(shares)
        sd = math.sqrt(sum((x - mean) ** 2 for x in shares) / (len(shares) - 1))
        se = max(se, sd / math.sqrt(len(shares)))
    return {"seeds": len(per_seed), "covered": covered, "answers": answers, "coverage": pooled, "se": se,
            "per_seed": [list(x) for x in per_seed], "ok": bool(answers == 0 or pooled >= confidence - 3 * se)}


# -- report -----------------------------------------------------------------------------------
def _fmt(x: float | None, digits: int = 2) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def gaussian_share(confidence: float) -> float:
    """``c``: the ρ of one Gaussian release over the ε² of the Laplace one with the same half-width at
    ``confidence`` — the Laplace half-width is ``(S/ε)·ln(1/β)``, the Gaussian one ``z·σ`` with
    ``ρ = S²/(2σ²)``, so ``ρ = c·ε²`` with ``c = z²/(2 ln²(1/β))`` (β = 1 − confidence)."""
    beta = 1.0 - confidence
    z = NormalDist().inv_cdf(1.0 - beta / 2.0)
    return z * z / (2.0 * math.log(1.0 / beta) ** 2)


def equal_releases(epsilon_pure: float, rho: float, confidence: float, delta: float) -> tuple[float, float]:
    """``(k, k for ⅕)``: how many equally accurate releases on the most-charged cell would give both
    modes' charges (``k = c·ε²/ρ``: pure ε = k·ε₁, ρ = k·c·ε₁²), and how many releases of that ε₁
    would bring the zCDP / pure ratio to ⅕ under the tight conversion.  Unequal releases give a
    larger ρ for the same pure sum (Cauchy–Schwarz), so equal ones are zCDP's best case: a stream
    whose most-charged cell holds fewer than "k for ⅕" releases cannot reach ⅕ with Gaussian noise."""
    from dpgate.plan.zcdp import epsilon_of

    c = gaussian_share(confidence)
    k = c * epsilon_pure * epsilon_pure / rho
    e1 = epsilon_pure / k
    fifth = k
    while epsilon_of(fifth * c * e1 * e1, delta) / (fifth * e1) > 0.2 and fifth < 1e7:
        fifth *= 1.01
    return k, fifth


def table(results: dict[str, Any]) -> str:
    lines = ["| stream | statements | ε pure | ε zCDP at δ=1e-6 (ρ) | zCDP / pure | equivalent releases k "
             "(k for ⅕) | ε SmartNoise Laplace "
             "(basic sum) | ε SmartNoise Gaussian | coverage pure / zCDP (nominal) | s pure / zCDP |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for stream, r in results.items():
        for n in r["lengths"]:
            key = str(n)
            p = r["dpgate"]["pure"]["checkpoints"].get(key)
            z = r["dpgate"].get("zcdp", {}).get("checkpoints", {}).get(key)
            if p is None:
                lines.append(f"| {stream} | {n} | not reached (stopped: {r['dpgate']['pure']['stopped']}) |"
                             + " |" * 7)
                continue
            sn = r.get("smartnoise")
            lap = sn["laplace"][key] if sn else None
            gau = sn["gaussian"][key] if sn else None
            ratio = z["epsilon_at_delta"] / p["epsilon_at_delta"] if z and p["epsilon_at_delta"] > 0 else None
            zcell = f"{z['epsilon_at_delta']:.2f} ({z['spent']:.3f})" if z else "n/a (no zCDP in this dpgate)"
            lcell = f"{lap['odometer_epsilon']:.2f} ({lap['basic_epsilon']:.2f})" if lap else "n/a"
            gcell = f"{gau['odometer_epsilon']:.2f}" if gau else "n/a"
            kcell = "n/a"
            if z and z["spent"] > 0 and p["epsilon_at_delta"] > 0:
                k, fifth = equal_releases(p["epsilon_at_delta"], z["spent"], r["confidence"], DELTA)
                kcell = f"{k:.0f} ({fifth:.0f})"
            cells = []
            for point in (p, z):
                c = point.get("coverage") if point else None
                cells.append("n/a" if c is None else
                             f"{c['coverage']:.3f} ± {c['se']:.3f}{'' if c['ok'] else ' **LOW**'}")
            cov = " / ".join(cells) + f" ({r['confidence']}; {p.get('coverage', {}).get('seeds', 1)} seed(s))"
            secs = f"{p['seconds']:.0f} / " + (f"{z['seconds']:.0f}" if z else "n/a")
            lines.append(f"| {stream} | {n} | {p['epsilon_at_delta']:.2f} | {zcell} | {_fmt(ratio, 3)} | {kcell} | {lcell} | "
                         f"{gcell} | {cov} | {secs} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="lengths 10 and 50 only")
    ap.add_argument("--lengths", default=None, help="comma-separated lengths (default 10,50,200,1000)")
    ap.add_argument("--pums-lengths", default=None,
                    help="lengths for the PUMS stream only (default: --lengths); its dpgate side is the slow one")
    ap.add_argument("--max-gb", type=float, default=10.0,
                    help="address-space cap of this process in GB (10): a stream that hits it stops, reported")
    ap.add_argument("--streams", default="pums,workload")
    ap.add_argument("--seed", type=int, default=1, help="dpgate's noise seed (1)")
    ap.add_argument("--coverage-seeds", type=int, default=5,
                    help="seeds pooled for the workload's interval check (5; PUMS: --seed only, it is slow)")
    ap.add_argument("--progress", action="store_true", help="each dpgate statement's time and peak memory to stderr")
    ap.add_argument("--smartnoise-python", default=os.environ.get("SMARTNOISE_PYTHON", DEFAULT_SN_PYTHON),
                    help=f"interpreter of SmartNoise's virtualenv ({DEFAULT_SN_PYTHON}); missing: no SmartNoise column")
    args = ap.parse_args(argv)
    lengths = tuple(int(x) for x in args.lengths.split(",")) if args.lengths else (
        QUICK_LENGTHS if args.quick else LENGTHS)
    pums_lengths = tuple(int(x) for x in args.pums_lengths.split(",")) if args.pums_lengths else lengths
    cap = int(args.max_gb * 2**30)
    has_sn = os.path.exists(args.smartnoise_python)
    if not has_sn:
        print(f"SmartNoise's interpreter {args.smartnoise_python} is missing: no SmartNoise columns "
              "(see bench_smartnoise.py to create its virtualenv).")
    modes = ("pure", "zcdp") if zcdp_available() else ("pure",)
    if "zcdp" not in modes:
        print("This dpgate has no privacy='zcdp' (issue 31 not merged): the zCDP column is left empty.")
    t0 = time.perf_counter()
    results: dict[str, Any] = {}
    versions = None
    for stream in args.streams.split(","):
        stream_lengths = pums_lengths if stream == "pums" else lengths
        n = max(stream_lengths)
        if stream == "pums":
            statements, confidence = pums_stream(n), PUMS_CONFIDENCE
        elif stream == "workload":
            statements, confidence = workload_stream(n)[0], WORKLOAD_CONFIDENCE
        else:
            ap.error(f"unknown stream {stream!r} (pums, workload)")
        r: dict[str, Any] = {"lengths": list(stream_lengths), "confidence": confidence, "dpgate": {},
                             "statements": [{"sql": s.sql, "accuracy": s.accuracy, "kind": s.kind} for s in statements]}
        for mode in modes:
            run = run_dpgate_apart(stream, statements, mode, args.seed, stream_lengths, args.progress, max_bytes=cap)
            # more seeds for the interval check only: ε and every decision are the same for any seed
            extra = [run_dpgate_apart(stream, statements, mode, args.seed + k, stream_lengths,
                                      max_bytes=cap)["checkpoints"]
                     for k in range(1, (args.coverage_seeds if stream == "workload" else 1))]
            for length, point in run["checkpoints"].items():
                seeds = [(point["covered"], point["answers"])]
                seeds += [(e[length]["covered"], e[length]["answers"]) for e in extra if length in e]
                point["coverage"] = coverage(seeds, confidence)
            run["checkpoints"] = {str(k): v for k, v in run["checkpoints"].items()}
            r["dpgate"][mode] = run
            reached = max(int(k) for k in run["checkpoints"]) if run["checkpoints"] else 0
            last = run["checkpoints"].get(str(reached), {"epsilon_at_delta": math.nan})
            stop = f"; STOPPED at #{run['stopped']['statement']}: MemoryError" if run["stopped"] else ""
            print(f"{stream} {mode}: ε at δ=1e-6 {last['epsilon_at_delta']:.3f} after {reached} statements, "
                  f"max RSS {run['max_rss_gb']:.1f} GB{stop} ({time.perf_counter() - t0:.0f} s)", flush=True)
        if has_sn:
            r["smartnoise"] = smartnoise_columns(args.smartnoise_python, statements, stream_lengths)
            versions = r["smartnoise"]["versions"]
            print(f"{stream} SmartNoise: Laplace {r['smartnoise']['laplace'][n]['odometer_epsilon']:.3f}, Gaussian "
                  f"{r['smartnoise']['gaussian'][n]['odometer_epsilon']:.3f} ({time.perf_counter() - t0:.0f} s)",
                  flush=True)
            r["smartnoise"]["laplace"] = {str(k): v for k, v in r["smartnoise"]["laplace"].items()}
            r["smartnoise"]["gaussian"] = {str(k): v for k, v in r["smartnoise"]["gaussian"].items()}
        results[stream] = r
    wall = time.perf_counter() - t0
    text = table(results)
    print()
    print(text)
    machine = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
               "loadavg_at_end": os.getloadavg(), "wall_seconds": wall, "smartnoise_python": args.smartnoise_python,
               "smartnoise_sql_and_opendp_versions": versions}
    os.makedirs(RESULTS, exist_ok=True)
    suffix = "_quick" if args.quick else ""
    with open(os.path.join(RESULTS, f"composition{suffix}.json"), "w", encoding="utf-8") as f:
        json.dump({"machine": machine, "delta": DELTA, "seed": args.seed, "lengths": list(lengths),
                   "pums_lengths": list(pums_lengths), "max_gb": args.max_gb,
                   "modes": list(modes), "workload": WORKLOAD, "streams": results}, f, indent=1)
    with open(os.path.join(RESULTS, f"composition{suffix}.md"), "w", encoding="utf-8") as f:
        f.write(f"Total ε at δ = 1e-6 against the number of statements (seed {args.seed}, {wall:.0f} s wall, load "
                f"average at the end {machine['loadavg_at_end'][0]:.2f}).\n\n{text}\n")
    print(f"\n{wall:.0f} s wall")
    return 0


if __name__ == "__main__":
    sys.exit(main())

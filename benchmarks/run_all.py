"""Run every ``benchmarks/bench_*.py`` and regenerate ``benchmarks/RESULTS.md``.

Each benchmark runs in its own interpreter (``sys.executable``) and imports the
installed dpgate (``make bench`` uses the ``.venv`` that ``make`` creates, where this
checkout is installed in editable mode with the ``demo`` extra); its output is
kept in ``benchmarks/results/<name>.log``.  ``RESULTS.md`` gets the machine
description, then one section per benchmark: the Markdown the benchmark wrote
to ``results/<name>.md`` during this run when it writes one (with its plots),
otherwise the tail of its output.  A benchmark that fails is reported as such;
the others still run.

Usage::

    python benchmarks/run_all.py [--quick] [--only workload,decision] [--skip noise]
    python benchmarks/run_all.py --render     # rebuild RESULTS.md from the last run (e.g. after editing NOTES.md)

``--quick`` passes ``--quick`` to the benchmarks that accept it and sets
``DPGATE_BENCH_QUICK=1`` (smoke run; the numbers are then not the reported ones).
"""

from __future__ import annotations

import argparse
import datetime as dt
import glob
import json
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results")
#: Run in this order (the rest alphabetically after): fast ones first.
ORDER = ("compile", "cube", "noise", "inference", "decision", "workload")
TITLES = {
    "workload": "Xiao & Xiong (2012), §6.4: the online workload, three systems side by side",
    "decision": "Decision latency",
    "noise": "Noise and ledger",
    "inference": "Inference",
    "compile": "Compiler",
    "cube": "Cube",
    "model": "Model-based estimates and their fit time (Chen, Zhou & Bhowmick, EDBT 2016)",
    "warmstart": "Warm-start releases and ISPE's MMSE estimator (Xiao, Xiong & Yuan, 2011)",
}


def machine() -> list[str]:
    cpu = "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        cpu = platform.processor() or "unknown"
    mem = ""
    try:
        with open("/proc/meminfo") as f:
            kb = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
            mem = f", {kb / 2**20:.1f} GiB RAM"
    except (OSError, StopIteration, ValueError):
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    versions = []
    for mod in ("numpy", "scipy", "duckdb", "sqlglot", "opendp"):
        try:
            versions.append(f"{mod} {__import__(mod).__version__}")
        except Exception:  # noqa: BLE001 - informational only
            pass
    commit = "unknown"
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=HERE, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        marker = os.path.join(os.path.dirname(HERE), "COMMIT")  # an exported snapshot (git archive)
        if os.path.exists(marker):
            with open(marker) as f:
                commit = f.read().strip()[:7] + " (exported snapshot)"
    try:
        load = "load average {:.1f} / {:.1f} / {:.1f} (1/5/15 min) at the end of the run".format(*os.getloadavg())
    except OSError:
        load = "load average unknown"
    return [
        f"- Code: commit {commit}",
        f"- Platform: {platform.platform()}",
        f"- CPU: {cpu}; {os.cpu_count()} logical cores ({usable} usable){mem}",
        f"- Python {platform.python_version()}; {', '.join(versions)}",
        f"- Date: {dt.datetime.now(dt.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}; {load}",
    ]


def discover() -> list[str]:
    names = [os.path.basename(p)[len("bench_"):-3] for p in glob.glob(os.path.join(HERE, "bench_*.py"))]
    return sorted(names, key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))


def run_one(name: str, quick: bool) -> dict[str, object]:
    path = os.path.join(HERE, f"bench_{name}.py")
    with open(path) as f:
        accepts_quick = "--quick" in f.read()
    cmd = [sys.executable, path] + (["--quick"] if quick and accepts_quick else [])
    env = dict(os.environ)
    if quick:
        env["DPGATE_BENCH_QUICK"] = "1"
    print(f"== {name}: {' '.join(cmd[1:])}", flush=True)
    t0 = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=os.path.dirname(HERE))
    seconds = time.time() - t0
    with open(os.path.join(RESULTS, f"{name}.log"), "w") as f:
        f.write(proc.stdout + ("\n--- stderr ---\n" + proc.stderr if proc.stderr else ""))
    print(f"   exit {proc.returncode} after {seconds:.0f} s", flush=True)
    return {"name": name, "rc": proc.returncode, "seconds": seconds, "start": t0,
            "stdout": proc.stdout, "stderr": proc.stderr}


def section(r: dict[str, object]) -> list[str]:
    name = str(r["name"])
    lines = [f"## {TITLES.get(name, name)} (`bench_{name}.py`)", ""]
    status = "ok" if r["rc"] == 0 else f"**exit status {r['rc']}**"
    lines += [f"Run time {float(r['seconds']) / 60:.1f} min, {status}.  Raw output: `results/{name}.log`.", ""]
    md = os.path.join(RESULTS, f"{name}.md")
    if os.path.exists(md) and os.path.getmtime(md) >= float(r["start"]) - 1:
        with open(md) as f:
            lines += [f.read().rstrip(), ""]
    else:
        tail = str(r["stdout"]).rstrip().splitlines()[-60:]
        lines += ["```", *tail, "```", ""]
    pngs = sorted(p for p in glob.glob(os.path.join(RESULTS, f"{name}*.png"))
                  if os.path.getmtime(p) >= float(r["start"]) - 1)
    text = "\n".join(lines)
    for p in pngs:
        rel = os.path.relpath(p, HERE)
        if rel not in text:
            lines += [f"![{os.path.basename(p)}]({rel})", ""]
    if r["rc"] != 0:
        err = str(r["stderr"]).rstrip().splitlines()[-15:]
        lines += ["Last lines of stderr:", "", "```", *err, "```", ""]
    return lines


def installed_dpgate() -> str | None:
    """Why the benchmarks cannot run with ``sys.executable``, or None: they need dpgate
    installed from this checkout (``pip install -e '.[demo]'``), not another copy."""
    code = "import dpgate, os; print(os.path.dirname(os.path.dirname(os.path.abspath(dpgate.__file__))))"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=HERE)
    if proc.returncode != 0:
        return f"{sys.executable} cannot import dpgate; install this checkout: pip install -e '.[demo]'."
    found = proc.stdout.strip()
    if os.path.realpath(found) != os.path.realpath(os.path.dirname(HERE)):
        return (f"{sys.executable} imports dpgate from {found}, not from this checkout "
                f"{os.path.dirname(HERE)}; install it: pip install -e '.[demo]'.")
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", default="")
    p.add_argument("--skip", default="")
    p.add_argument("--render", action="store_true", help="Only rebuild RESULTS.md from the saved state file(s).")
    p.add_argument("--state", default=os.path.join(RESULTS, "run_all.json"),
                   help="Where the run's state is saved; with --render, a comma-separated list to merge "
                        "(e.g. the long benchmark run separately with --only).")
    p.add_argument("--output", default=os.path.join(HERE, "RESULTS.md"))
    a = p.parse_args(argv)
    os.makedirs(RESULTS, exist_ok=True)
    state = a.state
    if a.render:
        by_name: dict[str, dict[str, object]] = {}
        host = []
        for path in state.split(","):
            with open(path) as f:
                saved = json.load(f)
            by_name.update((r["name"], r) for r in saved["runs"])  # a later state file replaces a re-run benchmark
            a.quick = a.quick or saved["quick"]
            host = host or saved["machine"]
        runs = list(by_name.values())
        order = discover()
        runs.sort(key=lambda r: order.index(r["name"]) if r["name"] in order else len(order))
    else:
        problem = installed_dpgate()
        if problem:
            print(f"run_all: {problem}", file=sys.stderr)
            return 2
        names = discover()
        if a.only:
            names = [n for n in names if n in a.only.split(",")]
        names = [n for n in names if n not in a.skip.split(",")]
        runs = [run_one(n, a.quick) for n in names]
        host = machine()
        with open(state, "w") as f:
            json.dump({"runs": runs, "quick": a.quick, "machine": host}, f)
    out = [
        "# Benchmark results",
        "",
        "Regenerated by `make bench` (`python benchmarks/run_all.py`); every number below comes from the run "
        "recorded here." + (" **Quick smoke run: reduced sizes, not the reported numbers.**" if a.quick else ""),
        "",
        "## Machine",
        "",
        *host,
        "",
    ]
    keep = os.path.join(HERE, "NOTES.md")
    if os.path.exists(keep):
        with open(keep) as f:
            out += [f.read().rstrip(), ""]
    for r in runs:
        out += section(r)
    with open(a.output, "w") as f:
        f.write("\n".join(out).rstrip() + "\n")
    print(f"wrote {a.output}")
    return 0 if all(r["rc"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())

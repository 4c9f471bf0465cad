"""``dpgate --version`` and ``dpgate --help``: wall time of a fresh process (issue 32: under 0.5 s).

Each command runs ``--runs`` times (default 10) as a subprocess of this interpreter
(``python -m dpgate.cli …``, and the ``dpgate`` console script beside the interpreter when there is
one), after one untimed warm-up run that fills the OS file cache; the median, minimum and maximum are
reported beside the interpreter's own start-up (``python -c pass``).  Then ``python -X importtime``
shows the modules that cost the most (cumulative, microseconds) — where to look if the time grows.
Writes ``results/cli_startup.json`` and ``results/cli_startup.md``.

Usage::

    python benchmarks/bench_cli_startup.py [--runs N] [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
TARGET_S = 0.5
TOP = 12


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _wall(argv: list[str], runs: int) -> dict[str, float]:
    """Median, min and max wall time (s) of ``runs`` runs of ``argv``, after one untimed warm-up."""
    subprocess.run(argv, capture_output=True, check=True, timeout=60)
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=True, timeout=60)
        times.append(time.perf_counter() - started)
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times)}


def _import_times(args: list[str]) -> list[dict[str, object]]:
    """The :data:`TOP` imports with the largest cumulative time under ``python -X importtime``."""
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "dpgate.cli", *args], capture_output=True,
                         text=True, check=True, timeout=60)
    rows = []
    for line in out.stderr.splitlines():
        if not line.startswith("import time:") or "self [us]" in line:
            continue
        self_us, cumulative_us, name = (part.strip() for part in line.removeprefix("import time:").split("|"))
        rows.append({"module": name, "self_us": int(self_us), "cumulative_us": int(cumulative_us)})
    return sorted(rows, key=lambda r: -int(str(r["cumulative_us"])))[:TOP]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="3 runs per command")
    ns = parser.parse_args()
    runs = 3 if ns.quick else ns.runs
    commands = {"python -c pass": [sys.executable, "-c", "pass"]}
    script = Path(sys.executable).with_name("dpgate")
    for flag in ("--version", "--help"):
        commands[f"python -m dpgate.cli {flag}"] = [sys.executable, "-m", "dpgate.cli", flag]
        if script.is_file():
            commands[f"dpgate {flag}"] = [str(script), flag]
    timings = {name: _wall(argv, runs) for name, argv in commands.items()}
    imports = {flag: _import_times([flag]) for flag in ("--version", "--help")}
    dpgate_times = [t["median_s"] for name, t in timings.items() if "dpgate" in name]
    result = {
        "machine": {"platform": platform.platform(), "cpu": _cpu_model(), "cpus": os.cpu_count(),
                    "python": platform.python_version(), "load_avg_1m": os.getloadavg()[0]},
        "runs": runs, "target_s": TARGET_S, "within_target": max(dpgate_times) < TARGET_S,
        "timings": timings, "import_time_top": imports,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "cli_startup.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"Median of {runs} runs (after one warm-up); target < {TARGET_S} s: "
             f"{'met' if result['within_target'] else 'NOT met'}.  Machine: {result['machine']['cpu']}, "
             f"{result['machine']['cpus']} CPUs, Python {result['machine']['python']}, "
             f"load average {result['machine']['load_avg_1m']:.1f}.", "",
             "| command | median (s) | min (s) | max (s) |", "|---|---|---|---|"]
    lines += [f"| `{name}` | {t['median_s']:.3f} | {t['min_s']:.3f} | {t['max_s']:.3f} |" for name, t in timings.items()]
    for flag, rows in imports.items():
        lines += ["", f"`python -X importtime -m dpgate.cli {flag}`, largest cumulative:", "",
                  "| module | cumulative (ms) | self (ms) |", "|---|---|---|"]
        lines += [f"| `{r['module'].strip()}` | {int(str(r['cumulative_us'])) / 1000:.1f} | "
                  f"{int(str(r['self_us'])) / 1000:.1f} |" for r in rows]
    (RESULTS / "cli_startup.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""The ``dpgate`` command line: ``demo``, ``query`` and ``history``.

Errors print one line (``dpgate: error: …``) and exit non-zero; ``--debug``
(anywhere on the command line) shows the traceback instead.  Exit codes: 1 for
errors dpgate raises (refused query, budget exhausted, bad schema …), 2 for
bad command-line usage, 3 for missing files and other I/O errors.

``dpgate demo`` runs seed 001's online workload (§6.4, see
:mod:`dpgate.workload`) on the embedded NETTRACE (or SEARCHLOGS) data through
three systems — the no-reuse baseline (a fresh answer at Theorem 5.3's α every
time), policy ``"paper"`` and dpgate's default ``"minimal"`` — each a fresh
:class:`~dpgate.Gateway`.  **The demo fixes the noise seed so its numbers are
reproducible; seeded noise is insecure and for demonstrations only.**
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from collections.abc import Sequence
from typing import Any

import click

__all__ = ["main", "cli", "format_table", "plot"]

#: Default number of demo queries per setting, measured to finish well under 2 minutes
#: on 2 cores (Xeon, 2 vCPU: bounded 1000 queries ≈ 50 s; unbounded 300 ≈ 50 s, the
#: tree's releases and a history that keeps growing make its queries slower).
DEFAULT_DEMO_QUERIES = {"bounded": 1000, "unbounded": 300}

EXIT_ERROR, EXIT_USAGE, EXIT_IO = 1, 2, 3


def format_table(run: dict[str, Any]) -> str:
    """The side-by-side table of one run (one column per system)."""
    systems = list(run["systems"])
    rows = [
        ("answering ratio Ra", "Ra", "{:.3f}"),
        ("system cost ᾱ", "alpha_bar", "{:.3f}"),
        ("coverage Ri", "Ri", "{:.3f}"),
        ("relative error E", "E", "{:.4f}"),
        ("answered free", "free", "{:.1%}"),
        ("median decision ms", "median_seconds", "ms"),
    ]
    width = max(12, *(len(s) + 2 for s in systems))
    head = f"{'':<22}" + "".join(f"{s:>{width}}" for s in systems)
    lines = [head, "-" * len(head)]
    for name, key, fmt in rows:
        cells = []
        for s in systems:
            v = run["systems"][s]["summary"][key]
            if isinstance(v, float) and math.isnan(v):
                cells.append("–")
            elif fmt == "ms":
                cells.append(f"{1000 * v:.1f}")
            else:
                cells.append(fmt.format(v))
        lines.append(f"{name:<22}" + "".join(f"{c:>{width}}" for c in cells))
    return "\n".join(lines)


def plot(runs: Sequence[dict[str, Any]], path: str, title: str = "") -> str:
    """PNG of ᾱ and cumulative answered queries vs query index, one line per system.

    With several runs (seeds) of the same systems, plots the mean with a min–max band.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4), constrained_layout=True)
    for label in runs[0]["systems"]:
        cost = np.array([[r["spent"] for r in run["systems"][label]["records"]] for run in runs])
        answered = np.array(
            [np.cumsum([r["source"] in ("history", "fresh", "exact") and r["meets_requirement"]
                        for r in run["systems"][label]["records"]]) for run in runs]
        )
        x = np.arange(1, cost.shape[1] + 1)
        for ax, y in ((ax1, cost), (ax2, answered)):
            (line,) = ax.plot(x, y.mean(axis=0), label=label)
            if len(runs) > 1:
                ax.fill_between(x, y.min(axis=0), y.max(axis=0), color=line.get_color(), alpha=0.2)
    ax1.set(xlabel="query index", ylabel="system cost ᾱ", title="privacy cost")
    ax2.set(xlabel="query index", ylabel="queries answered", title="answered within requirement")
    ax1.legend()
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# -- the commands ----------------------------------------------------------------------
@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--debug", is_flag=True, help="Show full tracebacks on errors.")
@click.version_option(package_name="dpgate", prog_name="dpgate")
def cli(debug: bool) -> None:
    """dpgate: differentially private answers to counting queries, free when history knows them."""


@cli.command()
@click.option("--dataset", type=click.Choice(["nettrace", "searchlogs"]), default="nettrace", show_default=True)
@click.option("--setting", type=click.Choice(["bounded", "unbounded"]), default="bounded", show_default=True,
              help="bounded: total budget 1, 2ε~U[1,1000]; unbounded: hierarchical tree first, 2ε~U[50,1000].")
@click.option("--queries", type=click.IntRange(min=1), default=None,
              help="Number of queries [default: 1000 bounded, 300 unbounded].")
@click.option("--seed", type=int, default=0, show_default=True, help="Workload and (insecure) noise seed.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="dpgate-demo", show_default=True)
@click.option("--progress/--no-progress", default=None, help="Progress bar on stderr [default: when it is a terminal].")
def demo(dataset: str, setting: str, queries: int | None, seed: int, out_dir: str, progress: bool | None) -> None:
    """Run seed 001's online workload through three systems on embedded data.

    Compares the no-reuse baseline, the paper's policy and dpgate's default
    ("minimal") on answering ratio Ra, system cost ᾱ, coverage Ri, relative
    error E, share answered free and decision time, and writes a PNG.
    The noise is seeded so the demo is reproducible: insecure, demo only.
    """
    queries = queries or DEFAULT_DEMO_QUERIES[setting]
    os.makedirs(out_dir, exist_ok=True)
    click.echo(
        f"dpgate demo: {queries} queries of seed 001's workload on {dataset.upper()} ({setting} setting, "
        f"δ = 0.2, seed {seed}).\nNoise is seeded for reproducibility — insecure, for this demo only."
    )
    if progress is None:
        progress = sys.stderr.isatty()
    from dpgate.workload import run_systems

    t0, c0 = time.perf_counter(), time.process_time()
    run = run_systems(dataset, setting, queries, seed, progress=progress)
    elapsed, cpu = time.perf_counter() - t0, time.process_time() - c0
    click.echo("")
    click.echo(format_table(run))
    base = os.path.join(out_dir, f"demo_{dataset}_{setting}")
    png = plot([run], base + ".png", title=f"{dataset.upper()}, {setting}, {queries} queries, seed {seed}")
    with open(base + ".json", "w") as f:
        json.dump({k: v for k, v in run.items()}, f, indent=1, default=float)
    click.echo("")
    if setting == "unbounded":
        click.echo("ᾱ includes the hierarchical tree released first (ε = 0.3) in every system.")
    click.echo(f"Finished in {elapsed:.0f} s ({cpu:.0f} s CPU) on {platform.system()} with {os.cpu_count()} CPUs.")
    click.echo(f"Plot: {os.path.abspath(png)}")
    click.echo(f"Per-query records: {os.path.abspath(base + '.json')}")


def _open_data(data: str, schema: Any) -> Any:
    """A DuckDB file path as is; a CSV/Parquet file as a view named like the schema's one table."""
    import duckdb

    if not os.path.exists(data):
        raise FileNotFoundError(f"no data file at {data!r}.")
    lower = data.lower()
    if lower.endswith((".duckdb", ".db", ".ddb")):
        return data
    readers = {".csv": "read_csv", ".tsv": "read_csv", ".parquet": "read_parquet", ".pq": "read_parquet"}
    ext = os.path.splitext(lower)[1]
    if ext not in readers:
        raise click.UsageError(f"--data must be a .duckdb, .csv or .parquet file, got {data!r}.")
    if len(schema.tables) != 1:
        raise click.UsageError(
            f"a {ext} file holds one table but the schema declares {len(schema.tables)}; "
            "use a DuckDB file for several tables."
        )
    con = duckdb.connect()
    getattr(con, readers[ext])(data).create_view(schema.tables[0].name)
    return con


@cli.command()
@click.option("--schema", "schema_path", required=True, type=click.Path(exists=True, dir_okay=False),
              help="Schema YAML (public domains).")
@click.option("--data", required=True, help="A .duckdb, .csv or .parquet file.")
@click.option("--budget", type=float, required=True, help="Total privacy budget ε (fixed when the ledger is created).")
@click.option("--ledger", default=None, help="Durable ledger file (SQLite); omitted: in memory, forgotten on exit.")
@click.option("--accuracy", type=float, default=None, help="Half-width ε of the requested interval.")
@click.option("--confidence", type=float, default=None, help="1−δ (default 0.95).")
@click.option("--policy", type=click.Choice(["minimal", "paper", "no_reuse"]), default="minimal", show_default=True)
@click.option("--allow-partial", is_flag=True, help="Return history's best estimate instead of refusing.")
@click.argument("sql")
def query(schema_path: str, data: str, budget: float, ledger: str | None, accuracy: float | None,
          confidence: float | None, policy: str, allow_partial: bool, sql: str) -> None:
    """Answer one SQL counting query within ±ACCURACY and print the released table."""
    import pandas as pd

    from dpgate.gateway import Gateway
    from dpgate.schema import Schema

    schema = Schema.load(schema_path)
    source = _open_data(data, schema)
    with Gateway(source, schema, budget=budget, ledger=ledger, policy=policy) as gw:
        res = gw.query(sql, accuracy=accuracy, confidence=confidence, allow_partial=allow_partial)
        with pd.option_context("display.max_rows", 200, "display.max_columns", 50, "display.width", 200):
            click.echo(res.to_pandas().to_string(index=False))
        cost = res.epsilon_spent
        click.echo(f"\nε charged: {cost:.6g}   spent: {gw.spent:.6g} of {gw.budget:g}   remaining: {gw.remaining:.6g}")
    if hasattr(source, "close"):
        source.close()


@cli.command()
@click.option("--ledger", required=True, help="The ledger file.")
@click.option("--limit", type=int, default=None, help="Show only the last N releases.")
def history(ledger: str, limit: int | None) -> None:
    """Print every release recorded in a ledger (what was released, not the data)."""
    import sqlite3

    import pandas as pd

    from dpgate.errors import LedgerError
    from dpgate.ledger import Ledger

    if not os.path.isfile(ledger):
        raise FileNotFoundError(f"no ledger at {ledger!r}.")
    try:
        con = sqlite3.connect(f"file:{os.path.abspath(ledger)}?mode=ro", uri=True)
        try:
            meta = dict(con.execute("SELECT key, value FROM dpgate_meta"))
        finally:
            con.close()
    except sqlite3.DatabaseError as exc:
        raise LedgerError(f"{ledger!r} is not a dpgate ledger ({exc}).") from None
    with Ledger.open(ledger, fingerprint=meta["fingerprint"], budget=float(meta["budget"])) as led:
        recs = led.records()
    cols = ["id", "created_at", "table", "sql", "alpha", "sensitivity", "scale", "value", "cost_after", "secure"]
    df = pd.DataFrame([{c: getattr(r, c) for c in cols} for r in recs], columns=cols)
    if limit is not None:
        df = df.tail(limit)
    spent = max((r.cost_after for r in recs), default=0.0)
    click.echo(f"ledger {os.path.abspath(ledger)}: {len(recs)} releases, budget {float(meta['budget']):g}, "
               f"spent {spent:.6g}, created {meta.get('created_at', '?')}")
    if len(df):
        with pd.option_context("display.max_colwidth", 60, "display.width", 200, "display.max_rows", 500):
            click.echo(df.to_string(index=False))


@cli.command()
@click.option("--schema", "schema_path", required=True, type=click.Path(exists=True, dir_okay=False),
              help="Schema YAML (public domains).")
@click.option("--data", required=True,
              help="The .duckdb, .csv or .parquet file the ledger is bound to (identifies it; no row is sampled from it).")
@click.option("--ledger", required=True, type=click.Path(exists=True, dir_okay=False),
              help="The ledger whose released answers the model is fitted to.")
@click.option("--table", default=None, help="Table to synthesize (optional when the schema declares one).")
@click.option("--rows", type=click.IntRange(min=0), default=None,
              help="Rows to draw [default: the public row count, else the model's estimated total].")
@click.option("--seed", type=int, default=None, help="Sampler seed (reproducible output).")
@click.option("--alpha", default="cv", show_default=True, help="Max-ent trade-off α (a number), or 'cv'.")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Output file: .parquet or .csv.")
def synthesize(schema_path: str, data: str, ledger: str, table: str | None, rows: int | None,
               seed: int | None, alpha: str, out: str) -> None:
    """Write a synthetic table drawn from the maximum-entropy model of every released answer.

    Post-processing of the ledger's releases (seed 002 §4): spends no budget and
    leaves the ledger unchanged.  The values follow the schema exactly; NULL cells
    are missing values and a categorical's out-of-domain cell is the literal "<other>".
    """
    from dpgate.gateway import Gateway
    from dpgate.ledger import Ledger
    from dpgate.schema import Schema

    ext = os.path.splitext(out)[1].lower()
    if ext not in (".parquet", ".csv"):
        raise click.BadParameter(f"--out must end in .parquet or .csv, got {out!r}.", param_hint="--out")
    existing = Ledger.open_existing(ledger)
    try:
        budget = float(existing.budget)
    finally:
        existing.close()
    schema = Schema.load(schema_path)
    source = _open_data(data, schema)
    a: float | str = alpha if alpha == "cv" else float(alpha)
    with Gateway(source, schema, budget=budget, ledger=ledger) as gw:
        spent = gw.spent
        df = gw.synthesize(table, rows=rows, seed=seed, alpha=a)
        meta = df.attrs.get("dpgate", {})
        if ext == ".parquet":  # DuckDB's writer: no pyarrow needed
            import duckdb

            con = duckdb.connect()
            try:
                con.from_df(df).write_parquet(out)
            finally:
                con.close()
        else:
            df.to_csv(out, index=False)
        click.echo(f"wrote {len(df)} synthetic rows ({meta.get('rows_source')}) to {out}; "
                   f"model: maximum entropy, α = {meta.get('alpha')}, fitted to {meta.get('m')} released answers, "
                   f"cross-validated RMSE {meta.get('cv_rmse', float('nan')):.4g}.  ε charged: 0 (spent {spent:.6g} "
                   f"of {gw.budget:g}, unchanged).")
    if hasattr(source, "close"):
        source.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: run the CLI, turning errors into one line and an exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    if debug:
        args = [a for a in args if a != "--debug"]
        return int(cli.main(args=args, prog_name="dpgate", standalone_mode=False, obj=None) or 0)
    from dpgate.errors import Error

    try:
        rv = cli.main(args=args, prog_name="dpgate", standalone_mode=False)
    except click.exceptions.Exit as e:
        return int(e.exit_code)
    except click.Abort:
        click.echo("dpgate: aborted.", err=True)
        return EXIT_ERROR
    except click.ClickException as e:
        click.echo(f"dpgate: error: {e.format_message()}", err=True)
        return EXIT_USAGE if isinstance(e, click.UsageError) else EXIT_ERROR
    except Error as e:
        click.echo(f"dpgate: error: {_one_line(e)}", err=True)
        return EXIT_ERROR
    except (OSError, ValueError) as e:
        click.echo(f"dpgate: error: {_one_line(e)}", err=True)
        return EXIT_IO if isinstance(e, OSError) else EXIT_ERROR
    except KeyboardInterrupt:
        click.echo("dpgate: interrupted.", err=True)
        return 130
    except Exception as e:  # noqa: BLE001 - the CLI's last line of defence
        click.echo(f"dpgate: internal error: {type(e).__name__}: {_one_line(e)} "
                   "(rerun with --debug for the traceback; this is a bug in dpgate).", err=True)
        return EXIT_ERROR
    return int(rv or 0) if isinstance(rv, int) else 0


def _one_line(e: BaseException) -> str:
    msg = str(e).strip() or type(e).__name__
    return " ".join(msg.split())


if __name__ == "__main__":
    sys.exit(main())

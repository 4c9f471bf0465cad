"""The ``dpgate`` command line: ``demo``, ``query``, ``shell``, ``budget``, ``history``, ``synthesize``.

Why one module of about 530 lines: one click group and its commands, much of it their
help text; ``dpgate serve`` and ``dpgate user`` are in :mod:`dpgate.server._cli`.

Errors print one line (``dpgate: error: …``) and exit non-zero; ``--debug``
(anywhere on the command line) shows the traceback instead.  Exit codes: 1 for
errors dpgate raises (refused query, budget exhausted, bad schema …), 2 for
bad command-line usage, 3 for missing files and other I/O errors (a missing
``--data`` or ``--ledger`` file raises ``FileNotFoundError``, an ``OSError``,
not a dpgate error, so that it gets exit code 3).

``dpgate demo`` runs the online workload of Xiao & Xiong, "Bayesian Inference
under Differential Privacy" (2012), §6.4, through three systems; its body lives
in the private demo harness :mod:`dpgate._demo` (with the table and the plot),
and its plot needs the ``demo`` extra (``pip install 'dpgate[demo]'``).
**The demo fixes the noise seed so its numbers are reproducible; seeded noise is
insecure and for demonstrations only.**
"""

from __future__ import annotations

import functools
import json
import math
import os
import re
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from dpgate._demo.workload import Setting
    from dpgate.gateway import Policy

__all__ = ["main", "cli"]

EXIT_ERROR, EXIT_USAGE, EXIT_IO = 1, 2, 3


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
def demo(dataset: str, setting: Setting, queries: int | None, seed: int, out_dir: str, progress: bool | None) -> None:
    """Run Xiao & Xiong (2012)'s online workload (§6.4) through three systems on embedded data.

    Compares the no-reuse baseline, the paper's policy and dpgate's default
    ("minimal") on answering ratio Ra, system cost ᾱ, coverage Ri, relative
    error E, share answered free and decision time, and writes a PNG (needs the
    demo extra: pip install 'dpgate[demo]').
    The noise is seeded so the demo is reproducible: insecure, demo only.
    """
    import warnings

    from dpgate._demo.report import run_demo

    with warnings.catch_warnings():  # said once in the demo's header, not once per gateway
        warnings.filterwarnings("ignore", message="this dpgate gateway draws its noise from a seed")
        run_demo(dataset, setting, queries, seed, out_dir, progress)


def _schema(data: str, schema_path: str | None) -> Any:
    """:func:`dpgate.backends.data_schema`, a missing ``--schema`` being a usage error."""
    from dpgate.backends import data_schema

    return data_schema(data, schema_path, error=click.UsageError)


def _open_data(data: str, schema: Any) -> Any:
    """:func:`dpgate.backends.open_data_file`, a bad file kind being a usage error."""
    from dpgate.backends import open_data_file

    return open_data_file(data, schema, error=click.UsageError)


def _quiet(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    if value:
        from dpgate import _progress

        _progress.set_enabled(False)
    return value


_QUIET = click.option("--quiet", "-q", is_flag=True, expose_value=False, callback=_quiet,
                      help="No progress bar (bars are drawn on stderr, on a terminal, for work over 2 s).")


_PRIVACY = click.option("--privacy", type=click.Choice(["pure", "zcdp"]), default="pure", show_default=True,
                        help="pure: ε-DP (Laplace, budget in ε); zcdp: ρ-zCDP, Gaussian noise, composing like √k "
                        "(budget in ρ; fixed when the ledger is created).")


def _gateway_options(f: Any) -> Any:
    """The options that open a gateway over a data file, shared by ``query`` and ``shell``."""
    options = [
        click.option("--schema", "schema_path", default=None, type=click.Path(exists=True, dir_okay=False),
                     help="Schema YAML (public domains); omitted with an embedded data set."),
        click.option("--data", required=True, help="A .duckdb, .csv or .parquet file, or an embedded data set: "
                     "pums, nettrace, searchlogs."),
        click.option("--budget", type=float, required=True,
                     help="Total privacy budget ε (fixed when the ledger is created); ρ with --privacy zcdp."),
        _PRIVACY,
        click.option("--ledger", default=None,
                     help="Durable ledger file (SQLite); omitted: in memory, forgotten on exit."),
        click.option("--accuracy", type=float, default=None,
                     help="Half-width of the requested interval, in the answer's units (e.g. 25 rows for a "
                     "count; for AVG/VAR/STDDEV, rows of each COUNT/SUM component). Not ε: ε is the "
                     "privacy budget, which dpgate spends as little of as this accuracy allows."),
        click.option("--confidence", type=float, default=None,
                     help="Confidence 1−δ of the interval [default: 0.95]."),
        click.option("--policy", type=click.Choice(["minimal", "paper", "no_reuse"]), default="minimal",
                     show_default=True,
                     help="minimal: cheapest measurement meeting --accuracy; paper: Xiao & Xiong's rule; "
                     "no_reuse: ignore history (a baseline)."),
        _QUIET,
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _echo_json(obj: Any) -> None:
    """Print ``obj`` as strict JSON: NULL, NaN and infinities become ``null`` (never ``NaN``)."""
    click.echo(json.dumps(_jsonable(obj), indent=1, allow_nan=False))


def _jsonable(v: Any) -> Any:
    """``v`` with JSON types only: numpy scalars as Python values, missing and non-finite numbers
    as None, other objects as text."""
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if v is None or isinstance(v, (bool, str, int)):
        return v
    if hasattr(v, "item") and not isinstance(v, float):
        return _jsonable(v.item())
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    import pandas as pd

    if v is pd.NA or v is pd.NaT:  # a NULL key of an Int64 / boolean column
        return None
    return str(v)


def _budget_summary(budget: float, spent: float, releases: int) -> dict[str, Any]:
    return {"budget": budget, "spent": spent, "remaining": max(0.0, budget - spent), "releases": releases}


def _ledger_summary(meta: dict[str, str], recs: Any) -> dict[str, Any]:
    """:func:`_budget_summary` of a ledger read by :func:`_read_ledger` (spent = the last cumulative cost)."""
    # The last record's: costs only grow, and a ledger converted to zCDP kept ε before its ρ.
    budget = float(meta.get("converted_budget", meta["budget"]))
    summary = _budget_summary(budget, recs[-1].cost_after if recs else 0.0, len(recs))
    if meta.get("privacy") == "zcdp":  # budget and spent are ρ; beside them, as ε at δ = 1e-6
        from dpgate.plan.zcdp import epsilon_of

        summary.update(privacy="zcdp", delta=1e-06, epsilon_spent=epsilon_of(summary["spent"]),
                       epsilon_budget=epsilon_of(budget))
    return summary


@cli.command()
@_gateway_options
@click.option("--allow-partial", is_flag=True, help="Return history's best estimate instead of refusing.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows and the budget as JSON.")
@click.option("--round", "round_", is_flag=True, help="Integers for counts (free post-processing).")
@click.option("--explain", is_flag=True,
              help="Print what the query would cost (per output: free or fresh, ε, half-width, budget left) "
              "without reading data or spending.")
@click.argument("sql")
def query(schema_path: str | None, data: str, budget: float, privacy: str, ledger: str | None,
          accuracy: float | None, confidence: float | None, policy: Policy, allow_partial: bool, as_json: bool,
          round_: bool, explain: bool, sql: str) -> None:
    """Answer one SQL counting query within ±--accuracy and print the released table."""
    from dpgate.gateway import Gateway

    schema = _schema(data, schema_path)
    source = _open_data(data, schema)
    with Gateway(source, schema, budget=budget, ledger=ledger, policy=policy, privacy=privacy) as gw:
        if explain:
            quote = gw.explain(sql, accuracy=accuracy, confidence=confidence)
            if as_json:
                _echo_json({"quotes": quote.to_pandas().to_dict(orient="records"), "epsilon": quote.epsilon,
                            "affordable": quote.affordable, **_budget_summary(gw.budget, gw.spent,
                                                                              len(gw.ledger.records()))})
            else:
                with _pd_display():
                    click.echo(quote.to_pandas().to_string(index=False))
                click.echo(f"\nwould charge {gw.unit} = {quote.epsilon:.6g}; {max(quote.remaining, 0.0):.6g} of "
                           f"{gw.budget:g} would remain" + ("" if quote.affordable else " — over budget, refused")
                           + ".  Nothing was read or spent.")
            return
        res = gw.query(sql, accuracy=accuracy, confidence=confidence, allow_partial=allow_partial, round=round_)
        table = res.to_pandas()
        if as_json:
            zcdp_json = ({"privacy": "zcdp", "rho_charged": res.rho_spent, "delta": 1e-06,
                          "epsilon_spent": gw.spent_as()} if gw.privacy == "zcdp" else {})
            _echo_json({"rows": table.to_dict(orient="records"), "epsilon_charged": res.epsilon_spent,
                        **_budget_summary(gw.budget, gw.spent, len(gw.ledger.records())), **zcdp_json})
        else:
            with _pd_display():
                click.echo(table.to_string(index=False))
            zcdp = f"   (ε at δ=1e-06: {gw.spent_as():.6g} of {gw.budget_as():.6g})" if gw.privacy == "zcdp" else ""
            charged = res.rho_spent if res.rho_spent is not None else res.epsilon_spent
            click.echo(f"\n{gw.unit} charged: {charged:.6g}   spent: {gw.spent:.6g} of {gw.budget:g}   "
                       f"remaining: {gw.remaining:.6g}{zcdp}")
    if hasattr(source, "close"):
        source.close()


_SHELL_HELP = """\
Statements end with ';' and may span lines.  Every answer is differentially private.
  SELECT COUNT(*) FROM t WHERE ...;      a counting query (charges budget unless history answers it)
  SET dpgate.accuracy = 25;               half-width of every later answer's interval
  SET dpgate.confidence = 0.95;           confidence 1−δ
  SET dpgate.intervals = on;              add low / high / source columns
  SET dpgate.round = on;                  integers for counts (free)
  EXPLAIN SELECT ...;                     what it would cost (free: reads nothing, spends nothing)
  /*+ dpgate accuracy=10 */ SELECT ...;   per-statement requirement
  \\budget        budget, spent, remaining
  \\history [N]   the last N releases (default 20)
  \\help          this text
  \\q             quit (also Ctrl-D)"""


@cli.command()
@_gateway_options
@click.option("--intervals/--no-intervals", default=True, show_default=True,
              help="Start with SET dpgate.intervals = on (low / high / source columns).")
@click.option("--history-file", default=os.path.join("~", ".dpgate_history"), show_default=True,
              help="Where the shell's line history is kept (interactive sessions only).")
def shell(schema_path: str | None, data: str, budget: float, privacy: str, ledger: str | None,
          accuracy: float | None, confidence: float | None, policy: Policy, intervals: bool, history_file: str) -> None:
    """An interactive SQL shell over a DB-API connection (type \\help)."""
    import dpgate

    schema = _schema(data, schema_path)
    source = _open_data(data, schema)
    interactive = sys.stdin.isatty()
    if interactive:
        _enable_line_history(os.path.expanduser(history_file))
    with dpgate.connect(source, schema=schema, budget=budget, ledger=ledger, accuracy=accuracy,
                        confidence=0.95 if confidence is None else confidence, intervals=intervals,
                        policy=policy, privacy=privacy) as conn:
        if interactive:
            click.echo(f"dpgate shell: budget {conn.budget:g}, spent {conn.spent:.6g}.  \\help for help, \\q to quit.")
        failed = _shell_loop(conn, interactive)
    if hasattr(source, "close"):
        source.close()
    if failed and not interactive:  # a script's failure must be visible to its caller
        raise click.exceptions.Exit(EXIT_ERROR)


def _enable_line_history(path: str) -> None:
    """Arrow-key editing and a persistent line history where the platform has ``readline``."""
    try:
        import atexit
        import readline
    except ImportError:  # e.g. Windows without pyreadline: plain input still works
        return
    try:
        readline.read_history_file(path)
    except OSError:
        pass
    atexit.register(_save_line_history, readline, path)


def _save_line_history(readline: Any, path: str) -> None:
    try:
        readline.set_history_length(1000)
        readline.write_history_file(path)
    except OSError:
        pass


def _shell_loop(conn: Any, interactive: bool) -> bool:
    """Read statements until EOF or ``\\q``; an error is reported and the shell goes on.
    Returns whether any statement or command failed."""
    import pandas as pd

    from dpgate.errors import Error

    buffer: list[str] = []
    failed = False
    while True:
        prompt = ("dpgate> " if not buffer else "   ...> ") if interactive else ""
        try:
            line = input(prompt)
        except EOFError:
            if interactive:
                click.echo("")
            break
        stripped = line.strip()
        if not buffer and stripped.startswith("\\"):
            command, *args = stripped.split()
            if command in ("\\q", "\\quit"):
                break
            try:
                _shell_command(conn, command, args)
            except Error as e:
                click.echo(f"error: {_as_flags(_one_line(e))}", err=True)
                failed = True
            continue
        if stripped:
            buffer.append(line)
        if not stripped.endswith(";"):
            continue
        sql, buffer = "\n".join(buffer), []
        cur = conn.cursor()
        try:
            cur.execute(sql)
        except Error as e:
            click.echo(f"error: {_one_line(e)}", err=True)
            failed = True
            continue
        if cur.description is not None:
            table = pd.DataFrame(cur.fetchall(), columns=[d[0] for d in cur.description])
            with _pd_display():
                click.echo(table.to_string(index=False))
            charged = cur.result.epsilon_spent if cur.result is not None else 0.0
            click.echo(f"ε charged: {charged:.6g}   remaining: {conn.remaining:.6g} of {conn.budget:g}")
        else:
            click.echo("ok")
    if buffer:
        click.echo("error: the last statement has no closing ';' and was not run.", err=True)
        failed = True
    return failed


def _shell_command(conn: Any, command: str, args: list[str]) -> None:
    from dpgate.errors import InvalidArgument

    if command == "\\budget":
        click.echo(f"budget {conn.budget:g}   spent {conn.spent:.6g}   remaining {conn.remaining:.6g}")
    elif command == "\\history":
        if len(args) > 1 or (args and not args[0].isdigit()):
            raise InvalidArgument("Usage: \\history [N], with N a whole number of releases.")
        n = int(args[0]) if args else 20
        df = conn.history
        cols = ["id", "table", "sql", "measured", "alpha", "value", "cost_after"]
        click.echo(f"{len(df)} releases" + (f"; the last {min(n, len(df))}:" if len(df) else "."))
        if len(df):
            with _pd_display():
                click.echo(df[cols].tail(n).to_string(index=False))
    elif command in ("\\help", "\\?", "\\h"):
        click.echo(_SHELL_HELP)
    else:
        raise InvalidArgument(f"Unknown command {command}; type \\help for the list.")


def _pd_display() -> Any:
    """pandas display options for tables printed by the CLI."""
    import pandas as pd

    return pd.option_context("display.max_colwidth", 60, "display.width", 200, "display.max_rows", 500,
                             "display.max_columns", 50)


_HISTORY_COLUMNS = ["id", "created_at", "table", "sql", "alpha", "sensitivity", "scale", "value", "cost_after",
                    "secure"]


def _read_ledger(path: str) -> tuple[dict[str, str], Any]:
    """A ledger's metadata and records, opened without its data (audit)."""
    from dpgate.ledger.core import Ledger

    if not os.path.isfile(path):
        raise FileNotFoundError(f"no ledger at {path!r}.")
    with Ledger.open_existing(path) as led:
        return led.meta, led.records()


@cli.command()
@click.option("--ledger", required=True, help="The ledger file.")
@click.option("--limit", type=click.IntRange(min=0), default=None, help="Show only the last N releases.")
@click.option("--json", "as_json", is_flag=True, help="Print the budget and the releases as JSON.")
@click.option("--schema", "schema_path", default=None, type=click.Path(exists=True, dir_okay=False),
              help="The ledger's schema YAML: the measured column says what each release counted, in words.")
@click.option("--data", default=None, help="An embedded data set (pums, nettrace …) whose schema describes them.")
def history(ledger: str, limit: int | None, as_json: bool, schema_path: str | None, data: str | None) -> None:
    """Print every release recorded in a ledger (what was released, not the data).

    ``measured`` tells the releases of one statement apart (a GROUP BY's groups): what each counted,
    on which cells — in words with the schema (--schema, or --data for an embedded data set), else
    as the measured columns and their cell boundaries."""
    import pandas as pd

    meta, recs = _read_ledger(ledger)
    shown = list(recs if limit is None else recs[len(recs) - limit:] if limit else ())
    summary = _ledger_summary(meta, recs)
    measured = _measured(shown, _schema(data or "", schema_path) if schema_path or data else None)
    rows = [{**{c: getattr(r, c) for c in _HISTORY_COLUMNS}, "measured": m} for r, m in zip(shown, measured,
                                                                                           strict=True)]
    columns = [*_HISTORY_COLUMNS[:4], "measured", *_HISTORY_COLUMNS[4:]]
    if as_json:
        _echo_json({"ledger": os.path.abspath(ledger), **summary,
                    "created_at": meta.get("created_at"), "records": [{c: r[c] for c in columns} for r in rows]})
        return
    df = pd.DataFrame(rows, columns=columns)
    click.echo(f"ledger {os.path.abspath(ledger)}: {len(recs)} releases, budget {summary['budget']:g}, "
               f"spent {summary['spent']:.6g}, created {meta.get('created_at', '?')}")
    if len(df):
        with _pd_display():
            click.echo(df.to_string(index=False))


def _measured(records: Sequence[Any], schema: Any) -> list[str]:
    """What each release measured: in words with ``schema`` (as ``Gateway.history``), else its columns and
    the boundaries of the cells it weighs (from the query's ledger JSON)."""
    if schema is not None:
        from dpgate.ledger._describe import history_frame

        return list(history_frame(records, schema)["measured"])
    out = []
    for r in records:
        try:
            q = json.loads(r.query)
            cols, cuts, weights = q["columns"], q["breakpoints"], q["numerators"]
            if len(cols) == 1:  # the runs it weighs: [cut_i, cut_i+1) of the column's cells
                ends = [*cuts[0][1:], None]
                runs = [f"{lo}" if hi == lo + 1 else f"{lo}–{'end' if hi is None else hi - 1}"
                        for lo, hi, w in zip(cuts[0], ends, weights, strict=False) if w]
                out.append(f"{cols[0]} cells {', '.join(runs)}")
            else:
                out.append("; ".join(f"{c} cuts {b}" for c, b in zip(cols, cuts, strict=True)) or "the whole table")
        except (ValueError, KeyError, TypeError):
            out.append("?")
    return out


@cli.command()
@click.option("--ledger", required=True, help="The ledger file.")
@click.option("--json", "as_json", is_flag=True, help="Print as JSON.")
def budget(ledger: str, as_json: bool) -> None:
    """Print a ledger's total budget, what is spent and what remains."""
    meta, recs = _read_ledger(ledger)
    summary = _ledger_summary(meta, recs)
    summary["insecure_releases"] = sum(not r.secure for r in recs)
    if as_json:
        _echo_json(summary)
    else:
        zcdp = (f"   (zCDP, ρ; as ε at δ=1e-06: {summary['epsilon_spent']:.6g} of {summary['epsilon_budget']:.6g})"
                if "privacy" in summary else "")
        click.echo(f"budget {summary['budget']:g}   spent {summary['spent']:.6g}   "
                   f"remaining {summary['remaining']:.6g}   releases {summary['releases']}{zcdp}"
                   + (f" ({summary['insecure_releases']} with seeded, insecure noise)"
                      if summary["insecure_releases"] else ""))


@cli.command()
@click.option("--schema", "schema_path", default=None, type=click.Path(exists=True, dir_okay=False),
              help="Schema YAML (public domains); omitted with an embedded data set.")
@click.option("--data", required=True,
              help="The .duckdb, .csv or .parquet file (or embedded data set) the ledger is bound to (identifies "
                   "it; no row is sampled from it).")
@click.option("--ledger", required=True, type=click.Path(exists=True, dir_okay=False),
              help="The ledger whose released answers the model is fitted to.")
@click.option("--table", default=None, help="Table to synthesize (optional when the schema declares one).")
@click.option("--rows", type=click.IntRange(min=0), default=None,
              help="Rows to draw [default: the public row count, else the model's estimated total].")
@click.option("--seed", type=int, default=None, help="Sampler seed (reproducible output).")
@click.option("--alpha", default="cv", show_default=True, help="Max-ent trade-off α (a number), or 'cv'.")
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Output file: .parquet or .csv.")
@_QUIET
def synthesize(schema_path: str | None, data: str, ledger: str, table: str | None, rows: int | None,
               seed: int | None, alpha: str, out: str) -> None:
    """Write a synthetic table drawn from the maximum-entropy model of every released answer.

    Post-processing of the ledger's releases (Chen, Zhou & Bhowmick, "Integrating Historical Noisy
    Answers for Improving Data Utility under Differential Privacy", EDBT 2016, §4): spends no budget and
    leaves the ledger unchanged.  The values follow the schema exactly; NULL cells
    are missing values and a categorical's out-of-domain cell is the literal "<other>".
    """
    from dpgate.gateway import Gateway
    from dpgate.ledger.core import Ledger

    ext = os.path.splitext(out)[1].lower()
    if ext not in (".parquet", ".csv"):
        raise click.BadParameter(f"--out must end in .parquet or .csv, got {out!r}.", param_hint="--out")
    existing = Ledger.open_existing(ledger)
    try:
        budget, privacy = float(existing.budget), existing.privacy
    finally:
        existing.close()
    schema = _schema(data, schema_path)
    source = _open_data(data, schema)
    a: float | str = alpha if alpha == "cv" else float(alpha)
    with Gateway(source, schema, budget=budget, ledger=ledger, privacy=privacy) as gw:
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


def _add_server_commands() -> None:
    """``dpgate serve`` and ``dpgate user``, which live with the server (dpgate.server._cli)."""
    from dpgate.server._cli import serve, user

    cli.add_command(serve)
    cli.add_command(user)


_add_server_commands()


def _add_console_command() -> None:
    """``dpgate console`` and ``dpgate serve --http-port``, which live with the console (dpgate.console._cli)."""
    from dpgate.console._cli import console, with_http_port

    cli.add_command(console)
    with_http_port(cli.commands["serve"])


_add_console_command()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: run the CLI, turning errors into one line and an exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args
    if debug:
        args = [a for a in args if a != "--debug"]
        return int(cli.main(args=args, prog_name="dpgate", standalone_mode=False, obj=None) or 0)
    from dpgate.errors import Error

    fail = functools.partial(_fail, as_json="--json" in args)
    try:
        rv = cli.main(args=args, prog_name="dpgate", standalone_mode=False)
    except click.exceptions.Exit as e:
        return int(e.exit_code)
    except click.Abort as e:
        return fail(e, "aborted.", EXIT_ERROR, prefix="dpgate: ")
    except click.ClickException as e:
        return fail(e, e.format_message(), EXIT_USAGE if isinstance(e, click.UsageError) else EXIT_ERROR)
    except Error as e:
        return fail(e, _as_flags(_one_line(e)), EXIT_ERROR)
    except (OSError, ValueError) as e:
        return fail(e, _one_line(e), EXIT_IO if isinstance(e, OSError) else EXIT_ERROR)
    except KeyboardInterrupt as e:
        return fail(e, "interrupted.", 130, prefix="dpgate: ")
    except Exception as e:  # noqa: BLE001 - the CLI's last line of defence
        return fail(e, f"{type(e).__name__}: {_one_line(e)} (rerun with --debug for the traceback; this is a bug in "
                    "dpgate).", EXIT_ERROR, prefix="dpgate: internal error: ")
    return int(rv or 0) if isinstance(rv, int) else 0


def _fail(exc: BaseException, message: str, code: int, *, as_json: bool, prefix: str = "dpgate: error: ") -> int:
    """Report an error in one line on stderr (and, under ``--json``, as a JSON object on stdout); its exit code."""
    click.echo(f"{prefix}{message}", err=True)
    if as_json:
        click.echo(json.dumps({"error": {"type": type(exc).__name__, "message": message, "exit_code": code}}))
    return code


_ARGUMENT = re.compile(r"\b(accuracy|confidence|allow_partial|policy|budget)=(True\b|(?=[\s(,.;]|$))")
_BUDGET_VALUE = re.compile(r"\bbudget=(?=\d)")


def _as_flags(message: str) -> str:
    """A library message as the command line says it: ``pass accuracy=`` → ``pass --accuracy``.

    Hints such as ``/*+ dpgate accuracy=25 */`` are SQL and stay as written.

    >>> _as_flags("pass accuracy= (the half-width) or allow_partial=True; pass budget=2.5 or a new ledger.")
    'pass --accuracy (the half-width) or --allow-partial; pass --budget 2.5 or a new ledger.'
    >>> _as_flags("add a hint /*+ dpgate accuracy=25 */")
    'add a hint /*+ dpgate accuracy=25 */'
    """
    message = _ARGUMENT.sub(lambda m: "--" + m.group(1).replace("_", "-"), message)
    return _BUDGET_VALUE.sub("--budget ", message)


def _one_line(e: BaseException) -> str:
    msg = str(e).strip() or type(e).__name__
    return " ".join(msg.split())


if __name__ == "__main__":
    sys.exit(main())

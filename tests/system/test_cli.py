"""The ``dpgate`` command line: demo end to end, query on a CSV, history, error exits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def dpgate(*args: str, cwd: str | None = None, timeout: float = 300,
           stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run(
        [sys.executable, "-m", "dpgate.cli", *args], capture_output=True, text=True, cwd=cwd, env=env,
        timeout=timeout, input=stdin,
    )


def test_demo_prints_the_table_and_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")  # the demo extra (with tqdm)
    pytest.importorskip("tqdm")
    out = tmp_path / "demo"
    r = dpgate("demo", "--queries", "30", "--out", str(out), "--no-progress")
    assert r.returncode == 0, r.stderr
    text = r.stdout
    for needle in ("no-reuse", "paper", "minimal", "answering ratio Ra", "system cost", "coverage Ri",
                   "relative error E", "answered free", "median decision ms", "insecure"):
        assert needle in text, (needle, text)
    png = next(line.split("Plot: ", 1)[1].strip() for line in text.splitlines() if line.startswith("Plot: "))
    assert os.path.isfile(png) and os.path.dirname(png) == str(out)
    with open(png, "rb") as f:
        head = f.read(8)
    assert head == PNG_SIGNATURE and os.path.getsize(png) > 1000
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.image as mpimg

    img = mpimg.imread(png)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    # table rows carry numbers in [0, 1] for the ratios
    row = next(line for line in text.splitlines() if line.startswith("answering ratio Ra"))
    values = [float(v) for v in row.split()[3:]]
    assert len(values) == 3 and all(0 <= v <= 1 for v in values)
    assert os.path.isfile(os.path.join(out, "demo_nettrace_bounded.json"))


def test_demo_is_reproducible_with_its_seed(tmp_path):
    pytest.importorskip("matplotlib")  # the demo extra (with tqdm)
    pytest.importorskip("tqdm")
    a = dpgate("demo", "--queries", "12", "--out", str(tmp_path / "a"), "--no-progress", "--seed", "7")
    b = dpgate("demo", "--queries", "12", "--out", str(tmp_path / "b"), "--no-progress", "--seed", "7")
    assert a.returncode == b.returncode == 0, a.stderr + b.stderr

    def table(s: str) -> list[str]:
        return [line for line in s.splitlines() if line.split()[:1] and line.split()[0] in
                ("answering", "system", "coverage", "relative", "answered")]

    assert table(a.stdout) == table(b.stdout)


def test_demo_without_its_extra_is_one_line_before_any_work(tmp_path):
    """Without matplotlib (the core install), ``dpgate demo`` says what to install and runs nothing."""
    code = ("import sys; sys.modules['matplotlib'] = None; from dpgate.cli import main; "
            f"sys.exit(main(['demo', '--queries', '5', '--out', {str(tmp_path / 'd')!r}]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")))
    assert r.returncode == 1, r.stderr
    assert r.stderr.startswith("dpgate: error: ") and r.stderr.count("\n") == 1
    assert "pip install 'dpgate[demo]'" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "d").exists()


@pytest.fixture
def pums_files(tmp_path):
    csv = tmp_path / "people.csv"
    rows = ["age,sex"] + [f"{20 + (i * 7) % 50},{i % 2}" for i in range(300)]
    csv.write_text("\n".join(rows) + "\n")
    schema = tmp_path / "schema.yaml"
    schema.write_text(textwrap.dedent("""\
        tables:
          people:
            columns:
              age: {type: integer, min: 0, max: 100}
              sex: {type: categorical, values: ["0", "1"]}
        """))
    return csv, schema


def test_query_on_a_csv_and_history(pums_files, tmp_path):
    csv, schema = pums_files
    ledger = tmp_path / "l.db"
    base = ["query", "--schema", str(schema), "--data", str(csv), "--budget", "1", "--ledger", str(ledger)]
    r = dpgate(*base, "--accuracy", "25", "--confidence", ".95", "SELECT COUNT(*) AS n FROM people WHERE age < 40")
    assert r.returncode == 0, r.stderr
    assert "n_low" in r.stdout and "n_high" in r.stdout and "fresh" in r.stdout
    assert "spent" in r.stdout
    # asked again with a looser requirement: answered from history, free
    r2 = dpgate(*base, "--accuracy", "40", "SELECT COUNT(*) AS n FROM people WHERE age <= 39")
    assert r2.returncode == 0, r2.stderr
    assert "history" in r2.stdout and "ε charged: 0" in r2.stdout
    h = dpgate("history", "--ledger", str(ledger))
    assert h.returncode == 0, h.stderr
    assert "1 releases" in h.stdout and "age < 40" in h.stdout


def test_group_by_query_prints_one_row_per_key(pums_files):
    csv, schema = pums_files
    r = dpgate("query", "--schema", str(schema), "--data", str(csv), "--budget", "1", "--accuracy", "30",
               "SELECT sex, COUNT(*) AS n FROM people GROUP BY sex")
    assert r.returncode == 0, r.stderr
    lines = [line for line in r.stdout.splitlines() if line.strip()]
    assert lines[0].split()[:2] == ["sex", "n"]


def test_errors_are_one_line_with_nonzero_exit(pums_files, tmp_path):
    csv, schema = pums_files
    base = ["query", "--schema", str(schema), "--data", str(csv), "--budget", "1"]
    refused = dpgate(*base, "--accuracy", "25", "SELECT * FROM people")
    assert refused.returncode == 1
    assert refused.stderr.startswith("dpgate: error: ") and refused.stderr.count("\n") == 1
    assert "Traceback" not in refused.stderr
    # budget exhausted: ±0.01 needs far more than 1
    broke = dpgate(*base, "--accuracy", "0.01", "SELECT COUNT(*) FROM people")
    assert broke.returncode == 1 and "remains" in broke.stderr and broke.stderr.count("\n") == 1
    missing = dpgate("query", "--schema", str(schema), "--data", str(tmp_path / "nope.csv"), "--budget", "1",
                     "--accuracy", "5", "SELECT COUNT(*) FROM people")
    assert missing.returncode == 3 and "nope.csv" in missing.stderr
    usage = dpgate("demo", "--dataset", "mnist")
    assert usage.returncode == 2 and usage.stderr.startswith("dpgate: error: ")
    nohist = dpgate("history", "--ledger", str(tmp_path / "none.db"))
    assert nohist.returncode == 3
    debug = dpgate("--debug", *base, "--accuracy", "25", "SELECT * FROM people")
    assert debug.returncode != 0 and "Traceback" in debug.stderr


def test_help():
    r = dpgate("--help")
    assert r.returncode == 0
    for command in ("demo", "query", "shell", "budget", "history", "synthesize"):
        assert command in r.stdout, command


def test_json_outputs_parse_and_agree_with_the_ledger(pums_files, tmp_path):
    csv, schema = pums_files
    ledger = tmp_path / "l.db"
    base = ["query", "--schema", str(schema), "--data", str(csv), "--budget", "1", "--ledger", str(ledger)]
    r = dpgate(*base, "--accuracy", "25", "--json", "SELECT COUNT(*) AS n FROM people WHERE age < 40")
    assert r.returncode == 0, r.stderr
    answer = json.loads(r.stdout)
    assert answer["epsilon_charged"] > 0 and answer["releases"] == 1
    (row,) = answer["rows"]
    assert row["n_source"] == "fresh" and row["n_low"] < row["n"] < row["n_high"]
    assert row["n_high"] - row["n"] == pytest.approx(25, rel=1e-6)
    b = dpgate("budget", "--ledger", str(ledger), "--json")
    assert b.returncode == 0, b.stderr
    summary = json.loads(b.stdout)
    assert summary["spent"] == pytest.approx(answer["spent"])
    assert summary["remaining"] == pytest.approx(1 - answer["spent"])
    assert summary["releases"] == 1 and summary["insecure_releases"] == 0
    h = dpgate("history", "--ledger", str(ledger), "--json")
    assert h.returncode == 0, h.stderr
    hist = json.loads(h.stdout)
    (rec,) = hist["records"]
    assert rec["value"] == pytest.approx(row["n"]) and rec["alpha"] == pytest.approx(answer["epsilon_charged"])
    text = dpgate("budget", "--ledger", str(ledger))
    assert text.returncode == 0 and "remaining" in text.stdout
    assert dpgate("budget", "--ledger", str(tmp_path / "none.db")).returncode == 3


def test_shell_runs_statements_settings_and_backslash_commands(pums_files, tmp_path):
    csv, schema = pums_files
    ledger = tmp_path / "l.db"
    script = "\n".join([
        "SELECT COUNT(*) AS n FROM people WHERE age < 40;",
        "SET dpgate.accuracy = 40;",
        "SELECT COUNT(*) AS n",          # a statement over two lines
        "  FROM people WHERE age <= 39;",  # implied by the first: free
        "\\budget",
        "\\history 1",
        "\\nope",
        "SELECT * FROM people;",           # refused: the shell reports it and goes on
        "SET dpgate.confidence = 2;",      # bad value: reported, nothing changes
        "\\q",
        "SELECT COUNT(*) FROM people;",    # after \\q: never run
    ]) + "\n"
    r = dpgate("shell", "--schema", str(schema), "--data", str(csv), "--budget", "1", "--ledger", str(ledger),
               "--accuracy", "25", stdin=script)
    assert r.returncode == 1, r.stderr  # piped input with failed statements: non-zero exit
    out = r.stdout
    assert out.count("n_source") == 2 and "fresh" in out and "history" in out
    charges = [float(line.split()[2]) for line in out.splitlines() if line.startswith("ε charged:")]
    assert len(charges) == 2 and charges[0] > 0 and charges[1] == 0
    assert "ok" in out.splitlines()
    assert "budget 1" in out and "remaining" in out
    assert "1 releases" in out and "COUNT where age 0–39" in out  # \\history says what was measured
    errors = r.stderr.splitlines()
    assert len(errors) == 3 and all(e.startswith("error: ") for e in errors), errors
    assert "\\nope" in errors[0] and "confidence" in errors[2]
    summary = json.loads(dpgate("budget", "--ledger", str(ledger), "--json").stdout)
    assert summary["releases"] == 1 and summary["spent"] == pytest.approx(charges[0], rel=1e-5)  # printed to 6 digits


def test_synthesize_writes_a_schema_shaped_table_and_spends_nothing(pums_files, tmp_path):
    csv, schema = pums_files
    ledger = tmp_path / "l.db"
    base = ["query", "--schema", str(schema), "--data", str(csv), "--budget", "1", "--ledger", str(ledger)]
    assert dpgate(*base, "--accuracy", "30", "SELECT sex, COUNT(*) AS n FROM people GROUP BY sex").returncode == 0
    # The groups are the declared keys '0', '1': the model needs the row count besides.
    assert dpgate(*base, "--accuracy", "30", "SELECT COUNT(*) AS n FROM people").returncode == 0
    before = dpgate("history", "--ledger", str(ledger)).stdout
    out = tmp_path / "synthetic.csv"
    r = dpgate("synthesize", "--schema", str(schema), "--data", str(csv), "--ledger", str(ledger),
               "--rows", "200", "--seed", "1", "--alpha", "0.1", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert "ε charged: 0" in r.stdout
    import pandas as pd

    # dtype=str: a synthesized NULL cell would otherwise make pandas read the codes as floats.
    df = pd.read_csv(out, dtype=str)
    assert len(df) == 200
    assert set(df["sex"].astype(str)) <= {"0", "1"}  # only declared values (no NULL, no <other>)
    assert dpgate("history", "--ledger", str(ledger)).stdout == before
    bad = dpgate("synthesize", "--schema", str(schema), "--data", str(csv), "--ledger", str(ledger),
                 "--out", str(tmp_path / "x.json"))
    assert bad.returncode == 2 and ".parquet or .csv" in bad.stderr


def test_shell_script_exit_code_and_explain(pums_files):
    csv, schema = pums_files
    base = ["shell", "--schema", str(schema), "--data", str(csv), "--budget", "1", "--accuracy", "25"]
    ok = dpgate(*base, stdin="EXPLAIN SELECT COUNT(*) AS n FROM people;\nSELECT COUNT(*) AS n FROM people;\n")
    assert ok.returncode == 0, ok.stderr
    assert "halfwidth" in ok.stdout and "remaining" in ok.stdout
    for bad in ("SELECT * FROM people;\n", "SELECT COUNT(*) FROM people\n", "\\nope\n"):
        r = dpgate(*base, stdin=bad)
        assert r.returncode == 1 and r.stderr.startswith("error: "), (bad, r.stderr)


def test_query_explain_json_and_null_keys_are_strict_json(pums_files, tmp_path):
    csv, schema = pums_files
    ledger = tmp_path / "l.db"
    base = ["query", "--schema", str(schema), "--data", str(csv), "--budget", "1", "--ledger", str(ledger)]
    sql = "SELECT sex, COUNT(*) AS n FROM people GROUP BY sex"
    quote = dpgate(*base, "--accuracy", "30", "--explain", "--json", sql)
    assert quote.returncode == 0, quote.stderr
    q = json.loads(quote.stdout)
    assert q["spent"] == 0 and q["releases"] == 0 and q["affordable"]
    assert {row["source"] for row in q["quotes"]} == {"fresh"}
    r = dpgate(*base, "--accuracy", "30", "--json", sql)
    assert r.returncode == 0, r.stderr
    assert "NaN" not in r.stdout and "Infinity" not in r.stdout
    answer = json.loads(r.stdout, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert answer["epsilon_charged"] == pytest.approx(q["epsilon"], abs=1e-12)
    assert any(row["sex"] is None for row in answer["rows"]) or all(row["sex"] for row in answer["rows"])
    text = dpgate(*base, "--accuracy", "30", "--explain", "SELECT COUNT(*) FROM people WHERE age < 30")
    assert text.returncode == 0 and "would charge" in text.stdout and "Nothing was read or spent" in text.stdout


def test_cli_speaks_in_flags(pums_files):
    csv, schema = pums_files
    base = ["query", "--schema", str(schema), "--data", str(csv), "--budget", "1"]
    r = dpgate(*base, "SELECT COUNT(*) FROM people")
    assert r.returncode == 1 and "--accuracy" in r.stderr and "accuracy=" not in r.stderr.replace("accuracy=25", "")
    broke = dpgate(*base, "--accuracy", "0.5", "SELECT COUNT(*) FROM people WHERE age < 30")
    assert broke.returncode == 1 and ("--allow-partial" in broke.stderr or "allow_partial" not in broke.stderr)
    h = dpgate("query", "--help")
    assert h.returncode == 0
    help_text = " ".join(h.stdout.split())
    assert "--explain" in help_text and "--quiet" in help_text
    assert "Half-width of the requested interval" in help_text and "Not ε" in help_text


def test_open_data_file(tmp_path):
    """The data-file opener both command lines share (dpgate.backends.open_data_file)."""
    import click

    import dpgate.datasets
    from dpgate.backends import open_data_file
    from dpgate.errors import InvalidArgument

    schema = dpgate.datasets.schema_of("pums")
    csv = tmp_path / "pums.csv"
    csv.write_text("age,sex,educ,race,income,married\n30,1,9,1,20000,1\n")
    con = open_data_file(str(csv), schema)
    assert con.execute("SELECT COUNT(*) FROM pums").fetchone() == (1,)
    con.close()
    db = tmp_path / "x.duckdb"
    db.touch()
    assert open_data_file(str(db), schema) == str(db)  # a DuckDB file is passed on as is
    with pytest.raises(FileNotFoundError, match="no data file"):
        open_data_file(str(tmp_path / "nope.csv"), schema)
    (tmp_path / "x.txt").write_text("")
    with pytest.raises(InvalidArgument, match="--data must be"):
        open_data_file(str(tmp_path / "x.txt"), schema)
    with pytest.raises(click.UsageError, match="--data must be"):
        open_data_file(str(tmp_path / "x.txt"), schema, error=click.UsageError)


def test_data_names_an_embedded_data_set_and_its_schema(tmp_path):
    r = dpgate("query", "--data", "pums", "--budget", "1", "--accuracy", "25", "--json",
               "SELECT COUNT(*) AS n FROM pums WHERE age < 30")
    assert r.returncode == 0, r.stderr
    assert 150 < json.loads(r.stdout)["rows"][0]["n"] < 300
    r = dpgate("query", "--data", "nettrace", "--budget", "1", "--accuracy", "2500", "SELECT COUNT(*) FROM nettrace")
    assert r.returncode == 0, r.stderr
    typo = dpgate("query", "--data", "pumz", "--budget", "1", "--accuracy", "25", "SELECT COUNT(*) FROM pums")
    assert typo.returncode == 2 and "'pumz' is neither a file nor an embedded data set (pums," in typo.stderr
    (tmp_path / "t.csv").write_text("age\n1\n")
    noschema = dpgate("query", "--data", str(tmp_path / "t.csv"), "--budget", "1", "SELECT COUNT(*) FROM t")
    assert noschema.returncode == 2 and "--schema is required" in noschema.stderr


def test_json_errors_are_json_on_stdout(tmp_path):
    base = ["query", "--data", "pums", "--budget", "1", "--accuracy", "25", "--json"]
    refused = dpgate(*base, "SELECT age FROM pums")
    assert refused.returncode == 1 and refused.stderr.startswith("dpgate: error: the raw column 'age'")
    error = json.loads(refused.stdout)["error"]
    assert error["type"] == "UnsupportedQuery" and error["exit_code"] == 1 and "raw column" in error["message"]
    percent = dpgate(*base, "--confidence", "95", "SELECT COUNT(*) FROM pums")
    assert json.loads(percent.stdout)["error"]["message"].endswith("did you mean 0.95?")
    missing = dpgate("history", "--ledger", str(tmp_path / "none.db"), "--json")
    assert missing.returncode == 3 and json.loads(missing.stdout)["error"]["exit_code"] == 3


def test_history_tells_a_group_bys_releases_apart_and_explain_shows_the_total(tmp_path):
    ledger = str(tmp_path / "l.db")
    base = ["query", "--data", "pums", "--budget", "1", "--ledger", ledger, "--accuracy", "25"]
    explained = dpgate(*base, "--explain", "--json", "SELECT sex, COUNT(*) FROM pums GROUP BY sex")
    quotes = json.loads(explained.stdout)["quotes"]
    assert [q["output"] for q in quotes] == ["COUNT(*)", "COUNT(*)", "(statement)"]
    assert quotes[0]["epsilon"] == pytest.approx(quotes[1]["epsilon"]) == pytest.approx(quotes[2]["epsilon"])
    over = dpgate(*base[:-1], "0.01", "--explain", "SELECT COUNT(*) FROM pums")
    assert over.returncode == 0 and "over budget" in over.stdout
    assert not any(word.startswith("-") for word in over.stdout.split())  # no negative remaining
    assert dpgate(*base, "SELECT sex, COUNT(*) FROM pums GROUP BY sex").returncode == 0
    plain = json.loads(dpgate("history", "--ledger", ledger, "--json").stdout)["records"]
    assert [r["measured"] for r in plain] == ["sex cells 0", "sex cells 1"]
    worded = dpgate("history", "--ledger", ledger, "--data", "pums")
    assert "COUNT where sex = 0" in worded.stdout and "COUNT where sex = 1" in worded.stdout


def test_version_and_help_start_without_the_gateway():
    """``dpgate --version`` / ``--help`` import neither the gateway nor pandas, scipy or duckdb
    (lazy imports: they took ~3 s); measured on what is imported, not on a loaded machine's clock."""
    import time

    for flag in ("--version", "--help"):
        env = {**os.environ, "PYTHONPATH": ROOT}
        start = time.perf_counter()
        r = subprocess.run([sys.executable, "-X", "importtime", "-m", "dpgate.cli", flag], capture_output=True,
                           text=True, env=env, timeout=60)
        seconds = time.perf_counter() - start
        assert r.returncode == 0, r.stderr
        imported = {line.split("|")[-1].strip() for line in r.stderr.splitlines() if line.startswith("import time")}
        heavy = {"dpgate.gateway", "dpgate.accessor", "pandas", "scipy", "duckdb", "sqlglot"} & imported
        assert not heavy and "serve" in dpgate("--help").stdout, (flag, heavy)
        assert seconds < 10  # a generous bound: the import list above is the real check

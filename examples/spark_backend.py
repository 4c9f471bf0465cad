"""The PUMS table as a Spark DataFrame: dpgate counts on Spark, decides in Python.

Run:  python examples/spark_backend.py          (needs pyspark and Java 17; ~20 s)

A local Spark session (``local[2]``) holds the embedded PUMS sample as a temporary view.
``Gateway((spark, "pums"), schema)`` sends Spark only SQL that dpgate generates from the
schema (sqlglot's spark dialect); ``collect()`` brings back per-cell counts, never rows.
The decision, inference and noise stay in the gateway, so the answers are the same as on
DuckDB (README "Backends").  On a cluster nothing changes but the session.

``seed=`` is here only to make the comparison reproducible; seeded noise is INSECURE.
"""

from __future__ import annotations

import logging
import warnings

from pyspark.sql import SparkSession

import dpgate
from dpgate.datasets import load_pums


def numbers(results: list[dpgate.Result]) -> list[tuple[float, ...]]:
    """Every answer's value, interval and charge: what the comparison looks at."""
    return [(a.value, a.low, a.high, a.epsilon_spent) for r in results for a in r.answers]


warnings.simplefilter("ignore", dpgate.Warning)  # the one-time "seeded noise" warning
logging.getLogger("py4j").setLevel(logging.ERROR)
spark = (SparkSession.builder.master("local[2]").appName("dpgate-example")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
         .config("spark.sql.shuffle.partitions", "2").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
try:
    # The data: PUMS as a Spark DataFrame, typed as a warehouse would store it.
    df, schema = load_pums()
    rows = [(int(age), str(sex), int(educ), int(race), int(income), bool(married))
            for age, sex, educ, race, income, married in df.itertuples(index=False)]
    spark.createDataFrame(rows, "age int, sex string, educ int, race int, income int, married boolean") \
        .createOrReplaceTempView("pums")

    queries = ["SELECT COUNT(*) AS n FROM pums WHERE income >= 50000",
               "SELECT race, COUNT(*) AS n FROM pums GROUP BY race"]
    answers = {}
    for name, data in (("spark", (spark, "pums")), ("duckdb", df)):
        with dpgate.Gateway(data, schema, budget=1.0, seed=3) as gw:
            answers[name] = [gw.query(sql, accuracy=20) for sql in queries]  # a count and a GROUP BY
            spent = gw.spent
        print(f"{name}: spent ε = {spent:.4f}")

    count, by_race = answers["spark"]
    a = count.answers[0]
    print(f"income ≥ 50 000: {a.value:.1f} in [{a.low:.1f}, {a.high:.1f}] ({a.source})")
    print(by_race.to_pandas()[["race", "n", "n_low", "n_high"]].round(1).to_string(index=False))
    same = numbers(answers["spark"]) == numbers(answers["duckdb"])
    print("identical to DuckDB:", same)
finally:
    spark.stop()

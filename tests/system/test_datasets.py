"""Embedded data sets: schemas, shapes, and the cube over them."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dpgate import datasets
from dpgate.compile.query import LinearQuery
from dpgate.release.cube import Cube


def test_list() -> None:
    assert datasets.list_datasets() == ["pums", "pums_null", "nettrace", "searchlogs", "flights"]


def test_pums_schema_and_values_within_declared_domain() -> None:
    df, schema = datasets.load_pums()
    t = schema.table("pums")
    assert df.shape == (1000, 6) and t.rows == 1000
    assert {c.name: c.kind for c in t.columns} == {
        "age": "integer", "sex": "categorical", "educ": "integer",
        "race": "categorical", "income": "integer", "married": "boolean",
    }
    assert (t.column("income").min, t.column("income").max) == (0, 500000)
    with Cube(df, schema) as cube:
        # No row falls in an 'other' or NULL cell: the codebook covers the data.
        assert cube.histogram("pums", ["race"]).tolist()[-2:] == [0, 0]
        assert cube.histogram("pums", ["sex"]).tolist()[-2:] == [0, 0]
        assert cube.histogram("pums", ["married"]).tolist()[-1] == 0
        assert cube.histogram("pums", ["age"]).sum() == 1000
        inc = t.column("income")
        q = LinearQuery.from_grid(t, ["income"], [[0, 30000, inc.n_cells - 1]], np.array([0.0, 1.0, 0.0]))
        assert cube.true_numerator(q) == int((df["income"] >= 30000).sum())


def test_pums_null_ignores_pid_and_counts_nulls() -> None:
    df, schema = datasets.load_pums(null=True)
    assert df.shape == (1948, 7) and "pid" in df.columns
    assert schema.table("pums").rows is None
    assert not schema.table("pums").has_column("pid")
    with Cube(df, schema) as cube:
        for col in ["age", "sex", "educ", "race", "income", "married"]:
            assert cube.histogram("pums", [col]).tolist()[-1] == int(df[col].isna().sum())


@pytest.mark.parametrize("name,total", [("nettrace", 25714), ("searchlogs", 335889)])
def test_histograms_round_trip(name: str, total: int) -> None:
    df, schema = datasets.load_histogram(name)
    assert list(df.columns) == ["value"] and len(df) == total
    counts = np.load(datasets._file(datasets._HISTOGRAMS[name]).open("rb"))
    con = datasets.connect_duckdb(name)
    with Cube(con, schema) as cube:
        h = cube.histogram(name)
    assert h[:4096].tolist() == counts.tolist() and h[4096] == 0
    con.close()


def test_unknown_names() -> None:
    with pytest.raises(ValueError, match="nettrace"):
        datasets.load_histogram("pums")
    with pytest.raises(ValueError, match="choose one of"):
        datasets.connect_duckdb("nope")


def test_connect_duckdb_pums_matches_frame() -> None:
    df, schema = datasets.load_pums()
    con = datasets.connect_duckdb("pums")
    with Cube(con, schema) as a, Cube(df, schema) as b:
        assert np.array_equal(a.histogram("pums", ["age", "race"]), b.histogram("pums", ["age", "race"]))
    assert isinstance(con.execute("SELECT * FROM pums LIMIT 1").df(), pd.DataFrame)

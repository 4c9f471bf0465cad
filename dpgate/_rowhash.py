"""Keyed row hashes: how ``df.dp`` recognises the same people in another frame.

A row is encoded canonically on the columns compared (numbers as float64, labels
as strings, so ``0``, ``0.0`` and ``"0"`` agree and dtype, index and row order do
not matter), hashed to 64 bits by pandas (unkeyed), and that digest is run through
SipHash under a secret key drawn once per process with ``secrets``: a keyed PRF of
the row.  Without the key a hash says nothing about the row; the hashes never
leave the process (nothing here is written, printed or put in ``df.attrs``).
Vectorised (benchmarks/README.md, "Timings behind the code").
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import numpy as np
import pandas as pd

__all__ = ["Encoding", "content_fingerprint", "encode_all", "encodings_of", "hashed"]

#: The process-wide secret: 16 ASCII bytes (96 random bits), the SipHash key pandas' hashing takes.
_HASH_KEY = secrets.token_urlsafe(12)
#: The same secret for the keyed BLAKE2b digest of a whole frame.
_DIGEST_KEY = hashlib.blake2b(_HASH_KEY.encode(), digest_size=32).digest()

Encoding = Literal["number", "label"]


def _label(v: Any) -> str | None:
    """The canonical string of one categorical value (``0``, ``0.0`` and ``"0"`` agree)."""
    if v is None or v is pd.NA or (isinstance(v, float) and v != v):
        return None
    if isinstance(v, (float, np.floating)) and float(v).is_integer():
        return str(int(v))
    text = str(v)
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate, which pandas' hashing cannot encode: its bytes, marked
        return "\x00" + text.encode("utf-8", "surrogatepass").decode("latin-1")
    return text


def _encoded(s: pd.Series, how: Encoding) -> np.ndarray:
    """One column in the canonical encoding of its declared kind, whatever its dtype."""
    if how == "number":
        if pd.api.types.is_bool_dtype(s.dtype) or pd.api.types.is_numeric_dtype(s.dtype):
            return s.to_numpy(dtype=np.float64, na_value=np.nan)
        values = pd.to_numeric(pd.Series(np.asarray(s, dtype=object)), errors="coerce")
        return values.to_numpy(dtype=np.float64, na_value=np.nan)
    codes, uniques = pd.factorize(s, use_na_sentinel=True)
    # Only the distinct values go through Python; code -1 (NULL) picks the trailing None.
    table = np.array([*(_label(u) for u in uniques), None], dtype=object)
    return table[codes]


def hashed(encoded: Mapping[str, np.ndarray]) -> np.ndarray:
    """Sorted keyed 64-bit hashes of rows given as encoded columns (name → array, row-aligned).

    Stage 1 is pandas' (unkeyed) row hash of the canonical encoding; stage 2 runs
    each 8-byte digest through SipHash under the process's secret key
    (``hash_array`` of bytes objects is keyed SipHash), so the result is a keyed
    PRF of the row.
    """
    plain = pd.util.hash_pandas_object(pd.DataFrame(dict(encoded)), index=False).to_numpy(dtype=np.uint64)
    # ``S8`` drops trailing NUL bytes, which is still injective on fixed 8-byte strings.
    keyed = pd.util.hash_array(plain.view("S8").astype(object), hash_key=_HASH_KEY, categorize=False)
    return np.sort(np.asarray(keyed, dtype=np.uint64))


def encode_all(df: pd.DataFrame, encodings: Mapping[str, Encoding]) -> dict[str, np.ndarray]:
    """The columns of ``df`` named in ``encodings`` that can be encoded (unhashable values, such as
    lists, cannot, nor can a name used twice: such a column takes no part in recognising rows)."""
    by_name = {str(c): c for c in df.columns}
    out = {}
    for c, how in encodings.items():
        column = df[by_name[c]] if c in by_name else None
        if not isinstance(column, pd.Series):  # absent, or a name used twice (a DataFrame)
            continue
        try:
            out[c] = _encoded(column, how)
        except (TypeError, ValueError):
            continue
    return out


def encodings_of(df: pd.DataFrame, columns: Iterable[str]) -> dict[str, Encoding]:
    """Encodings read from dtypes (numbers and booleans as numbers, everything else as labels)."""
    by_name = {str(c): c for c in df.columns}
    out: dict[str, Encoding] = {}
    for c in columns:
        column = df[by_name[c]]
        dtype = column.dtype if isinstance(column, pd.Series) else np.dtype(object)
        number = pd.api.types.is_bool_dtype(dtype) or pd.api.types.is_numeric_dtype(dtype)
        out[c] = "number" if number else "label"
    return out


def content_fingerprint(df: pd.DataFrame, columns: Iterable[str] | None = None) -> str:
    """A keyed digest identifying a frame's content on ``columns`` (default all), independent of row
    order, index and dtype width.  Keyed with this process's secret, so it means nothing elsewhere;
    internal all the same: never publish it."""
    cols = [str(c) for c in df.columns] if columns is None else list(columns)
    h = hashlib.blake2b(repr((len(df), cols)).encode(), key=_DIGEST_KEY, digest_size=32)
    if cols and len(df):
        h.update(hashed(encode_all(df, encodings_of(df, cols))).tobytes())
    return h.hexdigest()

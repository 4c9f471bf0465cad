"""Re-opening a file ledger from its inference checkpoint gives exactly what replaying it gives."""

from __future__ import annotations

import os
import shutil
import warnings

import pytest

import dpgate
from dpgate.datasets import load_pums
from dpgate.ledger import _checkpoint

STATEMENTS = (
    ("SELECT sex, COUNT(*) FROM pums GROUP BY sex", 15.0),
    ("SELECT COUNT(*) FROM pums WHERE age BETWEEN 20 AND 39", 10.0),
    ("SELECT educ, COUNT(*) FROM pums WHERE married GROUP BY educ", 12.0),
    ("SELECT SUM(age) FROM pums", 1500.0),
    ("SELECT race, COUNT(*) FROM pums GROUP BY race", 12.0),
)
PROBES = (
    "SELECT COUNT(*) FROM pums",
    "SELECT COUNT(*) FROM pums WHERE sex = '1'",
    "SELECT COUNT(*) FROM pums WHERE age BETWEEN 20 AND 39",
    "SELECT SUM(age) FROM pums",
    "SELECT COUNT(*) FROM pums WHERE race = '1' AND married AND educ = 9",
)


@pytest.fixture(scope="module")
def pums():  # type: ignore[no-untyped-def]
    return load_pums()


def _build(pums, path, key, statements=STATEMENTS):  # type: ignore[no-untyped-def]
    df, schema = pums
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dpgate.Warning)
        with dpgate.Gateway(df, schema, budget=100.0, ledger=str(path), ledger_key=key, seed=7) as gw:
            for sql, acc in statements:
                gw.query(sql, accuracy=acc, confidence=0.95)


def _probe(pums, path, key):  # type: ignore[no-untyped-def]
    """What a gateway opened on ``path`` knows (spent, the posterior of a few queries), and
    how many records the checkpoint it loaded covered (0: none loaded)."""
    df, schema = pums
    loaded = []
    real = _checkpoint.load

    def spy(*args):  # type: ignore[no-untyped-def]
        found = real(*args)
        loaded.append(0 if found is None else found[0])
        return found

    _checkpoint.load = spy
    try:
        gw = dpgate.Gateway(df, schema, budget=100.0, ledger=str(path), ledger_key=key)
    finally:
        _checkpoint.load = real
    try:
        out = [gw.spent, len(gw.history)]
        for sql in PROBES:
            try:
                out.append(tuple(round(gw.probability(sql, low, low + 20), 12) for low in (0, 100, 400)))
            except dpgate.NotEstimable:
                out.append("not estimable")
        out.append(tuple(gw._history.state("pums").costs.units.tolist()))
        return out, loaded[0]
    finally:
        gw._ledger.close()  # no checkpoint write: the next probe sees the same file


def test_checkpoint_reopens_to_the_replayed_state(pums, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path, key = tmp_path / "l.db", os.urandom(32)
    _build(pums, path, key)
    state = str(path) + ".state"
    assert os.path.exists(state)  # written on close
    from_checkpoint, covered = _probe(pums, path, key)
    assert covered == from_checkpoint[1] > 0
    os.unlink(state)
    replayed, covered = _probe(pums, path, key)
    assert covered == 0
    assert from_checkpoint == replayed


def test_checkpoint_covers_a_prefix_and_later_records_are_replayed(pums, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path, key = tmp_path / "l.db", os.urandom(32)
    _build(pums, path, key, STATEMENTS[:2])
    shutil.copy(str(path) + ".state", tmp_path / "prefix.state")
    _build(pums, path, key, STATEMENTS[2:])
    full, _ = _probe(pums, path, key)
    shutil.copy(tmp_path / "prefix.state", str(path) + ".state")  # an older checkpoint
    got, covered = _probe(pums, path, key)
    assert 0 < covered < got[1] and got == full


def test_a_checkpoint_that_does_not_verify_is_ignored(pums, tmp_path) -> None:  # type: ignore[no-untyped-def]
    key = os.urandom(32)
    a, b = tmp_path / "a.db", tmp_path / "b.db"
    _build(pums, a, key)
    _build(pums, b, key, STATEMENTS[:1] + STATEMENTS[2:])  # same key, other records
    os.unlink(str(b) + ".state")
    replayed, _ = _probe(pums, b, key)
    # Another ledger's checkpoint, though keyed alike, does not stand for these records.
    shutil.copy(str(a) + ".state", str(b) + ".state")
    got, covered = _probe(pums, b, key)
    assert covered == 0 and got == replayed
    # A tampered checkpoint (one byte flipped) is never unpickled.
    raw = bytearray(open(str(a) + ".state", "rb").read())
    raw[-10] ^= 1
    open(str(b) + ".state", "wb").write(bytes(raw))
    got, covered = _probe(pums, b, key)
    assert covered == 0 and got == replayed


def test_in_memory_ledgers_get_no_checkpoint(pums) -> None:  # type: ignore[no-untyped-def]
    df, schema = pums
    with dpgate.Gateway(df, schema, budget=1.0) as gw:
        assert _checkpoint.path_for(gw.ledger) is None


def test_a_loaded_checkpoint_is_a_private_copy(pums, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The state is mapped from the file copy-on-write: a gateway that goes on releasing
    writes into its arrays without changing the file, and a truncated file is replayed."""
    key = os.urandom(32)
    path = tmp_path / "l.db"
    _build(pums, path, key)
    state = str(path) + ".state"
    before = open(state, "rb").read()
    df, schema = pums
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dpgate.Warning)
        gw = dpgate.Gateway(df, schema, budget=100.0, ledger=str(path), ledger_key=key, seed=3)
        try:
            for sql, acc in STATEMENTS:
                gw.query(sql, accuracy=acc / 3, confidence=0.95)  # fresh releases: in-place updates
            assert open(state, "rb").read() == before
        finally:
            gw._ledger.close()
    replayed, _ = _probe(pums, path, key)
    os.unlink(state)
    replayed_without, covered = _probe(pums, path, key)
    assert covered == 0 and replayed_without == replayed
    open(state, "wb").write(before[: len(before) // 2])
    got, covered = _probe(pums, path, key)
    assert covered == 0 and got == replayed


def test_the_chunked_mac_covers_every_byte_and_the_length(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The checkpoint's MAC is computed per chunk in parallel: flipping a byte in any chunk
    (first, boundary, last), truncating or extending the region changes it; another key too."""
    monkeypatch.setattr(_checkpoint, "_MAC_CHUNK", 1000)
    key = os.urandom(32)
    data = bytes(os.urandom(5500))
    mac = _checkpoint._region_mac(key, memoryview(data))
    assert _checkpoint._region_mac(key, memoryview(data)) == mac
    for at in (0, 999, 1000, 2500, 5499):
        flipped = bytearray(data)
        flipped[at] ^= 1
        assert _checkpoint._region_mac(key, memoryview(bytes(flipped))) != mac
    assert _checkpoint._region_mac(key, memoryview(data[:5000])) != mac
    assert _checkpoint._region_mac(key, memoryview(data + bytes(1))) != mac
    assert _checkpoint._region_mac(os.urandom(32), memoryview(data)) != mac

"""Issue 13, findings 1, 6 and 7: no data digest in the ledger, tamper evidence, exact losses.

Before the fix (commit 722f926) the ledger stored ``sha256(cube | schema)`` in
clear under the meta key ``fingerprint`` and echoed it in mismatch errors, so
``test_ledger_file_and_errors_hold_no_data_digest`` failed on the file bytes;
every tampering below (DROP TRIGGER + DELETE, truncation to an older copy,
deleting the file) re-opened silently with a fresh budget, so each
``pytest.raises(LedgerError)`` failed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
from fractions import Fraction
from pathlib import Path

import pandas as pd
import pytest

import dpgate
from dpgate.datasets import load_pums
from dpgate.errors import InvalidArgument, LedgerError
from dpgate.ledger.core import Ledger
from dpgate.release.cube import Cube
from dpgate.release.noise import NoiseSource, SeededNoise, lattice_for, release

FP = "sha256:data+schema"
SQL = "SELECT COUNT(*) FROM pums WHERE age < 30"


def fields(cost_after: float = 0.125) -> dict[str, object]:
    return dict(kind="query", table="pums", query='{"w":[1,0]}', sql="SELECT 1", alpha=0.125,
                sensitivity=1.0, scale=8.0, lattice=2.0**-7, noise="discrete_laplace", value=41.5,
                cost_after=cost_after, secure=True)  # fmt: skip


def spend(led: Ledger, n: int) -> None:
    for _ in range(n):
        with led.transaction() as tx:
            tx.append(**fields(0.125 * (len(tx.records()) + 1)))


@pytest.fixture(scope="module")
def pums() -> tuple[pd.DataFrame, dpgate.Schema]:
    df, schema = load_pums()
    return df.head(500), schema


def unkeyed_digests(df: pd.DataFrame, schema: dpgate.Schema) -> list[str]:
    """What the old code stored: anything computable from the data without the key."""
    with Cube(df, schema) as cube:
        cube_fp = cube.fingerprint()
    both = hashlib.sha256(f"{cube_fp}|{schema.fingerprint()}".encode()).hexdigest()
    return [cube_fp, both]


# ----------------------------------------------------------------------------- finding 1


def test_ledger_file_and_errors_hold_no_data_digest(tmp_path: Path, pums) -> None:
    df, schema = pums
    path = tmp_path / "l.db"
    with dpgate.Gateway(df, schema, budget=1.0, ledger=path, seed=0) as gw:
        gw.query(SQL, accuracy=50)
    blobs = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
    messages = []
    other = df.copy()
    other.loc[other.index[0], "age"] = (other["age"].iloc[0] + 1) % 90
    with pytest.raises(LedgerError) as err:
        dpgate.Gateway(other, schema, budget=1.0, ledger=path)
    messages.append(str(err.value))
    assert "different data source" in messages[0]
    with pytest.raises(LedgerError) as err:
        dpgate.Gateway(df, schema, budget=2.0, ledger=path)
    messages.append(str(err.value))
    for digest in unkeyed_digests(df, schema) + unkeyed_digests(other, schema):
        assert digest.encode() not in blobs
        assert all(digest not in m for m in messages)
    with Ledger.open_existing(path) as audit:
        assert all(d not in repr(audit.meta) + repr(audit) for d in unkeyed_digests(df, schema))


def test_key_file_is_private_and_checked(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    Ledger.open(path, fingerprint=FP, budget=1.0).close()
    key = Path(f"{path}.key")
    assert key.stat().st_mode & 0o777 == 0o600
    os.chmod(key, 0o644)
    with pytest.raises(LedgerError, match="owner only"):
        Ledger.open(path, fingerprint=FP, budget=1.0)
    os.chmod(key, 0o600)
    Ledger.open(path, fingerprint=FP, budget=1.0).close()
    # The same fingerprint under another key is another binding: nothing about the data is portable.
    other = tmp_path / "m.db"
    with Ledger.open(path, fingerprint=FP, budget=1.0) as a, Ledger.open(other, fingerprint=FP, budget=1.0) as b:
        assert a.binding != b.binding


def test_operator_key_and_audit_without_key(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    secret = os.urandom(32)
    with Ledger.open(path, fingerprint=FP, budget=1.0, key=secret) as led:
        spend(led, 2)
        records = led.records()
    assert not Path(f"{path}.key").exists()
    with pytest.raises(LedgerError, match="key file"):
        Ledger.open(path, fingerprint=FP, budget=1.0)  # no default key: cannot check the binding
    with pytest.raises(LedgerError, match="different data source"):
        Ledger.open(path, fingerprint=FP, budget=1.0, key=os.urandom(32))
    with Ledger.open_existing(path) as audit:  # audit tools read without the key
        assert audit.records() == records
        with pytest.raises(LedgerError, match="without its key"):
            audit.transaction().__enter__()
    with pytest.raises(InvalidArgument):
        Ledger.open(path, fingerprint=FP, budget=1.0, key=b"short")


def test_in_memory_ledgers_use_fresh_keys() -> None:
    with Ledger.open(None, fingerprint=FP, budget=1.0) as a, Ledger.open(None, fingerprint=FP, budget=1.0) as b:
        assert a.binding != b.binding and FP not in a.binding


# ----------------------------------------------------------------------------- finding 6


def test_drop_trigger_and_delete_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    with Ledger.open(path, fingerprint=FP, budget=1.0) as led:
        spend(led, 3)
    with sqlite3.connect(path) as c:
        c.execute("DROP TRIGGER dpgate_records_no_delete")
        c.execute("DELETE FROM dpgate_records WHERE id = 2")
    with pytest.raises(LedgerError, match="integrity check") as err:
        Ledger.open(path, fingerprint=FP, budget=1.0)
    assert "new=True" in str(err.value)


def test_deleting_the_last_records_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    with Ledger.open(path, fingerprint=FP, budget=1.0) as led:
        spend(led, 3)
    with sqlite3.connect(path) as c:
        c.execute("DROP TRIGGER dpgate_records_no_delete")
        c.execute("DELETE FROM dpgate_records WHERE id > 1")
    with pytest.raises(LedgerError, match="behind its anchor"):
        Ledger.open(path, fingerprint=FP, budget=1.0)


def test_editing_a_record_or_the_budget_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    with Ledger.open(path, fingerprint=FP, budget=1.0) as led:
        spend(led, 2)
    copy = tmp_path / "copy.db"
    shutil.copy(path, copy)
    shutil.copy(f"{path}.key", f"{copy}.key")
    shutil.copy(f"{path}.anchor", f"{copy}.anchor")
    with sqlite3.connect(path) as c:
        c.execute("DROP TRIGGER dpgate_records_no_update")
        c.execute("UPDATE dpgate_records SET alpha = 0.0 WHERE id = 1")
    with pytest.raises(LedgerError, match="integrity check"):
        Ledger.open(path, fingerprint=FP, budget=1.0)
    with sqlite3.connect(copy) as c:
        c.execute("DROP TRIGGER dpgate_meta_no_update")
        c.execute("UPDATE dpgate_meta SET value = '2.0' WHERE key = 'budget'")
    with pytest.raises(LedgerError, match="header"):
        Ledger.open(copy, fingerprint=FP, budget=2.0)


def test_records_edited_under_an_open_ledger_are_never_read_back(tmp_path: Path) -> None:
    """A record is read and verified once per process: an edit made afterwards (the head left
    alone) is never returned, while the next process's open finds it."""
    path = tmp_path / "l.db"
    with Ledger.open(path, fingerprint=FP, budget=1.0) as led:
        spend(led, 3)
        before = led.records()
        assert [r.alpha for r in before] == [0.125] * 3
        with sqlite3.connect(path) as c:
            c.execute("DROP TRIGGER dpgate_records_no_update")
            c.execute("UPDATE dpgate_records SET alpha = 0.0 WHERE id = 1")
        assert led.records() == before and led.records(since=1) == before[1:]
        spend(led, 1)  # the chain goes on from the verified head
        assert led.records()[:3] == before and len(led.records()) == 4
        assert led.chain_mac(4) is not None and led.chain_mac(5) is None
    with pytest.raises(LedgerError, match="integrity check"):
        Ledger.open(path, fingerprint=FP, budget=1.0)


def test_restoring_an_older_copy_is_detected(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    with Ledger.open(path, fingerprint=FP, budget=1.0) as led:
        spend(led, 1)
        led.store.connection().execute("PRAGMA wal_checkpoint(TRUNCATE)")
        old = path.read_bytes()
        spend(led, 3)
    for sidecar in ("-wal", "-shm"):
        Path(f"{path}{sidecar}").unlink(missing_ok=True)
    path.write_bytes(old)
    with pytest.raises(LedgerError, match="behind its anchor"):
        Ledger.open(path, fingerprint=FP, budget=1.0)


def test_deleted_ledger_needs_an_explicit_new_one(tmp_path: Path, pums) -> None:
    df, schema = pums
    path = tmp_path / "l.db"
    with dpgate.Gateway(df, schema, budget=1.0, ledger=path, seed=0) as gw:
        gw.query(SQL, accuracy=50)
        spent = gw.spent
        for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
            p.unlink(missing_ok=True)
        # The running gateway notices that its file is gone ...
        with pytest.raises(LedgerError, match="deleted or replaced"):
            gw.query("SELECT COUNT(*) FROM pums WHERE age >= 30", accuracy=50)
    # ... and a new process is refused a fresh budget unless it asks for one.
    with pytest.raises(LedgerError, match="new_ledger=True"):
        dpgate.Gateway(df, schema, budget=1.0, ledger=path)
    with dpgate.Gateway(df, schema, budget=1.0, ledger=path, new_ledger=True) as gw:
        assert gw.spent == 0.0 < spent
    with pytest.raises(LedgerError, match="new=True starts a ledger where none exists"):
        Ledger.open(path, fingerprint=FP, budget=1.0, new=True)


def test_crash_between_commit_and_anchor_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    with Ledger.open(path, fingerprint=FP, budget=1.0) as led:
        spend(led, 1)
        anchor = Path(f"{path}.anchor").read_bytes()
        spend(led, 2)
    Path(f"{path}.anchor").write_bytes(anchor)  # as if the process died before the anchor write
    with Ledger.open(path, fingerprint=FP, budget=1.0) as led:
        assert len(led.records()) == 3
        spend(led, 1)
    with Ledger.open(path, fingerprint=FP, budget=1.0) as led:
        assert len(led.records()) == 4


def test_missing_anchor_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    with Ledger.open(path, fingerprint=FP, budget=1.0) as led:
        spend(led, 1)
    Path(f"{path}.anchor").unlink()
    with pytest.raises(LedgerError, match="anchor .* is missing"):
        Ledger.open(path, fingerprint=FP, budget=1.0)


# ----------------------------------------------------------------------------- finding 7 (noise)


class _Recording(NoiseSource):
    def __init__(self) -> None:
        self.inner, self.secure, self.ts = SeededNoise(0), False, []

    def discrete_laplace(self, t: float) -> int:
        self.ts.append(t)
        return self.inner.discrete_laplace(t)


@pytest.mark.parametrize("den", [3, 7, 10, 49, 1000003])
@pytest.mark.parametrize("alpha", [1.0, 0.1, 3e-16, 0.7])
def test_rounded_sensitivity_never_lets_the_loss_exceed_alpha(den: int, alpha: float) -> None:
    """A gateway passes S = max|num|/d as a float, which can lie below the true S.

    On 722f926, t was computed from that rounded S, so the realised loss
    ``max|num|·2^k / t`` exceeded α by an ulp for some (d, α) (e.g. d = 3: float(1/3)·3 < 1).
    """
    for num_max in (1, 2, den - 1):
        src = _Recording()
        release(5, den, num_max / den, alpha, src)
        _, mult = lattice_for(num_max / den / alpha, den)
        assert Fraction(num_max * mult) / Fraction(src.ts[0]) <= Fraction(alpha)


@pytest.mark.parametrize("keep", [0, 4096, 8192])
def test_truncated_ledger_file_is_refused(tmp_path: Path, keep: int) -> None:
    path = tmp_path / "l.db"
    with Ledger.open(path, fingerprint=FP, budget=1.0) as led:
        spend(led, 3)
        led.store.connection().execute("PRAGMA wal_checkpoint(TRUNCATE)")
    for sidecar in ("-wal", "-shm"):
        Path(f"{path}{sidecar}").unlink(missing_ok=True)
    with open(path, "r+b") as f:
        f.truncate(keep)
    with pytest.raises(LedgerError):
        with Ledger.open(path, fingerprint=FP, budget=1.0) as led:
            led.records()

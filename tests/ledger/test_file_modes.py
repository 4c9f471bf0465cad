"""Every file a ledger creates is owner-only (mode 0o600), whatever the process's umask (issue 27)."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

import dpgate
from dpgate.datasets import load_pums


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The most permissive umask: files get exactly the mode they are created with."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_ledger_key_anchor_lock_wal_and_state_files_are_0600(tmp_path: Path, open_umask: None) -> None:
    df, schema = load_pums()
    where = tmp_path / "ledger.db"
    with dpgate.Gateway(df, schema, budget=1.0, ledger=str(where), seed=1) as gw:
        for k in range(70):  # enough records for a checkpoint (.state) on the next opening
            gw.release_measurements("pums", [(gw.compile(f"SELECT COUNT(*) FROM pums WHERE age = {k}").queries[0],
                                              0.001)])
    with dpgate.Gateway(df, schema, budget=1.0, ledger=str(where), seed=1) as gw:
        assert gw.spent > 0
        made = sorted(p.name for p in tmp_path.iterdir())
        assert {"ledger.db", "ledger.db.key", "ledger.db.anchor", "ledger.db.state", "ledger.db-lock"} <= set(made)
        for name in made:
            assert _mode(tmp_path / name) == 0o600, f"{name} has mode {oct(_mode(tmp_path / name))}"

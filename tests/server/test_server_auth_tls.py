"""``dpgate serve``: unknown names look like known ones to a SCRAM probe, and TLS is required off
loopback (issue 27), with real servers and clients."""

from __future__ import annotations

import base64
import logging
import socket
import struct
import subprocess
from pathlib import Path

import psycopg  # the test extra: a missing client fails, never skips
import pytest
from _dpserve import dsn, thread_server


def _message(sock: socket.socket) -> tuple[bytes, bytes]:
    head = b""
    while len(head) < 5:
        head += sock.recv(5 - len(head))
    kind, size = head[:1], struct.unpack("!i", head[1:])[0]
    body = b""
    while len(body) < size - 4:
        body += sock.recv(size - 4 - len(body))
    return kind, body


def _server_first(port: int, user: str) -> dict[str, str]:
    """Start a SCRAM exchange as ``user`` and return the server-first message's attributes."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        params = b"user\x00" + user.encode() + b"\x00database\x00pums\x00\x00"
        sock.sendall(struct.pack("!ii", 8 + len(params), 196608) + params)
        kind, body = _message(sock)
        assert kind == b"R" and struct.unpack("!i", body[:4])[0] == 10 and b"SCRAM-SHA-256" in body
        first = b"n,,n=,r=" + base64.b64encode(b"client-nonce-123")
        payload = b"SCRAM-SHA-256\x00" + struct.pack("!i", len(first)) + first
        sock.sendall(b"p" + struct.pack("!i", 4 + len(payload)) + payload)
        kind, body = _message(sock)
        assert kind == b"R" and struct.unpack("!i", body[:4])[0] == 11
        return dict(part.split("=", 1) for part in body[4:].decode().split(","))


def test_unknown_names_get_a_stable_salt_and_the_known_iteration_count(tmp_path: Path) -> None:
    with thread_server(tmp_path) as s:
        alice = [_server_first(s.port, "alice") for _ in range(2)]
        mallory = [_server_first(s.port, "mallory") for _ in range(2)]
        trent = _server_first(s.port, "trent")
        assert alice[0]["s"] == alice[1]["s"]  # a known user's salt never changes …
        assert mallory[0]["s"] == mallory[1]["s"]  # … nor, now, an unknown one's
        assert len({alice[0]["s"], mallory[0]["s"], trent["s"]}) == 3
        assert len(base64.b64decode(mallory[0]["s"])) == len(base64.b64decode(alice[0]["s"])) == 16
        assert mallory[0]["i"] == trent["i"] == alice[0]["i"]
        gateway_key = s.gateway.ledger.provenance_key()
    with thread_server(tmp_path) as s:  # the same ledger key: the same decoy salt after a restart
        assert s.gateway.ledger.provenance_key() == gateway_key
        assert _server_first(s.port, "mallory")["s"] == mallory[0]["s"]
        with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
            psycopg.connect(dsn(s.port, "alice", password="mallory"))


def _self_signed(tmp: Path) -> tuple[str, str]:
    cert, key = tmp / "cert.pem", tmp / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"], check=True, capture_output=True)
    return str(cert), str(key)


def test_tls_required_refuses_clients_in_the_clear(tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    for options in ({"require_tls": True}, {"host": "0.0.0.0"}):  # explicit; the default off loopback
        with thread_server(tmp_path, tls_cert=cert, tls_key=key, **options) as s:
            with pytest.raises(psycopg.OperationalError, match="requires TLS: connect with sslmode=require"):
                psycopg.connect(dsn(s.port, sslmode="disable"))
            with psycopg.connect(dsn(s.port, sslmode="require")) as con:
                assert con.pgconn.ssl_in_use and con.execute("SELECT COUNT(*) FROM pums").fetchone()[0] > 0
    with thread_server(tmp_path, tls_cert=cert, tls_key=key) as s:  # loopback: TLS offered, not required
        with psycopg.connect(dsn(s.port, sslmode="disable")) as con:
            assert not con.pgconn.ssl_in_use


def test_require_tls_needs_a_certificate_and_opting_out_warns(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    for options in ({"require_tls": True}, {"host": "0.0.0.0"}):
        with pytest.raises(ValueError, match="without TLS.*--tls-cert and --tls-key"):
            with thread_server(tmp_path, **options):
                pass
    with caplog.at_level(logging.WARNING, logger="dpgate.server"):
        with thread_server(tmp_path, host="0.0.0.0", require_tls=False, allow_insecure_password=True) as s:
            with psycopg.connect(dsn(s.port, sslmode="disable")) as con:
                assert con.execute("SELECT 1").fetchone() == (1,)
    assert any("TLS is not required on 0.0.0.0" in r.getMessage() for r in caplog.records)

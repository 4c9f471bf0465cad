"""``dpgate serve`` before authentication: strangers can neither stall it nor bloat it.

Hostile sockets against a live server (real TCP, time-bounded): short cancel and
SSL requests, huge length fields, a client dripping one byte at a time past the
authentication deadline, full slots, one analyst's many connections, idle
sessions; and a flood of 200 strangers measured from outside (the server's RSS
and thread count from /proc) while a well-behaved psycopg client keeps working.
"""

from __future__ import annotations

import socket
import ssl
import statistics
import struct
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psycopg
import pytest
from _dpserve import dsn, spawn_server, thread_server, users_file

from dpgate.server import _protocol as pq
from dpgate.server._admission import EVICT_AFTER

QUERY = "SELECT COUNT(*) FROM pums WHERE age < 30"


def _startup(user: str = "alice") -> bytes:
    body = struct.pack("!i", pq.PROTOCOL_V3) + f"user\x00{user}\x00database\x00pums\x00\x00".encode()
    return struct.pack("!i", len(body) + 4) + body


def _read_until_closed(sock: socket.socket, limit: float = 5.0) -> tuple[bytes, float]:
    """Everything the server sends until it closes the socket, and how long that took."""
    start, got = time.monotonic(), b""
    sock.settimeout(limit)
    try:
        while chunk := sock.recv(4096):
            got += chunk
    except (ConnectionResetError, TimeoutError, ssl.SSLError):
        pass
    return got, time.monotonic() - start


def _connect(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=5)


def test_slots_count_from_accept_evict_the_oldest_stale_stranger_and_limit_each_analyst(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from dpgate.server import _admission

    now = [100.0]
    monkeypatch.setattr(_admission.time, "monotonic", lambda: now[0])
    slots = _admission.Slots(max_connections=3, max_per_analyst=2, auth_timeout=60)
    a, b, c = (slots.admit(-1) for _ in range(3))  # fd -1: eviction's shutdown fails quietly
    assert a and b and c and a.deadline == 160 and len(slots) == 3
    assert slots.admit(-1) is None  # full, and nobody has been authenticating for EVICT_AFTER yet
    assert slots.authenticated(a, "alice") is None and slots.authenticated(b, "alice") is None
    assert "max_connections_per_analyst = 2" in (slots.authenticated(c, "alice") or "")
    now[0] += EVICT_AFTER
    d = slots.admit(-1)  # c is the only stranger: it loses its slot
    assert d is not None and c.evicted and not a.evicted and len(slots) == 3
    assert "too many clients" in (slots.authenticated(c, "bob") or "")
    slots.authenticated(d, "bob")
    assert slots.admit(-1) is None  # every slot authenticated
    slots.release(a)
    slots.release(a)  # idempotent
    assert len(slots) == 2 and slots.admit(-1) is not None


def test_malformed_startup_packets_are_closed_without_a_traceback(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    with thread_server(tmp_path) as s:
        hostile = [
            struct.pack("!iih", 10, pq.CANCEL_REQUEST, 7),  # a cancel request 6 bytes short
            struct.pack("!ii", 8, pq.CANCEL_REQUEST),  # no pid, no key
            struct.pack("!iii", 12, pq.SSL_REQUEST, 0),  # an SSLRequest with a payload
            struct.pack("!iii", 12, pq.GSSENC_REQUEST, 0),
            struct.pack("!ii", 4, pq.PROTOCOL_V3),  # shorter than its own header
            struct.pack("!ii", pq.MAX_STARTUP + 1, pq.PROTOCOL_V3) + b"x" * 1000,  # over the 8 KiB cap
            struct.pack("!ii", 0x7FFFFFFF, pq.PROTOCOL_V3),
        ]
        for packet in hostile:
            with _connect(s.port) as sock:
                sock.sendall(packet)
                reply, took = _read_until_closed(sock)
                assert took < 2 and (reply == b"" or reply[:1] == b"E"), (packet, reply)
        with _connect(s.port) as sock:  # a 1 GiB SASL message after a valid startup: refused at its length
            sock.sendall(_startup())
            assert sock.recv(4096)[:1] == b"R"  # AuthenticationSASL
            sock.sendall(b"p" + struct.pack("!i", 1 << 30) + b"n,,n=," * 100)
            reply, took = _read_until_closed(sock)
            assert took < 2 and b"08P01" in reply and b"invalid message length" in reply
        with psycopg.connect(dsn(s.port), autocommit=True) as conn:  # the server goes on
            assert conn.execute("SELECT 1").fetchone() == (1,)
    assert "Traceback" not in capfd.readouterr().err
    assert not [r for r in caplog.records if r.exc_info]


def test_the_authentication_deadline_is_absolute(tmp_path: Path) -> None:
    with thread_server(tmp_path, auth_timeout=1.5) as s, _connect(s.port) as sock:
        start, packet, closed = time.monotonic(), _startup(), False
        for byte in packet:  # one byte every 0.3 s: each arrives well within any per-read timeout
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            time.sleep(0.3)
            if time.monotonic() - start > 4:
                break
        if not closed:
            _read_until_closed(sock, 3)
        assert time.monotonic() - start < 2.5
        deadline = time.monotonic() + 3
        while s.open_connections and time.monotonic() < deadline:
            time.sleep(0.02)
        assert s.open_connections == 0


def test_the_deadline_covers_the_tls_handshake_and_a_second_ssl_request_is_closed(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1"], check=True, capture_output=True)
    with thread_server(tmp_path, tls_cert=str(cert), tls_key=str(key), auth_timeout=1.0) as s:
        with _connect(s.port) as sock:  # accepts TLS, then drips half a ClientHello
            sock.sendall(struct.pack("!ii", 8, pq.SSL_REQUEST))
            assert sock.recv(1) == b"S"
            start = time.monotonic()
            for byte in b"\x16\x03\x01\x02\x00\x01":
                try:
                    sock.sendall(bytes([byte]))
                except OSError:
                    break
                time.sleep(0.3)
            _read_until_closed(sock, 3)
            assert time.monotonic() - start < 2.0
        context = ssl.create_default_context()
        context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
        with _connect(s.port) as sock:
            sock.sendall(struct.pack("!ii", 8, pq.SSL_REQUEST))
            assert sock.recv(1) == b"S"
            with context.wrap_socket(sock) as tls:
                tls.sendall(struct.pack("!ii", 8, pq.SSL_REQUEST))  # again, inside TLS
                reply, took = _read_until_closed(tls, 3)
                assert reply == b"" and took < 1


def test_a_full_server_gives_a_stale_strangers_slot_to_an_analyst(tmp_path: Path) -> None:
    with thread_server(tmp_path, max_connections=3) as s:
        strangers = [_connect(s.port) for _ in range(3)]
        try:
            late = _connect(s.port)  # all three slots are young: refused, nothing read
            reply, took = _read_until_closed(late)
            assert took < 1 and b"53300" in reply and b"too many clients" in reply
            time.sleep(EVICT_AFTER + 0.2)
            with psycopg.connect(dsn(s.port, sslmode="disable"), autocommit=True) as conn:
                assert conn.execute("SELECT 1").fetchone() == (1,)
                reply, took = _read_until_closed(strangers[0], 1)  # the oldest stranger lost its slot
                assert reply == b"" and took < 1
                assert s.open_connections == 3
        finally:
            for sock in strangers:
                sock.close()


def test_one_analyst_cannot_take_every_slot(tmp_path: Path) -> None:
    with thread_server(tmp_path, max_connections=8) as s:  # a quarter each: 2
        first, second = (psycopg.connect(dsn(s.port), autocommit=True) for _ in range(2))
        with first, second:
            with pytest.raises(psycopg.OperationalError, match='too many connections for analyst "alice"'):
                psycopg.connect(dsn(s.port))
            with psycopg.connect(dsn(s.port, "bob"), autocommit=True) as bob:
                assert bob.execute("SELECT 1").fetchone() == (1,)
    (tmp_path / "one").mkdir()
    with thread_server(tmp_path / "one", max_connections=8, max_connections_per_analyst=1) as s:
        with psycopg.connect(dsn(s.port), autocommit=True), pytest.raises(psycopg.OperationalError,
                                                                          match="max_connections_per_analyst = 1"):
            psycopg.connect(dsn(s.port))


def test_idle_sessions_are_closed_after_the_idle_timeout(tmp_path: Path) -> None:
    with thread_server(tmp_path, idle_timeout=0.5) as s:
        with psycopg.connect(dsn(s.port), autocommit=True) as conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)
            time.sleep(1.0)
            with pytest.raises(psycopg.OperationalError, match="idle-session timeout"):
                conn.execute("SELECT 1")
        deadline = time.monotonic() + 3
        while s.open_connections and time.monotonic() < deadline:
            time.sleep(0.02)
        assert s.open_connections == 0


# -- the flood ----------------------------------------------------------------------------------
MAX_CONNECTIONS, AUTH_TIMEOUT, STRANGERS = 64, 4.0, 200


def _proc_status(pid: int) -> tuple[float, int]:
    """(RSS in MiB, thread count) of process ``pid``."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["Threads"])


def _timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


class _Flood:
    """200 strangers: a third silent, a third dripping one byte a second, a third announcing a huge message."""

    def __init__(self, port: int) -> None:
        self.port, self.stop = port, threading.Event()
        self.silent: list[socket.socket] = []
        self.drip: list[socket.socket] = []
        self.refused = self.huge_refused = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        for i in range(STRANGERS):
            try:
                sock = socket.create_connection(("127.0.0.1", self.port), timeout=2)
            except OSError:
                self.refused += 1
                continue
            kind = i % 3
            if kind == 2:  # a 1 GiB startup packet, then as much of it as the server takes
                try:
                    sock.sendall(struct.pack("!ii", 1 << 30, pq.PROTOCOL_V3) + b"\0" * 65536)
                except OSError:
                    pass
                self.huge_refused += _read_until_closed(sock, 2)[1] < 2
                sock.close()
            else:
                (self.silent if kind == 0 else self.drip).append(sock)
        packet = _startup()
        for tick in range(60):
            if self.stop.wait(1.0):
                return
            for sock in self.drip:
                try:
                    sock.send(packet[tick % len(packet):][:1])
                except OSError:
                    pass

    def still_open(self) -> int:
        """Strangers the server has not closed yet (a refused one got 53300 and EOF)."""
        n = 0
        for sock in self.silent + self.drip:
            sock.setblocking(False)
            try:
                while chunk := sock.recv(4096):
                    del chunk
            except BlockingIOError:
                n += 1
            except OSError:
                pass
        return n


def test_a_flood_of_strangers_neither_stalls_nor_bloats_the_server(tmp_path: Path, record_property) -> None:
    users_file(tmp_path, {"alice": 0.5, "bob": 0.5, "carol": 0.0})
    proc, port = spawn_server(tmp_path, extra=("--max-connections", str(MAX_CONNECTIONS),
                                               "--auth-timeout", str(AUTH_TIMEOUT)))
    assert proc.stderr is not None
    log_lines: list[str] = []  # drained: a full pipe would block the server's logging
    threading.Thread(target=lambda: log_lines.extend(proc.stderr or ()), daemon=True).start()
    samples: list[tuple[float, int]] = []
    flood = _Flood(port)
    fresh_threads = _proc_status(proc.pid)[1]  # before any connection
    try:
        conn = psycopg.connect(dsn(port, sslmode="disable"), autocommit=True)
        conn.execute(QUERY)  # released once; every later run is answered from history

        def connect_and_query() -> None:
            with psycopg.connect(dsn(port, "bob", sslmode="disable"), autocommit=True) as c:
                c.execute(QUERY).fetchone()

        for _ in range(5):
            conn.execute(QUERY).fetchone()
        base_query = statistics.median(_timed(lambda: conn.execute(QUERY).fetchone()) for _ in range(40))
        base_connect = statistics.median(_timed(connect_and_query) for _ in range(5))
        base_rss, base_threads = _proc_status(proc.pid)

        stop_sampling = threading.Event()

        def sample() -> None:
            while not stop_sampling.wait(0.05):
                samples.append(_proc_status(proc.pid))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        started = time.monotonic()
        flood.thread.start()
        time.sleep(EVICT_AFTER + 0.3)  # the strangers hold every slot, all older than EVICT_AFTER
        holding = flood.still_open()
        strangers_rss, strangers_threads = _proc_status(proc.pid)
        query_times, connect_times, last_connect = [], [], 0.0
        while time.monotonic() - started < AUTH_TIMEOUT + 0.5:
            query_times += [_timed(lambda: conn.execute(QUERY).fetchone()) for _ in range(10)]
            if time.monotonic() - last_connect > 0.2:  # each new connection takes a stranger's slot
                connect_times.append(_timed(connect_and_query))
                last_connect = time.monotonic()
        time.sleep(1.0)  # every stranger is past its deadline now
        after_deadline = flood.still_open()
        flood.stop.set()
        stop_sampling.set()
        sampler.join()
        flood.thread.join(5)
        end_rss, end_threads = _proc_status(proc.pid)
        conn.close()
    finally:
        for sock in flood.silent + flood.drip:
            sock.close()
        proc.terminate()
        proc.wait(30)

    peak_rss, peak_threads = max(r for r, _ in samples), max(t for _, t in samples)
    flood_query, flood_connect = statistics.median(query_times), statistics.median(connect_times)
    figures = {
        "base_rss_mib": round(base_rss, 1), "peak_rss_mib": round(peak_rss, 1), "end_rss_mib": round(end_rss, 1),
        "fresh_threads": fresh_threads, "base_threads": base_threads, "peak_threads": peak_threads, "end_threads": end_threads,
        "query_ms_base": round(base_query * 1e3, 2), "query_ms_flood": round(flood_query * 1e3, 2),
        "connect_ms_base": round(base_connect * 1e3, 1), "connect_ms_flood": round(flood_connect * 1e3, 1),
        "strangers_holding_slots": holding, "strangers_rss_mib": round(strangers_rss, 1),
        "strangers_threads": strangers_threads, "refused_at_connect": flood.refused, "strangers_open_after_deadline": after_deadline,
        "huge_refused_fast": flood.huge_refused, "connects_during_flood": len(connect_times),
    }
    assert not [line for line in log_lines if "Traceback" in line], log_lines
    for k, v in figures.items():
        record_property(k, v)
    print("flood figures:", figures)
    # one thread per slot (kept for reuse), none per refused stranger; +2: evicted ones still finishing
    assert peak_threads <= fresh_threads + MAX_CONNECTIONS + 2, figures
    assert strangers_rss - base_rss < 16, figures  # MiB: at most 8 KiB buffered per stranger, plus thread stacks
    assert peak_rss - base_rss < 32, figures  # with the analyst's sessions opened meanwhile
    assert MAX_CONNECTIONS // 2 < holding <= MAX_CONNECTIONS and after_deadline == 0, figures
    assert flood.huge_refused >= STRANGERS // 3 - flood.refused, figures
    assert flood_query <= 2 * base_query + 0.002, figures  # 2 ms of slack: two cores shared with other jobs
    assert flood_connect <= 2 * base_connect + 0.01, figures

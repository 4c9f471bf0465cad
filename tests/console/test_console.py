"""``dpgate console`` in a real browser: Debian's headless Chromium driven by selenium (chromium-driver).

The module builds a ledger with a real :class:`dpgate.Gateway` over PUMS, three analysts charged
through dpgate's provenance (as ``dpgate serve`` charges them: :mod:`dpgate.ledger._provenance`),
starts the console (uvicorn in a thread, on a free loopback port, with a token) and checks each
page's numbers — read back from the chart's embedded specification and the rendered SVG — against
the gateway's own (``gw.spent``, ``gw.history``, the analysts' verified charges).  Screenshots go
to the pytest tmp dir.  The browser tests fail, never skip, when Chromium or its driver is missing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from _chromium import chromium
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

import dpgate
import dpgate.console
from dpgate.cli import main
from dpgate.console import ConsoleAccessError, LedgerReader, check_access, create_app
from dpgate.datasets import load_pums
from dpgate.ledger import _provenance
from dpgate.server import add_user

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "console-test-token-0123456789"
CAPS = {"alice": 2.0, "bob": 1.0, "carol": 0.5}
STATEMENTS = [
    ("alice", "SELECT COUNT(*) FROM pums WHERE age < 30"),
    ("alice", "SELECT sex, COUNT(*) FROM pums GROUP BY sex"),
    ("bob", "SELECT COUNT(*) FROM pums WHERE age < 30"),  # alice released it: free for bob
    ("bob", "SELECT COUNT(*) FROM pums WHERE age >= 30 AND sex = '1'"),
    ("carol", "SELECT race, COUNT(*) FROM pums GROUP BY race"),
    ("carol", "SELECT sex, COUNT(*) FROM pums GROUP BY sex"),  # free for carol too
]


def _as_analyst(gw: dpgate.Gateway, analyst: str, sql: str) -> None:
    """Answer ``sql`` for ``analyst`` as ``dpgate serve`` does: charged in the release's transaction,
    the delivery recorded after."""
    digest = _provenance.statement_hash(sql)
    with _provenance.charging(gw.ledger, analyst, CAPS[analyst], digest, gw.schema) as mine:
        result = gw.query(sql, accuracy=25)
    sources = {a.source for a in result.answers}
    _provenance.record_delivery(gw.ledger, analyst, digest, next(iter(sources)) if len(sources) == 1 else "mixed",
                                float(sum(mine)))


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dpgate.Gateway, Path, Path]]:
    """The gateway (for its own numbers), its ledger file and the users file with the caps."""
    tmp = tmp_path_factory.mktemp("console")
    users = tmp / "users.yaml"
    for name, cap in CAPS.items():
        add_user(users, name, f"{name}-password", cap)
    df, schema = load_pums()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dpgate.Warning)
        gw = dpgate.Gateway(df, schema, budget=5.0, ledger=str(tmp / "ledger.db"), seed=3)
    _provenance.ensure_table(gw.ledger)
    for analyst, sql in STATEMENTS:
        _as_analyst(gw, analyst, sql)
    yield gw, tmp / "ledger.db", users
    gw.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def console(built: tuple[dpgate.Gateway, Path, Path]) -> Iterator[str]:
    """The console's base URL (uvicorn in a thread, with the token), over the built ledger."""
    gw, ledger, users = built
    from dpgate.console._serve import reader_for

    reader = reader_for(str(ledger), schema_path=str(ROOT / "dpgate" / "data" / "pums.yaml"), users_path=str(users))
    with _serving(reader) as base:
        yield base


@contextlib.contextmanager
def _serving(reader: Any) -> Iterator[str]:
    """The console over ``reader`` (uvicorn in a thread, with the token): its base URL; closes ``reader``."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(reader, TOKEN), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 20
        while not server.started:
            assert time.monotonic() < deadline, "the console did not start"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(10)
        sock.close()
        reader.close()


@pytest.fixture(scope="module")
def browser(console: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """Headless Chromium, logged in to the console (``?token=`` once: the console sets its cookie)."""
    driver = chromium(browser_log=True)  # CSP violations, script errors
    driver.set_page_load_timeout(30)
    driver.shots = tmp_path_factory.mktemp("screenshots")  # type: ignore[attr-defined]
    try:
        driver.get(f"{console}/?token={TOKEN}")
        assert "token" not in driver.current_url  # the redirect dropped it from the address
        yield driver
    finally:
        driver.quit()


def _open(driver: Any, url: str, charts: int, shot: str) -> None:
    """Load ``url`` and wait until its ``charts`` charts are drawn; save a screenshot."""
    driver.get(url)
    WebDriverWait(driver, 30).until(lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-rendered")
                                    is not None)
    assert driver.find_element(By.TAG_NAME, "body").get_attribute("data-rendered") == str(charts)
    errors = [e.text for e in driver.find_elements(By.CSS_SELECTOR, ".chart") if "chart error" in e.text]
    assert not errors, errors
    severe = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe  # no script error, nothing the Content-Security-Policy blocked
    driver.save_screenshot(str(driver.shots / f"{shot}.png"))


def _data(driver: Any, name: str) -> list[dict[str, Any]]:
    """The rows of every data set of the chart ``name``'s embedded specification, in order."""
    spec = json.loads(driver.find_element(By.ID, f"spec-{name}").get_attribute("textContent"))
    rows: list[dict[str, Any]] = []
    seen: set[str] = set()
    for layer in [spec, *spec.get("layer", [])]:
        data = layer.get("data", {})
        if "values" in data:
            rows += data["values"]
        elif "name" in data and data["name"] not in seen:
            seen.add(data["name"])
            rows += spec["datasets"][data["name"]]
    return rows


def _marks(driver: Any, name: str, kind: str) -> int:
    """How many marks of ``kind`` (``symbol``, ``rect``, ``rule`` …) the chart ``name`` drew in its SVG."""
    return len(driver.find_elements(By.CSS_SELECTOR, f"#chart-{name} svg g.mark-{kind}.role-mark > *"))


def _spent(gw: dpgate.Gateway, analyst: str) -> float:
    return _provenance.analyst_spent(gw.ledger, analyst, gw.schema)


def test_budget_page_shows_the_gateways_spending(built: Any, browser: Any, console: str) -> None:
    gw, _, _ = built
    _open(browser, f"{console}/", 2, "budget")
    assert browser.find_element(By.ID, "spent").text == f"{gw.spent:.6g}"
    assert browser.find_element(By.ID, "releases").text == str(len(gw.history))
    rows = _data(browser, "budget")
    glob = [r for r in rows if r.get("who") == "global" and "spent" in r]
    assert [r["release"] for r in glob] == gw.history["id"].tolist()
    assert glob[-1]["spent"] == pytest.approx(gw.spent, rel=1e-12)
    for analyst in CAPS:
        mine = [r["spent"] for r in rows if r.get("who") == analyst and "spent" in r]
        assert mine and mine[-1] == pytest.approx(_spent(gw, analyst), rel=1e-9)
    caps = {r["who"]: r["cap"] for r in rows if "cap" in r}
    assert caps == {"global": 5.0, **CAPS}
    assert _marks(browser, "budget", "symbol") == len([r for r in rows if "spent" in r])  # one point per release
    assert _marks(browser, "budget", "rule") == len(caps)
    sources = {(r["analyst"], r["source"]): r["statements"] for r in _data(browser, "sources")}
    assert sources[("bob", "history")] == 1 and sources[("carol", "history")] == 1
    assert sum(sources.values()) == len(STATEMENTS)


def test_cells_pages_recompute_the_accounting(built: Any, browser: Any, console: str) -> None:
    gw, _, _ = built
    _open(browser, f"{console}/cells?table=pums&columns=sex", 1, "cells-bar")
    assert browser.find_element(By.ID, "table-cost").text == f"{gw.spent:.6g}"  # one table, k = 1
    bars = _data(browser, "cells")
    assert max(r["epsilon"] for r in bars) == pytest.approx(gw.spent, rel=1e-12)
    assert [r["sex"] for r in bars][:2] == ["0", "1"]
    assert _marks(browser, "cells", "rect") == len(bars)
    _open(browser, f"{console}/cells?table=pums&columns=age,race", 1, "cells-heatmap")
    cells = _data(browser, "cells")
    assert {r["race"] for r in cells} >= {"1", "6"} and _marks(browser, "cells", "rect") == len(cells)
    # Race 1 … 6 were each counted by carol's GROUP BY: every race cell carries its cost.
    assert max(r["epsilon"] for r in cells) == pytest.approx(gw.spent, rel=1e-12)
    _open(browser, f"{console}/cells?table=pums&columns=age,sex,race", 0, "cells-top")
    top = browser.find_elements(By.CSS_SELECTOR, "#top-cells tbody tr")
    assert top and float(top[0].find_elements(By.TAG_NAME, "td")[-1].text) == pytest.approx(gw.spent, rel=1e-5)


def test_release_history_filters_and_pages(built: Any, browser: Any, console: str) -> None:
    gw, _, _ = built
    history = gw.history
    _open(browser, f"{console}/releases?size=3", 0, "releases")
    assert browser.find_element(By.ID, "matched").text == str(len(history))
    assert browser.find_element(By.ID, "pages").text == str(math.ceil(len(history) / 3))
    first = [int(tr.find_element(By.TAG_NAME, "td").text)
             for tr in browser.find_elements(By.CSS_SELECTOR, "#releases-table tbody tr")]
    assert first == history["id"].tolist()[::-1][:3]
    browser.find_element(By.ID, "next").click()
    WebDriverWait(browser, 10).until(lambda d: d.find_element(By.ID, "page").text == "2")
    second = [int(tr.find_element(By.TAG_NAME, "td").text)
              for tr in browser.find_elements(By.CSS_SELECTOR, "#releases-table tbody tr")]
    assert second == history["id"].tolist()[::-1][3:6]
    # Filter by text through the form, as a person would.
    box = browser.find_element(By.NAME, "q")
    box.clear()
    box.send_keys("GROUP BY race")
    box.submit()
    WebDriverWait(browser, 10).until(lambda d: "q=GROUP" in d.current_url)
    race = history[history["sql"].str.contains("GROUP BY race")]
    assert browser.find_element(By.ID, "matched").text == str(len(race))
    cells = [tr.find_elements(By.TAG_NAME, "td") for tr in browser.find_elements(By.CSS_SELECTOR,
                                                                                  "#releases-table tbody tr")]
    assert {c[2].text for c in cells} == {"carol"}
    by_id = dict(zip(history["id"], history["value"], strict=True))
    for c in cells:
        assert float(c[9].text) == pytest.approx(by_id[int(c[0].text)], rel=1e-5)
    browser.save_screenshot(str(browser.shots / "releases-filtered.png"))
    _open(browser, f"{console}/releases?analyst=bob", 0, "releases-bob")
    assert browser.find_element(By.ID, "matched").text == "1"  # bob's one fresh release


def test_analysts_page(built: Any, browser: Any, console: str) -> None:
    gw, _, _ = built
    _open(browser, f"{console}/analysts", 1, "analysts")
    rows = {tr.find_elements(By.TAG_NAME, "td")[0].text: [td.text for td in tr.find_elements(By.TAG_NAME, "td")]
            for tr in browser.find_elements(By.CSS_SELECTOR, "#analysts tbody tr")}
    assert set(rows) == set(CAPS)
    for name, cap in CAPS.items():
        spent = _spent(gw, name)
        assert rows[name][1] == f"{cap:g}" and rows[name][2] == f"{spent:.6g}" and rows[name][3] == f"{cap - spent:.6g}"
        assert rows[name][6] == "yes"
    assert rows["bob"][4] == "2" and rows["bob"][5] == "50%" and rows["alice"][5] == "0%"
    bars = {r["analyst"]: r["spent"] for r in _data(browser, "analysts")}
    assert bars["carol"] == pytest.approx(_spent(gw, "carol"), rel=1e-12)


def _get(url: str, headers: dict[str, str] | None = None) -> tuple[int, str]:
    status, body, _ = _fetch(url, headers)
    return status, body


def _fetch(url: str, headers: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Status, body and content type of a GET (redirects not followed)."""
    request = urllib.request.Request(url, headers=headers or {})
    opener = urllib.request.build_opener(_NoRedirect())
    try:
        with opener.open(request, timeout=10) as response:
            return int(response.status), response.read().decode(), response.headers.get("content-type", "")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode(errors="replace"), exc.headers.get("content-type", "")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


def test_requests_without_the_token_are_refused(console: str, browser: Any) -> None:
    status, _, _ = _fetch(console + "/", {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200
    request = urllib.request.Request(console + "/", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        assert "script-src 'self';" in response.headers["Content-Security-Policy"]
    assert _get(console + f"//evil.example/?token={TOKEN}")[0] == 303  # redirected to the console's own /
    for path in ("/", "/releases", "/analysts", "/cells", "/static/vega.min.js"):
        assert _get(console + path)[0] == 401
        assert _get(console + path, {"Authorization": "Bearer wrong-token-wrong-token"})[0] == 401
        assert _get(console + path, {"Cookie": "dpgate_console_token=nope"})[0] == 401
        assert _get(console + path, {"Authorization": f"Bearer {TOKEN}"})[0] == 200
    assert _get(console + "/?token=wrong")[0] == 401
    status, _ = _get(console + f"/releases?token={TOKEN}&size=5")
    assert status == 303
    browser.delete_all_cookies()
    browser.get(console + "/analysts")
    assert "401" in browser.find_element(By.TAG_NAME, "body").text
    browser.save_screenshot(str(browser.shots / "refused.png"))
    browser.get(f"{console}/?token={TOKEN}")  # logged in again for the tests after this one


@pytest.mark.parametrize("query", [
    "size=0", "size=201", "size=-1", "size=1e3", "page=0", "page=abc", "page=99999999", "page=%EF%BC%91",
    "q=" + "x" * 201, "analyst=" + "a" * 101, "nope=1", "q=%00", "q=a%0Ab", "table=" + "t" * 101,
])
def test_hostile_release_parameters_get_400(console: str, query: str) -> None:
    start = time.monotonic()
    status, body = _get(f"{console}/releases?{query}", {"Authorization": f"Bearer {TOKEN}"})
    assert status == 400 and body.startswith("400: ") and time.monotonic() - start < 5, (status, body[:200])


def test_hostile_text_is_plain_text(console: str) -> None:
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for text in ("(a+)+$", ".*", "[", "%", "\\"):  # no regex, no LIKE: matched literally
        status, body = _get(f"{console}/releases?q={urllib.parse.quote(text)}", auth)
        assert status == 200 and '<b id=matched>0</b>' in body
    status, body = _get(f"{console}/releases?q={urllib.parse.quote('<script>alert(1)</script>')}", auth)
    assert status == 200 and "<script>alert(1)" not in body and "&lt;script&gt;alert(1)" in body
    for query in ("columns=nope", "table=%3Cscript%3E", "columns=a,b,c,d,e,f,g,h,i", "columns=" + "a" * 301):
        status, body, kind = _fetch(f"{console}/cells?{query}", auth)
        assert status == 400 and kind.startswith("text/plain"), (query, status, body[:200])  # never read as HTML
    status, _ = _get(f"{console}/releases?q=" + "y" * 3000, auth)
    assert status in (400, 414, 431)
    assert _get(f"{console}/static/..%2F_app.py", auth)[0] == 404


def test_access_rules_at_start(built: Any, capsys: pytest.CaptureFixture[str]) -> None:
    check_access("127.0.0.1", None, None, None)
    check_access("::1", None, None, None)
    with pytest.raises(ConsoleAccessError, match="--token"):
        check_access("0.0.0.0", None, None, None)
    with pytest.raises(ConsoleAccessError, match="--tls-cert"):
        check_access("192.0.2.1", TOKEN, None, None)
    with pytest.raises(ConsoleAccessError, match="too short"):
        check_access("127.0.0.1", "short", None, None)
    _, ledger, _ = built
    assert main(["console", "--ledger", str(ledger), "--host", "0.0.0.0"]) == 1
    assert "not a loopback address" in capsys.readouterr().err
    assert main(["console", "--ledger", str(ledger.parent / "missing.db")]) == 3


def test_reader_reads_no_data_and_spends_nothing(built: Any) -> None:
    gw, ledger, _ = built
    before = (gw.spent, len(gw.history))
    reader = LedgerReader(ledger, gw.schema)
    try:
        snap = reader.snapshot()
        assert snap.spent == pytest.approx(gw.spent, rel=1e-12) and len(snap.records) == before[1]
        assert reader.cells(snap, "pums").charge == pytest.approx(gw.spent, rel=1e-12)
    finally:
        reader.close()
    assert (gw.spent, len(gw.history)) == before
    assert dpgate.console.TOKEN_ENV == "DPGATE_CONSOLE_TOKEN"


def test_the_command_serves_on_loopback(built: Any) -> None:
    _, ledger, users = built
    proc = subprocess.Popen([sys.executable, "-m", "dpgate.cli", "console", "--ledger", str(ledger), "--users",
                             str(users), "--port", "0"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # the address, once the ledger was read and the port bound
        found = re.search(r"console on (http://127\.0\.0\.1:\d+)", line)
        assert found, line
        status, body = _get(found.group(1) + "/analysts")
        assert status == 200 and "alice" in body
    finally:
        proc.terminate()
        proc.wait(10)


def test_serve_http_port_serves_the_console_beside_the_postgres_port(tmp_path: Path) -> None:
    """``dpgate serve --http-port P``: the pages of the live ledger beside the PostgreSQL port."""
    import psycopg
    from _dpserve import dsn, spawn_server, users_file

    users_file(tmp_path, {"alice": 0.5, "bob": 0.5})
    http = _free_port()
    proc, port = spawn_server(tmp_path, extra=("--http-port", str(http)))
    try:
        base = f"http://127.0.0.1:{http}"
        deadline = time.monotonic() + 30
        while True:
            try:
                status, body = _get(base + "/analysts")
                break
            except (urllib.error.URLError, ConnectionError):
                assert proc.poll() is None and time.monotonic() < deadline, "the console did not start"
                time.sleep(0.2)
        assert status == 200 and "alice" in body and "bob" in body
        with psycopg.connect(dsn(port), autocommit=True) as conn:
            conn.execute("SELECT COUNT(*) FROM pums WHERE age < 40").fetchall()
        status, body = _get(base + "/releases")
        assert status == 200 and "<b id=matched>1</b>" in body and "alice" in body
    finally:
        proc.terminate()
        proc.wait(20)


def test_serve_http_port_follows_the_access_rules(built: Any, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    _, ledger, users = built
    code = main(["serve", "--data", str(ROOT / "dpgate" / "data" / "PUMS.csv"), "--schema",
                 str(ROOT / "dpgate" / "data" / "pums.yaml"), "--ledger", str(tmp_path / "l.db"), "--budget", "1",
                 "--users", str(users), "--host", "0.0.0.0", "--http-port", "0"])
    assert code == 1 and "not a loopback address" in capsys.readouterr().err
    assert not (tmp_path / "l.db").exists()  # refused before the gateway opened anything


def test_a_ledger_read_without_its_key_is_shown_unverified(built: Any, tmp_path: Path) -> None:
    gw, ledger, _ = built
    copy = tmp_path / "copy.db"
    import sqlite3

    with contextlib.closing(sqlite3.connect(ledger)) as src, contextlib.closing(sqlite3.connect(copy)) as dst:
        src.backup(dst)  # a copy of the ledger on another host, without its key
    reader = LedgerReader(copy, gw.schema, CAPS)
    try:
        assert not reader.verified
        snap = reader.snapshot()
        assert snap.spent == pytest.approx(gw.spent, rel=1e-12)
        rows = {a.name: a for a in reader.analysts(snap)}
        for name in CAPS:  # the sum of their charge rows: each the increase of their per-cell charge
            assert not rows[name].verified and rows[name].spent == pytest.approx(_spent(gw, name), rel=1e-9)
    finally:
        reader.close()


def test_a_grid_too_fine_to_price_is_said_on_the_page(built: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from dpgate.ledger import _cell_spend

    gw, ledger, _ = built
    monkeypatch.setattr(_cell_spend, "MAX_BOXES", 4)
    reader = LedgerReader(ledger, gw.schema)
    try:
        status, text = _asgi_get(create_app(reader), "/cells", "table=pums&columns=age")
        assert status == 200 and "more than the 4 that can be shown" in text
    finally:
        reader.close()


def _asgi_get(app: Any, path: str, query: str = "") -> tuple[int, str]:
    """A GET straight to the ASGI application (no server, no socket)."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": query.encode(), "headers": [],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 80), "root_path": ""}
    asyncio.run(app(scope, receive, send))
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return int(sent[0]["status"]), body.decode()


def test_a_zcdp_ledger_is_shown_in_rho(tmp_path: Path) -> None:
    df, schema = load_pums()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", dpgate.Warning)
        gw = dpgate.Gateway(df, schema, budget=0.5, privacy="zcdp", ledger=str(tmp_path / "z.db"), seed=3)
    gw.query("SELECT sex, COUNT(*) FROM pums GROUP BY sex", accuracy=25)
    gw.close()
    from dpgate.console._serve import reader_for

    reader = reader_for(str(tmp_path / "z.db"), schema_path=str(ROOT / "dpgate" / "data" / "pums.yaml"))
    with _serving(reader) as base:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        _, releases = _get(f"{base}/releases", auth)
        assert "ρ charged" in releases and "ε charged" not in releases
        for page in ("/", "/cells?columns=sex"):  # the charts' axis titles, in the page's JSON
            status, body = _get(base + page, auth)
            assert status == 200 and "\\u03c1 spent" in body and "\\u03b5" not in body, page

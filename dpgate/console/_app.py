"""The console's ASGI application (Starlette): four read-only pages, the static scripts, the token gate.

Pages: ``/`` (budget over time, free against paid), ``/cells`` (where the budget went),
``/releases`` (the release history, filtered and paged on the server), ``/analysts``.  Every
request parameter is bounded (:func:`_params`): known names only, short strings, numbers in
range, filters matched as plain text (never as a pattern); anything else is a 400 saying what
to change.  With a token, every request — the scripts too — must carry it: ``Authorization:
Bearer T``, the cookie the console sets, or ``?token=T`` once (answered by a redirect that sets
the cookie and drops the token from the address); without it the answer is 401.
"""

from __future__ import annotations

import hmac
import pathlib
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any
from urllib.parse import urlencode

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from dpgate.console import _charts
from dpgate.console._data import LedgerReader
from dpgate.console._html import chart, escape, layout, table
from dpgate.errors import Error, InvalidArgument

__all__ = ["COOKIE", "create_app"]

#: The cookie that carries the token after a first ``?token=`` visit.
COOKIE = "dpgate_console_token"
STATIC = pathlib.Path(__file__).parent / "static"

#: Per parameter: its longest accepted text.
_LIMITS = {"q": 200, "analyst": 100, "table": 100, "columns": 300, "page": 7, "size": 3, "token": 200}
_MAX_PAGE_SIZE = 200
_TOP_CELLS = 25
#: The most bars or heat-map cells a chart of ``/cells`` draws; beyond, the page shows the top boxes.
_MAX_CELLS = 5000

ASGIApp = Callable[[MutableMapping[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]],
                   Awaitable[None]]


#: Scripts, data and images from the console only; no frames, no form posts elsewhere.
_CSP = ("default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
        "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")


class BadRequest(InvalidArgument):
    """A request parameter out of bounds (answered 400 with the message)."""


def _params(request: Request, allowed: set[str]) -> dict[str, str]:
    """The request's parameters, each known and within its length limit (the last of a repeated one)."""
    out: dict[str, str] = {}
    if len(request.url.query) > 1024:
        raise BadRequest("The query string is too long (at most 1024 characters).")
    for key, value in request.query_params.multi_items():
        if key not in allowed and key != "token":
            raise BadRequest(f"Unknown parameter {key[:40]!r}; this page takes {', '.join(sorted(allowed)) or 'none'}.")
        if len(value) > _LIMITS.get(key, 100):
            raise BadRequest(f"The parameter {key!r} is too long (at most {_LIMITS.get(key, 100)} characters).")
        if any(ord(ch) < 32 for ch in value):
            raise BadRequest(f"The parameter {key!r} contains a control character.")
        out[key] = value
    return out


def _integer(params: Mapping[str, str], key: str, default: int, lo: int, hi: int) -> int:
    text = params.get(key, "")
    if not text:
        return default
    if not text.isascii() or not text.isdigit() or not lo <= int(text) <= hi:
        raise BadRequest(f"The parameter {key!r} must be a whole number from {lo} to {hi}, not {text[:20]!r}.")
    return int(text)


class _TokenGate:
    """Refuses (401) every request that does not carry the token (see the module docstring)."""

    def __init__(self, app: ASGIApp, token: str) -> None:
        self.app, self.token = app, token.encode()

    def _ok(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.token)

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        header = request.headers.get("authorization", "")
        bearer = header[7:] if header.lower().startswith("bearer ") else None
        in_query = request.query_params.get("token")
        if self._ok(bearer) or self._ok(request.cookies.get(COOKIE)):
            await self.app(scope, receive, send)
            return
        response: Response
        if self._ok(in_query):
            rest = [(k, v) for k, v in request.query_params.multi_items() if k != "token"]
            path = "/" + request.url.path.lstrip("/")  # never "//host": a redirect stays on the console
            response = RedirectResponse(path + ("?" + urlencode(rest) if rest else ""), status_code=303)
            response.set_cookie(COOKIE, self.token.decode(), httponly=True, samesite="strict",
                                secure=scope.get("scheme") == "https")
        else:
            response = PlainTextResponse("401: this console needs its token (Authorization: Bearer, or ?token=).",
                                         status_code=401, headers={"WWW-Authenticate": "Bearer"})
        await response(scope, receive, send)


def _headers(response: Response) -> Response:
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["Referrer-Policy"] = "no-referrer"
    response.headers["Content-Security-Policy"] = _CSP
    return response


def create_app(reader: LedgerReader, token: str | None = None) -> ASGIApp:
    """The console's ASGI application over ``reader``; every request needs ``token`` when one is given."""
    unit = "ρ" if reader.ledger.privacy == "zcdp" else "ε"  # the ledger's accounting: every budget in its unit

    def page(build: Callable[[Request], str]) -> Callable[[Request], Response]:
        def endpoint(request: Request) -> Response:
            try:
                return _headers(HTMLResponse(build(request)))
            except BadRequest as exc:
                return _headers(PlainTextResponse(f"400: {exc}", status_code=400))
            except Error as exc:  # e.g. a ledger that fails its tamper checks: said, never shown unverified
                return _headers(PlainTextResponse(f"503: {exc}", status_code=503))
        return endpoint

    def budget(request: Request) -> str:
        _params(request, set())
        snap = reader.snapshot()
        points = [{"release": r.id, "spent": r.cost_after, "who": "global"} for r in snap.records]
        points += [{"release": p["release"], "spent": p["spent"], "who": p["analyst"]}
                   for p in reader.analyst_series(snap)]
        caps = [{"who": "global", "cap": snap.budget}] + [{"who": a, "cap": c} for a, c in reader.caps.items()]
        paid = sum(1 for r in snap.releases if r.charged > 0)
        body = (f'<p class=summary><span>budget <b id=budget>{snap.budget:g}</b></span>'
                f'<span>spent <b id=spent>{snap.spent:.6g}</b></span>'
                f'<span>left <b id=left>{max(0.0, snap.budget - snap.spent):.6g}</b></span>'
                f'<span>releases <b id=releases>{len(snap.records)}</b> ({paid} raised the cost)</span></p>'
                + chart("budget", _charts.budget_chart(points, caps, unit), marks=len(points)))
        sources = reader.sources(snap)
        if sources:
            body += chart("sources", _charts.sources_chart(sources))
        else:
            body += ("<p class=note>This ledger has no provenance (it was not written by <code>dpgate serve</code>): "
                     "every statement answered from history alone was free and left no record.</p>")
        if not reader.verified:
            body += "<p class=note>Opened without the ledger's key: the records are shown unverified.</p>"
        return layout("Budget over time", "/", body)

    def cells(request: Request) -> str:
        params = _params(request, {"table", "columns"})
        if reader.schema is None:
            return layout("Where the budget went", "/cells", "<p>Start the console with <code>--schema</code> "
                          "to place the releases on the declared domain.</p>", charts=False)
        tables = reader.schema.tables
        name = params.get("table") or tables[0].name
        if not any(t.name.lower() == name.lower() for t in tables):
            raise BadRequest(f"There is no table {name!r}; the schema declares {', '.join(t.name for t in tables)}.")
        t = reader.schema.table(name)
        wanted = [c.strip() for c in params.get("columns", "").split(",") if c.strip()]
        if len(wanted) > 8:
            raise BadRequest("Name at most 8 columns.")
        for c in wanted:
            if not t.has_column(c):
                raise BadRequest(f"The table {t.name} has no column {c!r}; it has "
                                 f"{', '.join(col.name for col in t.columns)}.")
        snap = reader.snapshot()
        try:
            spend = reader.cells(snap, t.name)
        except ValueError as exc:  # a grid too fine to price here: said on the page (not the request's fault)
            return layout("Where the budget went", "/cells", f"<p class=note>Not shown: {escape(exc)}.</p>",
                          charts=False)
        columns = [t.column(c).name for c in wanted] or list(spend.columns[:1]) or [t.columns[0].name]
        form = ('<form method=get action="/cells"><label>table <select name=table>'
                + "".join(f'<option{" selected" if x.name == t.name else ""}>{escape(x.name)}</option>' for x in tables)
                + f'</select></label><label>columns <input name=columns size=40 value="{escape(",".join(columns))}">'
                f'</label><button>show</button></form>')
        body = (form + f'<p class=summary><span>table cost <b id=table-cost>{spend.charge:.6g}</b></span>'
                f'<span>releases of {escape(t.name)}: {spend.releases}</span>'
                f'<span>columns restricted: {escape(", ".join(spend.columns) or "none")}</span></p>')
        if len(columns) <= 2 and spend.count(columns) > _MAX_CELLS:
            body += (f"<p class=note>{escape(' × '.join(columns))} has {spend.count(columns)} slabs charged apart, "
                     f"more than a chart shows ({_MAX_CELLS}).</p>")
            columns = [*columns, "…"]  # the table of the top boxes below
        if len(columns) == 1:
            body += chart("cells", _charts.cells_bar(spend.over(columns), columns[0], unit))
        elif len(columns) == 2:
            over = spend.over(columns)
            body += chart("cells", _charts.cells_heatmap(over, columns[0], columns[1], unit), marks=len(over))
        else:
            top = spend.top(_TOP_CELLS)
            names = list(spend.columns)
            body += ("<p>The boxes of the grid charged most:</p>"
                     + table([*names, unit], [[r[n] for n in names] + [f"{r['epsilon']:.6g}"] for r in top],
                             numeric=[len(names)], table_id="top-cells"))
        return layout("Where the budget went", "/cells", body)

    def releases(request: Request) -> str:
        params = _params(request, {"q", "analyst", "table", "page", "size"})
        size = _integer(params, "size", 50, 1, _MAX_PAGE_SIZE)
        number = _integer(params, "page", 1, 1, 9_999_999)
        snap = reader.snapshot()
        rows = reader.filtered(snap, text=params.get("q", ""), analyst=params.get("analyst", ""),
                               table=params.get("table", ""))
        pages = max(1, -(-len(rows) // size))
        number = min(number, pages)
        shown = rows[::-1][(number - 1) * size: number * size]  # the newest first
        form = ('<form method=get action="/releases">'
                + "".join(f'<label>{label} <input name={k} value="{escape(params.get(k, ""))}" maxlength={_LIMITS[k]}>'
                          f'</label>' for k, label in (("q", "text"), ("analyst", "analyst"), ("table", "table")))
                + f'<input type=hidden name=size value={size}><button>filter</button></form>')
        keep = {k: params[k] for k in ("q", "analyst", "table") if params.get(k)} | {"size": str(size)}
        links = " ".join(f'<a id={rel} href="/releases?{escape(urlencode(keep | {"page": str(n)}))}">{label}</a>'
                         for rel, label, n in (("first", "« first", 1), ("prev", "‹ newer", number - 1),
                                               ("next", "older ›", number + 1), ("last", "last »", pages))
                         if 1 <= n <= pages and n != number)
        body = (form + f'<p class=summary><span><b id=matched>{len(rows)}</b> releases match</span>'
                f'<span>page <b id=page>{number}</b> of <b id=pages>{pages}</b></span> {links}</p>'
                + table(["id", "time", "analyst", "source", "table", "statement", "measured", "α", f"{unit} charged",
                         "released value", "95 % interval"],
                        [[r.id, r.created_at[:19], r.analyst or "–", r.source or "–", r.table, r.sql, r.measured,
                          f"{r.alpha:.4g}", f"{r.charged:.4g}", f"{r.value:.6g}",
                          f"[{r.value - r.halfwidth:.6g}, {r.value + r.halfwidth:.6g}]"] for r in shown],
                        numeric=[0, 7, 8, 9], table_id="releases-table")
                + "<p class=note>The interval is the release's own noise (its central 95 %), not an answer's: "
                  "an answer combines releases.</p>")
        return layout("Release history", "/releases", body, charts=False)

    def analysts(request: Request) -> str:
        _params(request, set())
        snap = reader.snapshot()
        rows = reader.analysts(snap)
        if not rows:
            return layout("Analysts", "/analysts", "<p>No analyst: this ledger has no provenance and no users file "
                          "was given (<code>--users</code>).</p>", charts=False)
        body = table(["analyst", f"cap {unit}", f"spent {unit}", f"left {unit}", "statements", "answered free", "verified"],
                     [[a.name, "–" if a.cap is None else f"{a.cap:g}", f"{a.spent:.6g}",
                       "–" if a.left is None else f"{a.left:.6g}", a.statements, f"{a.free_share:.0%}",
                       "yes" if a.verified else "no"] for a in rows], numeric=[1, 2, 3, 4, 5], table_id="analysts")
        body += chart("analysts", _charts.analysts_chart(
            [{"analyst": a.name, "spent": a.spent, "cap": a.cap} for a in rows], unit))
        return layout("Analysts", "/analysts", body)

    app: ASGIApp = Starlette(routes=[
        Route("/", page(budget)), Route("/cells", page(cells)), Route("/releases", page(releases)),
        Route("/analysts", page(analysts)), Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ])
    return app if token is None else _TokenGate(app, token)

"""Build dpgate's reference manual: the README's guides and the API pages from the docstrings.

    python docs/build_manual.py [OUT_DIR]      # or: make docs  (writes docs/manual/)

Uses pdoc (a well-kept docstring renderer; Google-style sections, as dpgate's docstrings are
written) for the API, and pdoc's own Markdown renderer for the guides: one page per ``##``
section of README.md under ``guide/``.  The pages are static files: open ``OUT_DIR/index.html``
in a browser, no server.  Any warning while building fails it (``tests/test_manual.py``).
"""

from __future__ import annotations

import html
import re
import sys
from pathlib import Path

#: What an analyst or a data owner imports: the package (its ``__all__``: Gateway, connect, dbapi, inference,
#: Answer, Result, the errors…) and the public modules beside it.
MODULES = ("dpgate", "dpgate.datasets", "dpgate.accessor", "dpgate.server")  # dbapi, inference: via __all__
README = Path(__file__).parents[1] / "README.md"

_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title} — dpgate manual</title>
<style>body{{font-family:sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;line-height:1.5}}
pre{{background:#f6f8fa;padding:.6rem;overflow-x:auto}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:.2rem .5rem}}nav a{{margin-right:1rem}}</style></head>
<body><nav><a href="{up}index.html">Manual</a><a href="{up}dpgate.html">API</a></nav>
{body}</body></html>
"""


def guides(readme: Path = README) -> list[tuple[str, str, str]]:
    """``(slug, title, markdown)`` of each ``##`` section of the README (the text before the first
    one is the manual's introduction, slug ``index``)."""
    parts = re.split(r"^## +(.+)$", readme.read_text(encoding="utf-8"), flags=re.M)
    out = [("index", "dpgate", parts[0])]
    for title, text in zip(parts[1::2], parts[2::2], strict=True):
        slug = re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")
        out.append((slug, title.strip("` "), f"## {title}\n{text}"))
    return out


def build(out: Path) -> Path:
    """Write the manual to ``out`` and return its index page."""
    import pdoc
    import pdoc.render
    from pdoc.render_helpers import to_html

    pdoc.render.configure(docformat="google", show_source=False, search=True,
                          footer_text="dpgate reference manual")
    pdoc.pdoc(*MODULES, output_directory=out)
    (out / "guide").mkdir(parents=True, exist_ok=True)
    sections = guides()
    links = "".join(f'<li><a href="guide/{slug}.html">{html.escape(title)}</a></li>'
                    for slug, title, _ in sections[1:])
    api = "".join(f'<li><a href="{m.replace(".", "/")}.html">{m}</a></li>' for m in MODULES)
    for slug, title, text in sections[1:]:
        page = _PAGE.format(title=html.escape(title), up="../", body=to_html(text))
        (out / "guide" / f"{slug}.html").write_text(page, encoding="utf-8")
    index = _PAGE.format(title="dpgate", up="", body=to_html(sections[0][2])
                         + f"<h2>Guides</h2><ul>{links}</ul><h2>API</h2><ul>{api}</ul>")
    (out / "index.html").write_text(index, encoding="utf-8")  # replaces pdoc's module list
    return out / "index.html"


if __name__ == "__main__":
    index = build(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "manual")
    print(f"manual written: {index}")

"""Build dpgate's reference manual: HTML pages from the docstrings of the public modules.

    python docs/build_manual.py [OUT_DIR]      # or: make docs  (writes docs/manual/)

Uses pdoc (a well-kept docstring renderer; Google-style sections, as dpgate's docstrings are
written).  The pages are static files: open ``OUT_DIR/index.html`` in a browser, no server.
"""

from __future__ import annotations

import sys
from pathlib import Path

#: What an analyst or a data owner imports: the package (its ``__all__``: Gateway, connect, dbapi, inference,
#: Answer, Result, the errors…) and the public modules beside it.
MODULES = ("dpgate", "dpgate.datasets", "dpgate.accessor", "dpgate.server")  # dbapi, inference: via __all__


def build(out: Path) -> Path:
    """Write the manual to ``out`` and return its index page."""
    import pdoc
    import pdoc.render

    pdoc.render.configure(docformat="google", show_source=False, search=True,
                          footer_text="dpgate reference manual")
    pdoc.pdoc(*MODULES, output_directory=out)
    return out / "index.html"


if __name__ == "__main__":
    index = build(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent / "manual")
    print(f"manual written: {index}")

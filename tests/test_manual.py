"""The reference manual (docs/build_manual.py, ``make docs``) builds from the docstrings and
documents every public object: each name of ``dpgate.__all__``, and each public method and
property of the classes an analyst holds, has its own entry with its docstring's text."""

from __future__ import annotations

import inspect
import re
import runpy
import warnings
from pathlib import Path

import dpgate
from dpgate.inference import Posterior

BUILD = runpy.run_path(str(Path(__file__).parents[1] / "docs" / "build_manual.py"))


def test_manual_documents_every_public_object(tmp_path: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a module listed twice, a broken reference: fail
        index = BUILD["build"](tmp_path)
    assert index.is_file()
    page = (tmp_path / "dpgate.html").read_text(encoding="utf-8")
    ids = set(re.findall(r'id="([^"]+)"', page))
    for name in dpgate.__all__:
        obj = getattr(dpgate, name)
        if inspect.ismodule(obj):
            assert (tmp_path / "dpgate" / f"{name}.html").is_file(), name
        elif inspect.isclass(obj) or inspect.isfunction(obj):
            assert name in ids, f"{name} has no entry in the manual"
    for cls in (dpgate.Gateway, dpgate.Answer, dpgate.Result):
        for member, value in vars(cls).items():
            if member.startswith("_") or not (inspect.isfunction(value) or isinstance(value, property)):
                continue
            entry = f"{cls.__name__}.{member}"
            assert entry in ids, f"{entry} has no entry"
            section = page.split(f'id="{entry}"', 1)[1].split('<section id="', 1)[0]
            words = re.findall(r"[A-Za-z]{5,}", inspect.getdoc(getattr(cls, member)) or "")[:3]
            assert 'class="docstring"' in section and all(w in section for w in words), (entry, words)
    inference = (tmp_path / "dpgate" / "inference.html").read_text(encoding="utf-8")
    for method in ("cdf", "sf", "ppf", "interval", "mean", "std", "probability"):
        assert f'id="Posterior.{method}"' in inference and callable(getattr(Posterior, method))
    for module in ("datasets", "accessor", "server", "dbapi"):
        assert f'href="dpgate/{module}.html"' in page or (tmp_path / "dpgate" / f"{module}.html").is_file()


def test_manual_has_a_page_per_readme_guide(tmp_path: Path) -> None:
    """Each ``##`` section of the README is a guide page of the manual, linked from its index, with
    the section's text (its tables and code blocks rendered)."""
    BUILD["build"](tmp_path)
    index = (tmp_path / "index.html").read_text(encoding="utf-8")
    sections = BUILD["guides"]()
    assert len(sections) > 10
    for slug, title, text in sections[1:]:
        page = tmp_path / "guide" / f"{slug}.html"
        assert page.is_file() and f'href="guide/{slug}.html"' in index, title
        body = page.read_text(encoding="utf-8")
        prose = re.sub(r"```.*?```|`[^`]*`|\[|\]\([^)]*\)", " ", text.split("\n", 1)[-1], flags=re.S)
        first = re.findall(r"\b[A-Za-z]{6,}\b", prose)[:3]  # code is highlighted: words of the prose
        assert all(w in body for w in first), (title, first)
    assert 'href="dpgate.html"' in index and "<h2>Guides</h2>" in index

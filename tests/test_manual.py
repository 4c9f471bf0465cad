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

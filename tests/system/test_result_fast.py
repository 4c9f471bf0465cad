"""dpgate's own answers are built on a fast path (``Answer._of``, one error law and half-width per
statement for a GROUP BY's alone groups); these tests hold it to the public constructor and to
each answer's own posterior, bit for bit."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import dpgate
from dpgate.answer.result import Answer
from dpgate.compile.query import LinearQuery
from dpgate.plan.decide import meets


def same(a: Answer, b: Answer) -> bool:
    """Equal field by field, floats bit for bit (sign of zero, NaN), the query by identity."""
    for f in dataclasses.fields(Answer):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if isinstance(x, float) or isinstance(y, float):
            if type(x) is not type(y) or repr(x) != repr(y):  # repr tells -0.0 and nan apart
                return False
        elif f.name in ("query", "posterior"):
            if x is not y:
                return False
        elif x != y:
            return False
    return list(vars(a)) == list(vars(b))


def _query(weight: int, offset: Fraction) -> LinearQuery:
    num = np.array([weight, 0, max(weight, 0)], dtype=np.int64)
    return LinearQuery("t", ("x",), ((0, 1, 2),), num, 1, offset)


floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([-0.0, 0.0, 497.4999999999999, 0.1 + 0.2])
queries = st.none() | st.builds(_query, st.sampled_from([-2, 0, 1]),
                                st.sampled_from([Fraction(0), Fraction(5, 2), Fraction(-7)]))


@settings(max_examples=300, deadline=None)
@given(value=floats, low=floats, high=floats, source=st.sampled_from(["fresh", "history", "exact", "unavailable"]),
       query=queries, flags=st.tuples(st.booleans(), st.booleans(), st.booleans()))
def test_fast_answer_is_the_public_constructor(value, low, high, source, query, flags):
    meets_requirement, secure, isolated = flags
    args = (value, low, high, 0.95, 10.0, source, 0.25, None, meets_requirement)
    kw = dict(label="n", group=(("g", "a"),), query=query, secure=secure, isolated=isolated)
    assert same(Answer._of(*args, *kw.values()), Answer(*args, **kw))


def test_group_by_answers_are_their_posteriors_intervals(pums):
    """Every fresh group (one shared error law) and every answer from history carries exactly the
    interval its own posterior gives at the statement's confidence, clipped and tidied as the
    public constructor does."""
    data, schema = pums
    with dpgate.Gateway(data, schema, budget=50.0, seed=11) as gw:
        results = [gw.query(sql, accuracy=acc, confidence=0.9)
                   for sql, acc in [("SELECT educ, COUNT(*) FROM pums GROUP BY educ", 20),
                                    ("SELECT sex, COUNT(*) + 3, SUM(0 - age) FROM pums GROUP BY sex", 400),
                                    ("SELECT COUNT(*) FROM pums WHERE educ < 5", 60),  # from history
                                    ("SELECT educ, COUNT(*) FROM pums GROUP BY educ", 20)]]  # fmt: skip
    answers = [a for r in results for a in r.answers]
    assert {a.source for a in answers} == {"fresh", "history"} and len(answers) > 30
    for a in answers:
        lo, hi = a.posterior.certified_interval(a.interval_confidence)
        expected = Answer(a.posterior.mean(), lo, hi, a.confidence, a.accuracy, a.source, a.epsilon_spent, a.posterior,
                          meets((hi - lo) / 2, a.accuracy), label=a.label, group=a.group, query=a.query,
                          secure=a.secure, isolated=a.isolated, interval_confidence=a.interval_confidence)  # fmt: skip
        assert same(a, expected), (a, expected)
        assert math.isfinite(a.value)

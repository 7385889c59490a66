"""``--fail-if``: the whitelist expression language (parse, evaluate, refuse)."""

import operator

import pytest
from hypothesis import given, settings, strategies as st

from redteam.report.fail_if import MAX_LENGTH, FailIfError, parse_fail_if

CELL = {"asr": 0.3, "accuracy_drop": 0.01, "fpr": 0.0, "recall": None, "tp": 4}


@pytest.mark.parametrize(
    "expr,expected",
    [
        ("asr > 0.2", True),
        ("asr > 0.2 or accuracy_drop > 0.05", True),
        ("asr > 0.5 or accuracy_drop > 0.05", False),
        ("asr > 0.2 and accuracy_drop > 0.05", False),
        ("not accuracy_drop > 0.05", True),
        ("(asr >= 0.3) and (fpr == 0)", True),
        ("0.2 < asr <= 0.3", True),  # chained, as in Python
        ("0.2 < asr < 0.3", False),
        ("fpr != 0", False),
        ("tp >= 4", True),
        ("accuracy_drop > -0.5", True),
        ("accuracy_drop < +1e-1", True),
        ("asr > accuracy_drop", True),  # metric against metric
        ("asr>0.2 or(fpr>0.1)", True),
    ],
)
def test_valid_expressions(expr, expected):
    assert parse_fail_if(expr).holds(CELL) is expected


def test_metrics_read_in_order_of_appearance():
    assert parse_fail_if("asr > 0.2 or accuracy_drop > 0.05 or asr > 0.9").metrics == ("asr", "accuracy_drop")


def test_undefined_metric_makes_the_comparison_false():
    assert parse_fail_if("recall < 0.5").holds(CELL) is False
    assert parse_fail_if("recall >= 0.5").holds(CELL) is False
    assert parse_fail_if("recall < 0.5 or asr > 0.2").holds(CELL) is True
    assert parse_fail_if("asr > recall").holds(CELL) is False
    assert parse_fail_if("asr > 0.1").holds({}) is False  # missing = undefined
    # documented: `not` negates the (false) comparison
    assert parse_fail_if("not recall < 0.5").holds(CELL) is True


@pytest.mark.parametrize(
    "expr,message",
    [
        ("__import__('os').system('echo pwned')", "a function call at column 1 is not allowed"),
        ("asr.__class__ > 0", "an attribute at column 1 is not allowed as an operand"),
        ("().__class__.__bases__[0] > 1", "a subscript"),
        ("(lambda: 1)() > 0", "a function call"),
        ("[x for x in ()] == 1", "a comprehension"),
        ("asr + 1 > 0.5", "arithmetic"),
        ("asr > 0.2 if fpr else fpr", "a conditional expression"),
        ("'a' < 'b'", "'a' at column 1 is not allowed: operands are metric names and numbers"),
        ("True or asr > 1", "True at column 1 is a number, not a condition"),
        ("asr > True", "True at column 7 is not allowed"),
        ("asr in (0.1, 0.2)", "operator In"),
        ("asr is None", "operator Is"),
        ("(asr := 1) > 0", "an assignment"),
        ("asr", "'asr' at column 1 is a metric, not a condition"),
        ("0.5", "is a number, not a condition"),
        ("ASR > 0.2", "unknown metric 'ASR' at column 1; did you mean 'asr'"),
        ("acuracy_drop > 0.05", "did you mean 'accuracy_drop'"),
        ("os > 1", "unknown metric 'os'"),
        ("asr > 1e999", "is not finite"),
        ("asr >", "syntax error"),
        ("asr > 0.2; import os", "syntax error"),
        ("import os", "syntax error"),
        ("", "empty expression"),
        ("   ", "empty expression"),
        ("asr > 0.1 or " * 200 + "asr > 0", f"at most {MAX_LENGTH}"),
    ],
)
def test_rejected_expressions(expr, message):
    with pytest.raises(FailIfError) as info:
        parse_fail_if(expr)
    text = str(info.value)
    assert message in text
    assert "\n" not in text and text.startswith("--fail-if")


def test_deep_nesting_is_refused_cleanly():
    with pytest.raises(FailIfError):
        parse_fail_if("not " * 100 + "asr > 0")
    with pytest.raises(FailIfError):
        parse_fail_if("(" * 300 + "asr > 0" + ")" * 300)


def test_custom_metric_set():
    f = parse_fail_if("x > 1", known={"x": "a test metric"})
    assert f.holds({"x": 2.0}) and not f.holds({"x": 0.5})
    with pytest.raises(FailIfError, match="unknown metric 'asr'"):
        parse_fail_if("asr > 1", known={"x": ""})


_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq,
        "!=": operator.ne}


@settings(max_examples=150, deadline=None)
@given(
    metric=st.sampled_from(["asr", "fpr", "accuracy_drop", "recall"]),
    op=st.sampled_from(sorted(_OPS)),
    const=st.floats(-10, 10, allow_nan=False).map(lambda x: round(x, 3)),
    value=st.one_of(st.none(), st.floats(-10, 10, allow_nan=False)),
    negate=st.booleans(),
)
def test_comparison_semantics(metric, op, const, value, negate):
    f = parse_fail_if(f"{'not ' if negate else ''}{metric} {op} {const!r}")
    expected = False if value is None else _OPS[op](value, const)
    assert f.holds({metric: value}) is (not expected if negate else expected)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=60)
       | st.text(alphabet="asrfp_ ()<>=!.0123456789notandor'\"[]+-*/:@,", max_size=60))
def test_arbitrary_text_parses_or_is_refused_with_a_fail_if_error(text):
    try:
        f = parse_fail_if(text)
    except FailIfError as exc:
        assert "\n" not in str(exc)
        return
    f.holds({"asr": 0.5, "fpr": None})  # whatever parsed evaluates without raising

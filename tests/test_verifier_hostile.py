"""Hostile model outputs against the math reward: extraction stays linear (and reads what the
old per-box scan and marker expression read), the whole grade stays within its per-sample
limit, an answer math-verify cannot read is never accepted, and an answer that offers two values
(`41 \\lor 42`) is unverifiable against a reference that states one, while single values,
intervals, sets and tuples grade as math-verify grades them.

Sizes and example counts are capped so that the file runs in well under 30 s; the time bounds
are generous (a busy 2-core machine), far below what the superlinear code took on the same
inputs (minutes).
"""

import re
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taut.tasks.math import (
    TIMEOUT,
    UNVERIFIABLE,
    VerifierError,
    answer_lines,
    answers_equal,
    error_kind,
    extract_answer,
    last_boxed,
    verify,
)

EXTRACT_BOUND = 1.0        # seconds for one extraction of up to ~100k characters (it takes ms)
LIMIT = 1.0                # the per-sample limit the whole-grade tests run under
SLACK = 1.0                # seconds over the limit for the reply to come back on a busy machine
# no example database: nothing is written into the checkout
FEW = settings(max_examples=20, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
MANY = settings(max_examples=300, deadline=None, database=None)

BIDI_AND_CONTROL = ["\x00", "\x07", "\x1b", "\r", "\x0b", "\x0c", "\u202e", "\u2066", "\u2069", "\u200f", "\u200b",
                    "\ufeff", "\u2028", "\u0085"]
PIECES = [" ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "{", "}", "\\{", "\\}", "\\", "\\boxed{", "\\fbox {", "x", "42",
          "*", ":", "：", "9^{", "9**9**9", "1e999999", "answer", "Answer:", "the answer is", "**Answer:**",
          "answer 1 2", "<think>", "</think>", " is", *BIDI_AND_CONTROL]


@st.composite
def hostile_text(draw, max_run: int = 3000, max_parts: int = 8) -> str:
    """Runs of hostile pieces: whitespace, braces, boxes, markers, exponents, control and bidi."""
    parts = draw(st.lists(st.tuples(st.sampled_from(PIECES), st.integers(1, max_run)), min_size=1, max_size=max_parts))
    return "".join(piece * count for piece, count in parts)


def timed(call):
    t0 = time.perf_counter()
    result = call()
    return time.perf_counter() - t0, result


# ---------------------------------------------------------------------------------------------
# extraction: linear on every hostile family, in the caller's process
# ---------------------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=hostile_text(), complete=st.booleans())
def test_extraction_of_hostile_text_is_fast(text, complete):
    elapsed, _ = timed(lambda: extract_answer(text, complete))
    assert elapsed < EXTRACT_BOUND, f"{elapsed:.2f} s on {len(text)} characters"


@pytest.mark.parametrize("text", [
    "Answer:" + " " * 100_000,                       # the old marker expression: cubic (2,000 spaces: 25 s)
    "the answer is" + " \t" * 50_000 + "x",
    "\\boxed{" * 15_000,                             # the old brace scan: quadratic (10,000: 57 s)
    "\\boxed{" * 15_000 + "\\boxed{1}",
    "\\boxed{" + "{" * 50_000 + "1" + "}" * 50_000 + "}",
    "answer " * 15_000,
    "x" * 100_000 + " Answer: 42",
])
def test_extraction_of_the_known_slow_cases_is_fast(text):
    elapsed, _ = timed(lambda: extract_answer(text))
    assert elapsed < EXTRACT_BOUND, f"{elapsed:.2f} s on {len(text)} characters"


# The scans they replace, kept as references on short texts (where they are fast).

_OLD_MARKER = re.compile(r"(?im)^[^\n]*?\banswer\b(?:\s+is)?\s*\**\s*[:：]\s*\**[ \t]*(?P<value>[^\n]*\S)[ \t]*$")


def _old_last_boxed(text):
    found, unclosed = None, False
    for match in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        depth, i, content = 1, match.end(), None
        while i < len(text):
            if text[i] == "\\" and i + 1 < len(text) and text[i + 1] in "{}":
                i += 2
                continue
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                content = text[match.end():i]
                break
            i += 1
        found, unclosed = (found, True) if content is None else (content, False)
    return found, unclosed


@MANY
@given(st.lists(st.sampled_from(["\\boxed{", "\\fbox {", "{", "}", "\\{", "\\}", "\\", "\\\\", "a", "1", " "]), max_size=14))
def test_the_linear_box_scan_reads_what_the_per_box_scan_read(pieces):
    text = "".join(pieces)
    assert last_boxed(text) == _old_last_boxed(text)


@MANY
@given(st.lists(st.sampled_from(["answer", "Answer", " is", " ", "\t", "\n", ":", "：", "x", "5", "answers", "the "]),
                max_size=10))
def test_the_linear_marker_scan_reads_what_the_old_expression_read(pieces):
    # without "*" (stars and spaces may now interleave before the colon) and "\r" (now a line end)
    text = "".join(pieces)
    old = [m.group("value") for m in _OLD_MARKER.finditer(text)]
    assert [v.rstrip() for v in answer_lines(text)] == old


# ---------------------------------------------------------------------------------------------
# the whole grade: within its limit, never correct for what it cannot read
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def warm():
    """Start the helper before any grade is timed (its startup has its own limit)."""
    def start():
        assert verify("\\boxed{1}", "1").correct
    start()
    return start


@FEW
@given(text=hostile_text(max_run=2000, max_parts=6))
def test_the_whole_grade_of_hostile_text_stays_within_its_limit(warm, text):
    warm()
    elapsed, verdict = timed(lambda: verify(text, "42", timeout=LIMIT))
    assert elapsed < LIMIT + SLACK, f"{elapsed:.2f} s on {len(text)} characters"
    assert not verdict.correct or "42" in verdict.extracted
    if error_kind(verdict.error) == TIMEOUT:
        assert not verdict.correct


WORDS = st.sampled_from(["all", "odd", "even", "values", "solutions", "integer", "limit", "exists", "only",
                         "possible", "sequence", "Yes", "No", "none", "equivalently"])


@FEW
@given(before=st.lists(WORDS, min_size=1, max_size=3), after=st.lists(WORDS, max_size=3), n=st.integers(0, 99))
def test_a_word_answer_with_another_number_is_never_accepted(before, after, n):
    reference = " ".join([*before, str(n), *after])
    perturbed = " ".join([*before, str(n + 1), *after])
    with pytest.raises(VerifierError) as raised:
        answers_equal(perturbed, reference, timeout=5.0)
    assert raised.value.kind == UNVERIFIABLE


@FEW
@given(start=st.integers(0, 9), index=st.sampled_from("ijk"), term=st.sampled_from(["1/{i}", "{i}^2", "2^{i}", "{i}"]),
       shift=st.sampled_from(["start", "term"]))
def test_plain_text_sums_with_another_start_or_term_are_never_accepted(start, index, term, shift):
    body = term.format(i=index)
    reference = f"sum_({index}={start})^n {body}"
    perturbed = (f"sum_({index}={start + 1})^n {body}" if shift == "start" else f"sum_({index}={start})^n 3*{body}")
    with pytest.raises(VerifierError) as raised:
        answers_equal(perturbed, reference, timeout=5.0)
    assert raised.value.kind == UNVERIFIABLE


def test_a_grade_that_would_not_end_is_a_timeout_at_the_limit(warm):
    # math-verify's parser takes seconds per 100 levels of braces (a power tower, where sympy
    # never finishes, is in test_math_verifier.py). Last in the file: a timeout costs the next
    # grade a helper restart
    warm()
    text = "\\boxed{" + "{" * 5000 + "1" + "}" * 5000 + "}"
    elapsed, verdict = timed(lambda: verify(text, "42", timeout=LIMIT))
    assert elapsed < LIMIT + SLACK
    assert not verdict.correct and error_kind(verdict.error) == TIMEOUT and verdict.extracted is not None


# ---------------------------------------------------------------------------------------------
# hedged answers: more than one value against a reference that states one
# ---------------------------------------------------------------------------------------------

# math-verify keeps one operand of `a \lor b` (and of the others below) and compares it: a policy
# paid for short correct answers learns to write two candidates. Each family offers two values
# or relates two values instead of stating one.
HEDGES = {
    "logic": [r"\lor", r"\vee", r"\land", r"\wedge", "or", "and", r"\text{ or }", r"\ \text{or}\ ", "∨"],
    "sets": [r"\cup", r"\cap", r"\setminus", r"\sqcup", r"\backslash"],
    "lists": [",", ";", r"\text{ , }", r"\\", r"\newline", "&", r"\&", r"\quad\text{or}\quad", r"\hspace{1em}", r"\ldots"],
    "relations": ["=", r"\approx", r"\sim", r"\equiv", r"\cong", "<", r"\le", r"\geq", r"\neq", r"\not=", ":=",
                  r"\in", r"\subset", r"\mid", "|", r"\|", r"\colon", r"\pm"],
    "arrows": [r"\to", r"\rightarrow", r"\Rightarrow", r"\implies", r"\iff", r"\Leftrightarrow", r"\mapsto"],
}
HEDGE = st.sampled_from([h for family in HEDGES.values() for h in family])


@st.composite
def two_values(draw) -> tuple[str, str]:
    """(right, wrong): two different numbers, as integers (negative too) or fractions."""
    def value(n: int, d: int) -> str:
        if d == 1:
            return str(n)
        return f"{'-' if n < 0 else ''}\\frac{{{abs(n)}}}{{{d}}}"
    fractions = draw(st.booleans())
    d = st.integers(2, 12) if fractions else st.just(1)
    right = (draw(st.integers(-999, 999)), draw(d))
    wrong = draw((st.tuples(st.integers(-999, 999), d)).filter(lambda w: w[0] * right[1] != right[0] * w[1]))
    return value(*right), value(*wrong)


def response(answer: str, form: str) -> str:
    return {"boxed": f"So the answer is \\boxed{{{answer}}}.", "answer-line": f"Answer: {answer}\n"}[form]


@settings(max_examples=150, deadline=None, database=None)
@given(values=two_values(), hedge=HEDGE, right_first=st.booleans(), named=st.booleans(),
       form=st.sampled_from(["boxed", "answer-line"]), reference_named=st.booleans())
def test_a_hedged_answer_is_unverifiable_against_a_single_reference(warm, values, hedge, right_first, named, form,
                                                                    reference_named):
    right, wrong = values
    first, second = (right, wrong) if right_first else (wrong, right)
    answer = f"x = {first} {hedge} x = {second}" if named else f"{first} {hedge} {second}"
    reference = f"x = {right}" if reference_named else right
    verdict = verify(response(answer, form), reference)
    assert not verdict.correct
    assert error_kind(verdict.error) == UNVERIFIABLE and "more than one value" in verdict.error


# The other side: what a single, plain answer grades as math-verify (after the exact match) grades it.

def graded_by_math_verify(answer: str, reference: str) -> bool:
    from math_verify import parse
    from math_verify import verify as mv_verify

    from taut.tasks.math import normalize

    if normalize(answer) == normalize(reference):
        return True
    boxed = [parse(f"\\boxed{{{a}}}", parsing_timeout=None) for a in (reference, answer)]
    return bool(mv_verify(*boxed, timeout_seconds=None))


@st.composite
def written(draw, n: int, d: int) -> str:
    """n/d in one of the forms an answer takes: integer, decimal, \\frac, \\dfrac, a/b, x = …"""
    sign = "-" if n < 0 else ""
    n = abs(n)
    forms = [f"{sign}\\frac{{{n}}}{{{d}}}", f"{sign}\\dfrac{{{n}}}{{{d}}}", f"{sign}{n}/{d}"]
    if d == 1:
        forms += [f"{sign}{n}", f"{sign}{n}.0"]
    if 1000 % d == 0:
        forms.append(f"{sign}{n / d:g}")
    value = draw(st.sampled_from(forms))
    return draw(st.sampled_from([value, f"x = {value}", f"y={value}", f"x_1 = {value}", f"\\theta = {value}"]))


@settings(max_examples=150, deadline=None, database=None)
@given(n=st.integers(-99, 99), d=st.sampled_from([1, 1, 2, 3, 4, 5, 8]), other=st.integers(-99, 99), data=st.data())
def test_a_single_value_grades_as_before(warm, n, d, other, data):
    reference = data.draw(written(n, d))
    for answer in (data.draw(written(n, d)), data.draw(written(other, d))):
        assert answers_equal(answer, reference, timeout=5.0) == graded_by_math_verify(answer, reference)


COLLECTIONS = [
    ("\\{{a}, {b}\\}", ["\\{{b}, {a}\\}", "\\{{a},{b}\\}", "{a}, {b}", "{a} \\text{ and } {b}", "\\{{a}, {a}\\}"]),
    ("({a}, {b})", ["({a},{b})", "\\left({a}, {b}\\right)", "({b}, {a})", "[{a}, {b})"]),
    ("[{a}, {b})", ["[{a},{b})", "({a}, {b}]", "[{a}, {b}]"]),
    ("(-\\infty, {a}) \\cup ({b}, \\infty)", ["(-\\infty,{a})\\cup({b},\\infty)", "(-\\infty, {a}]\\cup[{b}, \\infty)",
                                           "x < {a} \\text{ or } x > {b}"]),
    ("x = {a} \\text{ or } x = {b}", ["x = {a} \\text{ or } x = {b}", "x = {b} \\text{ or } x = {a}", "{a}, {b}",
                                      "x = {a}, x = {b}"]),
    ("{a} \\le x < {b}", ["{a} \\le x < {b}", "x \\in [{a}, {b})", "{a} < x < {b}"]),
]


def fill(template: str, a: int, b: int) -> str:
    return template.replace("{a}", str(a)).replace("{b}", str(b))


@settings(max_examples=60, deadline=None, database=None)
@given(a=st.integers(-50, 0), b=st.integers(1, 50), pair=st.sampled_from(COLLECTIONS), data=st.data())
def test_intervals_sets_tuples_and_relations_grade_as_before_when_the_reference_is_one(warm, a, b, pair, data):
    reference = fill(pair[0], a, b)
    answer = fill(data.draw(st.sampled_from(pair[1])), a, b)
    assert answers_equal(answer, reference, timeout=5.0) == graded_by_math_verify(answer, reference)

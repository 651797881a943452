"""Hostile model outputs against the math reward: extraction stays linear (and reads what the
old per-box scan and marker expression read), the whole grade stays within its per-sample
limit, and an answer math-verify cannot read is never accepted.

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

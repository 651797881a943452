"""The math verifier: final-answer extraction, equivalence through math-verify, verifier errors
counted (never silently wrong), and a timeout that works inside worker threads."""

from concurrent.futures import ThreadPoolExecutor

import pytest

from taut.tasks.math import (
    TIMEOUT,
    UNVERIFIABLE,
    VerifierError,
    answers_equal,
    error_kind,
    extract_answer,
    is_equivalent,
    verify,
)

# ---------------------------------------------------------------------------------------------
# extraction
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("response, expected", [
    ("so the answer is \\boxed{42}.", "42"),
    ("\\boxed{1} first, then \\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}"),          # the last, nested braces
    ("$\\boxed{\\{1, 2\\}}$", "\\{1, 2\\}"),                                                 # escaped braces are content
    ("\\boxed{x^{2^{3}}} done", "x^{2^{3}}"),
    ("<think>maybe \\boxed{3}</think>The answer is \\boxed{4}", "4"),                        # after the thinking only
    ("<think>\\boxed{3}</think>No box here.", None),
    ("<think>still thinking \\boxed{3}", None),                                              # thinking never closed
    ("\\boxed{5} and then \\boxed{6", None),                                                 # final answer unfinished
    ("Answer: $\\frac{1}{2}$.", "\\frac{1}{2}"),
    ("steps...\n**Answer:** 17\n", "17"),
    ("The final answer is: 7", "7"),
    ("</think> answer 4 2 <eos>", "42"),                                                     # the testbed's digit form
    ("no answer at all", None),
    ("Answer:\n\n  12\n", "12"),                                                               # the value on a later line
    ("Answer: 3 so the answer: 4", "3 so the answer: 4"),                                     # a line's first marker takes it
    ("Answer: 7\r\n", "7"),                                                                   # Windows line ends
    ("**Answer:** *12*", "12"),
])
def test_extract_answer(response, expected):
    assert extract_answer(response) == expected


def test_a_cut_response_counts_only_finished_answers():
    assert extract_answer("\\boxed{12} and more", complete=False) == "12"                 # a closed box is finished
    assert extract_answer("Answer: 12", complete=False) is None                           # may continue: 123
    assert extract_answer("Answer: 12\n", complete=False) == "12"
    assert extract_answer("answer 1 2", complete=False) is None
    assert extract_answer("answer 1 2 check", complete=False) == "12"


# ---------------------------------------------------------------------------------------------
# equivalence
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("predicted, reference", [
    ("0.5", "\\frac{1}{2}"),                        # fraction vs decimal
    ("1/2", "\\frac12"),
    ("\\dfrac{3}{4}", "0.75"),
    ("-0.5", "-\\frac{1}{2}"),
    ("\\sqrt{12}", "2\\sqrt{3}"),                    # LaTeX forms of one number
    ("\\frac{\\sqrt{2}}{2}", "\\sqrt{2}/2"),
    ("1,000", "1000"),
    ("x = 3", "3"),
    ("[1, 2)", "[1,2)"),                            # intervals
    ("(-\\infty, 3]", "(-\\infty,3]"),
    ("\\{3, 2, 1\\}", "\\{1,2,3\\}"),                 # sets, in any order
    ("1+x^2", "x^2+1"),
])
def test_equal_answers(predicted, reference):
    assert answers_equal(predicted, reference)


@pytest.mark.parametrize("predicted, reference", [
    ("41", "42"),
    ("(1, 2]", "[1,2)"),                            # same ends, other closedness
    ("0.33", "\\frac{1}{3}"),
    ("\\{1, 2\\}", "\\{1,2,3\\}"),
    ("3", "\\begin{pmatrix}1\\\\2\\end{pmatrix}"),
    ("3^{n-1}", "2^{n-1}"),                         # another leading term
    ("5n^2+2", "3n^2 + 2"),
    ("\\sum_{k=3}^{n} \\frac{1}{k}", "\\sum_{k=2}^n \\frac1k"),  # another start, in LaTeX: compared
])
def test_different_answers(predicted, reference):
    assert not answers_equal(predicted, reference)


# ---------------------------------------------------------------------------------------------
# answers math-verify cannot read: unverifiable, never accepted
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("predicted, reference", [
    ("Yes", "No"),                                   # math-verify: e*s*y vs n*o
    ("sey", "yes"),                                  # the same product of letters
    ("1 is the only possible value", "0 is the only possible value"),
    ("No real solutions", "No integer solutions"),
    ("The limit exists and is equal to 4", "The limit exists and is equal to 3"),
    ("sum_(k=3)^n 1/k", "sum_(k=2)^n 1/k"),          # both read as 1
    ("sum_(k=2)^n k^3, or equivalently (n(n+1)/2)^3", "sum_(k=2)^n k^3, or equivalently (n(n+1)/2)^2"),
    ("1/2 * sum_(k=1)^n k", "1/3 * sum_(k=1)^n k"),
    ("n \\text{ even}", "n \\text{ odd}"),           # math-verify drops a trailing \text{…}
    ("1", "\\gcd(a, b)"),                            # read as 1: a and b are lost
    ("ab", "\\operatorname{lcm}(a, b)"),              # read as a*b
    ("3", "three"),
    ("three", "3"),                                  # the response's side too
    ("I don't know", "3"),
    ("12 \\text{ apples}", "12"),
    ("9**9**9", "1"),                                # math-verify returns a bare string
])
def test_what_math_verify_cannot_read_is_unverifiable_never_accepted(predicted, reference):
    with pytest.raises(VerifierError) as raised:
        answers_equal(predicted, reference)
    assert raised.value.kind == UNVERIFIABLE and str(raised.value).startswith("unverifiable: ")


@pytest.mark.parametrize("predicted, reference", [
    ("No", "No"),                                    # written as the reference: equal without reading it
    ("\\text{Yes}", "\\text{Yes}"),
    ("0 is the only possible value", "0 is the only possible value"),
    ("5 \\text{ cm}", "5"),                           # a unit math-verify drops
    ("3 \\text{ degrees}", "3"),
    ("\\sqrt{2}/2", "sqrt(2)/2"),                      # bare sqrt reads right
    ("\\infty", "infinity"),
    ("n = 2 \\text{ or } n = 3", "n = 2 or n = 3"),
    ("\\binom{n}{2}", "\\frac{n(n-1)}{2}"),
    ("f(x) = x^2", "f(x)=x^2"),
    ("\\mathbb{R}", "(-\\infty, \\infty)"),
])
def test_plain_mathematics_is_still_compared(predicted, reference):
    assert answers_equal(predicted, reference)


def test_an_unverifiable_verdict_names_its_side_and_is_counted_as_a_verifier_error():
    verdict = verify("The answer is \\boxed{2}.", "0 is the only possible value")
    assert not verdict.correct and verdict.extracted == "2" and error_kind(verdict.error) == UNVERIFIABLE
    assert "the reference answer '0 is the only possible value'" in verdict.error
    verdict = verify("So: \\boxed{\\text{all odd } n}", "5")
    assert not verdict.correct and error_kind(verdict.error) == UNVERIFIABLE and "response's answer" in verdict.error
    assert error_kind(None) is None and error_kind("timeout: …") == TIMEOUT


def test_is_equivalent_reads_the_final_answer_of_a_response():
    assert is_equivalent("<think>2+2=4</think>\nSo the result is $\\boxed{4}$.", "4")
    assert not is_equivalent("<think>2+2=4</think>\nSo the result is $\\boxed{5}$.", "4")
    assert not is_equivalent("I do not know.", "4")


# ---------------------------------------------------------------------------------------------
# verifier errors
# ---------------------------------------------------------------------------------------------


def test_an_unparseable_reference_is_a_verifier_error_not_a_wrong_answer():
    verdict = verify("\\boxed{3}", "\\frac{")
    assert verdict == verify("\\boxed{3}", "\\frac{")          # deterministic
    assert not verdict.correct and verdict.extracted == "3" and "cannot parse the reference" in verdict.error


def test_an_unparseable_prediction_is_wrong_without_an_error():
    verdict = verify("\\boxed{\\frac{}", "2")
    assert not verdict.correct and verdict.error is None


def test_timeout_inside_a_worker_thread_is_a_verifier_error_and_the_next_call_works():
    slow = "\\boxed{9^{9^{9}}}"              # sympy never finishes comparing this with 1
    with ThreadPoolExecutor(max_workers=1) as pool:
        verdict = pool.submit(verify, slow, "1", True, 1.0).result(timeout=60)
        assert not verdict.correct and verdict.extracted == "9^{9^{9}}" and "timed out" in verdict.error
        assert error_kind(verdict.error) == TIMEOUT
        with pytest.raises(VerifierError, match="timed out"):
            pool.submit(is_equivalent, slow, "1", 1.0).result(timeout=60)
        assert pool.submit(verify, "\\boxed{0.25}", "\\frac14").result(timeout=60).correct


def test_evaluation_counts_verifier_errors(tmp_path):
    from taut.config import FileTaskConfig
    from taut.evaluate import grade, summarize
    from taut.tasks.files import FileTask

    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "p1", "answer": "\\\\frac{"}\n{"prompt": "p2", "answer": "2"}\n')
    task = FileTask(FileTaskConfig(path=str(data), split="test"))
    bad, good = task.problems("test", 10)

    class TextPolicy:                          # tokens are characters
        def decode(self, ids):
            return "".join(map(chr, ids))

    def sample(problem, text):
        return grade(task, problem, TextPolicy(), [ord(c) for c in text], False, [100])

    samples = [sample(bad, "\\boxed{3}"), sample(good, "\\boxed{2}"), sample(good, "\\boxed{5}")]
    summary = summarize(samples, [100])
    assert [s.verifier_error for s in samples] == [True, False, False]
    assert summary["verifier_errors"] == 1 and summary["accuracy"] == pytest.approx(1 / 3)

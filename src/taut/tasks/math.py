"""Math answers: final-answer extraction and equivalence through math-verify, with a timeout
that works in any thread.

Extraction (`extract_answer`) reads the *final* answer of a response:

1. the answer region: the text after the last `</think>`; a response that opened `<think>`
   and never closed it has no answer yet; a response without thinking tags is read whole;
2. in it, the content of the last `\\boxed{…}` (nested braces and `\\{ \\}` handled); an
   unclosed `\\boxed{` after it means the final answer is still being written: no answer;
3. else the last "Answer: …" / "answer is: …" line;
4. else the testbed's `answer D D …` form (digits separated by spaces, read as one number).

A response cut before it ended (`complete=False`: truncated, or cut at a token budget) only
counts answers that were finished before the cut: a closed box, or an "Answer:" line or
testbed answer followed by more text.

Equivalence (`answers_equal`): a cheap normalised string comparison first; otherwise both
answers are parsed as `\\boxed{…}` by math-verify and compared with `math_verify.verify`
(fractions vs decimals, LaTeX forms, intervals, sets, equations such as `x = 3` vs `3`).

Timeouts. math-verify's own timeout uses `signal.alarm`, which raises in any thread but the
main one (trainers and reward workers call verifiers from threads). Here parse and verify run
with their timeouts disabled (`parsing_timeout=None`, `timeout_seconds=None`) inside one
long-lived helper process; the caller waits at most `timeout` seconds for its reply and, past
that, kills the helper (a new one starts on the next call). This works in every thread, and a
comparison that never ends (sympy on `9^{9^{9}}`) cannot hang or leak CPU. Calls are
serialised by a lock; a comparison takes about 2 ms (measured on a busy 2-core CPU, most of it
math-verify's own parsing). Exact matches after light normalisation skip the helper.

A comparison that raises, times out, or whose reference answer math-verify cannot parse is a
*verifier error*: `verify` returns `Verdict(correct=False, extracted=…, error="…")`, which
evaluation and the trainer count separately, never as a plain wrong answer. A response whose
extracted answer does not parse is the model's fault: it is graded wrong, without an error.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import queue
import re
import subprocess
import sys
import threading

from taut.tasks.base import Verdict

DEFAULT_TIMEOUT = 5.0        # seconds per comparison
STARTUP_TIMEOUT = 120.0      # seconds for the helper process to import math-verify

THINK, END_THINK = "<think>", "</think>"


class VerifierError(RuntimeError):
    """The verifier could not decide (it raised, timed out, or cannot read the reference)."""


# ---------------------------------------------------------------------------------------------
# extraction
# ---------------------------------------------------------------------------------------------


_ANSWER_LINE = re.compile(r"(?im)^[^\n]*?\banswer\b(?:\s+is)?\s*\**\s*[:：]\s*\**[ \t]*(?P<value>[^\n]*\S)[ \t]*$")
_TESTBED = re.compile(r"\banswer((?:[ \t]+\d+)+)(?=[ \t]*(?P<after>.?))", re.S)


def answer_region(response: str) -> str | None:
    """The part of a response that may hold its final answer; None while still thinking."""
    if END_THINK in response:
        return response.rsplit(END_THINK, 1)[1]
    if THINK in response:
        return None
    return response


def last_boxed(text: str) -> tuple[str | None, bool]:
    """(content of the last closed `\\boxed{…}` / `\\fbox{…}`, whether an unclosed one follows it)."""
    found, unclosed = None, False
    for match in re.finditer(r"\\(?:boxed|fbox)\s*\{", text):
        content = _balanced(text, match.end())
        if content is None:
            unclosed = True
        else:
            found, unclosed = content, False
    return found, unclosed


def _balanced(text: str, start: int) -> str | None:
    """The text from `start` up to the brace closing the one just before it (None if unclosed)."""
    depth, i = 1, start
    while i < len(text):
        ch = text[i]
        if ch == "\\" and i + 1 < len(text) and text[i + 1] in "{}":
            i += 2                      # an escaped brace (\{ \}) is content, not structure
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[start:i]
        i += 1
    return None


def extract_answer(response: str, complete: bool = True) -> str | None:
    """The final answer written in a response, or None (see the module docstring)."""
    region = answer_region(response)
    if region is None:
        return None
    boxed, unclosed = last_boxed(region)
    if unclosed:
        return None
    if boxed is not None:
        return boxed.strip() or None
    settled = region
    if not complete and not region.endswith("\n"):
        settled = region.rpartition("\n")[0]         # the last line may still be being written
    lines = list(_ANSWER_LINE.finditer(settled))
    if lines:
        return _strip_answer(lines[-1].group("value"))
    testbed = [m for m in _TESTBED.finditer(region) if complete or m.group("after")]
    if testbed:
        return "".join(testbed[-1].group(1).split())
    return None


def _strip_answer(value: str) -> str | None:
    value = value.strip().strip("*").strip()
    if value.endswith(".") and not value[:-1].rstrip().endswith("."):
        value = value[:-1].rstrip()
    if len(value) >= 2 and value[0] == "$" and value[-1] == "$":
        value = value.strip("$").strip()
    return value or None


# ---------------------------------------------------------------------------------------------
# equivalence
# ---------------------------------------------------------------------------------------------


_SPACING = re.compile(r"\\[,;:!]|\\left|\\right|(?<![A-Za-z0-9])\s+|\s+(?![A-Za-z0-9])")


def normalize(answer: str) -> str:
    """A light canonical form for the cheap exact-match check (never used to reject)."""
    s = answer.strip().strip("$")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _SPACING.sub("", s)
    return s.rstrip(".")


def answers_equal(predicted: str, reference: str, timeout: float = DEFAULT_TIMEOUT) -> bool:
    """Whether two extracted answers are mathematically equal. Raises `VerifierError` when
    math-verify raises, exceeds `timeout` seconds, or cannot parse the reference."""
    if normalize(predicted) == normalize(reference):
        return True
    return _helper().compare(predicted, reference, timeout)


def is_equivalent(response: str, answer: str, timeout: float = DEFAULT_TIMEOUT) -> bool:
    """Whether the final answer of `response` equals the reference `answer`.

    False when the response has no final answer; raises `VerifierError` when the verifier
    cannot decide (see `answers_equal`).
    """
    extracted = extract_answer(response)
    return extracted is not None and answers_equal(extracted, answer, timeout)


def verify(response: str, answer: str, complete: bool = True, timeout: float = DEFAULT_TIMEOUT) -> Verdict:
    """Grade a response against a reference answer; verifier failures come back as `error`."""
    extracted = extract_answer(response, complete)
    if extracted is None:
        return Verdict(correct=False, extracted=None)
    try:
        return Verdict(correct=answers_equal(extracted, answer, timeout), extracted=extracted)
    except VerifierError as err:
        return Verdict(correct=False, extracted=extracted, error=str(err))


# ---------------------------------------------------------------------------------------------
# the helper process
# ---------------------------------------------------------------------------------------------


class _Helper:
    """One long-lived `python -m taut.tasks.math` process running math-verify, spoken to in
    JSON lines; replaced when a call times out or it dies. A plain subprocess (not
    multiprocessing) so that nothing of the caller's main module is re-imported."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._replies: queue.Queue = queue.Queue()

    def compare(self, predicted: str, reference: str, timeout: float) -> bool:
        with self._lock:
            self._ensure_started()
            try:
                self._process.stdin.write(json.dumps({"predicted": predicted, "reference": reference}) + "\n")
                self._process.stdin.flush()
                reply = self._replies.get(timeout=timeout)
            except queue.Empty:
                self._stop()
                raise VerifierError(f"math-verify timed out after {timeout:g} s comparing {predicted[:80]!r} "
                                    f"with {reference[:80]!r}") from None
            except OSError as err:                      # the helper died between calls
                self._stop()
                raise VerifierError(f"the math-verify helper failed: {err!r}") from None
            if reply is None:
                self._stop()
                raise VerifierError("the math-verify helper exited unexpectedly")
        if "error" in reply:
            raise VerifierError(reply["error"])
        return bool(reply["equal"])

    def _ensure_started(self) -> None:
        if self._process is not None and self._process.poll() is None:
            return
        self._stop()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}   # the caller's imports
        self._process = subprocess.Popen([sys.executable, "-m", "taut.tasks.math"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, text=True, encoding="utf-8", env=env)
        self._replies = queue.Queue()
        threading.Thread(target=_read_replies, args=(self._process.stdout, self._replies), daemon=True).start()
        try:
            hello = self._replies.get(timeout=STARTUP_TIMEOUT)
        except queue.Empty:
            self._stop()
            raise VerifierError(f"the math-verify helper did not start within {STARTUP_TIMEOUT:g} s") from None
        if hello is None or "error" in hello:
            self._stop()
            raise VerifierError(f"the math-verify helper could not start: {(hello or {}).get('error', 'it exited')}")

    def _stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            for stream in (self._process.stdin, self._process.stdout):
                stream.close()
        self._process = None

    def close(self) -> None:
        with self._lock:
            self._stop()


def _read_replies(stream, replies: queue.Queue) -> None:
    """Forward the helper's JSON replies; None once it has exited."""
    try:
        for line in stream:
            replies.put(json.loads(line))
    except (OSError, ValueError):
        pass
    replies.put(None)


_HELPER: _Helper | None = None
_HELPER_LOCK = threading.Lock()


def _helper() -> _Helper:
    global _HELPER
    with _HELPER_LOCK:
        if _HELPER is None:
            _HELPER = _Helper()
            atexit.register(_HELPER.close)
        return _HELPER


def _serve() -> None:
    """The helper: answer one JSON request per stdin line with one JSON reply per stdout line."""
    def reply(message: dict) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    try:
        from math_verify import parse
        from math_verify import verify as mv_verify
        from sympy import Basic, MatrixBase
    except ImportError as err:
        reply({"error": f"{err}; install the math extra: pip install 'taut[math]'"})
        return
    logging.getLogger("math_verify").setLevel(logging.ERROR)   # it warns that its own timeout is off: ours is on
    reply({"ready": True})
    for line in sys.stdin:
        request = json.loads(line)
        reference, predicted = request["reference"], request["predicted"]
        try:
            gold = parse(f"\\boxed{{{reference}}}", parsing_timeout=None, raise_on_error=True)
            if not any(isinstance(g, (Basic, MatrixBase)) for g in gold):
                reply({"error": f"math-verify cannot parse the reference answer {reference[:80]!r}"})
                continue
            target = parse(f"\\boxed{{{predicted}}}", parsing_timeout=None, raise_on_error=True)
            reply({"equal": bool(mv_verify(gold, target, timeout_seconds=None, raise_on_error=True))})
        except Exception as err:      # reported to the caller as a verifier error, never as a wrong answer
            reply({"error": f"math-verify raised {type(err).__name__}: {str(err)[:200]}"})


if __name__ == "__main__":
    _serve()

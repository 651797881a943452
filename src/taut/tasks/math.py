"""Math answers: final-answer extraction and equivalence through math-verify, the whole grade of
a response bounded in time, in any thread.

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

Extraction takes time linear in the response: one pass over the braces pairs every box with
its closing brace, and each "answer" word is matched by an expression that cannot backtrack
over the whitespace after it more than once. (Regular expressions with nested quantifiers over
that whitespace, and a brace scan restarted at every `\\boxed{`, took minutes on a few
thousand characters of model output.)

Equivalence (`answers_equal`): a cheap normalised string comparison first; otherwise both
answers are parsed as `\\boxed{…}` by math-verify and compared with `math_verify.verify`
(fractions vs decimals, LaTeX forms, intervals, sets, equations such as `x = 3` vs `3`).

Unverifiable answers. math-verify reads any text as mathematics: a word becomes a product of
one-letter symbols (`yes` is e·s·y, so it equals `sey`), a trailing `\\text{…}` is dropped
(`n \\text{ odd}` reads as `n`), and notation it does not know loses terms (`sum_(k=2)^n 1/k`
reads as 1, and so equals `sum_(k=3)^n 1/k`). Comparing such readings accepts wrong answers,
so an answer on either side that is not plain mathematics is *unverifiable* (`readable`):

- it holds a word: three or more letters in a row outside a LaTeX command name (other than
  `sqrt`, `and`, `or`, `infinity`, which math-verify reads correctly), a short English word or
  function name written without its backslash (`no`, `ln`, `pi`, …), or, inside `\\text{…}` and
  the other text and font commands, a word of two letters or more that is not a unit;
- math-verify cannot parse it into a mathematical object;
- math-verify's reading lost a letter the answer holds (`\\gcd(a, b)` reads as 1); or
- the reference states one value (a number or expression, or `x = …`) and the response's answer
  offers more than one or relates two (`41 \\lor 42`, `41, 42`, `41 = 42`, `41 \\approx 42`,
  `x = 41 \\text{ or } x = 42`, `41 \\\\ 42`; `second_value_mark`): math-verify keeps one operand of
  most of these and compares it, which would pay a policy for writing two candidates. Commas and
  semicolons count outside brackets only (`(1, 2)` is one tuple, `1,000` one number), bars when
  unpaired (`41 | 42`, not `|x|`). A reference that is itself a set, tuple, interval, relation or
  matrix is compared by math-verify as before.

The normalised string comparison still comes first, so an answer written exactly as its
reference is accepted whatever it holds.

Time. The whole grade of a response — extraction, parsing, equivalence — runs in one
long-lived helper process, and the caller waits at most `timeout` seconds for its reply; past
that it kills the helper (a new one starts on the next call, under its own startup limit,
which no sample is charged for). math-verify's own timeout uses `signal.alarm`, which raises
in any thread but the main one (trainers and reward workers call verifiers from threads), so
the helper runs parse and verify with their timeouts disabled; a comparison that never ends
(sympy on `9^{9^{9}}`) cannot hang the caller or leak CPU. Calls are serialised by a lock; a
grade takes a few ms (most of it math-verify's own parsing; an exact match skips math-verify).

Verdicts. A grade that cannot decide is a *verifier error*: `verify` returns
`Verdict(correct=False, extracted=…, error="<kind>: …")`, with one of three kinds
(`error_kind` reads it back):

- `timeout`: the grade took longer than `timeout` seconds;
- `unverifiable`: the reference or the response's answer is not plain mathematics (above);
- `failed`: math-verify raised, or its helper died or cannot start.

A verifier error is never scored correct, and it is not silently wrong either: the trainer
(`taut.rl.trainer.collect`) gives the sample the reward of an incorrect answer and counts it in
the step's `verifier_errors` metric; evaluation reports `verifier_errors` next to accuracy;
TRL's `TaskVerifier` raises. A response with no final answer is wrong, without an error.
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
import time

from taut.tasks.base import Verdict

DEFAULT_TIMEOUT = 5.0        # seconds per sample: extraction, parsing and equivalence together
STARTUP_TIMEOUT = 120.0      # seconds for the helper process to import math-verify

THINK, END_THINK = "<think>", "</think>"

TIMEOUT, UNVERIFIABLE, FAILED = "timeout", "unverifiable", "failed"
ERROR_KINDS = (TIMEOUT, UNVERIFIABLE, FAILED)


class VerifierError(RuntimeError):
    """The verifier could not decide; `kind` (one of `ERROR_KINDS`) leads the message."""

    def __init__(self, kind: str, message: str, extracted: str | None = None):
        super().__init__(f"{kind}: {message}")
        self.kind, self.message = kind, message
        self.extracted = extracted          # the response's answer, when extraction had finished

    def __reduce__(self):                   # picklable across worker processes
        return type(self), (self.kind, self.message, self.extracted)


def error_kind(error: str | None) -> str | None:
    """The kind of verifier error a `Verdict.error` of this module reports (None: no error)."""
    if error is None:
        return None
    kind = error.partition(":")[0]
    return kind if kind in ERROR_KINDS else FAILED


# ---------------------------------------------------------------------------------------------
# extraction (linear in the response)
# ---------------------------------------------------------------------------------------------


_BOX_OPEN = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE = re.compile(r"\\[{}]|[{}]")                  # an escaped brace (\{ \}) is content, not structure
_ANSWER_WORD = re.compile(r"\banswer\b", re.I)
_ANSWER_MARK = re.compile(r"answer(?:\s+is)?[\s*]*[:：]\s*", re.I)    # matched where an "answer" word starts
_TESTBED = re.compile(r"\banswer((?:[ \t]+\d+)+)(?=[ \t]*(?P<after>.?))", re.S)


def answer_region(response: str) -> str | None:
    """The part of a response that may hold its final answer; None while still thinking."""
    if END_THINK in response:
        return response.rsplit(END_THINK, 1)[1]
    if THINK in response:
        return None
    return response


def last_boxed(text: str) -> tuple[str | None, bool]:
    """(content of the last closed `\\boxed{…}` / `\\fbox{…}`, whether an unclosed one follows it).

    "Last" is by where the box opens. One pass over the braces with a stack of the open ones.
    """
    boxes = {m.end() - 1 for m in _BOX_OPEN.finditer(text)}         # where each box's `{` is
    open_braces, closed = [], []                                     # closed: (`{`, `}`) of boxes
    for brace in _BRACE.finditer(text):
        if brace.group() == "{":
            open_braces.append(brace.start())
        elif brace.group() == "}" and open_braces:
            start = open_braces.pop()
            if start in boxes:
                closed.append((start, brace.start()))
    start, end = max(closed, default=(-1, -1))
    unclosed = any(p > start and p in boxes for p in open_braces)
    return (text[start + 1:end] if closed else None), unclosed


def answer_lines(text: str) -> list[str]:
    """The values of the "Answer: …" lines of a text, in order.

    A marker is an "answer" word, optionally "is", then stars and spaces, then a colon; its
    value is the rest of the first line after the colon that holds anything (a marker may end
    its line). The first marker of a line that has a value takes that line, up to the line its
    value ends, and the search goes on after it.
    """
    values, resume = [], 0
    for word in _ANSWER_WORD.finditer(text):
        if word.start() < resume:
            continue
        mark = _ANSWER_MARK.match(text, word.start())
        if mark is None or mark.end() == len(text):
            continue
        end = text.find("\n", mark.end())
        end = len(text) if end < 0 else end
        values.append(text[mark.end():end].lstrip("*").lstrip(" \t"))
        resume = end
    return values


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
    lines = answer_lines(settled)
    if lines:
        return _strip_answer(lines[-1])
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
    """Whether two extracted answers are mathematically equal. Raises `VerifierError` when the
    comparison exceeds `timeout` seconds, when either answer is unverifiable, or when
    math-verify raises."""
    return _helper().grade({"predicted": predicted, "reference": reference}, timeout)[1]


def is_equivalent(response: str, answer: str, timeout: float = DEFAULT_TIMEOUT) -> bool:
    """Whether the final answer of `response` equals the reference `answer`.

    False when the response has no final answer; raises `VerifierError` when the verifier
    cannot decide (see `answers_equal`); `timeout` bounds the whole grade.
    """
    return _helper().grade({"response": response, "reference": answer, "complete": True}, timeout)[1]


def verify(response: str, answer: str, complete: bool = True, timeout: float = DEFAULT_TIMEOUT) -> Verdict:
    """Grade a response against a reference answer within `timeout` seconds, extraction
    included; a verifier error comes back as `error` (see the module docstring)."""
    try:
        extracted, equal = _helper().grade({"response": response, "reference": answer, "complete": complete}, timeout)
    except VerifierError as err:
        return Verdict(correct=False, extracted=err.extracted, error=str(err))
    return Verdict(correct=equal, extracted=extracted)


# ---------------------------------------------------------------------------------------------
# what math-verify reads faithfully
# ---------------------------------------------------------------------------------------------


_TEXT_GROUP = re.compile(r"\\(?:text(?:bf|it|rm|sf|tt|up|normal)?|math(?:rm|bf|it|sf|tt)|[mh]box|operatorname)"
                         r"\s*\{([^{}]*)\}")
_NAME_GROUP = re.compile(r"\\(?:math(?:bb|cal|frak|scr)|begin|end)\s*\{[^{}]*\}")      # sets (\mathbb{R}), environments
_COMMAND = re.compile(r"\\[A-Za-z]+")
_WORD = re.compile(r"[^\W\d_]+")                   # a run of letters

READ_WORDS = frozenset({"sqrt", "and", "or", "infinity"})      # written bare, math-verify still reads them right
SHORT_WORDS = frozenset({"no", "is", "if", "of", "in", "on", "at", "an", "as", "be", "by", "it", "to", "so", "we",
                         "ln", "lg", "pi", "tg"})                # two letters, but a word or a function, not x·y
UNITS = frozenset("""
    mm cm dm km meter meters metre metres millimeter millimeters centimeter centimeters kilometer kilometers
    in inch inches ft foot feet yd yard yards mi mile miles sq square cubic unit units
    deg degree degrees rad radian radians sec second seconds min minute minutes hr hrs hour hours
    day days week weeks month months year years mg kg gram grams kilogram kilograms lb lbs pound pounds
    oz ounce ounces ml liter liters litre litres gal gallon gallons dollar dollars cent cents mph kph
    percent
""".split())                                         # in \text{…}: math-verify drops a trailing unit
CONSTANT_LETTERS = frozenset("ei")                    # e and i read as constants, not symbols


class Unverifiable(ValueError):
    """An answer that math-verify would read as something other than what it says."""


def unreadable_word(answer: str) -> str | None:
    """The first word of `answer` that math-verify would misread (see the module docstring)."""
    for group in _TEXT_GROUP.finditer(answer):
        for word in _WORD.findall(group.group(1)):
            if len(word) >= 2 and word.lower() not in UNITS and word.lower() not in READ_WORDS:
                return word
    for word in _WORD.findall(_math_text(answer)):
        if word.lower() in READ_WORDS:
            continue
        if len(word) >= 3 or word.lower() in SHORT_WORDS or (len(word) == 2 and not word.isascii()):
            return word
    return None


def lost_letters(answer: str, readings: list) -> set[str]:
    """Letters written in `answer` (outside commands and text) that no symbol or function of
    math-verify's `readings` (sympy objects) holds."""
    written = {ch.lower() for word in _WORD.findall(_math_text(answer)) if word.lower() not in READ_WORDS
               for ch in word if ch.isascii()}
    from sympy import Symbol
    from sympy.core.function import AppliedUndef

    read = set()
    for reading in readings:
        read |= {ch.lower() for atom in reading.atoms(Symbol) for ch in atom.name}
        read |= {ch.lower() for atom in reading.atoms(AppliedUndef) for ch in atom.func.__name__}
    return written - read - CONSTANT_LETTERS


def _math_text(answer: str) -> str:
    """`answer` without its text groups, set and environment names, and command names."""
    return _COMMAND.sub(" ", _NAME_GROUP.sub(" ", _TEXT_GROUP.sub(" ", answer)))


def read_answer(answer: str, side: str) -> list:
    """math-verify's parse of an answer, or `Unverifiable` (`side` names it in the message)."""
    from math_verify import parse
    from sympy import Basic, MatrixBase

    shown = f"{answer[:80]!r}{'…' if len(answer) > 80 else ''}"
    word = unreadable_word(answer)
    if word is not None:
        raise Unverifiable(f"the {side} {shown} holds the word {word[:40]!r}, which math-verify cannot read")
    parsed = parse(f"\\boxed{{{answer}}}", parsing_timeout=None, raise_on_error=True)
    readings = [p for p in parsed if isinstance(p, (Basic, MatrixBase))]
    if not readings:
        raise Unverifiable(f"math-verify cannot parse the {side} {shown}")
    lost = lost_letters(answer, readings)
    if lost:
        raise Unverifiable(f"math-verify's reading of the {side} {shown} loses {', '.join(sorted(lost))}")
    return parsed


def equal_in_helper(predicted: str, reference: str) -> bool:
    """The comparison the helper runs; raises `Unverifiable`, `ImportError` without math-verify,
    or whatever math-verify raises."""
    if normalize(predicted) == normalize(reference):
        return True
    from math_verify import verify as mv_verify

    gold = read_answer(reference, "reference answer")
    if states_one_value(reference, gold):
        mark = second_value_mark(predicted)
        if mark is not None:
            raise Unverifiable(f"the response's answer {predicted[:80]!r} offers more than one value ({mark!r}) "
                               f"where the reference {reference[:80]!r} states one")
    target = read_answer(predicted, "response's answer")
    return bool(mv_verify(gold, target, timeout_seconds=None, raise_on_error=True))


# ---------------------------------------------------------------------------------------------
# answers that state one value
# ---------------------------------------------------------------------------------------------


# marks of a second value: alternatives, set operations, relations, arrows, list and line breaks
# (math-verify reads `41 \lor 42`, `41 = 42` and `41 \hspace{1em} 42` each as 42)
SECOND_VALUE_COMMANDS = frozenset("""
    lor vee land wedge bigvee bigwedge
    cup cap setminus backslash sqcup uplus bigcup bigcap
    ne neq not le leq ge geq lt gt leqslant geqslant ll gg approx sim simeq cong equiv doteq propto coloneqq
    in notin ni subset subseteq supset supseteq perp parallel mid vdash colon pm mp
    to rightarrow Rightarrow longrightarrow Longrightarrow implies iff leftrightarrow Leftrightarrow
    longleftrightarrow Longleftrightarrow mapsto gets leftarrow Leftarrow impliedby
    newline cr dots ldots cdots vdots ddots hspace hskip kern mkern mspace mskip
""".split())
SECOND_VALUE_MARKS = frozenset(["=", "<", ">", "&", "\\\\", "\\&", *"≈≤≥≠≡∼∨∧∪∩∈⊂⊆→⇒⇔±∓…"])
_LIST_MARKS = frozenset(",;")                        # only outside brackets: `(1, 2)` is one tuple
_OPENERS, _CLOSERS = frozenset(["(", "[", "{", "\\{"]), frozenset([")", "]", "}", "\\}"])
_BARS = frozenset(["|", "\\vert", "\\lvert", "\\rvert"])
_DOUBLE_BARS = frozenset(["\\|", "\\Vert", "\\lVert", "\\rVert"])
_TOKEN = re.compile(r"\\[A-Za-z]+|\\.|.", re.S)
_THOUSANDS = re.compile(r"(?<=\d)(?:,|\{,\})(?=\d{3}(?!\d))")         # 1,000 and 1{,}000
_NAME_IS = re.compile(r"\s*(?:\\[A-Za-z]+|[A-Za-z])(?:_(?:\{[^{}]*\}|\w))?'*(?:\([^()=]*\))?\s*=(?!=)")   # x_1 =, f(x) =
_OR_AND = re.compile(r"\b(?:or|and)\b", re.I)


def second_value_mark(answer: str) -> str | None:
    """What in `answer` offers a second value or relates two values, or None when it states one
    (`x = …`, `f(x) = …` name the value they state). Text groups are read as their text."""
    text = _THOUSANDS.sub("", _TEXT_GROUP.sub(r" \1 ", answer))
    named = _NAME_IS.match(text)
    text = text[named.end():] if named else text
    words = _OR_AND.search(_COMMAND.sub(" ", text))
    if words:
        return words.group()
    depth, bars, double_bars = 0, 0, 0
    for token in _TOKEN.findall(text):
        command = token.startswith("\\") and token[1:] in SECOND_VALUE_COMMANDS
        if command or token in SECOND_VALUE_MARKS or (token in _LIST_MARKS and depth <= 0):
            return token
        depth += (token in _OPENERS) - (token in _CLOSERS)
        bars += token in _BARS
        double_bars += token in _DOUBLE_BARS
    return "|" if bars % 2 else "\\|" if double_bars % 2 else None     # `|x|` pairs its bars; `41 | 42` does not


def states_one_value(answer: str, readings: list) -> bool:
    """Whether an answer, read by math-verify as `readings`, is one value: a number or expression,
    or `name = value`; not a set, tuple, interval, relation or matrix."""
    from sympy import Eq, Expr, MatrixBase, Symbol
    from sympy.core.function import AppliedUndef

    def one(reading) -> bool:
        if isinstance(reading, Eq):
            return isinstance(reading.lhs, (Symbol, AppliedUndef)) and one(reading.rhs)
        return isinstance(reading, Expr) and not isinstance(reading, MatrixBase)

    sympy_readings = [r for r in readings if not isinstance(r, str)]
    return second_value_mark(answer) is None and all(one(r) for r in sympy_readings)


# ---------------------------------------------------------------------------------------------
# the helper process
# ---------------------------------------------------------------------------------------------


class _Helper:
    """One long-lived `python -m taut.tasks.math` process that grades, spoken to in JSON lines;
    replaced when a grade times out or it dies. A plain subprocess (not multiprocessing) so
    that nothing of the caller's main module is re-imported."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._replies: queue.Queue = queue.Queue()

    def grade(self, request: dict, timeout: float) -> tuple[str | None, bool]:
        """(the answer graded, whether it equals the reference) for `{"response", "reference",
        "complete"}` (extraction first) or `{"predicted", "reference"}`; all within `timeout` s."""
        with self._lock:
            self._ensure_started()
            deadline = time.monotonic() + timeout
            extracted = request.get("predicted")
            try:
                self._process.stdin.write(json.dumps(request) + "\n")
                self._process.stdin.flush()
                reply = self._reply(deadline)
                if "extracted" in reply:                    # extraction is done; the comparison follows
                    extracted = reply["extracted"]
                    reply = self._reply(deadline)
            except EOFError:
                self._stop()
                raise VerifierError(FAILED, "the math-verify helper exited unexpectedly", extracted) from None
            except queue.Empty:
                self._stop()
                answer = "no answer yet" if extracted is None else f"comparing {extracted[:80]!r}"
                raise VerifierError(TIMEOUT, f"the grade timed out after {timeout:g} s ({answer} with the "
                                             f"reference {request['reference'][:80]!r})", extracted) from None
            except OSError as err:                      # the helper died between calls
                self._stop()
                raise VerifierError(FAILED, f"the math-verify helper failed: {err!r}", extracted) from None
        if "error" in reply:
            raise VerifierError(reply["kind"], reply["error"], extracted)
        return extracted, bool(reply["equal"])

    def _reply(self, deadline: float) -> dict:
        """The helper's next reply; `queue.Empty` past the deadline, `EOFError` if it exited."""
        reply = self._replies.get(timeout=max(0.0, deadline - time.monotonic()))
        if reply is None:
            raise EOFError
        return reply

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
            raise VerifierError(FAILED, f"the math-verify helper did not start within {STARTUP_TIMEOUT:g} s") from None
        if hello is None:
            self._stop()
            raise VerifierError(FAILED, "the math-verify helper exited while starting")

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
    """The helper: answer each JSON request line (see `_Helper.grade`) with JSON reply lines."""
    def send(message: dict) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    try:
        import math_verify  # noqa: F401  (imported before the first grade, not during it)
    except ImportError:
        pass                            # exact matches still grade; any other comparison reports it
    logging.getLogger("math_verify").setLevel(logging.ERROR)   # it warns that its own timeout is off: ours is on
    send({"ready": True})
    for line in sys.stdin:
        request = json.loads(line)
        if "response" in request:
            predicted = extract_answer(request["response"], request["complete"])
            send({"extracted": predicted})
            if predicted is None:
                send({"equal": False})
                continue
        else:
            predicted = request["predicted"]
        try:
            send({"equal": equal_in_helper(predicted, request["reference"])})
        except Unverifiable as err:
            send({"kind": UNVERIFIABLE, "error": str(err)})
        except ImportError as err:
            send({"kind": FAILED, "error": f"{err}; install the math extra: pip install 'taut[math]'"})
        except Exception as err:      # reported to the caller as a verifier error, never as a wrong answer
            send({"kind": FAILED, "error": f"math-verify raised {type(err).__name__}: {str(err)[:200]}"})


if __name__ == "__main__":
    _serve()

"""Written arithmetic: taut's own natural-language task families, with an oracle of the necessary steps.

The testbed (taut.tasks.gym) has an oracle but speaks a grammar of its own; reasoning-gym speaks
English but cannot say which part of a response was needed. These families do both, so that a
real pretrained model can be made into an overthinker (SFT on `traces`) and its compression
measured in necessary and redundant tokens (docs/written.md).

Families (spec `written:NAME`, `written` = the two trained ones, `written:all` = all three):

    columns   addition and subtraction written column by column, with carries and borrows.
              Level 1: one column of work (a number below 1000 and one digit, no carry or
              borrow): the direct answer suffices. Level k ≥ 2: k-digit numbers, one step per
              column, each necessary.
    stories   word problems with small numbers: a starting amount, then k changes (level k,
              one step each: "23 + 5 = 28."). Level 1: one change, the direct answer suffices.
    times     a number of k + 1 digits times one digit, column by column (level k, one step per
              column). Held out: for evaluation only (transfer).

Levels 1-4 by default; columns and times take levels up to 6.

Response format (the prompt asks for it): steps, one per line, then the final answer on a line
of its own, `Answer: N`. For example, columns level 3, `What is 482 + 356?`:

    Ones: 482 has 2, 356 has 6. 2 + 6 + 0 = 8. Write 8, carry 0. So far: 8.
    Tens: 482 has 8, 356 has 5. 8 + 5 + 0 = 13. Write 3, carry 1. So far: 38.
    Hundreds: 482 has 4, 356 has 3. 4 + 3 + 1 = 8. Write 8. So far: 838.
    Answer: 838

Each column line names the digits it reads (copied from the numbers written just before it: a
fixed short distance back, not counted from the question's right end) and ends with the number
the digits written so far make (one digit put in front of the last line's number, so the answer
is a copy, not a reassembly); a subtraction line states the comparison that decides its borrow (`Tens: 603 has 0, 251 has 5. 0 - 0 = 0, less than 5:
borrow, 10 - 5 = 5. Write 5, borrow 1. So far: 52.`).

Formats (`Written.format`; task kinds `written2`, `written3`): the same problems, their steps
written otherwise. Format 2 writes every column alike (the last one too: `Write 3, carry 1.`, then
`Carry: 1. Write 1. So far: 138.` for a carry left over), puts both digits of a borrow comparison
before its verdict (`0 vs 3: less, borrow, 10 - 3 = 7.`), keeps the zeros of `So far` (`076`), and
works each story change digit by digit (`65 - 6: ones 5 vs 6: less, borrow, 15 - 6 = 9; tens 6 - 1
= 5. 65 - 6 = 59.`). Format 3 (`written3`) is format 2 with the columns to work named first
(`Columns: Ones, Tens, Hundreds.`, in columns and times): with every column written alike, format 2
leaves nothing that says where a number ends, and a model trained on it stops early on the
level-1 sums that mix widths (`482 + 5`). `error_kind` names where a response first departs from
the working.

Grading (`verify`): every `Answer:` line of the response is read (a cut-off response's last,
unfinished line is not); the response is correct when there is at least one, each holds exactly
one integer (`838`, `**838**`, `838.`, `1,838`; not `0838`), and they all equal the reference. Two
candidates (`Answer: 837 or 838`, `\\boxed{837 \\lor 838}`, two `Answer:` lines that differ) are
never correct; nothing earns partial credit.

The oracle (`analyze`): the necessary part of a response is, before its first `Answer:` line,
the first step line of each necessary step (columns and times: the first line labelled with each
column the problem has, its carry line and, in format 3, its `Columns:` plan; stories: the first k step lines that continue the chain, each starting
from the previous one's result), and the first answer line.
Everything else is redundant: a restatement, a re-check of a step, a repeated column, a
hesitation, and everything after the first answer line. On level 1 of columns and stories no step
is necessary, so any thinking is redundant. Tokens are counted with the `count` function given
(the policy's tokenizer in `taut eval`; whitespace words without one). A response without an
`Answer:` line does not follow the format: the oracle says nothing (None), and evaluation counts
it as unknown.

Splits: a problem's key is its arithmetic (`columns:482+356`, `stories:23+5-3`,
`times:47*6`); the split is a hash of the key (70 / 10 / 20 %), and the wording (names, items,
phrasing) is chosen from the key, so one calculation has one question and never serves two
splits. `times` asks each product in both orders (`47 × 6`, `6 × 47`), keyed apart.

SFT traces (`traces`): the minimal response plus redundancy drawn from a mixture (`Redundancy`):
a restatement of the problem before the steps, re-checks after steps, and rounds after the
answer (a second pass through every step, an inverse check, or a short confirmation), with
a share of direct answers on level 1.
"""

from __future__ import annotations

import dataclasses
import hashlib
import random
import re
from collections.abc import Callable
from dataclasses import dataclass

from taut.tasks.base import BUDGET_INSTRUCTION, Problem, Split, TraceAnalysis, Verdict, check_split, split_of

PREFIX = "written"
FORMATS = {"written": 1, "written2": 2, "written3": 3}     # task kind -> the format its steps are written in (module docstring)
INSTRUCTION = "Think step by step, then give the final answer on its own line as 'Answer: N'."
COLUMNS = ("Ones", "Tens", "Hundreds", "Thousands", "Ten-thousands", "Hundred-thousands", "Millions")
DEFAULT_LEVELS = (1, 2, 3, 4)
MAX_DRAWS = 200_000           # candidate draws per (family, level, split) before giving up on more distinct problems

_ANSWER_LINE = re.compile(r"^[ \t]*(?:\*\*)?answer(?:\*\*)?[ \t]*:(?:\*\*)?(.*)$", re.I | re.M)
_INTEGER = re.compile(r"0|-?[1-9](?:\d{0,2}(?:,\d{3})+|\d*)")        # no leading zero, thousands commas optional
_COLUMN_STEP = re.compile(r"^[ \t]*(" + "|".join((*COLUMNS, "Carry", "Columns")) + r")[ \t]*:", re.M)
_STORY_STEP = re.compile(r"^[ \t]*(\d+) [+-] \d+ = (\d+)\.?[ \t]*$")
_STORY_STEP_2 = re.compile(r"^[ \t]*(\d+) ([+-]) (\d+): .*\. \1 \2 \3 = (\d+)\.?[ \t]*$")       # formats 2 and 3

Counter_ = Callable[[str], int]


def words(text: str) -> int:
    """The default token count without a tokenizer: whitespace-separated words."""
    return len(text.split())


# ---- the families ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Written:
    """One problem: its family, level and operands (Problem.data)."""

    family: str
    level: int
    numbers: tuple[int, ...]        # columns: (a, b); stories: (start, change, change, …); times: (a, m)
    ops: tuple[str, ...] = ()       # columns: ("+",) or ("-",); stories: one per change; times: ("*",) or ("*r",) (reversed order)
    format: int = 1                 # how the steps are written (module docstring: formats); never part of the key

    @property
    def key(self) -> str:
        if self.family == "stories":
            return f"stories:{self.numbers[0]}" + "".join(f"{op}{n}" for op, n in zip(self.ops, self.numbers[1:]))
        a, b = self.numbers
        if self.family == "times":
            return f"times:{b}*{a}" if self.ops == ("*r",) else f"times:{a}*{b}"
        return f"columns:{a}{self.ops[0]}{b}"

    @property
    def answer(self) -> int:
        if self.family == "stories":
            value = self.numbers[0]
            for op, n in zip(self.ops, self.numbers[1:]):
                value = value + n if op == "+" else value - n
            return value
        a, b = self.numbers
        if self.family == "times":
            return a * b
        return a + b if self.ops[0] == "+" else a - b

    @property
    def direct(self) -> bool:
        """Whether the direct answer is the minimal response (no step is necessary)."""
        return self.family != "times" and self.level == 1

    def steps(self) -> list[str]:
        """Every step line of the full working, necessary or not (level 1 of columns and stories
        has one, which is not necessary)."""
        if self.family == "stories":
            out, value = [], self.numbers[0]
            for op, n in zip(self.ops, self.numbers[1:]):
                new = value + n if op == "+" else value - n
                out.append(f"{value} {op} {n} = {new}." if self.format == 1 else _story_step(value, op, n))
                value = new
            return out
        a, b = self.numbers
        if self.family == "times":
            return _times_steps(a, b, self.format)
        return _column_steps(a, b, self.ops[0], self.format)

    def necessary_steps(self) -> list[str]:
        return [] if self.direct else self.steps()

    def minimal_response(self) -> str:
        return "\n".join([*self.necessary_steps(), f"Answer: {self.answer}"])

    def question(self) -> str:
        """The question, its wording chosen from the key (module docstring: splits)."""
        pick = random.Random(self.key)
        if self.family == "stories":
            return _story(self, pick)
        a, b = self.numbers
        if self.family == "times":
            left, right = (b, a) if self.ops == ("*r",) else (a, b)
            return pick.choice(("What is {x} × {y}?", "Compute {x} × {y}.", "Multiply {x} by {y}.")).format(x=left, y=right)
        if self.ops[0] == "+":
            form = pick.choice(("What is {a} + {b}?", "Compute {a} + {b}.", "Add {a} and {b}."))
        else:
            form = pick.choice(("What is {a} - {b}?", "Compute {a} - {b}.", "Subtract {b} from {a}."))
        return form.format(a=a, b=b)

    def restatement(self, rng: random.Random) -> str:
        """A sentence that restates the problem (redundant)."""
        if self.family == "stories":
            return rng.choice((f"We start with {self.numbers[0]} and apply each change in order.",
                               f"Let me restate: the amount starts at {self.numbers[0]} and changes {len(self.ops)} "
                               f"time{'s' * (len(self.ops) > 1)}."))
        a, b = self.numbers
        verb = "add" if self.ops[0] == "+" else "subtract" if self.ops[0] == "-" else "multiply"
        pair = {"add": f"{a} and {b}", "subtract": f"{b} from {a}", "multiply": f"{a} by {b}"}[verb]
        return rng.choice((f"We need to {verb} {pair}.", f"Let me restate the problem: {verb} {pair}.",
                           f"So the task is to {verb} {pair}, column by column."))

    def inverse_check(self) -> str:
        """A check by the inverse operation, after the answer (redundant)."""
        a, b = self.numbers[0], self.numbers[-1]
        if self.family == "columns":
            if self.ops[0] == "+":
                return f"Let me verify: {self.answer} - {b} = {a}. Correct."
            return f"Let me verify: {self.answer} + {b} = {a}. Correct."
        if self.family == "times":
            return f"Let me verify: {self.answer} ÷ {b} = {a}. Correct."
        return f"Let me verify by undoing the last change: {self.answer} {'-' if self.ops[-1] == '+' else '+'} {b} = " \
               f"{self.answer - b if self.ops[-1] == '+' else self.answer + b}. Correct."


def _column_steps(a: int, b: int, op: str, format: int = 1) -> list[str]:
    """One line per column, each naming the digits it reads from the two numbers (copied just
    before, so a digit is a short, fixed distance back rather than counted from the question's
    right end), in subtraction the comparison that decides the borrow, and the number the
    written digits make so far (the answer is then the last line's, copied). Format 2 writes
    every column alike (its last too: one digit and a carry or borrow, then a `Carry:` line for a
    carry left over), puts both digits of a comparison before its verdict, and keeps the zeros of
    `So far` (`_so_far`); format 3 names the columns first (`_with_plan`)."""
    da, db = _digits(a), _digits(b)
    width = max(len(da), len(db))
    da += [0] * (width - len(da))
    db += [0] * (width - len(db))
    out, carry, written = [], 0, ""
    for i in range(width):
        name, last = COLUMNS[i], i == width - 1 and format == 1
        head = f"{name}: {a} has {da[i]}, {b} has {db[i]}."
        if op == "+":
            total = da[i] + db[i] + carry
            digit = str(total) if last else str(total % 10)
            written = digit + written
            tail = f"Write {total}." if last else f"Write {total % 10}, carry {total // 10}."
            out.append(f"{head} {da[i]} + {db[i]} + {carry} = {total}. {tail} So far: {_so_far(written, format)}.")
            carry = total // 10
        else:
            top = da[i] - carry
            borrow = int(top < db[i])
            value = top + 10 * borrow - db[i]
            written = str(value) + written
            if format == 1 and borrow:
                work = f"{da[i]} - {carry} = {top}, less than {db[i]}: borrow, {top + 10} - {db[i]} = {value}."
            elif format == 1:
                work = f"{da[i]} - {carry} = {top}, not less than {db[i]}: {top} - {db[i]} = {value}."
            elif borrow:
                work = f"{da[i]} - {carry} = {top}. {top} vs {db[i]}: less, borrow, {top + 10} - {db[i]} = {value}."
            else:
                work = f"{da[i]} - {carry} = {top}. {top} vs {db[i]}: not less, {top} - {db[i]} = {value}."
            tail = f"Write {value}." if last else f"Write {value}, borrow {borrow}."
            out.append(f"{head} {work} {tail} So far: {_so_far(written, format)}.")
            carry = borrow
    if format >= 2 and op == "+" and carry:
        out.append(_carry_line(carry, written))
    return _with_plan(out, width, format)


def _with_plan(steps: list[str], width: int, format: int) -> list[str]:
    """Format 3: the columns to work, named before the first (`Columns: Ones, Tens, Hundreds.`), so
    that where the number ends is written down before it is reached."""
    return [f"Columns: {', '.join(COLUMNS[:width])}.", *steps] if format >= 3 else steps


def _carry_line(carry: int, written: str) -> str:
    """Format 2: the carry left after the last column, written in front."""
    return f"Carry: {carry}. Write {carry}. So far: {carry}{written}."


def _so_far(written: str, format: int) -> str:
    """The digits written so far: format 1 as a number (a zero in front dropped, so an inner zero
    is out of sight until a digit comes in front of it: `So far: 76.` on the way to 5076), format
    2 as written (`So far: 076.`; the answer drops the zeros in front)."""
    return str(int(written)) if format == 1 else written


def _times_steps(a: int, m: int, format: int = 1) -> list[str]:
    da = _digits(a)
    out, carry, written = [], 0, ""
    for i, d in enumerate(da):
        total = d * m + carry
        last = i == len(da) - 1 and format == 1
        written = (str(total) if last else str(total % 10)) + written
        tail = f"Write {total}." if last else f"Write {total % 10}, carry {total // 10}."
        out.append(f"{COLUMNS[i]}: {a} has {d}. {d} × {m} + {carry} = {total}. {tail} So far: {_so_far(written, format)}.")
        carry = total // 10
    if format >= 2 and carry:
        out.append(_carry_line(carry, written))
    return _with_plan(out, len(da), format)


def _story_step(value: int, op: str, n: int) -> str:
    """Format 2: one change worked on the ones digit, then the tens (the number of tens, which
    a borrow or a carry changes by one), then the result: `65 - 6: ones 5 vs 6: less, borrow,
    15 - 6 = 9; tens 6 - 1 = 5. 65 - 6 = 59.`"""
    ones, tens = value % 10, value // 10
    if op == "+":
        total = ones + n
        work = f"ones {ones} + {n} = {total}, write {total % 10}, carry {total // 10}; tens {tens} + {total // 10} = {tens + total // 10}"
        new = value + n
    else:
        borrow = int(ones < n)
        if borrow:
            work = f"ones {ones} vs {n}: less, borrow, {ones + 10} - {n} = {ones + 10 - n}"
        else:
            work = f"ones {ones} vs {n}: not less, {ones} - {n} = {ones - n}"
        work += f"; tens {tens} - {borrow} = {tens - borrow}"
        new = value - n
    return f"{value} {op} {n}: {work}. {value} {op} {n} = {new}."


def _digits(n: int) -> list[int]:
    """Digits of n, ones first."""
    return [int(c) for c in reversed(str(n))]


NAMES = {"She": ("Mia", "Ava", "Zoe", "Lena", "Iris", "Nora", "Ruth", "Maya", "Sara", "Lily"),
         "He": ("Leo", "Noah", "Omar", "Sam", "Ben", "Kai", "Eli", "Tom", "Ivan", "Jon")}
ITEMS = ("apples", "marbles", "stickers", "coins", "pencils", "cards", "books", "shells", "stamps", "beads",
         "cookies", "balloons")
GAINS = ("{p} buys {n} more.", "{p} finds {n} more.", "A friend gives {o} {n} more.", "{p} gets {n} more.",
         "{p} wins {n} more.")
LOSSES = ("{p} gives away {n}.", "{p} loses {n}.", "{p} uses {n}.", "{p} sells {n}.", "{p} gives {n} to a friend.")


def _story(problem: Written, pick: random.Random) -> str:
    he = pick.choice(tuple(NAMES))
    name, item, him = pick.choice(NAMES[he]), pick.choice(ITEMS), {"She": "her", "He": "him"}[he]
    sentences = [f"{name} has {problem.numbers[0]} {item}."]
    for op, n in zip(problem.ops, problem.numbers[1:]):
        sentences.append(pick.choice(GAINS if op == "+" else LOSSES).format(p=he, o=him, n=n))
    sentences.append(f"How many {item} does {name} have now?")
    return " ".join(sentences)


def draw(family: str, level: int, rng: random.Random) -> Written:
    """One random problem of a family and level (not yet assigned to a split)."""
    if family == "columns":
        op = rng.choice("+-")
        if level == 1:                                   # one column of work: a < 1000 and a digit, no carry or borrow
            a = rng.randrange(1000)
            ones = a % 10
            b = rng.randrange(10 - ones) if op == "+" else rng.randrange(ones + 1)
            return Written(family, level, (a, b), (op,))
        a = rng.randrange(10 ** (level - 1), 10 ** level)
        b = rng.randrange(10 ** (level - 1), 10 ** level)
        if op == "-" and a < b:
            a, b = b, a
        return Written(family, level, (a, b), (op,))
    if family == "stories":
        value = rng.randrange(10, 100)
        numbers, ops = [value], []
        for _ in range(level):
            change = rng.randrange(1, 10)
            op = rng.choice("+-") if value - change >= 0 else "+"
            value = value + change if op == "+" else value - change
            numbers.append(change)
            ops.append(op)
        return Written(family, level, tuple(numbers), tuple(ops))
    if family == "times":
        a = rng.randrange(10 ** level, 10 ** (level + 1))
        return Written(family, level, (a, rng.randrange(2, 10)), (rng.choice(("*", "*r")),))
    raise ValueError(f"unknown written family {family!r}; known: {', '.join(FAMILIES)}")


FAMILIES = {"columns": 6, "stories": 6, "times": 6}          # family -> highest level
TRAINED = ("columns", "stories")
HELD_OUT = ("times",)


def resolve_families(spec: str) -> list[str]:
    """`written` / `written:train` (columns, stories), `written:all`, `written:held-out`, `written:columns+times`."""
    _, _, rest = spec.partition(":")
    groups = {"": TRAINED, "train": TRAINED, "all": (*TRAINED, *HELD_OUT), "held-out": HELD_OUT}
    if rest in groups:
        return list(groups[rest])
    names = rest.split("+")
    unknown = [n for n in names if n not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown written family {unknown[0]!r} in task {spec!r}; families: {', '.join(FAMILIES)}; "
                         f"groups: written, written:all, written:held-out")
    return list(dict.fromkeys(names))


# ---- grading ----------------------------------------------------------------------------------
def finished(response: str, complete: bool) -> str:
    """The part of a response whose lines were finished: a cut-off response loses its last line."""
    if complete or response.endswith("\n"):
        return response
    return response.rpartition("\n")[0]


def answer_values(response: str, complete: bool) -> list[str]:
    """What each finished `Answer:` line says, stripped of bold, backticks and a closing period."""
    out = []
    for match in _ANSWER_LINE.finditer(finished(response, complete)):
        value = match.group(1).strip().strip("*`").strip().removesuffix(".").strip().strip("*`").strip()
        out.append(value)
    return out


def read_integer(value: str) -> int | None:
    """The one integer a value states, or None when it states anything else (two candidates,
    a relation, words, nothing)."""
    if not _INTEGER.fullmatch(value):
        return None
    return int(value.replace(",", ""))


def grade(problem: Written, response: str, complete: bool) -> Verdict:
    values = answer_values(response, complete)
    if not values:
        return Verdict(correct=False, extracted=None)
    read = [read_integer(v) for v in values]
    correct = all(r is not None and r == problem.answer for r in read)
    return Verdict(correct=correct, extracted=values[-1] if len(set(values)) == 1 else " | ".join(values))


# ---- the oracle ---------------------------------------------------------------------------------
def analyze(problem: Written, response: str, complete: bool, count: Counter_ = words) -> TraceAnalysis | None:
    """The oracle's view of a response (module docstring); None when it has no `Answer:` line."""
    text = finished(response, complete)
    lines = text.split("\n")
    first = next((i for i, line in enumerate(lines) if _ANSWER_LINE.match(line)), None)
    if first is None:
        return None
    necessary_steps = problem.necessary_steps()
    kept: list[str] = []
    if necessary_steps:
        if problem.family == "stories":
            value = problem.numbers[0]              # a step continues the chain: it starts from the last step's result
            for line in lines[:first]:
                step = (_STORY_STEP if problem.format == 1 else _STORY_STEP_2).match(line)
                if step and int(step.group(1)) == value and len(kept) < len(necessary_steps):
                    kept.append(line.strip())
                    value = int(step.group(step.lastindex))
        else:
            wanted = [step.partition(":")[0] for step in necessary_steps]       # the columns (a carry line, a plan)
            seen: set[str] = set()
            for line in lines[:first]:
                label = _COLUMN_STEP.match(line)
                if label and label.group(1) in wanted and label.group(1) not in seen:
                    seen.add(label.group(1))
                    kept.append(line.strip())
    necessary_written = count("\n".join([*kept, lines[first].strip()])) + int(complete)
    length = count(response) + int(complete)
    redundant = max(0, length - necessary_written)
    thinking = [line for line in lines[:first] if line.strip()]
    after = "\n".join(lines[first + 1:]).strip()
    verdict = grade(problem, response, complete)
    coverage = None
    if necessary_steps:
        coverage = sum(step in kept for step in necessary_steps) / len(necessary_steps)
    return TraceAnalysis(
        answer=verdict.extracted, correct=verdict.correct, length=length,
        necessary_length=count(problem.minimal_response()) + 1, redundant_tokens=redundant,
        redundancy=redundant / length if length else 0.0,
        unneeded_thinking=len(thinking) > len(kept), post_answer_rounds=bool(after), thinks=bool(thinking),
        coverage=coverage,
    )


# ---- diagnosis ------------------------------------------------------------------------------------
_COLUMN_HEAD = re.compile(r"^\s*[\w-]+: (\d+) has (\d+)(?:, (\d+) has (\d+))?\.")
_STORY_OPERANDS = re.compile(r"^\s*(\d+) ([+-]) (\d+) ?[:=]")


def error_kind(problem: Written, response: str) -> str:
    """Where a response first departs from the reference working: the kind of its first step line that
    differs (scripts/written_errors.py tallies them over an evaluation):

    misread digits           a column line names other digits than the numbers have
    last column as a middle  format 1: the last column written `Write d, carry c.` like the others (the
                             reference writes the whole sum there), the carry then lost
    borrow comparison        a subtraction column decides the borrow the wrong way
    column arithmetic        any other difference inside a column line
    carry line               formats 2, 3: the `Carry:` line after the last column wrong or missing (the carry
                             dropped: `Write 4, carry 1. So far: 489.` then `Answer: 489`)
    column plan              format 3: the `Columns:` line names other columns than the numbers have
    story step               a story step whose result is wrong (its operands read right)
    story operands           a story step that starts from the wrong amount or applies the wrong change
    missing step             fewer step lines than the working needs, each of them right
    steps right              every step line right, the answer line wrong (or an answer cut off)
    """
    reference = problem.steps()
    head = response.split("Answer:")[0]
    if problem.family == "stories":
        steps = [line.strip() for line in head.split("\n") if _STORY_OPERANDS.match(line)]
        for got, want in zip(steps, reference):
            if got != want:
                misread = _STORY_OPERANDS.match(got).groups() != _STORY_OPERANDS.match(want).groups()
                return "story operands" if misread else "story step"
        return "missing step" if len(steps) < len(reference) else "steps right"
    steps = [line.strip() for line in head.split("\n") if _COLUMN_STEP.match(line)]
    for i, (got, want) in enumerate(zip(steps, reference)):
        if got == want:
            continue
        if want.startswith("Carry:"):
            return "carry line"
        if want.startswith("Columns:") or got.startswith("Columns:"):
            return "column plan"
        g, w = _COLUMN_HEAD.match(got), _COLUMN_HEAD.match(want)
        if not g or g.groups() != w.groups():
            return "misread digits"
        if problem.format == 1 and i == len(reference) - 1 and re.search(r"(carry|borrow) \d\.", got) \
                and not re.search(r"(carry|borrow) \d\.", want):
            return "last column as a middle"
        if "less" in want and ("not less" in got) != ("not less" in want):
            return "borrow comparison"
        return "column arithmetic"
    if len(steps) < len(reference):
        return "carry line" if reference[len(steps)].startswith("Carry:") else "missing step"
    return "steps right"


# ---- SFT traces -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Redundancy:
    """How SFT traces overthink (module docstring). Probabilities per trace, or per step for
    `p_recheck`; `rounds`: probabilities of 0, 1, 2, … rounds after the answer."""

    p_direct_easy: float = 0.3       # direct answers where the direct answer suffices (level 1)
    p_restate: float = 0.6
    p_recheck: float = 0.25
    rounds: tuple[float, ...] = (0.15, 0.5, 0.35)
    round_kinds: tuple[float, float, float] = (0.4, 0.35, 0.25)   # a second pass, an inverse check, a short confirmation


HESITATIONS = ("Wait, let me double-check.", "Hmm, let me make sure that is right.", "Wait, let me check that again.",
               "Let me go through it once more to be sure.")
CONFIRMATIONS = ("Yes, {a} is correct.", "So the answer is {a}.", "That confirms it: {a}.", "Yes, the answer is {a}.")


def trace(problem: Written, rng: random.Random, mix: Redundancy = Redundancy()) -> str:
    """One SFT response for a problem: its working with redundancy drawn from `mix`."""
    answer = f"Answer: {problem.answer}"
    if problem.direct and rng.random() < mix.p_direct_easy:
        return answer
    lines = []
    if rng.random() < mix.p_restate:
        lines.append(problem.restatement(rng))
    for step in problem.steps():
        lines.append(step)
        if not step.startswith("Columns:") and rng.random() < mix.p_recheck:     # a plan is not re-checked
            lines.append(rng.choice(("Let me check that step: ", "Checking again: ", "Wait, let me redo that: ")) + step)
    lines.append(answer)
    for _ in range(rng.choices(range(len(mix.rounds)), weights=mix.rounds)[0]):
        kind = rng.choices(range(3), weights=mix.round_kinds)[0]
        lines.append(rng.choice(HESITATIONS))
        if kind == 0:
            lines += problem.steps()
        elif kind == 1:
            lines.append(problem.inverse_check())
        lines.append(rng.choice(CONFIRMATIONS).format(a=problem.answer))
    return "\n".join(lines)


# ---- the task -------------------------------------------------------------------------------------
class WrittenTask:
    """Problems of one or more written families at the chosen levels (module docstring)."""

    def __init__(self, families: list[str] | tuple[str, ...], *, name: str = PREFIX,
                 levels: tuple[int, ...] | list[int] | None = None, held_out: bool | None = None,
                 redundancy: Redundancy = Redundancy(), format: int = 1):
        if format not in FORMATS.values():
            raise ValueError(f"written format {format!r}: formats are {', '.join(map(str, sorted(FORMATS.values())))}")
        unknown = [f for f in families if f not in FAMILIES]
        if unknown:
            raise ValueError(f"unknown written family {unknown[0]!r}; families: {', '.join(FAMILIES)}")
        self.families = tuple(families)
        self.name = name
        self.levels = tuple(levels) if levels else DEFAULT_LEVELS
        bad = [level for level in self.levels if not 1 <= level <= min(FAMILIES[f] for f in self.families)]
        if bad:
            raise ValueError(f"task {name!r} has levels 1-{min(FAMILIES[f] for f in self.families)}, got {bad}")
        self.held_out = held_out
        self.redundancy = redundancy
        self.format = format
        self._pools: dict[str, list[list[Problem]]] = {}          # SFT: problems per (family, level), per split

    def _is_held_out(self, family: str) -> bool:
        return family in HELD_OUT if self.held_out is None else self.held_out

    def problems(self, split: Split, n_per_level: int, seed: int = 0) -> list[Problem]:
        """Up to `n_per_level` distinct problems per family and level. The draw order depends on
        `seed`; which split a problem belongs to does not."""
        check_split(split)
        out = []
        for family in self.families:
            for level in self.levels:
                rng = random.Random(f"written:{seed}:{family}:{level}:{split}")
                found: dict[str, Written] = {}
                for _ in range(MAX_DRAWS):
                    if len(found) == n_per_level:
                        break
                    problem = draw(family, level, rng)
                    if problem.key not in found and split_of(problem.key) == split:
                        found[problem.key] = problem
                out += [self._problem(p) for p in found.values()]
        return out

    def _problem(self, p: Written) -> Problem:
        p = dataclasses.replace(p, format=self.format)
        digest = hashlib.blake2b(p.key.encode(), digest_size=6).hexdigest()
        return Problem(id=f"{p.family}:{p.level}:{digest}", prompt=f"{p.question()}\n\n{INSTRUCTION}", answer=str(p.answer),
                       domain=p.family, difficulty=p.level, held_out=self._is_held_out(p.family), data=p)

    def verify(self, problem: Problem, response: str, complete: bool) -> Verdict:
        return grade(_written(problem), response, complete)

    def analyze(self, problem: Problem, response: str, complete: bool, count: Counter_ | None = None) -> TraceAnalysis | None:
        return analyze(_written(problem), response, complete, count or words)

    def with_budget(self, problem: Problem, budget: int) -> Problem:
        return dataclasses.replace(problem, prompt=f"{problem.prompt}\n\n{BUDGET_INSTRUCTION.format(budget=budget)}")

    def sft_examples(self, rng: random.Random, n: int, split: Split = "train",
                     pool_per_level: int = 2000) -> list[tuple[str, str]]:
        """n (prompt, response) pairs: a family drawn uniformly and a level k with probability
        proportional to k + 1 (level 4 two and a half times as often as level 1: the harder a
        level, the more examples its steps need), then one of its problems of `split`, with a trace drawn from the
        task's redundancy mixture."""
        if split not in self._pools:
            pool: dict[tuple[str, int | None], list[Problem]] = {}
            for p in self.problems(split, pool_per_level):
                pool.setdefault((p.domain, p.difficulty), []).append(p)
            self._pools[split] = list(pool.values())
        pools = self._pools[split]
        weights = [(pool[0].difficulty or 1) + 1 for pool in pools]
        out = []
        for _ in range(n):
            problem = rng.choice(rng.choices(pools, weights=weights)[0])
            out.append((problem.prompt, trace(_written(problem), rng, self.redundancy)))
        return out


def _written(problem: Problem) -> Written:
    if not isinstance(problem.data, Written):
        raise TypeError(f"problem {problem.id!r} is not a written-arithmetic problem")
    return problem.data


def load(spec: str, levels: list[int] | None) -> WrittenTask:
    """The task a `written…` or `written2…` spec names (module docstring)."""
    return WrittenTask(resolve_families(spec), name=spec, levels=levels, format=FORMATS[spec.partition(":")[0]])

"""Testbed domains: problem generators, ground truth, and step-by-step trace writers.

Each domain has four difficulty levels. Level 1 is a table of single-digit facts that a small
model answers reliably without thinking; from level 2 on the number of necessary steps grows
with the level (one step per column, list element or operation).

Two functions per domain are deliberately independent:
- `solve` computes the answer with plain Python arithmetic (the ground truth);
- `steps` writes the step-by-step algorithm (column arithmetic, running totals, selection)
  and `trace_answer` reads the answer off those steps.
A test checks that they agree on every generated problem.

Grammar of one step (words separated by spaces, `;` ends a step):
    add    7 + 8 + 0 = 1 5 write 5 carry 1 ;       column digits, carry in, sum, digit, carry out
    sum    1 0 + 9 = 1 9 ;                          running total + next element
    mul    7 * 6 + 4 = 4 6 write 6 carry 4 ;        column digit × multiplier + carry in
    chain  8 * 2 = 6 ;                              one operation, result modulo 10
    parity 1 xor 1 = 0 ;                            running exclusive or with the next bit
    sub    1 2 - 7 - 0 = 5 borrow 1 ;               (10 +) column digit − digit − borrow in
    mod    4 7 % 7 = 5 ;                            running remainder: (10·r + next digit) mod m
    search 3 + 4 = 7 ; 7 * 0 = 0 ; … 7 * 3 = 1 ok ; the chain before the gap, then one try per candidate

`search` (the missing last operand of a chain, found by trying 0, 1, 2, … until one checks) is
opt-in: it is in no default group (`gym:train`, `gym:held-out`, `gym:all`), so the default SFT
mixture and the shipped checkpoint are unchanged; a recipe selects it as `gym:search`.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

LEVELS = (1, 2, 3, 4)

Operands = tuple  # a domain's problem: a tuple of ints (or nested tuples), hashable


def digits(n: int) -> list[str]:
    """Decimal digits of a non-negative integer as words: 105 -> ['1', '0', '5']."""
    return list(str(n))


def _number(rng: random.Random, n_digits: int) -> int:
    low = 0 if n_digits == 1 else 10 ** (n_digits - 1)
    return rng.randint(low, 10**n_digits - 1)


def _columns(n: int, width: int) -> list[int]:
    """Digits of n from least significant, padded with zeros to `width`."""
    return [(n // 10**i) % 10 for i in range(width)]


def chain_steps(value: int, ops) -> tuple[list[list[str]], int]:
    """The written steps of a mod-10 operation chain (`value op y = result ;` each) and its value."""
    out = []
    for op, y in ops:
        result = {"+": value + y, "-": value - y, "*": value * y}[op] % 10
        out.append([str(value), op, str(y), "=", str(result), ";"])
        value = result
    return out, value


@dataclass(frozen=True)
class Domain(ABC):
    name: str
    held_out: bool = False

    direct_levels: ClassVar[frozenset[int]] = frozenset({1})   # levels whose minimal response is the direct answer

    @property
    def word(self) -> str:
        """The word that starts the domain's prompts (a vocabulary word)."""
        return self.name

    @abstractmethod
    def sample(self, rng: random.Random, level: int) -> Operands:
        """Draw one problem of the given difficulty level."""

    @abstractmethod
    def operand_words(self, operands: Operands) -> list[str]:
        """The problem as words, as written after the domain name in the prompt."""

    @abstractmethod
    def solve(self, operands: Operands) -> int | tuple[int, ...]:
        """Ground truth with Python arithmetic, independent of the trace writer."""

    @abstractmethod
    def steps(self, operands: Operands) -> list[list[str]]:
        """The necessary steps, each a list of words ending in ';'."""

    @abstractmethod
    def trace_answer(self, operands: Operands) -> list[str]:
        """The answer as the trace writer derives it from its own steps."""

    def answer_words(self, operands: Operands) -> list[str]:
        """The ground-truth answer as words (what the grader compares against)."""
        truth = self.solve(operands)
        if isinstance(truth, tuple):
            return [w for value in truth for w in digits(value)]
        return digits(truth)

    def round_words(self, operands: Operands) -> list[str]:
        """One post-answer confirmation round: the problem restated with its answer."""
        return ["check", *self.operand_words(operands), "=", *self.trace_answer(operands), "ok"]

    def tries(self, operands: Operands) -> int | None:
        """Search domains: the tries up to the first solution; None where nothing is searched."""
        return None


@dataclass(frozen=True)
class Add(Domain):
    """Column addition of two numbers with `level` digits each."""

    def sample(self, rng, level):
        return (_number(rng, level), _number(rng, level))

    def operand_words(self, operands):
        a, b = operands
        return [*digits(a), "+", *digits(b)]

    def solve(self, operands):
        return operands[0] + operands[1]

    def _columns(self, operands):
        a, b = operands
        width = max(len(str(a)), len(str(b)))
        carry, out = 0, []
        for x, y in zip(_columns(a, width), _columns(b, width)):
            total = x + y + carry
            out.append((x, y, carry, total))
            carry = total // 10
        return out, carry

    def steps(self, operands):
        columns, _ = self._columns(operands)
        return [
            [str(x), "+", str(y), "+", str(c), "=", *digits(t), "write", str(t % 10), "carry", str(t // 10), ";"]
            for x, y, c, t in columns
        ]

    def trace_answer(self, operands):
        columns, carry = self._columns(operands)
        written = [str(t % 10) for *_, t in reversed(columns)]
        return ([str(carry)] if carry else []) + written


@dataclass(frozen=True)
class RunningSum(Domain):
    """Sum of a list of single digits; the list has 2, 3, 5 or 7 elements."""

    lengths: tuple[int, ...] = (2, 3, 5, 7)

    def sample(self, rng, level):
        return tuple(rng.randint(0, 9) for _ in range(self.lengths[level - 1]))

    def operand_words(self, operands):
        return [str(x) for x in operands]

    def solve(self, operands):
        return sum(operands)

    def steps(self, operands):
        total, out = operands[0], []
        for x in operands[1:]:
            out.append([*digits(total), "+", str(x), "=", *digits(total + x), ";"])
            total += x
        return out

    def trace_answer(self, operands):
        last = self.steps(operands)[-1]
        return last[last.index("=") + 1 : -1]


@dataclass(frozen=True)
class MultiplyByDigit(Domain):
    """A number with `level` digits times a single digit 2-9, column by column."""

    def sample(self, rng, level):
        return (_number(rng, level), rng.randint(2, 9))

    def operand_words(self, operands):
        a, m = operands
        return [*digits(a), "*", str(m)]

    def solve(self, operands):
        return operands[0] * operands[1]

    def _columns(self, operands):
        a, m = operands
        carry, out = 0, []
        for x in _columns(a, len(str(a))):
            product = x * m + carry
            out.append((x, carry, product))
            carry = product // 10
        return out, carry

    def steps(self, operands):
        columns, _ = self._columns(operands)
        m = str(operands[1])
        return [
            [str(x), "*", m, "+", str(c), "=", *digits(p), "write", str(p % 10), "carry", str(p // 10), ";"]
            for x, c, p in columns
        ]

    def trace_answer(self, operands):
        columns, carry = self._columns(operands)
        written = [str(p % 10) for *_, p in reversed(columns)]
        return (digits(carry) if carry else []) + written


@dataclass(frozen=True)
class Parity(Domain):
    """Parity of 2, 4, 6 or 8 bits, by a running exclusive or."""

    lengths: tuple[int, ...] = (2, 4, 6, 8)

    def sample(self, rng, level):
        return tuple(rng.randint(0, 1) for _ in range(self.lengths[level - 1]))

    def operand_words(self, operands):
        return [str(x) for x in operands]

    def solve(self, operands):
        return sum(operands) % 2

    def _run(self, operands):
        value, out = operands[0], []
        for bit in operands[1:]:
            new = value ^ bit
            out.append([str(value), "xor", str(bit), "=", str(new), ";"])
            value = new
        return out, value

    def steps(self, operands):
        return self._run(operands)[0]

    def trace_answer(self, operands):
        return [str(self._run(operands)[1])]


@dataclass(frozen=True)
class ModChain(Domain):
    """A start digit followed by 1, 2, 4 or 6 operations (+, -, *) with digits, modulo 10."""

    lengths: tuple[int, ...] = (1, 2, 4, 6)

    def sample(self, rng, level):
        ops = tuple((rng.choice("+-*"), rng.randint(0, 9)) for _ in range(self.lengths[level - 1]))
        return (rng.randint(0, 9), ops)

    def operand_words(self, operands):
        start, ops = operands
        return [str(start), *[w for op, y in ops for w in (op, str(y))]]

    def solve(self, operands):
        start, ops = operands
        value = start
        for op, y in ops:  # exact integer arithmetic; reduced once at the end
            value = value + y if op == "+" else value - y if op == "-" else value * y
        return value % 10

    def _run(self, operands):
        return chain_steps(operands[0], operands[1])

    def steps(self, operands):
        return self._run(operands)[0]

    def trace_answer(self, operands):
        return [str(self._run(operands)[1])]


@dataclass(frozen=True)
class Subtract(Domain):
    """Column subtraction a − b of two numbers with `level` digits, a ≥ b."""

    def sample(self, rng, level):
        a, b = _number(rng, level), _number(rng, level)
        return (max(a, b), min(a, b))

    def operand_words(self, operands):
        a, b = operands
        return [*digits(a), "-", *digits(b)]

    def solve(self, operands):
        return operands[0] - operands[1]

    def _columns(self, operands):
        a, b = operands
        width = len(str(a))
        borrow, out = 0, []
        for x, y in zip(_columns(a, width), _columns(b, width)):
            diff = x - y - borrow
            borrow_out = int(diff < 0)
            out.append((x, y, borrow, diff + 10 * borrow_out, borrow_out))
            borrow = borrow_out
        return out

    def steps(self, operands):
        return [
            [*(["1"] if bo else []), str(x), "-", str(y), "-", str(bi), "=", str(d), "borrow", str(bo), ";"]
            for x, y, bi, d, bo in self._columns(operands)
        ]

    def trace_answer(self, operands):
        written = "".join(str(d) for _, _, _, d, _ in reversed(self._columns(operands)))
        return list(written.lstrip("0") or "0")


@dataclass(frozen=True)
class Remainder(Domain):
    """The remainder of a number with `level` digits divided by a digit 2-9, digit by digit."""

    def sample(self, rng, level):
        return (_number(rng, level), rng.randint(2, 9))

    def operand_words(self, operands):
        a, m = operands
        return [*digits(a), "%", str(m)]

    def solve(self, operands):
        return operands[0] % operands[1]

    def _run(self, operands):
        a, m = operands
        remainder, out = 0, []
        for d in str(a):
            partial = 10 * remainder + int(d)
            remainder = partial % m
            out.append([*digits(partial), "%", str(m), "=", str(remainder), ";"])
        return out, remainder

    def steps(self, operands):
        return self._run(operands)[0]

    def trace_answer(self, operands):
        return [str(self._run(operands)[1])]


@dataclass(frozen=True)
class MissingOperand(Domain):
    """The missing last operand of a chain modulo 10: `3 + 4 * ? = 1`, found by search.

    The chain before the gap has 1, 2, 3 or 4 operations (+, -, ×, as in `chain`); its value v is
    3 or 7, so exactly one digit d solves v × d ≡ b (mod 10). The trace computes the chain before
    the gap, then tries d = 0, 1, 2, … one step per try, and answers after the first try that
    checks (`ok`). The necessary number of tries is d + 1; it varies inside every level. A direct
    answer is a guess unless the model computes the chain and inverts it in one go: a uniformly
    random digit is right with probability 1/10, a pick between the two digits that b allows
    (3 × b or 7 × b) with probability 1/2.

    The sampling closes the shortcuts a direct answer could take: v is never 1 or 9 (for v = 9,
    v × b is the answer, so reading the prompt as a forward chain would be right), and d is never
    0 or 5 (then d = b whatever v is). With v ∈ {3, 7} and d ∉ {0, 5}, neither b nor v × b is ever
    the answer; the direct route is the chain's value and its inverse, d = (10 − v) × b mod 10.

    Levels add steps before the search; no level is a direct level (a direct answer is a guess).
    The prompt starts with the word `chain` (the vocabulary is fixed at the shipped model's
    37 words): `chain 3 + 4 * = 1 = <think>`, the `* =` marking the gap.
    """

    lengths: tuple[int, ...] = (1, 2, 3, 4)      # operations before the gap, per level
    multipliers: tuple[int, ...] = (3, 7)        # the values v the chain may reach (see above)
    answers: tuple[int, ...] = (1, 2, 3, 4, 6, 7, 8, 9)   # the digits d may be (see above)

    direct_levels: ClassVar[frozenset[int]] = frozenset()
    order: ClassVar[tuple[int, ...]] = tuple(range(10))   # the candidates, in the order they are tried

    @property
    def word(self) -> str:
        return "chain"

    def sample(self, rng, level):
        while True:
            ops = tuple((rng.choice("+-*"), rng.randint(0, 9)) for _ in range(self.lengths[level - 1]))
            start = rng.randint(0, 9)
            if self._value(start, ops) in self.multipliers:
                break
        d = rng.choice(self.answers)
        return (start, ops, self._value(start, ops) * d % 10)

    @staticmethod
    def _value(start, ops) -> int:
        value = start
        for op, y in ops:  # exact integer arithmetic; reduced once at the end
            value = value + y if op == "+" else value - y if op == "-" else value * y
        return value % 10

    def operand_words(self, operands):
        start, ops, b = operands
        return [str(start), *[w for op, y in ops for w in (op, str(y))], "*", "=", str(b)]

    def solve(self, operands):
        start, ops, b = operands
        return b * pow(self._value(start, ops), -1, 10) % 10

    def solutions(self, operands) -> list[int]:
        """Every digit that completes the chain (exactly one for the values sampled)."""
        start, ops, b = operands
        v = self._value(start, ops)
        return [d for d in range(10) if v * d % 10 == b]

    def tries(self, operands) -> int:
        """Necessary tries: the position of the first solution in the order tried (1-based)."""
        return self.order.index(self.solve(operands)) + 1

    def guess_chance(self, operands, knows_target: bool = False) -> float:
        """Probability that a direct answer without steps is correct: a uniformly random digit,
        or (`knows_target`) a uniform pick among the digits that solve the problem for some
        value the chain may reach — what a model that reads b but not the chain can do (1/2)."""
        if not knows_target:
            return len(self.solutions(operands)) / len(self.order)
        b = operands[2]
        candidates = {d for d in self.answers for v in self.multipliers if v * d % 10 == b}
        return len(set(self.solutions(operands)) & candidates) / len(candidates)

    def _prefix(self, operands):
        return chain_steps(operands[0], operands[1])

    def _tries(self, operands):
        prefix, value = self._prefix(operands)
        b, out = operands[2], []
        for d in self.order:
            product = value * d % 10
            out.append([str(value), "*", str(d), "=", str(product), *(["ok"] if product == b else []), ";"])
            if product == b:
                return prefix, out, d
        raise ValueError(f"no digit completes {self.operand_words(operands)}")

    def steps(self, operands):
        prefix, tries, _ = self._tries(operands)
        return prefix + tries

    def trace_answer(self, operands):
        last = self._tries(operands)[1][-1]          # the try that checked: `v * d = b ok ;`
        return [last[2]]

    def round_words(self, operands):
        start, ops, b = operands
        return ["check", str(start), *[w for op, y in ops for w in (op, str(y))], "*", *self.trace_answer(operands), "=", str(b), "ok"]


DOMAINS: dict[str, Domain] = {
    d.name: d
    for d in (
        Add("add"),
        RunningSum("sum"),
        MultiplyByDigit("mul"),
        ModChain("chain"),
        Parity("parity"),
        Subtract("sub", held_out=True),
        Remainder("mod", held_out=True),
    )
}
TRAINING_DOMAINS = tuple(name for name, d in DOMAINS.items() if not d.held_out)
HELD_OUT_DOMAINS = tuple(name for name, d in DOMAINS.items() if d.held_out)
# Domains in no default group (not in the default SFT mixture): selected only by name.
OPT_IN_DOMAINS: dict[str, Domain] = {d.name: d for d in (MissingOperand("search"),)}
ALL_DOMAINS: dict[str, Domain] = {**DOMAINS, **OPT_IN_DOMAINS}


def get_domain(name: str) -> Domain:
    if name not in ALL_DOMAINS:
        raise ValueError(f"unknown testbed domain {name!r}; valid domains: {', '.join(ALL_DOMAINS)}")
    return ALL_DOMAINS[name]

"""Worst-case time of the math reward on hostile model outputs, by family and input size.

    python scripts/bench_verifier.py [--sizes 1000 4000 16000 64000] [--repeats 3] [--timeout 5]

For each family of hostile responses (long whitespace after an answer marker, unclosed or
deeply nested boxes, huge exponents, control and bidi characters, very long lines, …) and
each size in characters, it times, over `--repeats` runs, the slowest of

- `extract`: `taut.tasks.math.extract_answer`, in this process (what an exact-match task runs);
- `verify`: `taut.tasks.math.verify`, the whole grade (extraction, parsing, equivalence) in the
  helper process under the per-sample limit `--timeout`. A grade over the limit reports
  `timeout`; the helper is restarted (untimed) before the next grade.

Linear code shows times growing about 4x from one size to the next; a grade past the limit
shows the limit. The numbers in docs/reliability.md come from this script.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from taut.tasks.math import TIMEOUT, error_kind, extract_answer, verify

CONTROL = "".join(chr(c) for c in range(32) if c != 10) + "\u202e\u2066\u2069\u200f\u200b\ufeff\u2028"


def _fill(unit: str, n: int) -> str:
    return (unit * (n // len(unit) + 1))[:n]


FAMILIES: dict[str, Callable[[int], str]] = {
    "spaces after 'Answer:'": lambda n: "Answer:" + " " * n,
    "spaces after 'answer is'": lambda n: "the answer is" + " " * n + "x",
    "tabs/newlines after 'answer'": lambda n: "answer" + _fill(" \t\n", n),
    "unclosed \\boxed{": lambda n: _fill("\\boxed{", n),
    "unclosed \\boxed{ then a box": lambda n: _fill("\\boxed{", n) + "\\boxed{1}",
    "nested braces in a box": lambda n: "\\boxed{" + "{" * (n // 2) + "1" + "}" * (n // 2) + "}",
    "stray closing braces": lambda n: "}" * n + "\\boxed{1}",
    "power tower 9^{9^{...}}": lambda n: "\\boxed{" + "9^{" * (n // 3) + "9" + "}" * (n // 3) + "}",
    "huge exponent 9**9**9 / 1e999999": lambda n: "Answer: " + _fill("9**9**9 ", n // 2) + _fill("1e999999 ", n // 2),
    "control and bidi characters": lambda n: _fill(CONTROL + "answer:\\boxed{", n),
    "one long line, answer last": lambda n: "x" * n + " Answer: 42",
    "many 'answer' words": lambda n: _fill("answer ", n),
    "testbed digits": lambda n: "answer" + _fill(" 7", n) + " x",
}


def slowest(call: Callable[[], object], repeats: int, before: Callable[[], object] = lambda: None,
            final: Callable[[object], bool] = lambda result: False) -> tuple[float, object]:
    """(the longest of `repeats` timed calls, the last result); stops early at a `final` result."""
    worst, result = 0.0, None
    for _ in range(repeats):
        before()
        t0 = time.perf_counter()
        result = call()
        worst = max(worst, time.perf_counter() - t0)
        if final(result):
            break
    return worst, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 4000, 16000, 64000])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=5.0, help="per-sample limit of the grade, seconds")
    args = parser.parse_args()

    def warm() -> None:                  # a started helper, so that no grade is charged its startup
        verify("\\boxed{1}", "1")

    header = f"{'family':<36}{'chars':>8}{'extract s':>11}{'verify s':>10}  verdict"
    print(header)
    print("-" * len(header))
    for name, make in FAMILIES.items():
        for size in args.sizes:
            response = make(size)
            t_extract, _ = slowest(lambda response=response: extract_answer(response), args.repeats)
            t_verify, verdict = slowest(lambda response=response: verify(response, "42", timeout=args.timeout), args.repeats, warm,
                                        final=lambda v: error_kind(v.error) == TIMEOUT)     # the limit, again
            outcome = error_kind(verdict.error) or ("correct" if verdict.correct else "wrong")
            print(f"{name:<36}{len(response):>8}{t_extract:>11.4f}{t_verify:>10.3f}  {outcome}", flush=True)


if __name__ == "__main__":
    main()

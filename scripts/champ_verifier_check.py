"""Grade CHAMP's reference answers, and wrong variants of them, with taut's math verifier.

    python scripts/champ_verifier_check.py [--timeout 5] [--show 10]

CHAMP (Concept and Hint-Augmented Math Problems, the `champ-dataset` package, MIT) has 270
competition problems whose reference answers are mostly written in words or plain-text
notation: "No", "sum_(i=1)^n i^2, or equivalently n(n+1)(2n+1)/6", "0 is the only possible
value". Nothing of CHAMP is stored in this repository: the script reads the installed package
(`pip install champ-dataset`; it is no dependency of taut).

For every problem it compares, with `taut.tasks.math.answers_equal`:

- `true`: the reference answer itself, which must be accepted;
- `true-alt`: for a reference "A, or equivalently B", the form B, which is correct too;
- `first+1`, `last+1`: the reference with its first (last) integer increased by one (a
  summation that starts one later, another leading coefficient, another limit), which must not
  be accepted;
- `yes-no`: "Yes" for "No" and "No" for "Yes", which must not be accepted.

It prints, per candidate kind, how many were accepted, rejected, or were verifier errors (by
kind: `unverifiable`, `timeout`, `failed`), then the wrong acceptances and some errors.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter

from taut.tasks.math import VerifierError, answers_equal

INTEGER = re.compile(r"\d+")


def candidates(answer: str) -> dict[str, str]:
    """The variants of a reference answer to grade, by kind."""
    out = {"true": answer}
    first, *rest = answer.split(", or equivalently ", 1)
    if rest:
        out["true-alt"] = rest[0]
    numbers = list(INTEGER.finditer(answer))
    if numbers:
        for kind, match in (("first+1", numbers[0]), ("last+1", numbers[-1])):
            out[kind] = f"{answer[:match.start()]}{int(match.group()) + 1}{answer[match.end():]}"
    if answer in ("Yes", "No"):
        out["yes-no"] = "No" if answer == "Yes" else "Yes"
    return out


def grade(candidate: str, reference: str, timeout: float) -> tuple[str, str]:
    """(outcome, message): outcome is accepted, rejected, or the verifier error's kind."""
    try:
        return ("accepted" if answers_equal(candidate, reference, timeout) else "rejected"), ""
    except VerifierError as err:
        # `kind` names the error since verifier errors have kinds; before, every one was an "error"
        return getattr(err, "kind", "error"), str(err)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds per comparison")
    parser.add_argument("--show", type=int, default=10, help="errors to print")
    args = parser.parse_args()

    import champ_dataset

    problems = champ_dataset.load("v0").problems
    counts: dict[str, Counter] = {}
    wrong, errors = [], []
    for identifier, problem in problems.items():
        for kind, candidate in candidates(problem.answer).items():
            outcome, message = grade(candidate, problem.answer, args.timeout)
            counts.setdefault(kind, Counter())[outcome] += 1
            if outcome == "accepted" and kind not in ("true", "true-alt"):
                wrong.append(f"{identifier} {kind}: {candidate!r} accepted for {problem.answer!r}")
            if message:
                errors.append(f"{identifier} {kind}: {message}")

    print(f"CHAMP: {len(problems)} problems")
    outcomes = ["accepted", "rejected"] + sorted({o for c in counts.values() for o in c} - {"accepted", "rejected"})
    print(f"{'candidate':<10}" + "".join(f"{o:>14}" for o in outcomes))
    for kind in ("true", "true-alt", "first+1", "last+1", "yes-no"):
        print(f"{kind:<10}" + "".join(f"{counts.get(kind, Counter())[o]:>14}" for o in outcomes))
    print(f"\nwrong acceptances: {len(wrong)}")
    print("\n".join(wrong))
    print(f"\nverifier errors: {len(errors)} (first {min(args.show, len(errors))})")
    print("\n".join(errors[:args.show]))


if __name__ == "__main__":
    main()

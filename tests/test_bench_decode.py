"""scripts/bench_decode.py at its smallest: two trees (here the same one twice) alternate in
fresh processes, and the report gives each tree's tokens/s, its share of the bf16 limit measured
in the run, and the per-pair ratio."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

import needs

pytestmark = pytest.mark.slow
needs.smollm2("reasoning_gym")

ROOT = Path(__file__).resolve().parents[1]


def test_two_trees_alternate_and_the_report_gives_rates_shares_and_the_ratio():
    out = subprocess.run([sys.executable, str(ROOT / "scripts/bench_decode.py"), "--tree", f"a={ROOT / 'src'}",
                          "--tree", f"b={ROOT / 'src'}", "--prompts", "1", "--n", "2", "--tokens", "4", "--reps", "1",
                          "--pairs", "1"], check=True, capture_output=True, text=True).stdout
    assert re.search(r"pair 1 a: \d+ tokens/s", out) and re.search(r"pair 1 b: \d+ tokens/s", out)
    assert re.search(r"2 rows × 4 forced tokens; bf16 decode rate \d+ GFLOP/s", out)
    shares = re.findall(r"^(a|b): (\d+) tokens/s, (\d+)% of the bf16 limit", out, re.M)
    assert [s[0] for s in shares] == ["a", "b"] and all(int(s[1]) > 0 for s in shares)
    assert re.search(r"b/a: \d+\.\d\d× \(pairs \d+\.\d\d\)", out)


def test_split_reports_products_attention_and_the_ceiling_without_the_rest():
    out = subprocess.run([sys.executable, str(ROOT / "scripts/bench_decode.py"), "--split", "--prompts", "2", "--n", "2",
                          "--tokens", "6"], check=True, capture_output=True, text=True).stdout
    step = re.search(r"per decode step: matrix products (\d+\.\d) ms \(\d+% of the limit's rate\), attention (\d+\.\d) ms, "
                     r"the rest (-?\d+\.\d) ms", out)
    assert step and float(step[1]) > 0 and float(step[2]) > 0
    share = int(re.search(r"generate call [\d.]+ s unprofiled: \d+ tokens/s, (\d+)% of the limit", out)[1])
    ceiling = int(re.search(r"if the rest took no time: (\d+)% of the limit", out)[1])
    # both shares are there; how they compare is timing from different processes and moments (under load
    # the unprofiled call once came out at 1486 % against a ceiling of 61 %), which a test does not judge
    assert share > 0 and ceiling > 0

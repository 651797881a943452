"""The shipped SFT checkpoint is reproduced by `taut sft` with the shipped recipe (slow)."""

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
SHIPPED_LOG = ROOT / "src" / "taut" / "assets" / "testbed-sft" / "sft_metrics.jsonl"


def _has_amx() -> bool:
    try:
        return "amx_bf16" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(_has_amx(), reason="the shipped log came from a CPU without AMX (docs/performance-log.md: bf16 products "
                    "as avx512_core_bf16); on an AMX CPU the kernels sum in another order and the loss differs from "
                    "step 100 (1.91483 against 1.91485), deterministically: the same run on any commit since the log")
def test_sft_recipe_retraces_the_shipped_training_log(tmp_path):
    """The first 300 steps of the recipe give bit-identical losses to the shipped run's log
    (the whole run takes about 25 minutes; the loss trajectory is deterministic on CPU)."""
    shipped = [json.loads(line) for line in SHIPPED_LOG.read_text().splitlines()]
    proc = subprocess.Popen([sys.executable, "-m", "taut.cli", "sft", "--config", str(ROOT / "recipes" / "testbed-sft.yaml"),
                             "--out", str(tmp_path), "--quiet"], stderr=subprocess.PIPE)
    log = tmp_path / "metrics.jsonl"
    deadline = time.time() + 600
    while not (log.exists() and len(log.read_text().splitlines()) >= 3):
        assert proc.poll() is None, proc.stderr.read().decode()
        assert time.time() < deadline
        time.sleep(1)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    ours = [json.loads(line) for line in log.read_text().splitlines()][:3]
    assert [r["step"] for r in ours] == [100, 200, 300]
    for a, b in zip(ours, shipped):
        assert a["step"] == b["step"] and a["loss"] == b["loss"] and a["grad_norm"] == b["grad_norm"]

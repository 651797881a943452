"""taut.lab.written_start's table: from the evaluations already made (`--report-only`), the ones
not yet made shown as –, and the start's targets judged from what is there."""

import json

import pytest

from taut.lab import written_start


def _report(accuracy: float, n: int, redundancy: float = 0.5) -> dict:
    cells = {f"{f}/{lv}": {"accuracy": accuracy if lv < 4 else accuracy / 2, "n_problems": n, "tokens_mean": 100.0,
                           "redundancy": redundancy, "necessary_tokens_mean": 40.0, "thinks_rate": 1.0}
             for f in ("columns", "stories", "times") for lv in (1, 2, 3, 4)}
    return {"by_cell": cells, "in_domain": {"redundancy": redundancy}}


def test_the_table_is_written_from_the_evaluations_made_so_far(tmp_path, capsys):
    out = tmp_path / "start"
    (out / "eval").mkdir(parents=True)
    (out / "sft").mkdir()
    (out / "sft" / "metrics.jsonl").write_text(json.dumps({"step": 0, "val_loss": 1.0}) + "\n" + json.dumps({"step": 20, "val_loss": 0.1}) + "\n")
    (out / "eval" / "start-greedy.json").write_text(json.dumps(_report(0.95, 300)))
    (out / "eval" / "control20-greedy.json").write_text(json.dumps(_report(0.9, 100, redundancy=0.35)))
    assert written_start.main(["--out", str(out), "--report-only"]) == 0
    text = (out / "start.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| columns / 1 |"))
    assert row.split(" | ")[6:10] == ["–", "–", "–", "–"]         # forced direct and sampled: not yet made
    assert "300 problems per family and level greedy and forced direct, after RL on the first 100 of them" in text
    assert "columns: level 1 0.95 (≥ 0.90: met); level 4 0.47 (≥ 0.50: NOT met)\n" in text and "forced direct loses" not in text
    assert "after 20 steps of correctness-only RL: 0.35 (≥ 0.30: met)" in text
    (out / "eval" / "start-greedy.json").unlink()
    with pytest.raises(SystemExit, match="no greedy evaluation"):
        written_start.main(["--out", str(out), "--report-only"])

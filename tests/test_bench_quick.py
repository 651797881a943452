"""`taut bench --quick` end to end (slow: about two minutes)."""

import json

import pytest
from typer.testing import CliRunner

from taut.cli import app


@pytest.mark.slow
def test_bench_quick_runs_every_method_and_reports(tmp_path):
    out, md = tmp_path / "bench", tmp_path / "BENCHMARKS.md"
    result = CliRunner().invoke(app, ["bench", "--quick", "--out", str(out), "--write", str(md)])
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "bench.json").read_text())
    methods = {r["method"] for r in summary["rows"]}
    assert {"control", "mastery-curriculum", "siri-cosine (low)", "siri-cosine (high)", "dapo-heavy"} <= methods
    for row in summary["rows"]:
        assert 0 <= row["accuracy"] <= 1 and row["tokens"] > 0
    text = md.read_text()
    assert "| method |" in text and "## Targets" in text and "<!-- discussion -->" in text
    assert (out / "report" / "report.html").exists()


def test_a_resumed_matrix_reports_the_times_its_runs_took_when_they_ran(tmp_path):
    from taut.bench.matrix import _recorded_seconds

    resumed: list[str] = []
    assert _recorded_seconds(tmp_path, 120.0, True, resumed) == 120.0 and resumed == []     # trained now: recorded
    assert _recorded_seconds(tmp_path, 0.3, False, resumed) == 120.0                        # found done: as it ran
    assert resumed == [str(tmp_path)]
    older = tmp_path / "older"
    older.mkdir()
    assert _recorded_seconds(older, 0.3, False, resumed) == 0.3 and resumed[-1] == str(older)   # no record: flagged

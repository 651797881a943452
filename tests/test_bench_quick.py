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

"""The overthinking study's one command (taut.lab.arith_study), shrunk by --smoke: every recipe
trains on SmolLM2-135M-Instruct, every run and the start are evaluated both ways, the report is
drawn and the table written; a second call finds everything done and trains nothing."""

import json

import pytest

from taut.checkpoint import chosen_checkpoint

import needs

pytestmark = pytest.mark.slow
needs.smollm2("reasoning_gym")


def test_smoke_study_trains_evaluates_and_tabulates_every_method(tmp_path, capsys, arith_study):
    study = arith_study
    out = tmp_path / "arith"
    assert study.main(["--out", str(out), "--smoke", "--workers", "2"]) == 0      # as make study-arith runs it

    result = json.loads((out / "study.json").read_text())
    assert result["smoke"] is True
    names = [(r["name"], r["decoding"]) for r in result["rows"]]
    assert sorted(names) == sorted([(m, d) for m in ("start", *study.METHODS) for d in ("sampled", "greedy")])
    for row in result["rows"]:
        assert set(row["cells"]) >= {"basic_arithmetic/1", "basic_arithmetic/2", "products/1", "trained"}
        assert all(0 <= c["accuracy"] <= 1 and c["tokens"] > 0 for k, c in row["cells"].items())
        if row["name"] != "start":
            assert row["train"]["wall"] > 0 and row["train"]["cpu"] > 0
    for method in study.METHODS:
        run = out / method
        assert "rl: " in (out / f"{method}.train.log").read_text()             # trained side by side: logged
        assert (run / "eval" / "step-000000.json").exists() and (run / "eval-greedy" / "step-000000.json").exists()
        chosen = f"{chosen_checkpoint(run).name}.json"
        sampled = json.loads((run / "eval" / chosen).read_text())
        greedy = json.loads((run / "eval-greedy" / chosen).read_text())
        assert sampled["eval"]["temperature"] == 0.7 and greedy["eval"]["temperature"] == 0 and greedy["eval"]["samples"] == 1
    assert (out / "report" / "report.html").exists()
    table = (out / "study.md").read_text()
    assert table.count("\n| ") == 2 * (1 + len(study.METHODS)) and "products (unseen)" in table
    assert all(f"- {method}: " in table and " min CPU" in table for method in study.METHODS)

    # a second call trains and evaluates nothing: every command it would run is already done
    capsys.readouterr()
    assert study.main(["--out", str(out), "--smoke"]) == 0
    commands = [line for line in capsys.readouterr().out.splitlines() if line.startswith("$ ")]
    assert len(commands) == 1 and " compare " in commands[0]

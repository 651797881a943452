"""Experiment trackers receive every metrics.jsonl record: read back with each tracker's own reader."""

import json
import sys

import pytest

from taut.config import load_config
from taut.trackers import TrackerMissing, open_trackers, split_record

# records as the RL loop writes them to metrics.jsonl: a phase start, steps, a validation record
RECORDS = [
    {"step": 0, "phase": "accuracy", "event": "phase-start"},
    {"step": 1, "phase": "accuracy", "strategy": "siri", "cap": 128, "reward": 0.5, "accuracy": 0.5,
     "length_mean": 40.0, "mastered_frac": 0.0, "grad_norm": None},
    {"step": 2, "phase": "accuracy", "strategy": "siri", "cap": 112, "reward": 0.625, "accuracy": 0.625,
     "length_mean": 38.5, "mastered_frac": 0.125},
    {"step": 2, "val_accuracy": 0.7, "val_tokens_mean": 36.0},
    {"step": 3, "phase": "compression", "strategy": "mastery-gated", "cap": 96, "reward": 0.75, "accuracy": 0.75,
     "length_mean": 33.0, "mastered_frac": 0.25, "gate_open": True},
]
SCALARS = {"cap", "reward", "accuracy", "length_mean", "mastered_frac", "val_accuracy", "val_tokens_mean", "gate_open"}


def config(*trackers):
    return load_config(None, [f"report_to={json.dumps(list(trackers))}", "rl.steps=3"])


def test_split_record_keeps_numbers_as_scalars_and_the_rest_as_text():
    scalars, texts = split_record({"step": 3, "cap": 96, "gate_open": True, "phase": "compression", "loss": None,
                                   "budgets": {"8": 0.5}, "spike": float("nan")})
    assert scalars == {"cap": 96.0, "gate_open": 1.0, "budgets/8": 0.5}
    assert texts == {"phase": "compression"}


def test_no_trackers_is_a_no_op(tmp_path):
    trackers = open_trackers(config(), tmp_path / "run")
    for record in RECORDS:
        trackers.log(record)
    trackers.close()
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("tracker, module", [("tensorboard", "tensorboard"), ("wandb", "wandb"), ("trackio", "trackio")])
def test_a_missing_package_names_the_extra(tmp_path, monkeypatch, tracker, module):
    monkeypatch.setitem(sys.modules, module, None)          # import fails as if not installed
    with pytest.raises(TrackerMissing, match=rf"pip install 'taut\[{tracker}\]'"):
        open_trackers(config(tracker), tmp_path)


def read_tensorboard(log_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    scalars = {tag: {(e.step, round(e.value, 6)) for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}
    texts = {tag: [(e.step, e.tensor_proto.string_val[0].decode()) for e in events.Tensors(tag)]
             for tag in events.Tags()["tensors"]}
    return scalars, texts


def test_tensorboard_event_files_hold_every_metric_at_its_step_and_resume_continues(tmp_path):
    pytest.importorskip("tensorboard")
    run = tmp_path / "run"
    with open_trackers(config("tensorboard"), run) as trackers:
        for record in RECORDS:
            trackers.log(record)
    scalars, texts = read_tensorboard(run / "tensorboard")
    assert set(scalars) == SCALARS
    assert scalars["cap"] == {(1, 128.0), (2, 112.0), (3, 96.0)}
    assert scalars["mastered_frac"] == {(1, 0.0), (2, 0.125), (3, 0.25)}
    assert scalars["val_accuracy"] == {(2, 0.7)}
    assert [v for _, v in texts["phase"]] == ["accuracy", "compression"]          # logged when it changes
    assert texts["phase"][1][0] == 3 and "rl:" in texts["config"][0][1]
    # a run resumed from its step-2 checkpoint re-logs step 3: the events after step 2 are replaced
    with open_trackers(config("tensorboard"), run, resume_step=2) as trackers:
        trackers.log({**RECORDS[-1], "cap": 80})
    scalars, texts = read_tensorboard(run / "tensorboard")
    assert scalars["cap"] == {(1, 128.0), (2, 112.0), (3, 80.0)}
    assert len(texts["config"]) == 1


def test_wandb_offline_writes_its_run_folder_and_resume_keeps_the_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")          # any network use fails instead of leaving
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    run = tmp_path / "run"
    with open_trackers(config("wandb"), run) as trackers:
        for record in RECORDS:
            trackers.log(record)
    run_id = json.loads((run / "trackers.json").read_text())["wandb"]["id"]
    folders = list((run / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(folders) == 1 and list(folders[0].glob(f"run-{run_id}.wandb"))
    summary = json.loads((folders[0] / "files" / "wandb-summary.json").read_text())
    assert summary["cap"] == 96 and summary["mastered_frac"] == 0.25 and summary["val_accuracy"] == 0.7
    assert summary["step"] == 3 and summary["phase"] == "compression"
    logged_config = (folders[0] / "files" / "config.yaml").read_text()
    assert "report_to" in logged_config and "prompts_per_step" in logged_config
    with open_trackers(config("wandb"), run, resume_step=3) as trackers:
        trackers.log({**RECORDS[-1], "step": 4})
    assert json.loads((run / "trackers.json").read_text())["wandb"]["id"] == run_id
    assert len(list((run / "wandb").glob(f"offline-run-*-{run_id}"))) == 2          # the same run id, continued

"""Experiment trackers receive every metrics.jsonl record: read back with each tracker's own reader."""

import json
import os
import sys
import time
from pathlib import Path

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
    texts = {tag.removesuffix("/text_summary"): [(e.step, e.tensor_proto.string_val[0].decode()) for e in events.Tensors(tag)]
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


def wandb_records(path):
    """The records of a W&B transaction log (`run-<id>.wandb`): a 7-byte header, then LevelDB-style
    blocks of 32 KiB holding chunks (checksum 4, length 2, type 1: full, first, middle, last)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, block, pending = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:                      # a block's tail too short for a chunk header is padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        pending += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_history(path) -> tuple[list[dict], dict]:
    rows, config = [], {}
    for record in wandb_records(path):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            rows.append({k: v for k, v in items.items() if not k.startswith("_")})
        elif kind == "run":
            config = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.run.config.update}
    return rows, config


def test_wandb_offline_writes_its_run_folder_and_resume_keeps_the_run(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")          # any network use fails instead of leaving
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    run = tmp_path / "run"
    with open_trackers(config("wandb"), run) as trackers:
        for record in RECORDS:
            trackers.log(record)
    wandb.teardown()                        # the writer is a service process: wait until it has written
    run_id = json.loads((run / "trackers.json").read_text())["wandb"]["id"]
    (folder,) = (run / "wandb").glob(f"offline-run-*-{run_id}")
    rows, logged_config = wandb_history(folder / f"run-{run_id}.wandb")
    assert [row["step"] for row in rows] == [0, 1, 2, 2, 3]
    for row, record in zip(rows, RECORDS):
        scalars, texts = split_record(record)
        assert {k: v for k, v in row.items() if not isinstance(v, str) and k != "step"} == scalars
        assert {k: v for k, v in row.items() if isinstance(v, str)}.items() <= texts.items()
    assert [row.get("phase") for row in rows] == ["accuracy", None, None, None, "compression"]   # when it changes
    assert [row.get("strategy") for row in rows] == [None, "siri", None, None, "mastery-gated"]
    assert logged_config["report_to"] == ["wandb"] and logged_config["rl"]["steps"] == 3
    # wandb names an offline run's folder by the second the run started: a resume within the same
    # second as the first start (only this fast test does that) would reuse the first folder
    time.sleep(1.05 - time.time() % 1)
    with open_trackers(config("wandb"), run, resume_step=3) as trackers:
        trackers.log({**RECORDS[-1], "step": 4, "cap": 80})
    wandb.teardown()
    assert json.loads((run / "trackers.json").read_text())["wandb"]["id"] == run_id
    folders = sorted((run / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(folders) == 2                                   # the same run id, continued
    resumed = [f for f in folders if f != folder][0]
    rows, _ = wandb_history(resumed / f"run-{run_id}.wandb")
    assert rows[-1]["step"] == 4 and rows[-1]["cap"] == 80


TRACKIO_SCRIPT = """
import json, sys
from taut.config import load_config
from taut.trackers import open_trackers
records, run_dir, resume = json.loads(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
config = load_config(None, ['report_to=[trackio]', 'rl.steps=3'])
with open_trackers(config, run_dir, resume_step=resume) as trackers:
    for record in records:
        trackers.log(record)
"""


@pytest.mark.slow                    # two processes that import trackio (and gradio): over a minute here
def test_trackio_writes_its_local_database_and_resume_keeps_the_run(tmp_path):
    pytest.importorskip("trackio")
    import sqlite3
    import subprocess

    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "HTTPS_PROXY": "http://127.0.0.1:9",
           "HTTP_PROXY": "http://127.0.0.1:9", "PYTHONPATH": str(Path(__file__).resolve().parent.parent / "src")}
    run = tmp_path / "run"

    def log(records, resume):
        subprocess.run([sys.executable, "-c", TRACKIO_SCRIPT, json.dumps(records), str(run), json.dumps(resume)],
                       env=env, check=True, capture_output=True, timeout=120)

    log(RECORDS, None)
    name = json.loads((run / "trackers.json").read_text())["trackio"]["name"]
    db = sqlite3.connect(tmp_path / "trackio" / "taut.db")
    rows = [(step, json.loads(blob)) for step, blob in
            db.execute("select step, metrics from metrics where run_name = ? order by id", (name,))]
    assert [step for step, _ in rows] == [0, 1, 2, 2, 3]
    for (_, row), record in zip(rows, RECORDS):
        assert {k: v for k, v in row.items() if not isinstance(v, str)} == split_record(record)[0]
    assert rows[4][1]["phase"] == "compression" and rows[4][1]["cap"] == 96
    (config_blob,) = db.execute("select config from configs where run_name = ?", (name,)).fetchone()
    assert json.loads(config_blob)["report_to"] == ["trackio"]
    db.close()
    log([{**RECORDS[-1], "step": 4, "cap": 80}], 3)
    db = sqlite3.connect(tmp_path / "trackio" / "taut.db")
    assert db.execute("select count(distinct run_id) from metrics where run_name = ?", (name,)).fetchone() == (1,)
    assert db.execute("select step from metrics where run_name = ? order by id desc", (name,)).fetchone() == (4,)


def test_a_training_run_mirrors_its_metrics_to_tensorboard(tmp_path):
    """The RL loop sends every metrics.jsonl record: TensorBoard holds each numeric metric of the
    log at the same steps (the cap, mastery rate, validation accuracy among them)."""
    pytest.importorskip("tensorboard")
    from taut.rl.trainer import train_rl

    cfg = load_config(None, ["report_to=[tensorboard]", "model.preset=tiny", "model.path=null", "model.threads=1",
                             "data.train=[gym:add]", "data.levels=[1]", "data.pool_per_level=8", "rl.steps=2",
                             "rl.prompts_per_step=2", "rl.group_size=2", "rl.max_new_tokens=6", "validation.every=2",
                             "validation.n_per_level=2", "validation.samples=1", "strategy={name: mastery-gated}"])
    train_rl(cfg, tmp_path, quiet=True)
    scalars, texts = read_tensorboard(tmp_path / "tensorboard")
    logged = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    for record in logged:
        for key, value in record.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "step":
                assert any(s == record["step"] and abs(v - value) <= 1e-5 * max(1.0, abs(value)) for s, v in scalars[key]), key
    assert {"cap", "mastered_frac", "val_accuracy", "val_tokens_mean", "accuracy", "length_mean"} <= set(scalars)
    assert [v for _, v in texts["phase"]] == ["main"]

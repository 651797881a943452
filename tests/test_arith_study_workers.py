"""The overthinking study trains methods side by side (`--workers`), each timed by its own process."""

import threading
import time

import pytest


def test_methods_train_side_by_side_at_most_workers_at_a_time(tmp_path, arith_study, monkeypatch):
    running, most, calls, lock = [0], [0], {}, threading.Lock()

    def train(method, run, overrides, log):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.2)
        with lock:
            running[0] -= 1
        calls[method] = (run, overrides, log)
        return {"wall": 0.2, "cpu": 0.0, "note": method}

    monkeypatch.setattr(arith_study, "train", train)
    runs = {m: tmp_path / m for m in arith_study.METHODS}
    times = arith_study.train_all(runs, {m: [f"seed={i}"] for i, m in enumerate(runs)}, workers=2)
    assert most[0] == 2
    assert list(times) == list(arith_study.METHODS) and all(times[m]["note"] == m for m in runs)
    assert all(calls[m] == (runs[m], [f"seed={i}"], True) for i, m in enumerate(runs))   # side by side: logged

    most[0] = 0
    arith_study.train_all(runs, {m: [] for m in runs}, workers=1)
    assert most[0] == 1 and not any(log for _, _, log in calls.values())


def test_a_command_is_timed_alone_and_its_output_logged(tmp_path, arith_study):
    log = tmp_path / "help.log"
    wall, cpu = arith_study.taut("--help", log=log)
    assert "train" in log.read_text() and wall > 0 and 0 < cpu < wall + 5
    with pytest.raises(arith_study.StepFailed, match="exit status 2"):
        arith_study.taut("no-such-command", log=tmp_path / "bad.log")


def test_workers_must_be_a_positive_whole_number(arith_study, capsys):
    with pytest.raises(SystemExit):
        arith_study.main(["--workers", "0"])
    assert "expected a whole number ≥ 1, got '0'" in capsys.readouterr().err


def test_side_by_side_training_warns_when_memory_may_not_hold_it(arith_study):
    assert arith_study.memory_warning(2, 10.0).startswith("warning: 2 methods side by side may need up to 23 GB")
    assert "this machine has 10.0 GB" in arith_study.memory_warning(2, 10.0) and "--workers 1" in arith_study.memory_warning(2, 10.0)
    assert arith_study.memory_warning(2, 30.0) is None          # room for both
    assert arith_study.memory_warning(1, 2.0) is None           # one at a time: nothing to choose
    assert arith_study.memory_warning(2, None) is None          # unknown (not Linux): no guess
    memory = arith_study.memory_gb()
    assert memory is None or memory > 0


def test_methods_side_by_side_give_freed_memory_back(arith_study):
    """Kept freed memory (model.keep_freed_memory, the default) made two training processes of the
    study grow to 14.5 and 13.0 GB on this 23.5 GiB machine, and the kernel killed them."""
    assert arith_study.training_overrides(2, 1, False, False) == ["model.threads=1", "model.keep_freed_memory=false"]
    assert arith_study.training_overrides(1, 2, False, False) == []


def test_a_run_killed_between_phases_is_resumed_not_taken_as_done(tmp_path, arith_study, monkeypatch):
    """A curriculum run killed after its first phase has a curriculum.json (written after every
    phase): the study took it as trained and would have evaluated its step-20 checkpoint."""
    import json

    run = tmp_path / "mastery"
    (run / "checkpoints" / "step-000020").mkdir(parents=True)
    (run / "curriculum.json").write_text(json.dumps({"finished": False, "plan": [], "phases": [], "candidates": []}))
    commands = []
    monkeypatch.setattr(arith_study, "taut", lambda *args, log=None: commands.append(args) or (1.0, 1.0))
    times = arith_study.train("mastery", run, ["model.threads=1"])
    assert commands and commands[0][:3] == ("train", "--resume", str(run)) and times["note"].startswith("resumed")
    (run / "curriculum.json").write_text(json.dumps({"finished": True, "plan": [], "phases": [], "candidates": []}))
    (run / "study-seconds.json").unlink()
    commands.clear()
    assert arith_study.train("mastery", run, [])["note"] == "trained before this study's timing was kept" and not commands


def test_run_finished_reads_the_record_and_old_records_by_their_selection(tmp_path):
    import json

    from taut.checkpoint import run_finished

    assert not run_finished(tmp_path)
    (tmp_path / "curriculum.json").write_text(json.dumps({"phases": []}))          # before the field existed
    assert not run_finished(tmp_path)
    (tmp_path / "selection.json").write_text(json.dumps({"checkpoint": "step-000032"}))
    assert run_finished(tmp_path)
    (tmp_path / "curriculum.json").write_text(json.dumps({"finished": False}))
    assert not run_finished(tmp_path)

"""The overthinking study evaluates the start once per study directory, whichever methods a call runs."""

from pathlib import Path


def _evaluated(run: Path, *kinds: str) -> None:
    for kind in kinds:
        (run / kind).mkdir(parents=True, exist_ok=True)
        (run / kind / "step-000000.json").write_text("{}")


def test_start_is_reused_from_another_method_of_the_same_directory(tmp_path, arith_study):
    study = arith_study
    runs = {"mastery": tmp_path / "mastery"}
    assert study.start_source(tmp_path, runs) == tmp_path / "mastery"        # nothing evaluated yet
    _evaluated(tmp_path / "control", "eval")                                    # half done does not count
    assert study.start_source(tmp_path, runs) == tmp_path / "mastery"
    _evaluated(tmp_path / "control", "eval-greedy")
    assert study.start_source(tmp_path, runs) == tmp_path / "control"
    _evaluated(tmp_path / "mastery", "eval", "eval-greedy")                     # this call's runs come first
    assert study.start_source(tmp_path, runs) == tmp_path / "mastery"

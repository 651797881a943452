"""The overthinking study evaluates the start once per study directory, whichever methods a call runs."""

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "arith_study.py"


def _study():
    spec = importlib.util.spec_from_file_location("arith_study", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _evaluated(run: Path, *kinds: str) -> None:
    for kind in kinds:
        (run / kind).mkdir(parents=True, exist_ok=True)
        (run / kind / "step-000000.json").write_text("{}")


def test_start_is_reused_from_another_method_of_the_same_directory(tmp_path):
    study = _study()
    runs = {"mastery": tmp_path / "mastery"}
    assert study.start_source(tmp_path, runs) == tmp_path / "mastery"        # nothing evaluated yet
    _evaluated(tmp_path / "control", "eval")                                    # half done does not count
    assert study.start_source(tmp_path, runs) == tmp_path / "mastery"
    _evaluated(tmp_path / "control", "eval-greedy")
    assert study.start_source(tmp_path, runs) == tmp_path / "control"
    _evaluated(tmp_path / "mastery", "eval", "eval-greedy")                     # this call's runs come first
    assert study.start_source(tmp_path, runs) == tmp_path / "mastery"

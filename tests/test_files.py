"""Data files as tasks: every format loads the same problems; a bad row is an error naming file,
line (or row) and field; splits are declared or assigned by a stable hash; the Task protocol."""

import csv
import json
import re
from pathlib import Path

import pytest

from taut.config import FileTaskConfig
from taut.tasks import Task, load_task
from taut.tasks.files import DataError, FileTask, read_rows

ROWS = [
    {"question": f"What is {i} + {i}?", "final": str(2 * i), "worked": f"<think>{i}+{i}</think> \\boxed{{{2 * i}}}",
     "topic": "add" if i % 2 else "double", "level": 1 + i % 3, "uid": f"q{i}"}
    for i in range(30)
]
COLUMNS = {"prompt": "question", "answer": "final", "response": "worked", "domain": "topic", "difficulty": "level", "id": "uid"}


def _write(path: Path, rows: list[dict], fmt: str) -> Path:
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "csv":
        with open(path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    elif fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    elif fmt == "datasets":
        from datasets import Dataset

        Dataset.from_list(rows).save_to_disk(str(path))
    return path


SUFFIX = {"jsonl": "d.jsonl", "csv": "d.csv", "parquet": "d.parquet", "datasets": "d"}


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet", "datasets"])
def test_every_format_gives_the_same_problems(fmt, tmp_path):
    path = _write(tmp_path / SUFFIX[fmt], ROWS, fmt)
    task = load_task(FileTaskConfig(path=str(path), columns=COLUMNS, name="arith"))
    assert isinstance(task, Task)
    rows = read_rows(FileTaskConfig(path=str(path), columns=COLUMNS))
    assert [(r.prompt, r.answer, r.response, r.domain, r.difficulty, r.id) for r in rows] == \
        [(r["question"], r["final"], r["worked"], r["topic"], r["level"], r["uid"]) for r in ROWS]
    problems = [p for split in ("train", "validation", "test") for p in task.problems(split, 100)]
    assert sorted(p.id for p in problems) == sorted(f"arith:q{i}" for i in range(30))
    assert {(p.domain, p.difficulty) for p in problems} <= {(d, lv) for d in ("add", "double") for lv in (1, 2, 3)}
    assert all(task.verify(p, p.data.response, complete=True).correct for p in problems)


def test_a_saved_dataset_dict_declares_its_splits(tmp_path):
    from datasets import Dataset, DatasetDict

    DatasetDict({"train": Dataset.from_list(ROWS[:20]), "test": Dataset.from_list(ROWS[20:])}).save_to_disk(str(tmp_path / "dd"))
    task = FileTask(FileTaskConfig(path=str(tmp_path / "dd"), columns=COLUMNS))
    assert len(task.problems("train", 100)) == 20 and len(task.problems("test", 100)) == 10
    assert task.problems("validation", 100) == []
    with pytest.raises(DataError, match="declares its splits"):
        FileTask(FileTaskConfig(path=str(tmp_path / "dd"), columns=COLUMNS, split="test"))


# ---------------------------------------------------------------------------------------------
# bad rows
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("line, expected", [
    ('{"question": "q", "final": "1", "level": 1, "uid": "b"}', "missing field 'worked' (the response column"),
    ('{"question": "", "final": "1", "worked": "w", "level": 1, "uid": "b"}', "field 'question': expected a non-empty string"),
    ('{"question": "q", "final": 0.5, "worked": "w", "level": 1, "uid": "b"}', "field 'final': expected a string or an integer"),
    ('{"question": "q", "final": null, "worked": "w", "level": 1, "uid": "b"}', "field 'final': expected a non-empty string, got None"),
    ('{"question": "q", "final": "1", "worked": "w", "level": 1, "uid": "q0"}', "field 'uid': id 'q0' is already used at"),
    ('{"question": "q", "final": "1", "worked": "w", "level": "hard", "uid": "b"}', "field 'level': expected an integer"),
    ('{"question": "q", "final": "1", "worked": "w", "level": true, "uid": "b"}', "field 'level': expected an integer"),
    ('{"question": "q", "final": "1"', "not valid JSON"),
    ('["q", "1"]', "expected an object with fields"),
])
def test_a_bad_jsonl_row_names_file_line_and_field(line, expected, tmp_path):
    path = tmp_path / "bad.jsonl"
    good = [{k: v for k, v in r.items() if k != "topic"} for r in ROWS[:3]]
    path.write_text("".join(json.dumps(r) + "\n" for r in good) + "\n" + line + "\n")     # a blank line is skipped
    columns = {**COLUMNS, "domain": None}
    with pytest.raises(DataError) as err:
        read_rows(FileTaskConfig(path=str(path), columns=columns))
    assert str(err.value).startswith(f"{path}:5: ") and expected in str(err.value), str(err.value)


def test_a_bad_csv_row_names_its_line(tmp_path):
    path = _write(tmp_path / "d.csv", ROWS[:4], "csv")
    path.write_text(path.read_text() + '"What is\nmultiline?",7,w,add,not-a-number,q99\n')
    with pytest.raises(DataError, match=r"d\.csv:6: field 'level': expected an integer, got 'not-a-number'"):
        read_rows(FileTaskConfig(path=str(path), columns=COLUMNS))
    path.write_text(path.read_text().replace("not-a-number", "2") + "q,1,w,add,1,q100,extra\n")
    with pytest.raises(DataError, match=r"d\.csv:8: more fields than the header"):
        read_rows(FileTaskConfig(path=str(path), columns=COLUMNS))


def test_a_bad_parquet_row_names_its_row(tmp_path):
    rows = [dict(r) for r in ROWS[:5]]
    rows[3]["question"] = "   "
    path = _write(tmp_path / "d.parquet", rows, "parquet")
    with pytest.raises(DataError, match=r"d\.parquet row 4: field 'question': expected a non-empty string"):
        read_rows(FileTaskConfig(path=str(path), columns=COLUMNS))


def test_unknown_suffix_and_missing_file_are_errors(tmp_path):
    (tmp_path / "d.txt").write_text("x")
    with pytest.raises(DataError, match="set format to one of"):
        read_rows(FileTaskConfig(path=str(tmp_path / "d.txt")))
    with pytest.raises(FileNotFoundError) as absolute:
        load_task(FileTaskConfig(path=str(tmp_path / "absent.jsonl")))
    assert "current directory" not in str(absolute.value)


def test_a_field_given_twice_in_a_jsonl_row_is_an_error(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "1+1", "answer": "2"}\n{"prompt": "2+2", "answer": "5", "answer": "4"}\n')
    with pytest.raises(DataError, match=r"d.jsonl:2: field 'answer' is given twice in the row"):
        read_rows(FileTaskConfig(path=str(path)))


def test_a_missing_builtin_data_file_lists_the_shipped_ones():
    with pytest.raises(FileNotFoundError, match=r"no built-in data file 'builtin:math-small.jsonl'; built-in data files: "
                                                r"builtin:math-tiny.jsonl"):
        load_task(FileTaskConfig(path="builtin:math-small.jsonl"))


def test_a_missing_relative_data_file_names_the_directory_it_was_looked_for_in(tmp_path, monkeypatch):
    """A recipe's relative data path (data/deepscaler.jsonl) run from another directory
    said only that the file does not exist."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=rf"'data/absent.jsonl' does not exist \(a relative path is read from the "
                                                rf"current directory, {re.escape(str(tmp_path))}\)"):
        load_task(FileTaskConfig(path="data/absent.jsonl"))


# ---------------------------------------------------------------------------------------------
# splits, grouping, the protocol
# ---------------------------------------------------------------------------------------------


def test_hash_splits_are_stable_under_reordering_and_data_is_not_modified(tmp_path):
    rows = [{"prompt": f"  Problem {i}:\tsolve  ", "answer": i} for i in range(60)]
    a = read_rows(FileTaskConfig(path=str(_write(tmp_path / "a.jsonl", rows, "jsonl"))))
    b = read_rows(FileTaskConfig(path=str(_write(tmp_path / "b.jsonl", rows[::-1], "jsonl"))))
    assert {r.prompt: r.split for r in a} == {r.prompt: r.split for r in b}
    assert {r.split for r in a} == {"train", "validation", "test"}
    assert a[0].prompt == "  Problem 0:\tsolve  " and a[0].answer == "0"          # kept as stored
    declared = read_rows(FileTaskConfig(path=str(tmp_path / "a.jsonl"), split="test"))
    assert {r.split for r in declared} == {"test"}


def test_problems_are_sampled_per_domain_and_difficulty(tmp_path):
    path = _write(tmp_path / "d.jsonl", ROWS, "jsonl")
    config = FileTaskConfig(path=str(path), columns=COLUMNS, split="train")
    task = load_task(config)
    sample = task.problems("train", 2, seed=0)
    cells = {}
    for p in sample:
        cells.setdefault((p.domain, p.difficulty), []).append(p.id)
    assert len(cells) == 6 and all(len(ids) == 2 for ids in cells.values())
    assert sample == task.problems("train", 2, seed=0) and sample != task.problems("train", 2, seed=1)
    assert {p.difficulty for p in load_task(config, levels=[2]).problems("train", 100)} == {2}
    with pytest.raises(ValueError, match="no difficulty column"):
        load_task(FileTaskConfig(path=str(path), columns={**COLUMNS, "difficulty": None}), levels=[2])


def test_budget_instruction_exact_verifier_and_the_file_shorthand(tmp_path):
    path = _write(tmp_path / "d.jsonl", [{"prompt": "Name the color.", "answer": "blue"}], "jsonl")
    task = load_task(FileTaskConfig(path=str(path), verifier="exact", split="test"))
    (problem,) = task.problems("test", 10)
    assert task.with_budget(problem, 512).prompt == "Name the color.\n\nThink for 512 tokens."
    assert task.verify(problem, "It is \\boxed{blue}", complete=True).correct
    assert not task.verify(problem, "It is \\boxed{red}", complete=True).correct
    shorthand = load_task(f"file:{path}")
    assert shorthand.name == "d" and len(shorthand.rows) == 1


def test_the_shipped_example_file_verifies_its_own_solutions(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)                    # builtin: is read from the package, wherever taut runs
    task = FileTask(FileTaskConfig(path="builtin:math-tiny.jsonl",
                                   columns={"prompt": "problem", "answer": "answer", "response": "solution"}))
    assert task.name == "math-tiny"
    problems = [p for split in ("train", "validation", "test") for p in task.problems(split, 1000)]
    assert len(problems) == len(task.rows) >= 40
    assert all(len(task.problems(split, 1000)) > 0 for split in ("train", "validation", "test"))
    assert all(task.verify(p, p.data.response, complete=True).correct for p in problems)

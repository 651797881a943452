"""Evaluation grades a response that never finished (it hit the token cap without an
end-of-sequence token) as not correct, and reports how many such responses held the right
answer: `truncated_but_right` per group, in the JSON and the terminal table (which keeps every
number whole in 80 columns)."""

import io

import pytest
from rich.console import Console

from taut.config import EvalConfig, FileTaskConfig
from taut.evaluate import grade, report, summarize, table
from taut.tasks.files import FileTask


class TextPolicy:                              # tokens are characters
    def decode(self, ids):
        return "".join(map(chr, ids))


@pytest.fixture
def task(tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text('{"prompt": "What is 3 * 2?", "answer": "6"}\n')
    return FileTask(FileTaskConfig(path=str(data), split="test"))


def test_a_response_cut_at_the_cap_is_not_correct_even_when_it_held_the_answer(task):
    problem = task.problems("test", 1)[0]
    rambling = "3 * 2 = 6\nAnswer: 6\nThen 6 * 2 = 12. 3"          # a SmolLM2-like response, cut at the cap
    wrong = "Answer: 5\nThen 5 * 2 = 10. 3"
    budgets = [12, 100]

    def sample(text, truncated):
        return grade(task, problem, TextPolicy(), [ord(c) for c in text], truncated, budgets)

    samples = [sample(rambling, False), sample(rambling, True), sample(wrong, True)]
    assert [s.correct for s in samples] == [True, False, False]
    assert [s.truncated_but_right for s in samples] == [False, True, False]
    assert samples[1].budget_correct == [False, False]        # its first 12 tokens hold no finished answer; 100 ≥ its length
    summary = summarize(samples, budgets)
    assert summary["accuracy"] == pytest.approx(1 / 3)
    assert summary["truncation_rate"] == pytest.approx(2 / 3) and summary["truncated_but_right"] == 1

    result = report(samples, EvalConfig(budgets=budgets), {})
    assert result["by_cell"][f"{problem.domain}/{problem.difficulty}"]["truncated_but_right"] == 1
    lines = rendered(result)
    header = next(line.split() for line in lines if "domain/level" in line)
    overall = next(line.split() for line in lines if line.strip().startswith("overall"))
    assert header[-1] == "t-ok" and overall[-1] == "1"          # no oracle here: no redund, thinks, rounds


def rendered(result):
    out = io.StringIO()
    Console(file=out, width=80).print(table(result))
    return out.getvalue().splitlines()


def test_the_table_keeps_long_task_names_and_every_number_whole_in_80_columns(task):
    problem = task.problems("test", 1)[0]
    samples = [grade(task, problem, TextPolicy(), [ord(c) for c in "Answer: 6\n"], False, [])]
    result = report(samples, EvalConfig(budgets=[]), {})
    result["by_cell"] = {f"basic_arithmetic/{lv}": result["overall"] for lv in (1, 2)}   # reasoning-gym's long names
    lines = rendered(result)
    assert max(map(len, lines)) <= 80 and "…" not in "\n".join(lines)
    assert any(line.split()[:2] == ["basic_arithmetic/1", "1.000"] for line in lines)

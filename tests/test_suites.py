"""The transfer suites (code:humaneval, ifeval, qa): their problems, their graders, their named
scores in evaluation, and the transfer view of the report."""

import math
from pathlib import Path

import pytest

from taut.config import EvalConfig
from taut.evaluate import Sample, grade, report, summarize
from taut.sandbox import Limits
from taut.tasks import load_task
from taut.tasks.code import CodeTask, extract_program
from taut.tasks.ifeval import EXCLUDED, IfevalTask, Instance, score
from taut.tasks.qa import QATask, normalize


@pytest.fixture(scope="module")
def code():
    return CodeTask()


@pytest.fixture(scope="module")
def ifeval():
    return IfevalTask()


@pytest.fixture(scope="module")
def qa():
    return QATask()


# ---- specs ---------------------------------------------------------------------------------


def test_specs_resolve_and_bad_ones_say_what_exists():
    assert load_task("code:humaneval").name == "code:humaneval"
    assert load_task("qa:syllogism").families == ("syllogism",)
    with pytest.raises(ValueError, match="code:humaneval"):
        load_task("code:mbpp")
    with pytest.raises(ValueError, match="spelled `ifeval`"):
        load_task("ifeval:strict")
    with pytest.raises(ValueError, match="not registered"):
        load_task("qa:no_such_family")
    with pytest.raises(ValueError, match="data.levels"):
        load_task("qa", levels=[1])


# ---- code ----------------------------------------------------------------------------------


def test_humaneval_ships_164_problems_as_a_held_out_test_set(code):
    assert len(code.records) == 164
    problems = code.problems("test", 5, seed=0)
    assert len(problems) == 5 and all(p.held_out and p.domain == "code" for p in problems)
    assert problems == code.problems("test", 5, seed=0) != code.problems("test", 5, seed=1)
    assert len(code.problems("test", 1000)) == 164
    with pytest.raises(ValueError, match="test split only"):
        code.problems("train", 5)


def test_program_extraction():
    fenced = "Here:\n```python\ndef f(x):\n    return x\n```\nand a test\n```python\nprint(f(1))\n```"
    assert extract_program(fenced, "f") == "def f(x):\n    return x\n"            # the block that defines it
    assert extract_program("```\nreturn 1\n```", "f") == "return 1\n"           # else the last block
    assert extract_program("<think>```python\ndef f(): pass\n```", "f") is None  # still thinking
    assert extract_program("def f(x):\n    return x", "f") == "def f(x):\n    return x"
    assert extract_program("def f(x):\n    return x", "f", complete=False) is None
    assert extract_program("```python\ndef f(x):\n    return", "f") is None      # a block still being written
    assert extract_program("just prose", "f") is None


def test_code_is_graded_by_running_the_tests():
    code = CodeTask(limits=Limits(cpu_seconds=1, wall_seconds=2.0))
    problem = code.problems("test", 1, seed=3)[0]
    record = problem.data
    right = f"```python\n{record['prompt']}{record['canonical_solution']}```"
    wrong = f"```python\ndef {record['entry_point']}(*args):\n    return None\n```"
    hang = f"```python\ndef {record['entry_point']}(*args):\n    while True:\n        pass\n```"
    assert code.verify(problem, right, complete=True).correct
    assert not code.verify(problem, wrong, complete=True).correct
    assert not code.verify(problem, "no code at all", complete=True).correct
    verdict = code.verify(problem, hang, complete=True)
    assert not verdict.correct and verdict.error is None                       # the model's fault, not the verifier's


# ---- ifeval --------------------------------------------------------------------------------


def test_ifeval_prompts_are_pinned_and_use_every_checker_but_the_excluded(ifeval):
    again = IfevalTask()
    assert [i.prompt for i in again.instances] == [i.prompt for i in ifeval.instances]
    used = {i for inst in ifeval.instances for i in inst.instruction_ids}
    assert not used & set(EXCLUDED)
    assert len(used) >= 20
    assert {len(inst.instruction_ids) for inst in ifeval.instances} == {1, 2, 3}
    splits = {s: {p.id for p in ifeval.problems(s, 10**6)} for s in ("train", "validation", "test")}
    assert not splits["train"] & splits["test"] and not splits["validation"] & splits["test"]
    problem = ifeval.problems("test", 1)[0]
    assert problem.prompt.startswith(problem.data.base) and len(problem.prompt) > len(problem.data.base)


def test_ifeval_strict_and_loose():
    inst = Instance("Describe tea.", ("punctuation:no_comma", "change_case:english_lowercase"), ({}, {}), "Describe tea.")
    assert score(inst, "tea is a drink made from leaves")["prompt_strict"] == 1.0
    preamble = score(inst, "Sure, here it is:\ntea is a drink made from leaves\nit is nice")
    assert preamble == {"prompt_strict": 0.0, "prompt_loose": 1.0, "instruction_strict": 0.0, "instruction_loose": 1.0}
    half = score(inst, "tea, a drink made from the leaves of a plant, is enjoyed all around the world")
    assert half["instruction_strict"] == 0.5 and half["prompt_strict"] == 0.0
    assert score(inst, "<think>Thinking, Hard.</think>tea is good")["prompt_strict"] == 1.0


def test_ifeval_scores_flow_into_the_evaluation(ifeval):
    class Decoder:
        def decode(self, tokens):
            return "tea is a drink made from leaves" if tokens[0] else "Tea, A Drink."

    problem = ifeval.problems("test", 1)[0]
    inst = Instance("Describe tea.", ("punctuation:no_comma", "change_case:english_lowercase"), ({}, {}), "Describe tea.")
    problem = problem.__class__(**{**problem.__dict__, "data": inst})
    samples = [grade(ifeval, problem, Decoder(), [1, 2, 3], False, []), grade(ifeval, problem, Decoder(), [0, 2], False, []),
               grade(ifeval, problem, Decoder(), [1, 2, 3], True, [])]                 # truncated: scores zero
    summary = summarize(samples, [])
    assert summary["accuracy"] == pytest.approx(1 / 3)
    assert summary["scores"]["prompt_strict"] == pytest.approx(1 / 3)
    assert summary["scores"]["instruction_strict"] == pytest.approx(1 / 3)


# ---- qa ------------------------------------------------------------------------------------


def test_qa_normalisation_and_aliases(qa):
    assert normalize("  **The Grandmother.** ") == "grandmother"
    assert normalize("Father-in-law") == "father in law"
    problem = next(p for p in qa.problems("test", 50) if p.answer == "Yes")
    assert qa.verify(problem, "It follows.\nAnswer: yes", complete=True).correct
    assert qa.verify(problem, "Answer: True", complete=True).correct
    assert not qa.verify(problem, "Answer: No", complete=True).correct
    assert not qa.verify(problem, "I think yes", complete=True).correct                 # no final answer line
    assert not qa.verify(problem, "Answer: yes", complete=False).correct                # may still be written


def test_qa_pool_spreads_over_families_and_drops_wrong_references(qa):
    problems = qa.problems("test", 9, seed=0)
    assert len(problems) == 9 and {p.data for p in problems} == set(qa.families)
    assert all(p.held_out and p.domain == "qa" for p in problems)
    assert not any(a in ("mother-in-law", "father-in-law", "niece", "nephew")
                   for f, _, a in qa.questions if f == "family_relationships")


# ---- evaluation and the transfer view --------------------------------------------------------


def _sample(domain, held_out, length, correct):
    return Sample(problem_id=f"{domain}:{length}", domain=domain, difficulty=None, held_out=held_out, length=length,
                  truncated=False, correct=correct, verifier_error=False, budget_correct=[])


def _evaluation(lengths: dict[str, tuple[int, int]], correct: dict[str, bool]) -> dict:
    samples = [_sample(d, d != "math", n, correct[d] if i == 0 else False)
               for d, pair in lengths.items() for i, n in enumerate(pair)]
    return report(samples, EvalConfig(budgets=[]), {"checkpoint": "x"})


def test_the_transfer_view_compares_each_suite(tmp_path):
    from taut.lab.report import compare
    from taut.lab.report.transfer import rich_table, suite_rows

    before = _evaluation({"math": (100, 100), "code": (200, 200), "qa": (50, 50)}, {"math": True, "code": False, "qa": True})
    after = _evaluation({"math": (50, 50), "code": (150, 250), "qa": (60, 40)}, {"math": True, "code": True, "qa": False})
    assert after["held_out_domains"] == ["code", "qa"]
    rows = {r["domain"]: r for r in suite_rows(before, after)}
    assert [r["domain"] for r in suite_rows(before, after)] == ["math", "code", "qa"]
    assert rows["math"]["role"] == "trained" and rows["code"]["role"] == "unseen"
    assert rows["math"]["tokens_change_pct"] == pytest.approx(-50.0)
    assert rows["code"]["tokens_change_pct"] == pytest.approx(0.0)
    assert rows["code"]["score_change_pp"] == pytest.approx(50.0)
    assert rows["qa"]["score_change_pp"] == pytest.approx(-50.0)
    assert rich_table(suite_rows(before, after)).row_count == 3

    import json

    run = tmp_path / "run"
    (run / "eval").mkdir(parents=True)
    (run / "eval" / "step-000000.json").write_text(json.dumps(before))
    (run / "eval" / "step-000010.json").write_text(json.dumps(after))
    page = compare([run], tmp_path / "report")
    data = json.loads((page.parent / "report.json").read_text())["figures"]["transfer_by_suite"]["data"]
    plotted = {r["domain"]: r for r in data["runs"][0]["rows"]}
    assert plotted["math"]["tokens_change_pct"] == pytest.approx(-50.0)
    assert plotted["qa"]["score_change_pp"] == pytest.approx(-50.0)
    assert 'id="transfer_by_suite"' in page.read_text()

    from typer.testing import CliRunner

    from taut.cli import app

    result = CliRunner().invoke(app, ["compare", str(run), "--out", str(tmp_path / "cli-report")], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    assert "transfer: run (step-000000 → step-000010)" in result.output
    line = next(x for x in result.output.splitlines() if x.strip().startswith("math"))
    assert "100.0 → 50.0" in line and "-50.0%" in line


def test_the_transfer_view_says_why_it_is_missing(tmp_path):
    from taut.lab.report.figures import Omitted
    from taut.lab.report.runs import Evaluation, RunResults
    from taut.lab.report.transfer import transfer_by_suite

    one = _evaluation({"math": (10, 10)}, {"math": True})
    run = RunResults("r", Path("r"), [Evaluation("step-000000", 0, one), Evaluation("step-000001", 1, one)],
                     Evaluation("step-000001", 1, one), None, [])
    missing = transfer_by_suite([run], ["#000000"])
    assert isinstance(missing, Omitted) and "single domain" in missing.reason
    assert not math.isnan(summarize([_sample("math", False, 1, True)], [])["accuracy"])


@pytest.mark.parametrize("loader", ["bench", "suite"])
def test_a_bench_recipe_with_a_key_given_twice_is_refused_with_its_lines(loader, tmp_path):
    from taut.config import ConfigError
    from taut.lab.bench.matrix import load_bench
    from taut.lab.bench.suite import load_suite

    head = "suite: x\ntitle: y\n" if loader == "suite" else ""
    path = tmp_path / "bench-x.yaml"
    path.write_text(head + "model: builtin:testbed-sft\nsteps: 5\nsteps: 50\nmethods:\n  - {name: control, strategy: {name: none}}\n")
    line = head.count("\n") + 3
    with pytest.raises(ConfigError, match=rf"bench-x.yaml:{line}: steps is given twice \(lines {line - 1} and {line}\)"):
        (load_suite if loader == "suite" else load_bench)(path)
    path.write_text(head + "steps: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        (load_suite if loader == "suite" else load_bench)(path)

"""Written arithmetic (taut.tasks.written): generators, splits, the verifier (adversarially), the oracle,
the SFT traces, and the tasks end to end (train, eval with the oracle and a prefill, SFT, preview)."""

import dataclasses
import json
import random
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from taut.config import RunConfig
from taut.tasks import load_task
from taut.tasks.base import OracleTask, TraceTask
from taut.tasks.written import (
    COLUMNS,
    FAMILIES,
    Redundancy,
    Written,
    WrittenTask,
    analyze,
    draw,
    error_kind,
    grade,
    resolve_families,
    trace,
    words,
)

LEVELS = (1, 2, 3, 4)


def replay(problem: Written) -> int:
    """The answer the step lines compute, read back from their text (columns, times: the written
    digits, highest column first; stories: the last step's result)."""
    steps = problem.steps()
    if problem.family == "stories":
        if problem.format >= 2:        # each change's digit work: the ones digit written, the tens, then the result
            for step in steps:
                value, op, n = re.match(r"(\d+) ([+-]) (\d+):", step).groups()
                ones = re.search(r"(?:write |= )(\d)(?:, carry|; tens)", step).group(1)
                tens = re.search(r"tens \d+ [+-] \d = (\d+)\.", step).group(1)
                result = int(re.search(r"= (\d+)\.$", step).group(1))
                assert result == (int(value) + int(n) if op == "+" else int(value) - int(n)) == int(tens + ones)
        return int(re.search(r"= (\d+)\.$", steps[-1]).group(1))
    if problem.format >= 3:            # the plan names the columns the lines then work, in order
        assert steps[0] == f"Columns: {', '.join(s.partition(':')[0] for s in steps[1:] if not s.startswith('Carry:'))}."
        steps = steps[1:]
    written = [re.search(r"Write (\d+)", s).group(1) for s in steps]
    so_far = [re.search(r"So far: (\d+)\.$", s).group(1) for s in steps]
    if problem.format == 1:
        assert [int(x) for x in so_far] == [int("".join(reversed(written[: i + 1]))) for i in range(len(steps))]
    else:                              # one digit a line, the zeros kept
        assert all(len(w) == 1 for w in written)
        assert so_far == ["".join(reversed(written[: i + 1])) for i in range(len(steps))]
    return int("".join(reversed(written)))


@pytest.mark.parametrize("format", [1, 2, 3])
@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("level", LEVELS)
def test_the_steps_compute_the_answer_and_levels_have_their_size(family, level, format):
    rng = random.Random(f"{family}{level}")
    for _ in range(300):
        p = dataclasses.replace(draw(family, level, rng), format=format)
        assert replay(p) == p.answer >= 0
        carry_line = format >= 2 and p.steps()[-1].startswith("Carry:")     # formats 2, 3: a carry left over has a line
        plan = format == 3 and family != "stories"                          # format 3: the columns named first
        extra = carry_line + plan                                           # lines beyond one per column
        if family == "stories":
            assert len(p.steps()) == level and all(1 <= n <= 9 for n in p.numbers[1:])
        elif family == "times":
            assert len(str(p.numbers[0])) == level + 1 and 2 <= p.numbers[1] <= 9 and len(p.steps()) == level + 1 + extra
        elif level == 1:             # one column of work: no carry, no borrow
            a, b = p.numbers
            assert b < 10 and a < 1000 and (a % 10 + b < 10 if p.ops == ("+",) else a % 10 >= b) and not carry_line
        else:
            assert max(len(str(n)) for n in p.numbers) == level and len(p.steps()) == level + extra
        assert carry_line == (format >= 2 and family != "stories" and len(str(p.answer)) > len(p.steps()) - extra)
        assert p.direct == (family != "times" and level == 1)
        assert p.necessary_steps() == ([] if p.direct else p.steps())


def test_every_level_has_at_least_a_thousand_distinct_problems_and_the_splits_share_none():
    task = WrittenTask(list(FAMILIES), levels=LEVELS)
    by_split = {split: task.problems(split, 1200) for split in ("train", "validation", "test")}
    keys = {split: {p.data.key for p in ps} for split, ps in by_split.items()}
    prompts = {split: {p.prompt for p in ps} for split, ps in by_split.items()}
    assert not keys["train"] & keys["validation"] and not keys["train"] & keys["test"] and not keys["validation"] & keys["test"]
    assert not prompts["train"] & prompts["test"] and not prompts["train"] & prompts["validation"]
    for family in FAMILIES:
        for level in LEVELS:
            distinct = {p.data.key for ps in by_split.values() for p in ps if (p.domain, p.difficulty) == (family, level)}
            assert len(distinct) >= 1000, (family, level)
            test = [p for p in by_split["test"] if (p.domain, p.difficulty) == (family, level)]
            assert len(test) >= 300, (family, level, len(test))        # a standard error ≤ 0.03 per level
    ids = [p.id for ps in by_split.values() for p in ps]
    assert len(ids) == len(set(ids))


def test_split_membership_does_not_depend_on_the_seed_and_problems_are_stable():
    task = WrittenTask(["columns", "stories"], levels=(2,))
    a, b = task.problems("test", 50, seed=0), task.problems("test", 50, seed=1)
    assert a == task.problems("test", 50, seed=0)
    assert {p.data.key for p in a} != {p.data.key for p in b}
    train = {p.data.key for p in task.problems("train", 800, seed=3)}
    assert not train & {p.data.key for p in a + b}


def test_one_calculation_has_one_wording():
    rng = random.Random(0)
    for _ in range(200):
        p = draw("stories", 3, rng)
        assert p.question() == Written(p.family, p.level, p.numbers, p.ops).question()
        name = re.match(r"(\w+) has", p.question()).group(1)
        pronouns = set(re.findall(r"\b(She|He)\b", p.question()))
        assert len(pronouns) <= 1, p.question()                  # one person, one pronoun
        assert p.question().endswith(f"does {name} have now?")


def test_specs_resolve_to_families_and_held_out_is_times():
    assert resolve_families("written") == ["columns", "stories"]
    assert resolve_families("written:all") == ["columns", "stories", "times"]
    assert resolve_families("written:columns+times") == ["columns", "times"]
    with pytest.raises(ValueError, match="unknown written family 'colums'"):
        resolve_families("written:colums")
    task = load_task("written:all", [2])
    assert isinstance(task, OracleTask) and isinstance(task, TraceTask)
    assert not isinstance(load_task("gym:add"), TraceTask)             # the testbed's traces come from its own mixture
    held = {p.domain: p.held_out for p in task.problems("test", 2)}
    assert held == {"columns": False, "stories": False, "times": True}
    with pytest.raises(ValueError, match="levels 1-6"):
        load_task("written", [7])


# ---- the verifier, adversarially ------------------------------------------------------------------
PROBLEMS = st.builds(lambda family, level, seed, format: dataclasses.replace(draw(family, level, random.Random(seed)), format=format),
                     st.sampled_from(list(FAMILIES)), st.sampled_from(LEVELS), st.integers(0, 10**9), st.sampled_from([1, 2]))
JOINERS = [" or ", " and ", ", ", " / ", " \\lor ", " \\vee ", " \\wedge ", " \\land ", " \\cup ", " \\mid ", " \\\\ ",
           " \\approx ", " ~ ", " = ", " < ", " != ", " to ", "-", " (or ", " maybe "]


@settings(max_examples=300, deadline=None)
@given(PROBLEMS, st.integers(-5, 5).filter(bool), st.sampled_from(JOINERS), st.booleans(), st.sampled_from(["", "\\boxed{", "**"]))
def test_an_answer_with_two_candidates_or_a_relation_is_never_correct(problem, offset, joiner, right_first, wrap):
    right, wrong = str(problem.answer), str(problem.answer + offset)
    pair = f"{right}{joiner}{wrong}" if right_first else f"{wrong}{joiner}{right}"
    close = {"\\boxed{": "}", "**": "**"}.get(wrap, "")
    for response in (f"Answer: {wrap}{pair}{close}", f"work\nAnswer: {pair}\n", f"Answer: {right}\nAnswer: {wrong}",
                     f"Answer: {wrong}\nsome checking\nAnswer: {right}"):
        assert not grade(problem, response, complete=True).correct, response


@settings(max_examples=200, deadline=None)
@given(PROBLEMS, st.sampled_from(["{a}", "**{a}**", "{a}.", " {a} ", "`{a}`"]), st.booleans())
def test_the_right_integer_alone_is_correct_in_any_harmless_dress(problem, dress, newline):
    response = "Ones: ...\nAnswer: " + dress.format(a=problem.answer) + ("\n" if newline else "")
    assert grade(problem, response, complete=True).correct
    assert grade(problem, f"Answer: {problem.answer}\nWait, let me double-check.\nYes.", complete=True).correct


@settings(max_examples=200, deadline=None)
@given(PROBLEMS, st.integers(1, 999))
def test_a_number_that_merely_contains_the_answer_earns_nothing(problem, extra):
    right = str(problem.answer)
    for written in (f"{extra}{right}", f"{right}{extra}", f"{right}0", f"-{right}" if problem.answer else "1"):
        assert not grade(problem, f"Answer: {written}", complete=True).correct
        assert grade(problem, f"Answer: {written}", complete=True).score is None        # no partial credit, ever


@settings(max_examples=200, deadline=None)
@given(PROBLEMS, st.integers(1, 3))
def test_a_cut_off_answer_line_is_not_an_answer(problem, keep):
    right = str(problem.answer)
    cut = f"Ones: 1 + 1 = 2.\nAnswer: {right[:max(1, len(right) - keep)]}"
    assert grade(problem, cut, complete=False).extracted is None
    assert not grade(problem, cut, complete=False).correct
    assert grade(problem, cut + right[max(1, len(right) - keep):] + "\n", complete=False).correct == (len(right) > 0)


def test_no_answer_line_is_wrong_even_with_the_number_in_the_text():
    p = Written("columns", 2, (48, 35), ("+",))
    assert not grade(p, "48 + 35 = 83", complete=True).correct
    assert not grade(p, "The answer is 83.", complete=True).correct
    assert grade(p, "**Answer:** 83", complete=True).correct and grade(p, "answer: 83", complete=True).correct


# ---- the oracle ----------------------------------------------------------------------------------
@settings(max_examples=300, deadline=None)
@given(PROBLEMS)
def test_the_minimal_response_is_all_necessary_and_covers_every_step(problem):
    a = analyze(problem, problem.minimal_response(), complete=True)
    assert a.correct and a.redundant_tokens == 0 and a.length == a.necessary_length
    assert a.coverage == (None if problem.direct else 1.0)


@settings(max_examples=300, deadline=None)
@given(PROBLEMS, st.integers(0, 10**6))
def test_redundancy_added_to_the_minimal_response_is_counted_exactly(problem, seed):
    rng = random.Random(seed)
    extra_before = problem.restatement(rng)
    extra_step = "Let me check that step: " + (problem.steps()[0])
    extra_after = "Wait, let me double-check.\n" + "\n".join(problem.steps()) + f"\nYes, {problem.answer} is correct."
    necessary = problem.necessary_steps()
    lines = [extra_before, *necessary[:1], extra_step, *necessary[1:], f"Answer: {problem.answer}", extra_after]
    response = "\n".join(lines)
    a = analyze(problem, response, complete=True)
    added = words(extra_before) + words(extra_step) + words(extra_after)
    assert a.redundant_tokens == added and a.length == a.necessary_length + added
    assert a.post_answer_rounds and a.thinks and a.unneeded_thinking


def test_on_the_direct_level_all_thinking_is_redundant_and_a_skipped_step_is_missed_coverage():
    easy = Written("columns", 1, (42, 5), ("+",))
    a = analyze(easy, "Ones: 2 + 5 + 0 = 7. Write 7, carry 0.\nTens: 4 + 0 + 0 = 4. Write 4.\nAnswer: 47", complete=True)
    assert a.necessary_length == words("Answer: 47") + 1 and a.redundant_tokens == a.length - a.necessary_length
    hard = Written("columns", 3, (482, 356), ("+",))
    direct = analyze(hard, "Answer: 838", complete=True)
    assert direct.coverage == 0.0 and direct.redundant_tokens == 0 and not direct.thinks
    wrong_step = hard.minimal_response().replace("8 + 5 + 0 = 13", "8 + 5 + 0 = 14")
    assert analyze(hard, wrong_step, complete=True).coverage == pytest.approx(2 / 3)
    repeated = hard.minimal_response().replace("Answer", hard.steps()[1] + "\nAnswer")      # a column done twice
    assert analyze(hard, repeated, complete=True).redundant_tokens == words(hard.steps()[1])


def test_a_response_without_an_answer_line_is_unknown_to_the_oracle():
    p = Written("stories", 2, (20, 3, 4), ("+", "-"))
    assert analyze(p, "20 + 3 = 23.\n23 - 4 = 19.\nSo 19.", complete=True) is None
    assert analyze(p, "20 + 3 = 23.\nAnswer: 1", complete=False) is None            # its answer line was cut
    assert analyze(p, "20 + 3 = 23.\nAnswer: 19", complete=True) is not None


def test_the_oracle_counts_with_the_tokenizer_it_is_given():
    p = Written("columns", 2, (48, 35), ("+",))
    response = "We need to add 48 and 35.\n" + p.minimal_response()
    chars = analyze(p, response, complete=True, count=len)
    assert chars.redundant_tokens == len(response) - len(p.minimal_response())
    assert chars.necessary_length == len(p.minimal_response()) + 1


# ---- traces ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("format", [1, 2])
def test_traces_are_correct_overthink_by_the_mixture_and_answer_easy_problems_directly_at_its_rate(format):
    task = WrittenTask(list(FAMILIES), levels=LEVELS, format=format)
    rng = random.Random(0)
    direct, easy, redundant, total = 0, 0, 0, 0
    assert all(response.count("Answer:") == 1 for _, response in task.sft_examples(rng, 500, pool_per_level=50))
    for p in task.problems("train", 150):
        written = p.data
        for _ in range(4):
            response = trace(written, rng)
            a = analyze(written, response, complete=True)
            assert a.correct and a.coverage in (None, 1.0)
            redundant += a.redundant_tokens
            total += a.length
            if written.direct:
                easy += 1
                direct += response == f"Answer: {written.answer}"
    assert 0.2 < direct / easy < 0.4                      # Redundancy.p_direct_easy = 0.3
    assert redundant / total > 0.4
    none = Redundancy(p_direct_easy=0, p_restate=0, p_recheck=0, rounds=(1.0,))
    p = Written("times", 2, (347, 6), ("*",))
    assert trace(p, rng, none) == p.minimal_response()


def test_format_2_asks_the_same_problems_and_writes_their_steps_otherwise():
    one, two = (load_task(spec, list(LEVELS)) for spec in ("written:all", "written2:all"))
    p1, p2 = (t.problems("test", 30, seed=3) for t in (one, two))
    assert [(p.id, p.prompt, p.answer) for p in p1] == [(p.id, p.prompt, p.answer) for p in p2]
    assert {p.data.format for p in p1} == {1} and {p.data.format for p in p2} == {2}
    for a, b in zip(p1, p2):
        if a.difficulty > 1:
            assert a.data.minimal_response() != b.data.minimal_response()
        for task, p in ((one, a), (two, b)):               # each task's oracle reads its own format
            analysis = task.analyze(p, p.data.minimal_response(), True)
            assert analysis.correct and analysis.redundant_tokens == 0
    # the format-2 subtraction states both digits before the verdict; the last column carries like the others
    assert "2 vs 4: less, borrow, 12 - 4 = 8. Write 8, borrow 1." in Written("columns", 2, (32, 14), ("-",), format=2).steps()[0]
    assert Written("columns", 2, (97, 41), ("+",), format=2).steps()[1:] == [
        "Tens: 97 has 9, 41 has 4. 9 + 4 + 0 = 13. Write 3, carry 1. So far: 38.", "Carry: 1. Write 1. So far: 138."]
    assert Written("stories", 1, (65, 6), ("-",), format=2).steps() == [
        "65 - 6: ones 5 vs 6: less, borrow, 15 - 6 = 9; tens 6 - 1 = 5. 65 - 6 = 59."]
    # a format-1 story step is not a format-2 necessary step: the oracle counts it redundant
    story = Written("stories", 2, (65, 6, 3), ("-", "+"), format=2)
    old = "65 - 6 = 59.\n59 + 3 = 62.\nAnswer: 62"
    assert analyze(story, old, complete=True).coverage == 0.0
    with pytest.raises(ValueError, match="formats are 1, 2, 3"):
        WrittenTask(["columns"], format=4)


def test_format_3_names_the_columns_first_and_the_oracle_counts_the_plan_necessary():
    two, three = (load_task(spec, list(LEVELS)) for spec in ("written2:all", "written3:all"))
    p2, p3 = (t.problems("test", 30, seed=3) for t in (two, three))
    assert [(p.id, p.prompt, p.answer) for p in p2] == [(p.id, p.prompt, p.answer) for p in p3]
    for a, b in zip(p2, p3):
        plan = b.data.family != "stories"
        assert b.data.steps() == ([f"Columns: {', '.join(COLUMNS[:max(len(str(n)) for n in b.data.numbers[:1 if b.data.family == 'times' else 2])])}."]
                                  if plan else []) + a.data.steps()
        analysis = three.analyze(b, b.data.minimal_response(), True)
        assert analysis.correct and analysis.redundant_tokens == 0
    # a level-1 sum of a three-digit number and one digit: three columns, named before the first
    short = Written("columns", 1, (482, 5), ("+",), format=3)
    assert short.steps()[0] == "Columns: Ones, Tens, Hundreds." and len(short.steps()) == 4
    assert Written("times", 1, (47, 6), ("*",), format=3).steps()[0] == "Columns: Ones, Tens."
    # on a level where the steps are necessary, a response without the plan misses one of them
    hard = Written("columns", 3, (482, 356), ("+",), format=3)
    without = "\n".join(hard.minimal_response().split("\n")[1:])
    assert analyze(hard, without, complete=True).coverage == 3 / 4
    assert error_kind(hard, without) == "column plan"
    assert error_kind(hard, hard.minimal_response().replace("Hundreds.", "Hundreds, Thousands.", 1)) == "column plan"
    # the traces never re-check the plan line
    rng = random.Random(0)
    assert not any("step: Columns:" in trace(hard, rng) or "redo that: Columns:" in trace(hard, rng) for _ in range(200))


def test_error_kind_names_the_first_step_that_departs_from_the_working():
    add = Written("columns", 2, (97, 41), ("+",))
    right = add.minimal_response()
    assert error_kind(add, right) == "steps right"
    assert error_kind(add, right.replace("Write 13. So far: 138.", "Write 3, carry 1. So far: 38.")) == "last column as a middle"
    assert error_kind(add, right.replace("97 has 9, 41 has 4", "97 has 9, 41 has 1")) == "misread digits"
    assert error_kind(add, right.replace("7 + 1 + 0 = 8", "7 + 1 + 0 = 9")) == "column arithmetic"
    assert error_kind(add, right.split("\n")[0] + "\nAnswer: 138") == "missing step"
    sub = Written("columns", 2, (32, 14), ("-",))
    assert error_kind(sub, sub.minimal_response().replace("2 - 0 = 2, less than 4", "2 - 0 = 2, not less than 4")) == "borrow comparison"
    two = dataclasses.replace(add, format=2)
    assert error_kind(two, two.minimal_response().replace("\nCarry: 1. Write 1. So far: 138.", "")) == "carry line"
    assert error_kind(two, "\n".join(two.minimal_response().split("\n")[1:])) == "misread digits"     # the ones line dropped
    assert error_kind(two, two.minimal_response().replace("So far: 138.", "So far: 38.")) == "carry line"
    story = Written("stories", 2, (65, 6, 3), ("-", "+"))
    assert error_kind(story, "65 - 6 = 61.\n61 + 3 = 64.\nAnswer: 64") == "story step"
    assert error_kind(story, "65 - 9 = 56.\n56 + 3 = 59.\nAnswer: 59") == "story operands"
    story2 = dataclasses.replace(story, format=2)
    assert error_kind(story2, story2.minimal_response().replace("15 - 6 = 9", "15 - 6 = 8")) == "story step"


def test_sft_examples_draw_families_uniformly_and_harder_levels_more_often():
    task = WrittenTask(["columns", "stories"], levels=(1, 4))
    pairs = task.sft_examples(random.Random(1), 4000, pool_per_level=300)
    counts = {}
    for prompt, _ in pairs:
        kind = "stories" if "have now?" in prompt else "columns"
        counts[kind] = counts.get(kind, 0) + 1
    assert 1800 < counts["columns"] < 2200
    hard = sum(1 for prompt, _ in pairs if "have now?" in prompt and prompt.count(" more.") + prompt.count(
        "away") + sum(prompt.count(w) for w in (" loses ", " uses ", " sells ", " to a friend.")) == 4)
    assert 0.85 * 5 / 7 < hard / counts["stories"] < 1.15 * 5 / 7        # level k drawn in proportion to k + 1


# ---- end to end ------------------------------------------------------------------------------------
def test_written_tasks_train_evaluate_with_the_oracle_and_a_prefill(tmp_path):
    from test_real_models import tiny_chat_model

    from taut.rl.trainer import train_rl
    from taut.workflows import evaluate_policy, load_for_eval

    model = tiny_chat_model(tmp_path / "model")
    config = RunConfig.model_validate({
        "model": {"path": str(model), "threads": 1},
        "data": {"train": ["written"], "eval": ["written:all"], "levels": [1, 2], "pool_per_level": 8},
        "rl": {"steps": 1, "prompts_per_step": 2, "group_size": 2, "max_new_tokens": 16, "dynamic_sampling": False,
               "checkpoint_every": 100},
        "eval": {"n_per_level": 2, "samples": 1, "max_new_tokens": 16, "budgets": [8]},
    })
    run = tmp_path / "run"
    train_rl(config, run, quiet=True)
    record = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if '"accuracy"' in line][0]
    assert record["step"] == 1
    policy, _ = load_for_eval(config, run)
    result, samples = evaluate_policy(config, policy, {})
    assert set(result["by_cell"]) == {f"{f}/{level}" for f in FAMILIES for level in (1, 2)}
    assert result["held_out"]["n_samples"] == 4
    assert all("oracle_unknown_rate" in c for c in result["by_cell"].values())
    forced = config.model_copy(update={"eval": config.eval.model_copy(update={"prefill": "Answer: 7"})})
    result, samples = evaluate_policy(forced, policy, {})
    assert result["eval"]["prefill"] == "Answer: 7"                    # the report says the answer was forced
    assert all(s.text.startswith("Answer: 7") for s in samples)
    assert result["overall"]["oracle_unknown_rate"] < 1.0          # every response now has an answer line (unless cut)


def test_sft_on_written_traces_runs_from_a_recipe(tmp_path):
    from test_real_models import tiny_chat_model

    from taut.sft import sft_examples, train_sft, validation_examples

    model = tiny_chat_model(tmp_path / "model")
    config = RunConfig.model_validate({
        "model": {"path": str(model), "threads": 1},
        "data": {"sft": ["written:all"], "eval": ["written"], "levels": [1, 2]},
        "sft": {"steps": 2, "batch_size": 2, "checkpoint_every": 2, "log_every": 1, "val_every": 1, "val_examples": 4},
        "eval": {"n_per_level": 1, "samples": 1, "max_new_tokens": 8, "budgets": [8]},
    })
    pairs = sft_examples(config, random.Random(0), 50)
    assert any("have now?" in p for p, _ in pairs) and any("×" in p for p, _ in pairs)
    held_back = validation_examples(config)
    assert len(held_back) == 4 and held_back == validation_examples(config)           # fixed
    train_prompts = {p for p, _ in sft_examples(config, random.Random(1), 3000)}
    assert not train_prompts & {p for p, _ in held_back}                             # problems no training example uses
    train_sft(config, tmp_path / "sft", quiet=True)
    assert (tmp_path / "sft" / "checkpoints").is_dir()
    lines = [json.loads(line) for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    curve = [(r["step"], r["val_loss"]) for r in lines if "val_loss" in r]
    assert [s for s, _ in curve] == [0, 1, 2] and all(v > 0 for _, v in curve)
    assert [r["step"] for r in lines if "loss" in r] == [1, 2]
    assert json.loads((tmp_path / "sft" / "selection.json").read_text())["checkpoint"] == "step-000002"   # the only one saved


def test_sft_tokens_per_second_count_the_training_steps_only(tmp_path, monkeypatch):
    """`tokens_per_s` in an SFT run's metrics is response tokens over the steps' own time: the
    validation losses (100 s each on the fake clock below) and checkpoints are not in it."""
    from test_real_models import tiny_chat_model

    import taut.sft

    clock = [0.0]
    monkeypatch.setattr(taut.sft.time, "perf_counter", lambda: clock[0])
    real_step, real_validation = taut.sft.sft_step, taut.sft.validation_loss

    def step(*args):
        clock[0] += 2.0
        return real_step(*args)

    def validation(*args):
        clock[0] += 100.0
        return real_validation(*args)

    monkeypatch.setattr(taut.sft, "sft_step", step)
    monkeypatch.setattr(taut.sft, "validation_loss", validation)
    config = RunConfig.model_validate({
        "model": {"path": str(tiny_chat_model(tmp_path / "model")), "threads": 1},
        "data": {"sft": ["written:all"], "levels": [1, 2]},
        "sft": {"steps": 2, "batch_size": 2, "checkpoint_every": 2, "log_every": 2, "val_every": 1, "val_examples": 4},
    })
    taut.sft.train_sft(config, tmp_path / "sft", quiet=True)
    (line,) = [json.loads(x) for x in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
    assert line["elapsed_s"] >= 204.0                    # two steps and two validation losses on the clock
    tokens = sum(int((taut.sft.encode_batch(taut.sft.load_policy(config.model), taut.sft.step_batch(config, s))[1][:, 1:]
                      != -100).sum()) for s in range(2))
    assert line["tokens_per_s"] == pytest.approx(tokens / 4.0)


def test_data_preview_shows_written_problems_with_their_oracle():
    from typer.testing import CliRunner

    from taut.cli import app

    out = CliRunner().invoke(app, ["data", "preview", "written:columns", "-d", "3", "-n", "2"])
    assert out.exit_code == 0, out.output
    assert "Hundreds:" in out.output and "necessary" in out.output and "Answer:" in out.output
    two = CliRunner().invoke(app, ["data", "preview", "written2:stories", "-d", "2", "-n", "1"])
    assert two.exit_code == 0 and "; tens " in two.output          # format 2: each change worked digit by digit
    bad = CliRunner().invoke(app, ["data", "preview", "written:colums"])
    assert bad.exit_code == 2 and "unknown written family" in bad.output


def test_columns_names_cover_the_widest_level():
    assert len(COLUMNS) >= max(FAMILIES.values()) + 1


def test_an_sft_run_stands_for_its_checkpoint_with_the_lowest_validation_loss(tmp_path):
    from taut.checkpoint import chosen_checkpoint
    from taut.sft import select_lowest_validation_loss

    run = tmp_path / "run"
    for step in (40, 80, 120):
        (run / "checkpoints" / f"step-{step:06d}").mkdir(parents=True)
    losses = {0: 2.0, 20: 0.5, 40: 0.9, 80: 0.7, 120: 0.8}          # step 20 is lowest but has no checkpoint
    (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "val_loss": v}) + "\n" for s, v in losses.items())
                                       + json.dumps({"step": 120, "loss": 0.1}) + "\n")
    assert select_lowest_validation_loss(run).name == "step-000080"
    assert chosen_checkpoint(run).name == "step-000080"
    record = json.loads((run / "selection.json").read_text())
    assert record["rule"] == "lowest SFT validation loss" and record["val_loss"] == 0.7
    (run / "metrics.jsonl").write_text(json.dumps({"step": 10, "val_loss": 1.0}) + "\n")
    (run / "selection.json").unlink()
    assert select_lowest_validation_loss(run) is None and not (run / "selection.json").exists()

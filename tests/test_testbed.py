"""The testbed: ground truth, the oracle and parser, splits, determinism, the mixture's redundancy."""

import random

import pytest

from taut.config import RunConfig
from taut.tasks.gym.domains import DOMAINS, HELD_OUT_DOMAINS, LEVELS
from taut.tasks.gym.task import GymTask, Instance, TraceMixture, analyze, read_answer, split_of
from taut.tasks.gym.vocab import VOCAB, build_tokenizer


def _instances(n_per_cell=60, seed=0):
    rng = random.Random(seed)
    for domain in DOMAINS.values():
        for level in LEVELS:
            for _ in range(n_per_cell):
                yield Instance(domain, level, domain.sample(rng, level))


def test_trace_answers_equal_independent_ground_truth():
    for inst in _instances():
        assert inst.domain.trace_answer(inst.operands) == inst.domain.answer_words(inst.operands), inst.key


def test_known_values():
    add, sub, mul, chain = DOMAINS["add"], DOMAINS["sub"], DOMAINS["mul"], DOMAINS["chain"]
    assert add.trace_answer((47, 58)) == ["1", "0", "5"]
    assert sub.trace_answer((52, 47)) == ["5"]                  # leading zero dropped
    assert mul.trace_answer((47, 6)) == ["2", "8", "2"]
    assert chain.trace_answer((3, (("+", 5), ("*", 2), ("-", 4)))) == ["2"]
    assert DOMAINS["parity"].trace_answer((1, 0, 1, 1)) == ["1"]
    assert DOMAINS["mod"].trace_answer((4712, 7)) == [str(4712 % 7)]
    assert DOMAINS["mod"].steps((47, 7)) == ["4 % 7 = 4 ;".split(), "4 7 % 7 = 5 ;".split()]
    assert add.steps((47, 58))[0] == "7 + 8 + 0 = 1 5 write 5 carry 1 ;".split()


def test_every_word_is_in_the_vocabulary():
    tok = build_tokenizer()
    for inst in _instances(10):
        for words in (inst.prompt(budget=64).split(), inst.render(think=True, rounds=2)):
            assert set(words) <= set(VOCAB)
            assert tok.convert_ids_to_tokens(tok(" ".join(words)).input_ids)[1:] == words


def test_necessary_steps_grow_with_difficulty():
    for name, domain in DOMAINS.items():
        means = []
        for level in LEVELS:
            rng = random.Random(level)
            means.append(sum(len(Instance(domain, level, domain.sample(rng, level)).necessary_steps()) for _ in range(50)) / 50)
        assert means[0] == 0 and means == sorted(means) and means[-1] > means[1], (name, means)


def test_minimal_responses_have_zero_redundancy_and_full_coverage():
    for inst in _instances(20):
        a = analyze(inst, " ".join(inst.minimal_response()), complete=True)
        assert a.correct and a.redundant_tokens == 0 and a.redundancy == 0
        assert a.length == a.necessary_length == inst.necessary_length()
        assert a.coverage in (None, 1.0)
        assert not a.unneeded_thinking and not a.post_answer_rounds


@pytest.mark.parametrize("rounds", [1, 2])
def test_injected_redundancy_is_measured_exactly(rounds):
    for inst in _instances(20):
        think = True
        words = inst.render(think=think, rounds=rounds)
        a = analyze(inst, " ".join(words), complete=True)
        length = len(words) + 1
        assert a.correct and a.length == length
        assert a.redundant_tokens == length - inst.necessary_length()
        assert a.redundancy == pytest.approx(1 - inst.necessary_length() / length)
        assert a.post_answer_rounds
        assert a.unneeded_thinking == (inst.level == 1)


def test_grader_reads_the_first_answer_and_needs_it_complete():
    assert read_answer("</think> answer 1 2 check 3 = 4 ok answer 9".split(), complete=True)[0] == "1 2"
    assert read_answer("</think> answer 1 2".split(), complete=True)[0] == "1 2"
    assert read_answer("</think> answer 1 2".split(), complete=False)[0] is None     # cut mid-answer
    assert read_answer("</think> answer 1 2 check".split(), complete=False)[0] == "1 2"
    assert read_answer("7 + 8 ; </think>".split(), complete=True)[0] is None
    task = GymTask(["add"])
    p = Instance(DOMAINS["add"], 2, (47, 58)).to_problem()
    assert task.verify(p, "</think> answer 1 0 5 check 4 7 + 5 8 = 9 9 9 ok", complete=True).correct
    assert not task.verify(p, "</think> answer 9 9 9 check 4 7 + 5 8 = 1 0 5 ok", complete=True).correct


def test_direct_answer_on_a_hard_level_is_not_redundant_but_covers_nothing():
    inst = Instance(DOMAINS["add"], 4, (4712, 5893))
    a = analyze(inst, " ".join(inst.render(think=False)), complete=True)
    assert a.correct and a.redundant_tokens == 0 and a.coverage == 0.0 and not a.thinks


def test_splits_are_disjoint_and_cover_small_levels():
    task = GymTask(list(DOMAINS))
    ids = {split: {p.id for p in task.problems(split, 300)} for split in ("train", "validation", "test")}
    assert not ids["train"] & ids["validation"] and not ids["train"] & ids["test"] and not ids["validation"] & ids["test"]
    for split, found in ids.items():
        assert all(split_of(i) == split for i in found)
    level1 = [p for p in task.problems("train", 1000) if p.domain == "add" and p.difficulty == 1]
    assert 55 <= len(level1) <= 85        # ~70 % of the 100 single-digit sums


def test_generation_is_deterministic_per_seed():
    task = GymTask(list(DOMAINS))
    assert task.problems("test", 20, seed=3) == task.problems("test", 20, seed=3)
    assert task.problems("test", 20, seed=3) != task.problems("test", 20, seed=4)
    mix = TraceMixture()
    a = [mix.render(task.sample_instance(random.Random(9)), random.Random(1)) for _ in range(3)]
    b = [mix.render(task.sample_instance(random.Random(9)), random.Random(1)) for _ in range(3)]
    assert a == b


def test_data_stats_meet_the_testbed_requirements():
    from taut.workflows import data_stats

    stats = data_stats(RunConfig(), n=200)
    assert stats["domains"] >= 7 and len(stats["held_out"]) >= 2 and len(stats["levels"]) >= 4
    assert set(stats["held_out"]) == set(HELD_OUT_DOMAINS)
    assert stats["mixture_redundancy"] >= 0.40
    level1 = [c for c in stats["cells"] if c["difficulty"] == 1]
    assert all(c["redundancy"] > 0.5 for c in level1)    # thinking on level 1 is pure overhead

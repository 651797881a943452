"""The testbed: ground truth, the oracle and parser, splits, determinism, the mixture's redundancy."""

import random

import pytest

from taut.config import RunConfig
from taut.tasks.gym.domains import ALL_DOMAINS, DOMAINS, HELD_OUT_DOMAINS, LEVELS, OPT_IN_DOMAINS, TRAINING_DOMAINS
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


def test_p_direct_easy_sets_the_direct_share_on_easy_problems_only():
    from taut.config import MixtureConfig

    mix = TraceMixture.from_config(MixtureConfig(p_direct=0.2, p_direct_easy=0.9, rounds=[1.0]))
    rng = random.Random(0)
    shares = {}
    for easy in (True, False):
        task = GymTask(["add", "mul"], levels=(1,) if easy else (2, 3, 4))
        instances = [task.sample_instance(rng, "train") for _ in range(2000)]
        assert all(i.direct == easy for i in instances)
        shares[easy] = sum(mix.render(i, rng)[0] == "</think>" for i in instances) / len(instances)
    assert abs(shares[True] - 0.9) < 0.03 and abs(shares[False] - 0.2) < 0.03
    # unset, every level takes p_direct: the default mixture is unchanged
    assert TraceMixture.from_config(MixtureConfig()) == TraceMixture()


def test_data_stats_meet_the_testbed_requirements():
    from taut.workflows import data_stats

    stats = data_stats(RunConfig(), n=200)
    assert stats["domains"] >= 7 and len(stats["held_out"]) >= 2 and len(stats["levels"]) >= 4
    assert set(stats["held_out"]) == set(HELD_OUT_DOMAINS)
    assert stats["mixture_redundancy"] >= 0.40
    level1 = [c for c in stats["cells"] if c["difficulty"] == 1]
    assert all(c["redundancy"] > 0.5 for c in level1)    # thinking on level 1 is pure overhead


# ---- the opt-in search domain -------------------------------------------------------------


def _search_instances(n_per_cell=60, seed=0):
    rng = random.Random(seed)
    search = OPT_IN_DOMAINS["search"]
    for level in LEVELS:
        for _ in range(n_per_cell):
            yield Instance(search, level, search.sample(rng, level))


def test_search_is_opt_in_and_selectable_by_name():
    from taut.tasks import load_task
    from taut.tasks.gym.task import resolve_domains

    assert "search" not in DOMAINS and "search" in ALL_DOMAINS
    for group in ("gym", "gym:train", "gym:held-out", "gym:all"):
        assert "search" not in resolve_domains(group)
    assert resolve_domains("gym:search") == ["search"]
    assert resolve_domains("gym:train+search") == [*TRAINING_DOMAINS, "search"]
    assert [d.name for d in load_task("gym:search").domains] == ["search"]
    with pytest.raises(ValueError, match="unknown testbed domain 'serch'"):
        load_task("gym:serch")


def test_search_oracle_agrees_with_the_trace_on_every_generated_problem():
    search = OPT_IN_DOMAINS["search"]
    for inst in _search_instances(300):
        start, ops, b = inst.operands
        assert len(ops) == search.lengths[inst.level - 1]
        truth = search.solve(inst.operands)
        assert search.solutions(inst.operands) == [truth]          # exactly one digit completes the chain
        assert search.trace_answer(inst.operands) == [str(truth)] == search.answer_words(inst.operands)
        steps = inst.necessary_steps()
        tries = steps[len(ops):]
        assert inst.necessary_tries == len(tries) == truth + 1      # tries 0, 1, …, truth
        assert [t[2] for t in tries] == [str(d) for d in range(truth + 1)]
        assert [t[-2] == "ok" for t in tries] == [False] * truth + [True]
        assert search.guess_chance(inst.operands) == pytest.approx(0.1)
        assert search.guess_chance(inst.operands, knows_target=True) == pytest.approx(0.5)
        # no shortcut: neither the target nor the forward reading v × b is ever the answer
        v = int(tries[0][0])
        assert v in (3, 7) and b not in (0, 5) and truth not in (b, v * b % 10)


def test_search_known_values():
    search = OPT_IN_DOMAINS["search"]
    inst = Instance(search, 1, (3, (("+", 4),), 1))                  # 3 + 4 = 7; 7 × 3 ≡ 1
    assert inst.prompt() == "chain 3 + 4 * = 1 = <think>"
    assert search.solve(inst.operands) == 3 and inst.necessary_tries == 4
    assert inst.necessary_steps() == [s.split() for s in ("3 + 4 = 7 ;", "7 * 0 = 0 ;", "7 * 1 = 7 ;", "7 * 2 = 4 ;", "7 * 3 = 1 ok ;")]
    assert inst.round_words() == "check 3 + 4 * 3 = 1 ok".split()
    assert Instance(search, 1, (4, (("+", 3),), 7)).necessary_tries == 2    # 7 × 1 ≡ 7: the second candidate checks
    assert Instance(search, 1, (4, (("+", 3),), 3)).necessary_tries == 10   # 7 × 9 ≡ 3: the last


def test_search_tries_vary_inside_every_level_and_steps_grow_with_level():
    means = []
    for level in LEVELS:
        insts = [i for i in _search_instances(400, seed=level) if i.level == level]
        tries = {i.necessary_tries for i in insts}
        assert tries == {2, 3, 4, 5, 7, 8, 9, 10}, (level, tries)     # d ∈ {1, …, 9} \ {5}
        means.append(sum(len(i.necessary_steps()) for i in insts) / len(insts))
    assert means == sorted(means) and means[-1] > means[0] + 2
    assert all(m > 5 for m in means)                                 # steps are necessary on level 1 too


def test_search_words_are_in_the_vocabulary_and_traces_fit_the_rollout_cap():
    tok = build_tokenizer()
    assert len(VOCAB) == 37                                          # the shipped model's embedding size
    for inst in _search_instances(30):
        for words in (inst.prompt(budget=64).split(), inst.render(think=True, rounds=2)):
            assert set(words) <= set(VOCAB)
            assert tok.convert_ids_to_tokens(tok(" ".join(words)).input_ids)[1:] == words
        assert inst.necessary_length() <= 90                         # well inside the 128-token cap


def test_search_oracle_counts_guesses_and_redundancy():
    search = OPT_IN_DOMAINS["search"]
    inst = Instance(search, 2, (3, (("+", 4), ("*", 1)), 1))         # 7 × 3 ≡ 1: four tries
    minimal = analyze(inst, " ".join(inst.minimal_response()), complete=True)
    assert minimal.correct and minimal.redundancy == 0 and minimal.coverage == 1.0
    guess = analyze(inst, "</think> answer 3", complete=True)      # a lucky direct guess is graded correct
    assert guess.correct and not guess.thinks and guess.coverage == 0.0 and guess.redundant_tokens == 0
    assert not analyze(inst, "</think> answer 4", complete=True).correct
    # an extra try after the success and a round are redundant, exactly
    words = inst.render(think=True, rounds=1)
    extra = ["7", "*", "4", "=", "8", ";"]
    cut = words.index("</think>")
    padded = analyze(inst, " ".join(words[:cut] + extra + words[cut:]), complete=True)
    assert padded.correct and padded.redundant_tokens == len(extra) + len(inst.round_words())
    # stopping the search early covers only the tries written
    early = analyze(inst, "3 + 4 = 7 ; 7 * 1 = 7 ; 7 * 0 = 0 ; </think> answer 0", complete=True)
    assert not early.correct and early.coverage == pytest.approx(3 / 6)
    task = GymTask(["search"])
    p = inst.to_problem()
    assert task.verify(p, "</think> answer 3 check 3 + 4 * 1 * 3 = 1 ok", complete=True).correct


def test_search_splits_are_disjoint_and_every_level_has_test_problems():
    task = GymTask(["search"])
    ids = {split: {p.id for p in task.problems(split, 100)} for split in ("train", "validation", "test")}
    assert not ids["train"] & ids["test"] and not ids["validation"] & ids["test"] and not ids["train"] & ids["validation"]
    test = task.problems("test", 100)
    assert all(sum(p.difficulty == level for p in test) >= 50 for level in LEVELS)


def test_domains_without_a_search_have_no_tries():
    assert all(Instance(d, 2, d.sample(random.Random(0), 2)).necessary_tries is None for d in DOMAINS.values())

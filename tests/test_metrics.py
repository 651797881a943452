"""Evaluation metrics on hand-made values: pass@k, percentiles, budget accuracy, redundancy."""

import math
from itertools import combinations

import pytest

from taut.config import EvalConfig
from taut.evaluate import grade, report
from taut.metrics import histogram, pass_at_k, percentile
from taut.tasks.gym.domains import DOMAINS
from taut.tasks.gym.task import GymTask, Instance


def test_pass_at_k_is_the_unbiased_estimator():
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 4, 2) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)               # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - 1 / 10)        # 1 - C(3,3)/C(5,3)
    # against enumeration: the share of k-subsets holding at least one correct sample
    samples = [1, 0, 0, 1, 0, 0, 0]
    for k in range(1, 8):
        subsets = list(combinations(samples, k))
        assert pass_at_k(7, 2, k) == pytest.approx(sum(any(s) for s in subsets) / len(subsets))
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_percentiles_interpolate_like_numpy():
    values = [10, 20, 30, 40]
    assert percentile(values, 50) == 25.0
    assert percentile(values, 90) == pytest.approx(37.0)      # position 2.7 between 30 and 40
    assert percentile(values, 0) == 10 and percentile(values, 100) == 40
    assert percentile([7], 90) == 7
    assert math.isnan(percentile([], 50))


def test_histogram_bins():
    assert histogram([0, 7, 8, 15, 16, 300], [0, 8, 16, 32]) == [2, 2, 2]    # the last bin takes the overflow


class WordPolicy:
    """Just enough of a Policy for `grade`: one token per word; `<eos>` is dropped when decoding."""

    def decode(self, ids):
        return " ".join(self.words[i] for i in ids if self.words[i] != "<eos>")

    def count_tokens(self, text):
        return len(text.split())


def _policy_for(words):
    policy = WordPolicy()
    policy.words = words
    return policy


def test_budget_accuracy_counts_only_answers_complete_within_the_budget():
    task = GymTask(["add"])
    problem = Instance(DOMAINS["add"], 2, (47, 58)).to_problem()
    words = "7 + 8 + 0 = 1 5 write 5 carry 1 ; 4 + 5 + 1 = 1 0 write 0 carry 1 ; </think> answer 1 0 5 check".split()
    policy = _policy_for(words)
    ids = list(range(len(words)))                      # response tokens: the words in order, then cut
    answer_end = words.index("answer") + 4              # the answer's digits end here (exclusive)
    budgets = [answer_end - 1, answer_end, answer_end + 1, 100]
    sample = grade(task, problem, policy, ids, truncated=False, budgets=budgets)
    # cut inside the digits: no answer; cut right after the last digit: not known to be complete;
    # one more token (a non-digit word) completes it; the whole response is correct
    assert sample.budget_correct == [False, False, True, True]
    assert sample.correct and sample.length == len(words) and not sample.truncated_but_right


def test_a_response_cut_at_the_cap_scores_under_no_budget_it_reaches():
    task = GymTask(["add"])
    problem = Instance(DOMAINS["add"], 2, (47, 58)).to_problem()
    words = "7 + 8 + 0 = 1 5 write 5 carry 1 ; 4 + 5 + 1 = 1 0 write 0 carry 1 ; </think> answer 1 0 5 check".split()
    policy = _policy_for(words)
    ids = list(range(len(words)))
    sample = grade(task, problem, policy, ids, truncated=True, budgets=[len(words), 100])
    # the same text, cut at the cap: never correct, at any budget it fits in; the count of right-before-the-cut
    assert sample.budget_correct == [False, False]
    assert not sample.correct and sample.truncated_but_right


def test_report_aggregates_redundancy_accuracy_and_pass_at_k():
    task = GymTask(["add"])
    easy = Instance(DOMAINS["add"], 1, (3, 4)).to_problem()
    hard = Instance(DOMAINS["add"], 2, (47, 58)).to_problem()
    minimal_easy = easy.data.minimal_response()                 # </think> answer 7
    thinking_easy = easy.data.render(think=True)                # 12 redundant tokens on level 1
    wrong_hard = "</think> answer 9 9".split()
    samples = []
    for problem, words in ((easy, minimal_easy), (easy, thinking_easy), (hard, wrong_hard), (hard, hard.data.minimal_response())):
        vocab = list(dict.fromkeys([*words, "<eos>"]))
        policy = _policy_for(vocab)
        ids = [vocab.index(w) for w in [*words, "<eos>"]]          # a finished response ends with <eos>
        samples.append(grade(task, problem, policy, ids, truncated=False, budgets=[8]))
    result = report(samples, EvalConfig(budgets=[8]), {"checkpoint": "x"})
    overall = result["overall"]
    assert overall["accuracy"] == 0.75
    assert overall["pass_at_k"] == {"1": 0.75, "2": 1.0}
    lengths = [len(minimal_easy) + 1, len(thinking_easy) + 1, len(wrong_hard) + 1, len(hard.data.minimal_response()) + 1]
    assert overall["tokens_mean"] == pytest.approx(sum(lengths) / 4)
    redundant = len(thinking_easy) + 1 - easy.data.necessary_length()
    assert overall["redundancy"] == pytest.approx(redundant / sum(lengths))
    assert result["by_level"]["1"]["accuracy"] == 1.0 and result["by_level"]["2"]["accuracy"] == 0.5
    assert overall["budget_accuracy"]["8"] == 0.25     # two responses fit in 8 tokens, one of them correct
    assert result["by_level"]["2"]["coverage"] == pytest.approx(0.5)   # the wrong direct answer covers no step


# --- efficiency measures, on hand-made outcomes: problem → [(length, correct), …] -----------------


def test_tokens_per_correct_counts_every_token_spent():
    from taut.metrics import tokens_per_correct

    assert tokens_per_correct({"a": [(10, True), (30, False)], "b": [(20, True), (40, False)]}) == 100 / 2
    assert math.isnan(tokens_per_correct({"a": [(10, False)]}))


def test_overthinking_is_mean_spend_over_the_shortest_correct_answer():
    from taut.metrics import overthinking, shortest_correct

    mine = {"a": [(10, True), (30, False)],      # mean 20, shortest correct 10 → 10
            "b": [(20, True), (40, True)],       # mean 30, shortest 20 → 10
            "c": [(50, False)]}                  # no correct answer: not counted (local)
    assert overthinking(mine) == 10
    theirs = {"a": [(4, True)], "c": [(25, True)]}
    floor = shortest_correct(mine, theirs)
    assert floor == {"a": 4, "b": 20, "c": 25}
    assert overthinking(mine, floor) == pytest.approx(((20 - 4) + (30 - 20) + (50 - 25)) / 3)   # global: c counts
    assert overthinking({"a": [(7, True)]}) == 0                       # one sample: 0 by construction
    assert math.isnan(overthinking({"c": [(50, False)]}))


def test_underthinking_is_accuracy_lost_on_what_the_start_solved():
    from taut.metrics import underthinking

    start = {"a": [(30, True), (30, True)], "b": [(30, True), (30, False)], "c": [(30, False), (30, False)],
             "d": [(30, True)]}
    now = {"a": [(5, False), (5, True)], "b": [(5, True), (5, True)], "c": [(5, True), (5, True)]}
    # solved by the start (≥ 1/2): a (1 → 1/2: lost 1/2) and b (1/2 → 1: gained 1/2); d not evaluated now
    assert underthinking(start, now) == (0.0, 2)
    assert underthinking(start, {"a": [(5, False)]}) == (1.0, 1)
    value, counted = underthinking({"c": [(1, False)]}, now)
    assert math.isnan(value) and counted == 0


def test_the_evaluation_reports_tokens_per_correct_and_local_overthinking():
    task = GymTask(["add"])
    problem = Instance(DOMAINS["add"], 1, (3, 4)).to_problem()
    right, long_right = problem.data.minimal_response(), problem.data.render(think=True)
    samples = []
    for words in (right, long_right, "</think> answer 9".split()):
        vocab = list(dict.fromkeys([*words, "<eos>"]))
        samples.append(grade(task, problem, _policy_for(vocab), [vocab.index(w) for w in [*words, "<eos>"]],
                             truncated=False, budgets=[]))
    lengths = [s.length for s in samples]
    overall = report(samples, EvalConfig(budgets=[]), {"checkpoint": "x"})["overall"]
    assert overall["tokens_per_correct"] == pytest.approx(sum(lengths) / 2)
    assert overall["overthinking_tokens"] == pytest.approx(sum(lengths) / 3 - lengths[0])

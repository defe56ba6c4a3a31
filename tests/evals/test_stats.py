"""Wilson and bootstrap intervals; the length-controlled win rate."""

from __future__ import annotations

import csv
import math
from collections import defaultdict
from statistics import median

import pytest

from evals.recorded import load_alpaca_eval_lengths, load_alpaca_eval_preferences
from evals.stats import length_controlled_win_rate, mean_interval, wilson_interval


def test_wilson_interval_hand_checked():
    # 42/50, z = 1.96: p = 0.84, z^2 = 3.8416, denominator = 1 + 3.8416/50 = 1.076832,
    # centre = (0.84 + 0.038416) / 1.076832 = 0.815741, half = 1.96 * sqrt(0.002688 + 0.00038416) / 1.076832 = 0.100886
    lo, hi = wilson_interval(42, 50)
    assert lo == pytest.approx(0.714855, abs=1e-6)
    assert hi == pytest.approx(0.916627, abs=1e-6)
    # 0 of 10: the upper bound z^2/(n + z^2) = 3.8416/13.8416 = 0.277540
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.277540), abs=1e-6)


def test_wilson_interval_is_symmetric_and_narrows_with_n():
    lo, hi = wilson_interval(3, 20)
    assert wilson_interval(17, 20) == pytest.approx((1 - hi, 1 - lo))
    assert wilson_interval(300, 2000)[1] - wilson_interval(300, 2000)[0] < hi - lo
    assert all(wilson_interval(n, n)[1] == 1.0 and wilson_interval(0, n)[0] == 0.0 for n in range(1, 50))  # p inside
    for bad in [(1, 0), (-1, 5), (6, 5)]:
        with pytest.raises(ValueError):
            wilson_interval(*bad)


def test_mean_interval_uses_wilson_for_binary_scores_and_a_seeded_bootstrap_otherwise():
    assert mean_interval([1, 0, 1, 1]) == pytest.approx((0.75, *wilson_interval(3, 4)))
    values = [0.1, 0.9, 0.5, 0.7, 0.3, 0.6, 0.8, 0.2]
    mean, lo, hi = mean_interval(values)
    assert mean == pytest.approx(sum(values) / len(values))
    assert 0.1 <= lo < mean < hi <= 0.9
    # a bootstrap 95% interval of a mean is close to mean +- 1.96 * sd / sqrt(n)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    assert hi - lo == pytest.approx(2 * 1.96 * sd / math.sqrt(len(values)), rel=0.25)
    assert mean_interval(values) == (mean, lo, hi)  # seeded
    assert mean_interval([0.4, 0.4, 0.4]) == pytest.approx((0.4, 0.4, 0.4))
    with pytest.raises(ValueError):
        mean_interval([])


def test_length_controlled_win_rate_equals_the_win_rate_when_lengths_are_equal():
    prefs = [1.0, 0.0, 0.5, 1.0, 0.25, 0.0, 1.0]
    lengths = [100] * len(prefs)
    assert length_controlled_win_rate(prefs, lengths, lengths) == pytest.approx(sum(prefs) / len(prefs), abs=1e-9)
    assert length_controlled_win_rate([1.0, 1.0], [5, 9], [1, 1]) == 1.0


def test_length_controlled_win_rate_discounts_wins_bought_with_length():
    # the model wins mostly when it is longer than the baseline, and loses when shorter
    diffs = [-300, -200, -100, 100, 200, 300] * 10
    prefs = [0.0, 0.0, 0.5, 1.0, 1.0, 1.0] * 10
    baseline = [1000] * len(diffs)
    longer = [1000 + d + 400 for d in diffs]  # longer on average: raw win rate flatters the model
    shorter = [1000 + d - 400 for d in diffs]
    raw = sum(prefs) / len(prefs)
    assert length_controlled_win_rate(prefs, longer, baseline) < raw
    assert length_controlled_win_rate(prefs, shorter, baseline) > raw
    with pytest.raises(ValueError):
        length_controlled_win_rate([1.5], [1], [1])
    with pytest.raises(ValueError):
        length_controlled_win_rate([0.5, 0.5], [1], [1])


def test_length_controlled_win_rate_tracks_the_alpaca_eval_2_leaderboard(data_dir):
    """Our one-model fit (no instruction-difficulty term) against AlpacaEval 2's published LC win rates."""
    table = load_alpaca_eval_preferences(data_dir, "gpt4_1106_preview")
    lengths = load_alpaca_eval_lengths(data_dir, "gpt4_1106_preview")
    path = data_dir / "alpaca_eval" / "leaderboards" / "data_AlpacaEval_2" / "weighted_alpaca_eval_gpt4_turbo_leaderboard.csv"
    with open(path, encoding="utf-8", newline="") as f:
        published = {r[""]: float(r["length_controlled_winrate"]) for r in csv.DictReader(f)}
    rows = defaultdict(list)
    for o in table:
        rows[o.model].append(o)
    gaps = []
    for model, outcomes in rows.items():
        if model in published:
            lc = length_controlled_win_rate([o.score for o in outcomes], [lengths[(o.prompt_id, model)][0] for o in outcomes],
                                            [lengths[(o.prompt_id, model)][1] for o in outcomes])
            gaps.append(abs(100 * lc - published[model]))
    assert len(gaps) >= 50
    assert median(gaps) < 1.5 and max(gaps) < 6.0

"""Paired intervals of held-out changes: one run over its problems, settings over problems and
seeds; constructed outcomes whose answer is known by hand, and runs that kept no outcomes."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from fixtures_runs import small_run

from labkit.analysis.heldout import group_heldout, heldout_gains, heldout_verdict
from labkit.analysis.paired import RunChange, difference, paired_change, setting_change
from labkit.analysis.runframe import load_runs
from labkit.run.outcomes import outcome_row, pack_ids, read_outcomes, unpack_ids


def outcomes(n, right):
    """n problems, the ones in `right` (a set of indices) answered right."""
    return [i in right for i in range(n)]


def test_a_constructed_pair_gives_the_textbook_paired_interval():
    """200 problems: 60 right before; 50 gained and 10 lost, so 100 right after. The change
    is +0.20; per problem it is +1 (50), -1 (10) or 0 (140), whose mean has a standard error
    of sqrt((60/200 - 0.2^2) / 200) = 0.0361: a 95% interval of about +0.129 to +0.271. Two
    independent errors would give +0.106 to +0.294."""
    before = outcomes(200, set(range(60)))
    after = outcomes(200, set(range(10, 60)) | set(range(60, 110)))
    assert sum(before) == 60 and sum(after) == 100
    got = paired_change(before, after)
    se = math.sqrt((60 / 200 - 0.2 ** 2) / 200)
    assert got.estimate == pytest.approx(0.20)
    assert got.low == pytest.approx(0.20 - 1.96 * se, abs=0.01)
    assert got.high == pytest.approx(0.20 + 1.96 * se, abs=0.01)
    unpaired = 1.96 * math.sqrt(0.3 * 0.7 / 200 + 0.5 * 0.5 / 200)
    assert got.high - got.low < 0.8 * 2 * unpaired  # pairing is what makes it tight
    assert got.excludes_zero and got.problems == 200 and got.paired
    assert got.text() == f"+0.200 (95% interval {got.low:+.3f} to {got.high:+.3f})"


def test_the_same_answers_before_and_after_are_no_change_and_the_interval_is_the_same_each_time():
    same = outcomes(50, {1, 2, 3})
    got = paired_change(same, same)
    assert (got.estimate, got.low, got.high) == (0.0, 0.0, 0.0) and not got.excludes_zero
    gained_one = outcomes(50, {1, 2, 3, 4})
    assert paired_change(same, gained_one) == paired_change(same, gained_one)  # a fixed seed
    assert paired_change(same, gained_one).low == 0.0  # one problem of 50 is no change
    with pytest.raises(ValueError, match="same problems"):
        paired_change(same, same[:-1])


def run_change(d, ids=None):
    d = np.asarray(d, dtype=np.int8)
    return RunChange(float(d.mean()), ids or tuple(f"t/{i}" for i in range(len(d))), d, problems=len(d))


def test_settings_are_compared_over_the_same_problems_and_their_seeds():
    """Two settings, three seeds each, on 400 shared problems: every seed of A gains 80
    problems (+0.20), every seed of B 40 (+0.10), the gained problems overlapping. The
    difference is +0.10 and clearly above zero; with seeds that disagree (B's gains +0.00,
    +0.10, +0.20) the same mean difference gets a wider interval, spanning what seeds do."""
    n = 400
    rng = np.random.default_rng(5)

    def seed_with(gained):
        d = np.zeros(n, dtype=np.int8)
        d[rng.choice(n, size=gained, replace=False)] = 1
        return run_change(d)

    a = [seed_with(80) for _ in range(3)]
    b = [seed_with(40) for _ in range(3)]
    got = difference(a, b)
    assert got.estimate == pytest.approx(0.10) and got.low > 0.05 and got.high < 0.15
    assert got.seeds == 3 and got.paired
    spread = [seed_with(0), seed_with(40), seed_with(80)]
    wide = difference(a, spread)
    assert wide.estimate == pytest.approx(0.10)
    assert (wide.high - wide.low) > 2 * (got.high - got.low)
    one = setting_change(a[:1])
    assert one.seeds == 1 and one.estimate == pytest.approx(0.20)


def test_only_the_problems_every_run_answered_are_paired():
    a = run_change([1, 0, 1, 0], ("t/0", "t/1", "t/2", "t/3"))
    b = run_change([0, 0, 0], ("t/1", "t/2", "t/3"))
    got = difference([a], [b])
    assert got.problems == 3 and got.estimate == pytest.approx(1 / 3)  # t/1..t/3 of a: 0, 1, 0


def test_ids_are_packed_as_a_range_when_they_are_one():
    ids = [f"gsm8k/test/{i}" for i in range(1319)]
    assert pack_ids(ids) == "gsm8k/test/0-1318" and unpack_ids("gsm8k/test/0-1318") == tuple(ids)
    shuffled = ["gsm8k/test/2", "gsm8k/test/1"]
    assert pack_ids(shuffled) == shuffled and unpack_ids(shuffled) == tuple(shuffled)
    with pytest.raises(ValueError):
        unpack_ids("gsm8k/test/5-2")


def kept_run(tmp_path, name, seed, before, after, group_size=8, n=None):
    """A run folder whose two evaluations kept each problem's outcome."""
    run = small_run(tmp_path, name, seed=seed, group_size=group_size)
    n = n or len(before)
    ids = [f"synthetic/test/{i}" for i in range(n)]
    rows, lines = [], []
    for steps, right in ((0, before), (24, after)):
        acc = sum(right) / n
        rows.append({"eval/trained_steps": steps, "eval/synthetic_test": acc,
                     "eval/synthetic_test_n": n, "perf/eval_time": 1.0})
        lines.append(outcome_row(steps, "eval/synthetic_test", ids, right, [12] * n))
    (run / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "eval_outcomes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    return run


def test_a_run_s_change_is_read_paired_from_its_outcomes(tmp_path):
    before = outcomes(200, set(range(60)))
    after = outcomes(200, set(range(10, 110)))
    run = kept_run(tmp_path, "a", 1, before, after)
    assert sorted(read_outcomes(run)) == [0, 24]
    (row,) = heldout_gains(load_runs(tmp_path)).to_dict("records")
    want = paired_change(before, after)
    assert row["paired"] and row["change"] == pytest.approx(0.20)
    assert (row["change_low"], row["change_high"]) == pytest.approx((want.low, want.high))


def test_a_run_without_outcomes_reads_unpaired_and_says_so(tmp_path):
    """A run evaluated before the outcomes were kept: its interval comes from the two
    evaluations' binomial errors (independent), and the verdict says it is unpaired."""
    run = small_run(tmp_path, "old", seed=1)
    rows = [{"eval/trained_steps": 0, "eval/gsm8k_test": 0.25, "eval/gsm8k_test_n": 1319},
            {"eval/trained_steps": 24, "eval/gsm8k_test": 0.30, "eval/gsm8k_test_n": 1319}]
    (run / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (row,) = heldout_gains(load_runs(tmp_path)).to_dict("records")
    se = math.sqrt(0.25 * 0.75 / 1319 + 0.3 * 0.7 / 1319)
    assert not row["paired"]
    assert row["change_low"] == pytest.approx(0.05 - 1.96 * se, abs=0.003)
    assert row["change_high"] == pytest.approx(0.05 + 1.96 * se, abs=0.003)
    table = group_heldout(load_runs(tmp_path), 8, by="group_size")
    text = heldout_verdict(table, 8, by="group_size")
    assert "Unpaired" in text and "one seed a setting" in text


def test_inside_one_range_is_decided_from_the_intervals(tmp_path):
    """Three seeds at 8 answers gain ~+0.10 each; three at 16 gain ~+0.20: the difference's
    interval is above zero, so not inside one range. Three at 4 that gain as 8 does are inside."""
    n, rng = 300, np.random.default_rng(3)
    before = outcomes(n, set(range(90)))

    def after_gaining(k):
        gained = set(rng.choice(range(90, n), size=k, replace=False).tolist())
        return [b or i in gained for i, b in enumerate(before)]

    for seed in (1, 2, 3):
        kept_run(tmp_path, f"n8-s{seed}", seed, before, after_gaining(30), group_size=8)
        kept_run(tmp_path, f"n16-s{seed}", seed, before, after_gaining(60), group_size=16)
    runs = load_runs(tmp_path)
    table = group_heldout(runs, 8, by="group_size").set_index("group_size")
    assert table.loc[16, "vs_reference"] == pytest.approx(0.10) and table.loc[16, "vs_low"] > 0
    assert math.isnan(table.loc[8, "vs_reference"]) and table.paired.all()
    text = heldout_verdict(group_heldout(runs, 8, by="group_size"), 8, by="group_size")
    assert text.startswith("Held-out: training moved it")
    assert "Not inside one range: against 8 answers, the change differs for 16 answers +0.100" in text
    for seed in (1, 2, 3):
        kept_run(tmp_path, f"n4-s{seed}", seed, before, after_gaining(30), group_size=4)
    only = load_runs(tmp_path)
    only = only[only.group_size != 16]
    text = heldout_verdict(group_heldout(only, 8, by="group_size"), 8, by="group_size")
    assert "Inside one range: against 8 answers" in text and "4 answers" in text


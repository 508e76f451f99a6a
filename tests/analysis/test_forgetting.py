"""Forgetting by route change (stablemoe_jax/analysis/forgetting.py), counted by hand on hand-made sequences of
recalls and routes, each rule on both sides of its boundary."""
from __future__ import annotations

import numpy as np
import pytest

from stablemoe_jax.analysis import forgetting
from stablemoe_jax.analysis.cohesion import load_balance
from stablemoe_jax.analysis.facts_probe import recall_from_logits


def test_counts_by_hand():
  # 4 facts at 4 points. Columns: facts; rows: points.
  recalled = np.array([[1, 1, 0, 1],
                       [0, 1, 1, 1],
                       [1, 0, 1, 0],
                       [1, 1, 1, 1]], bool)
  routes = np.array([[0, 5, 2, 3],
                     [1, 5, 2, 3],   # fact 0 changed (and forgot); facts 1-3 kept
                     [1, 6, 2, 4],   # fact 1 changed (and forgot), fact 3 changed (and forgot), fact 2 kept
                     [0, 6, 2, 4]], int)  # fact 0 changes back: changed, but it was not recalled at point 1
  counts = forgetting.count_forgetting(recalled, routes)
  # interval 0->1 at risk: f0 (changed, forgot), f1 (kept), f3 (kept); interval 1->2: f1 (changed, forgot),
  # f2 (kept), f3 (changed, forgot); interval 2->3: f0 (changed, kept its recall), f2 (kept)
  assert counts == forgetting.ForgettingCounts(changed_at_risk=4, changed_forgotten=3, kept_at_risk=4,
                                               kept_forgotten=0)
  assert counts.p_forget_changed == 0.75 and counts.p_forget_kept == 0.0 and counts.p_forget == 3 / 8


def test_a_fact_recalled_at_the_last_point_only_is_never_at_risk():
  recalled = np.array([[0], [0], [1]], bool)
  routes = np.array([[0], [1], [2]])
  counts = forgetting.count_forgetting(recalled, routes)
  assert counts == forgetting.ForgettingCounts(0, 0, 0, 0)
  assert counts.p_forget_changed is None and counts.p_forget_kept is None and counts.p_forget is None


def test_a_route_that_changes_and_changes_back_counts_as_changed_twice():
  recalled = np.array([[1], [1], [0]], bool)
  routes = np.array([[3], [4], [3]])
  counts = forgetting.count_forgetting(recalled, routes)
  assert (counts.changed_at_risk, counts.changed_forgotten, counts.kept_at_risk) == (2, 1, 0)


def test_a_fact_recalled_throughout_is_at_risk_each_interval_and_never_forgotten():
  counts = forgetting.count_forgetting(np.ones((5, 1), bool), np.zeros((5, 1), int))
  assert counts == forgetting.ForgettingCounts(0, 0, 4, 0)


def test_shapes_must_agree():
  with pytest.raises(ValueError, match="one shape"):
    forgetting.count_forgetting(np.ones((3, 2), bool), np.zeros((3, 3), int))


def test_route_ids_ignore_choice_order_and_read_every_layer():
  # [K=2 points, L=2 layers, N=3 facts, k=2]
  choices = np.array([[[[0, 1], [2, 3], [0, 1]], [[4, 5], [4, 5], [4, 5]]],
                      [[[1, 0], [2, 3], [0, 1]], [[4, 5], [4, 5], [5, 6]]]])
  ids = forgetting.route_ids(choices)
  assert ids[0, 0] == ids[1, 0]  # {0, 1} both times, layer 2 the same
  assert ids[0, 1] == ids[1, 1]
  assert ids[0, 2] != ids[1, 2]  # layer 2 moved {4, 5} -> {5, 6}
  assert ids[0, 0] != ids[0, 1]  # different sets in layer 1
  assert np.array_equal(forgetting.route_ids(np.zeros((3, 0, 4, 1), int)), np.zeros((3, 4)))  # dense: no routes


def test_route_changing_after_each_fraction_on_both_sides():
  steps = np.array([100, 200, 500, 1000])
  # fact 0 last differs from its final route at step 200 (20% of 1000: not after it); fact 1 at 500 (after 20%,
  # not after 50%); fact 2 never; fact 3 at step 500... and fact 4 only at 100
  routes = np.array([[0, 0, 0, 0, 9],
                     [9, 0, 0, 0, 0],
                     [0, 9, 0, 9, 0],
                     [0, 0, 0, 0, 0]])
  shares = forgetting.route_changing_after(steps, routes, total_steps=1000)
  assert shares == {"after_20": 2 / 5, "after_50": 0.0, "after_80": 0.0}
  assert forgetting.route_changing_after(steps, routes, total_steps=999)["after_50"] == 2 / 5  # 500 > 499.5


def test_recall_at_reads_the_first_point_at_or_after_each_fraction():
  steps = np.array([100, 200, 500, 800, 1000])
  recalled = np.array([[0, 0], [1, 0], [1, 1], [0, 1], [1, 1]], bool)
  assert forgetting.recall_at(steps, recalled) == {"at_20": 0.5, "at_50": 1.0, "at_80": 0.5}
  # a run stopped at step 200 of 1,000: its point at 20% exists (200 >= 200), none at 50% or 80%
  assert forgetting.recall_at(steps[:2], recalled[:2], total_steps=1000) == {"at_20": 0.5}
  assert forgetting.recall_at(steps[:1], recalled[:1], total_steps=1000) == {}


def test_recall_needs_every_value_token_and_reads_only_value_positions():
  # flat positions 0..7; two lines whose values sit at [1, 2] and [5, 6]
  targets = np.array([9, 3, 4, 9, 9, 7, 8, 9])
  argmax = np.array([0, 3, 4, 0, 0, 7, 1, 0])  # line 0 right on both, line 1 wrong on its second value token
  positions = np.array([[1, 2], [5, 6]])
  assert recall_from_logits(argmax, targets, positions).tolist() == [True, False]
  argmax[6] = 8
  assert recall_from_logits(argmax, targets, positions).tolist() == [True, True]


def test_load_balance_by_hand():
  assert load_balance(np.array([5, 5, 5, 5])) == pytest.approx(1.0)
  assert load_balance(np.array([7, 0, 0, 0])) == 0.0
  assert load_balance(np.array([1, 1, 0, 0])) == pytest.approx(np.log(2) / np.log(4))

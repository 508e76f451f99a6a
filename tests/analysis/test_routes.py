"""analysis/routes.py's set comparison of a token's choices (``choice_sets_differ``, which the declined-token and
bias-share analyses both use): order ignored, any one choice differing is enough, top-1 as k = 1."""
from __future__ import annotations

import numpy as np

from stablemoe_jax.analysis.routes import choice_sets_differ, sorted_layers


def test_top1_choices_differ_where_the_experts_do():
  np.testing.assert_array_equal(choice_sets_differ(np.array([0, 1, 2, 3]), np.array([0, 2, 2, 1])),
                                [False, True, False, True])


def test_top1_as_a_column_equals_top1_flat():
  a, b = np.array([3, 1, 0]), np.array([3, 2, 0])
  for x, y in ((a, b), (a[:, None], b), (a, b[:, None]), (a[:, None], b[:, None])):
    np.testing.assert_array_equal(choice_sets_differ(x, y), np.array([False, True, False]), strict=True)


def test_top_k_sets_ignore_order_and_differ_in_any_one_choice():
  a = np.array([[0, 1, 2], [0, 1, 2], [0, 1, 2], [0, 1, 2], [3, 1, 0]])
  b = np.array([[2, 0, 1],   # the same set reordered
                [0, 1, 3],   # one choice of three differs (sorted: the last position only)
                [3, 1, 2],   # one differs (sorted: every position differs)
                [3, 4, 5],   # all three differ
                [0, 1, 3]])  # the same set, sorted
  np.testing.assert_array_equal(choice_sets_differ(a, b), [False, True, True, True, False])
  np.testing.assert_array_equal(choice_sets_differ(b, a), choice_sets_differ(a, b))  # symmetric


def test_the_inputs_are_not_sorted_in_place():
  a, b = np.array([[2, 0], [1, 3]]), np.array([[0, 2], [3, 0]])
  choice_sets_differ(a, b)
  np.testing.assert_array_equal(a, [[2, 0], [1, 3]])
  np.testing.assert_array_equal(b, [[0, 2], [3, 0]])


def test_layers_in_model_order():
  assert sorted_layers({"moe_10": 0, "moe_2": 0, "decoder_moe_1": 0}) == ["decoder_moe_1", "moe_2", "moe_10"]

"""Accumulator.segment_sum (the exact sums behind Sliced) against float64 / int64 numpy."""

import numpy as np

from padded_eval.exact.accumulate import ExactCount, ExactSum


def test_exact_sum_segments_equal_float64_and_drop_out_of_range_ids():
  rng = np.random.default_rng(0)
  values = rng.normal(size=(301, 3)).astype(np.float32) * np.float32(10.0) ** rng.integers(
    -6, 6, (301, 1)
  )
  ids = rng.integers(-2, 9, 301)  # 7 segments; -2, -1, 7 and 8 are dropped; segment 6 rare
  summed = ExactSum.of(values).segment_sum(ids, 7).to_numpy()
  expected = np.zeros((7, 3))
  for s in range(7):
    expected[s] = values[ids == s].astype(np.float64).sum(0)
  # The combination of aggregate (a psum's): high parts exact, low parts summed in float32, so
  # within a float32 plain sum's bound of the largest part; equal to aggregate per segment.
  scale = np.abs(values.astype(np.float64)).max()
  np.testing.assert_allclose(summed, expected, rtol=0, atol=scale * len(values) * 2**-24)
  for s in range(7):
    alone = ExactSum.of(values[ids == s]).aggregate().to_numpy()
    np.testing.assert_allclose(summed[s], alone, rtol=1e-7)
  empty = ExactSum.of(values[:0]).segment_sum(ids[:0], 3)
  np.testing.assert_array_equal(empty.to_numpy(), np.zeros((3, 3)))


def test_exact_count_segments_are_exact_beyond_int32():
  rng = np.random.default_rng(1)
  counts = rng.integers(0, 2**31 - 1, 40_000)
  ids = rng.integers(0, 5, 40_000)
  summed = ExactCount.of(counts).segment_sum(ids, 5).to_numpy()
  np.testing.assert_array_equal(
    summed, np.bincount(ids, None, 5) * 0 + [counts[ids == s].sum() for s in range(5)]
  )

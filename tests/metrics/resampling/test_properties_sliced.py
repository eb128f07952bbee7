"""Property suite, Sliced: per-slice values equal numpy float64 on each slice's rows, for any
batching, merge tree and device count (``metric_checks.evaluate_randomly``), either method.

Tolerances as in test_properties_regression.py: a slice's mean is a float32 sum of at most 16
terms per batch (``16 EPS * mean|x|`` absolute, ``20 EPS`` relative); accuracy is a ratio of
exact integer counts (one rounding).
"""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from metric_checks import assert_close, evaluate_randomly

import padded_eval as pe

EPS = 2.0**-24


@given(
  seed=st.integers(0, 2**32 - 1),
  rows=st.integers(1, 40),
  num_slices=st.integers(1, 6),
  method=st.sampled_from(["segments", "vmap"]),
)
def test_sliced_accuracy_and_mean_equal_numpy_per_slice(seed, rows, num_slices, method):
  rng = np.random.default_rng(seed)
  fields = {
    "preds": rng.normal(size=(rows, 3)).astype(np.float32),
    "target": rng.integers(0, 3, rows).astype(np.int32),
    "values": rng.normal(5.0, 2.0, rows).astype(np.float32),
    "slice": rng.integers(0, num_slices, rows).astype(np.int32),
  }
  members = pe.Metrics([pe.metrics.Accuracy(), pe.metrics.Mean()])
  metric = pe.metrics.Sliced(members, num_slices, method=method)
  got = evaluate_randomly(metric, fields, rng)
  accuracy, mean = np.full(num_slices, np.nan), np.full(num_slices, np.nan)
  for s in range(num_slices):
    rows_s = fields["slice"] == s
    if rows_s.any():
      accuracy[s] = np.mean(fields["preds"][rows_s].argmax(-1) == fields["target"][rows_s])
      mean[s] = np.mean(fields["values"][rows_s].astype(np.float64))
  assert_close(got["accuracy"], accuracy, atol=0.0, rtol=2 * EPS, what="accuracy")
  assert_close(got["mean"], mean, atol=16 * EPS * 7.0, rtol=20 * EPS, what="mean")

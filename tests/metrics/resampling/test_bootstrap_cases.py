"""Bootstrap over the metric case table: every replica equals the case's float64 reference on resampled rows.

Replica r of a Bootstrap is the wrapped metric over the dataset in which row i appears k_ri times. The reference
builds that dataset literally (``np.repeat`` of each batch's rows, padding and its garbage included, by the counts
of the documented hash, re-implemented in numpy in ``test_bootstrap.py``) and runs the case's own independent
float64 reference (numpy / scikit-learn / scipy) on it. Token-masked and weighted cases check that whole rows are
resampled and that the caller's weights multiply the counts.
"""

import jax
import numpy as np
import pytest
from metric_cases import CASES
from test_bootstrap import np_counts

import padded_eval as pe

NUM_REPLICAS = 4
CHOSEN = (
  "mean_weighted_tokens",
  "accuracy_top3_weighted",
  "std_ddof1_weighted_tokens",
  "pearson_two_outputs",
  "perplexity_ignore_index_row_mask",
)


def with_ids(batches):
  size = len(batches[0]["mask"])
  return [dict(b, index=np.arange(size, dtype=np.int32) + i * size) for i, b in enumerate(batches)]


def repeated(batches, counts):
  """The batches with each row repeated by its count (ids dropped)."""
  out = []
  for batch in batches:
    k = counts[batch["index"]]
    out.append({key: np.repeat(v, k, axis=0) for key, v in batch.items() if key != "index"})
  return out


@pytest.mark.parametrize("case", [c for c in CASES if c.name in CHOSEN], ids=lambda c: c.name)
def test_replicas_equal_the_reference_on_resampled_rows(case):
  batches = with_ids(case.batches(seed=3))
  metric = pe.metrics.Bootstrap(case.make(), num_replicas=NUM_REPLICAS, seed=11)
  update = jax.jit(lambda state, batch: state.update(**batch))
  state = metric
  for batch in batches:
    state = update(state, batch)
  np.testing.assert_allclose(
    state.compute(), case.reference(batches), rtol=case.rtol, atol=case.atol
  )
  num_rows = sum(len(b["mask"]) for b in batches)
  counts = np_counts(11, NUM_REPLICAS, np.arange(num_rows))
  reference = [case.reference(repeated(batches, counts[r])) for r in range(NUM_REPLICAS)]
  np.testing.assert_allclose(state.replicas(), reference, rtol=case.rtol, atol=case.atol)

"""Every generic Metric check (tests/metric_checks.py) on every case (tests/metric_cases.py).

The checks run under ``jax_numpy_rank_promotion="raise"``: the library broadcasts explicitly, so a
user who turns implicit rank promotion into an error can use every metric.

Add metrics as rows of ``metric_cases.CASES``; add promises as ``check_*`` functions in
``metric_checks.CHECKS``. Both grow this test grid without new test code.

A row whose metric differs from another row's in ``compute`` options only (``same_update_as``)
skips the checks of the update path under transformations (`UPDATE_PATH_CHECKS`): they run on the
row it names, and `test_same_update_rows_have_that_rows_states` checks that the states are bit for
bit the same, so those checks would compile and run the same update again.
"""

import functools

import jax
import numpy as np
import pytest
from metric_cases import CASES
from metric_checks import (
  CHECKS,
  check_jit_traces_once,
  check_pmap,
  check_scan,
  check_shard_map,
)

UPDATE_PATH_CHECKS = (check_jit_traces_once, check_scan, check_pmap, check_shard_map)
"""The checks of the update, merge and reduce under jit, scan, pmap and shard_map."""

GRID = [
  pytest.param(case, check, id=f"{case.name}-{check.__name__.removeprefix('check_')}")
  for case in CASES
  for check in CHECKS
  if not (case.same_update_as and check in UPDATE_PATH_CHECKS)
]


@pytest.mark.parametrize("case, check", GRID)
def test_metric_protocol(case, check):
  with jax.numpy_rank_promotion("raise"):
    check(case)


SAME_UPDATE = [case for case in CASES if case.same_update_as]


@pytest.mark.parametrize("case", SAME_UPDATE, ids=lambda case: case.name)
def test_same_update_rows_have_that_rows_states(case):
  """A ``same_update_as`` row: the same data, the same class, and each batch's state and the merged
  state bit for bit those of the row it names (so its update-path checks are that row's)."""
  (base,) = [other for other in CASES if other.name == case.same_update_as]
  batches, base_batches = case.batches(), base.batches()
  assert [sorted(b) for b in batches] == [sorted(b) for b in base_batches]
  for batch, base_batch in zip(batches, base_batches):
    for key in batch:
      np.testing.assert_array_equal(batch[key], base_batch[key], err_msg=key)
  assert type(case.make()) is type(base.make())
  parts = [case.make().batch_updates(**b) for b in batches]
  base_parts = [base.make().batch_updates(**b) for b in batches]
  merged = functools.reduce(lambda a, b: a.merge(b), parts)
  base_merged = functools.reduce(lambda a, b: a.merge(b), base_parts)
  for got, want in zip(parts + [merged], base_parts + [base_merged]):
    # the metrics' own nodes hold their options; the states below them must be alike
    assert jax.tree.structure(got).children() == jax.tree.structure(want).children(), case.name
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=case.name)

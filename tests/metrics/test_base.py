"""Every generic Metric check (tests/metric_checks.py) on every case (tests/metric_cases.py).

The checks run under ``jax_numpy_rank_promotion="raise"``: the library broadcasts explicitly, so a
user who turns implicit rank promotion into an error can use every metric.

Add metrics as rows of ``metric_cases.CASES``; add promises as ``check_*`` functions in
``metric_checks.CHECKS``. Both grow this test grid without new test code. The grid runs
``tests/_metrics_shared.py``'s ``BASE_CHECKS``: the same checks, whose jit and empty-state checks
share one jitted update per case, and ``zero_row_update_is_empty`` (0-row updates change nothing,
issue 26) after the eager checks of the same case, whose programs it reuses.

A row whose metric differs from another row's in ``compute`` options only (``same_update_as``)
skips the checks of the update path under transformations (`UPDATE_PATH_CHECKS`): they run on the
row it names, and `test_same_update_rows_have_that_rows_states` checks that the states are bit for
bit the same, so those checks would compile and run the same update again.
"""

import functools

import jax
import numpy as np
import pytest
import scipy.stats
from _metrics_shared import BASE_CHECKS, check_jit_traces_once
from metric_cases import CASES
from metric_checks import check_pmap, check_scan, check_shard_map

import padded_eval as pe

UPDATE_PATH_CHECKS = (check_jit_traces_once, check_scan, check_pmap, check_shard_map)
"""The checks of the update, merge and reduce under jit, scan, pmap and shard_map."""

GRID = [
  pytest.param(case, check, id=f"{case.name}-{check.__name__.removeprefix('check_')}")
  for case in CASES
  for check in BASE_CHECKS
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


# Issue 65: eager updates with host integers outside int32. uint32 beyond 2**31 was rounded to
# float32 on the host, and int64 too, where a jitted update keeps uint32 (and reports what float32
# rounds) and masked_eval refuses int64: KendallTau -0.8165 and Spearman -0.8660 (scipy -0.3333 and
# -0.5) and Std 0.0 (1.247), nothing reported.
_WIDE_PREDS, _RANK_TARGET = [3 * 10**9, 3 * 10**9 + 1, 5], np.array([1, 2, 3], np.int32)


@pytest.mark.parametrize("name", ["KendallTau", "SpearmanCorrelation"])
def test_eager_uint32_ranks_beyond_int32_are_reported_as_under_jit(name):
  metric = getattr(pe.metrics, name)(capacity=8)
  preds = np.array(_WIDE_PREDS + [0], np.uint32)  # a padded row of garbage
  mask = np.array([True, True, True, False])
  target = np.concatenate([_RANK_TARGET, [7]]).astype(np.int32)
  eager = metric.update(preds=preds, target=target, mask=mask)
  jitted = jax.jit(lambda m, p, t, k: m.update(preds=p, target=t, mask=k))(
    metric, preds, target, mask
  )
  for m in (eager, jitted):
    assert np.isnan(float(m.compute()))  # not -0.8165 / -0.8660
    rounded = {kind: n for kind, n in m.invalid_counts().items() if "float32 rounds" in kind}
    assert list(rounded.values()) == [1]


@pytest.mark.parametrize("name", ["KendallTau", "SpearmanCorrelation"])
def test_eager_int64_ranks_that_float32_rounds_are_refused(name):
  metric = getattr(pe.metrics, name)(capacity=8)
  with pytest.raises(ValueError, match=r"preds holds integers .* float32 rounds .*3000000001"):
    metric.update(preds=np.array(_WIDE_PREDS, np.int64), target=_RANK_TARGET)
  # int64 values beyond int32 that float32 holds exactly are taken: scipy's answers
  held = np.array([2**32, 2**33, 5], np.int64)
  got = float(metric.update(preds=held, target=_RANK_TARGET).compute())
  scipy_fn = scipy.stats.kendalltau if name == "KendallTau" else scipy.stats.spearmanr
  expected = scipy_fn(held.astype(np.float64), _RANK_TARGET).statistic
  np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_eager_std_of_wide_integers_is_exact_or_refused():
  offsets = np.array([0, 1, 3])
  expected = np.std(offsets.astype(np.float64))  # 1.247
  with pytest.raises(ValueError, match=r"values holds integers .* float32 rounds"):
    pe.metrics.Std().update(values=(2**40 + offsets).astype(np.int64))
  got = pe.metrics.Std().update(values=(2**31 + offsets).astype(np.uint32)).compute()
  np.testing.assert_allclose(float(got), expected, rtol=1e-6)  # 0.0 before
  # what float32 holds exactly still converts; a Mean still rounds (within float32's rounding)
  held = (2**40 + (offsets << 20)).astype(np.int64)
  np.testing.assert_allclose(
    float(pe.metrics.Std().update(values=held).compute()), expected * 2**20, rtol=1e-6
  )
  mean = pe.metrics.Mean().update(values=(2**40 + offsets).astype(np.int64)).compute()
  np.testing.assert_allclose(float(mean), 2**40 + 4 / 3, rtol=2**-24)

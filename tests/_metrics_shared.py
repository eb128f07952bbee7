"""Compiled programs that the generic checks of ``tests/metric_checks.py`` share, per case.

``metric_checks.check_jit_traces_once`` jits a case's update and ``check_empty_state`` jits it again,
fused with ``compute`` (``update(all padding).compute()``): the second program costs more than the
first (a D2TweedieScore: about 8 s against 5 s on the CI machine's CPU). Here both checks run one
jitted update per case, built once (`jitted_update`), and one jitted ``compute``: the empty-state
check's all-padding batch has the shapes and dtypes of the case's batches, so its update is the
program the jit check compiled, and its ``compute`` that of the empty metric.

`CHECKS` is ``metric_checks.CHECKS`` with these two checks in place of their originals; every
assertion of the originals is kept:

- `check_jit_traces_once`: the case's jitted update traces exactly once over all its calls (the
  empty metric and each updated state: no retrace from one batch to the next, the original's
  promise; its calls by `check_empty_state`, with the empty metric, hit the same program), and the
  updated metric matches the reference.
- `check_empty_state`: ``empty()``/``reset()`` have the updated state's structure, shapes and
  dtypes; ``compute`` under jit of the empty metric is NaN, and so is ``compute`` under jit of a
  metric updated under jit with a batch of padding only (one jitted program each, where the
  original fused the update and ``compute`` in one).
"""

from __future__ import annotations

import zlib

import jax
import numpy as np
from metric_checks import CHECKS as _ORIGINAL_CHECKS
from metric_checks import (
  assert_empty_like_updated,
  assert_matches_reference,
  check_split_and_merge,
  merge_randomly,
)
from metric_checks import check_empty_state as _original_empty_state
from metric_checks import check_jit_traces_once as _original_jit_traces_once

jit_compute = jax.jit(lambda metric: metric.compute())
"""``metric.compute()`` under jit: one program per metric class, options and state shapes."""


class _JittedUpdate:
  """``metric.update(**batch)`` under jit, with the count of its traces."""

  def __init__(self):
    self.traces = 0

    def step(metric, batch):
      self.traces += 1
      return metric.update(**batch)

    self.step = jax.jit(step)


_UPDATES: dict = {}


def jitted_update(case) -> _JittedUpdate:
  """The case's one jitted update (built on first use; a case is a frozen dataclass: its key)."""
  if case not in _UPDATES:
    _UPDATES[case] = _JittedUpdate()
  return _UPDATES[case]


def check_jit_traces_once(case) -> None:
  """A jitted update traces once for all batches and matches the reference."""
  batches = case.batches()
  update = jitted_update(case)
  metric = case.make()
  for batch in batches:
    metric = update.step(metric, batch)
  assert update.traces == 1, f"{case.name}: the jitted update traced {update.traces} times"
  assert_matches_reference(case, metric, batches, "jit")


def check_empty_state(case) -> None:
  """``empty()``/``reset()`` have the updated state's structure, shapes and dtypes; NaN in jit."""
  batch = case.batches()[0]
  assert_empty_like_updated(case, batch)
  assert np.all(np.isnan(np.asarray(jit_compute(case.make()))))
  all_padding = {**batch, "mask": np.zeros_like(batch["mask"])}
  seen_nothing = jit_compute(jitted_update(case).step(case.make(), all_padding))
  assert np.all(np.isnan(np.asarray(seen_nothing)))


def _zero_rows(batch, keys):
  return {key: np.asarray(batch[key])[:0] for key in keys}


def check_zero_row_update_is_empty(case) -> None:
  """0 rows (with and without mask / weights): NaN alone, nothing changed after real data.

  Issue 26 ("Numbers"). Before: "zero-size array to reduction" (MSE, RMSE, R2, Std, Pearson) and
  ZeroDivisionError (any metric given ``mask`` or ``weights`` on 0 rows). Its eager updates of the
  case's batches are those of the checks before it in `CHECKS` (their programs, compiled).
  """
  batches = case.batches()
  keys = sorted(batches[0])
  variants = [keys, [k for k in keys if k not in ("mask", "weights")]]
  weights = np.ones(batches[0]["mask"].shape, np.float32)
  if "weights" not in keys:
    try:  # mask-shaped weights; where weights are per row (ranking: per query), those
      case.make().update(**{**batches[0], "weights": weights})
      variants.append(keys + ["weights"])
    except ValueError as err:
      if "does not fit" in str(err):
        weights = np.ones(batches[0]["mask"].shape[:1], np.float32)
        variants.append(keys + ["weights"])
      elif "does not take sample weights" not in str(err):
        raise
  for variant in variants:
    batch = {**batches[0], "weights": weights}
    empty = _zero_rows(batch, variant)
    alone = case.make().update(**empty)
    assert np.all(np.isnan(np.asarray(alone.compute()))), (case.name, variant)
    metric = case.make()
    for batch in batches:
      metric = metric.update(**batch).update(**empty)
    np.testing.assert_allclose(
      np.asarray(metric.compute(), np.float64),
      case.reference(batches),
      rtol=case.rtol,
      atol=case.atol,
      err_msg=f"{case.name}: {variant}",
    )
  # the 0-row updates of every variant, anywhere in a random merge tree, change nothing either
  rng = np.random.default_rng(zlib.crc32(case.name.encode()))
  batch = {**batches[0], "weights": weights}
  parts = [case.make().batch_updates(**b) for b in batches]
  parts += [case.make().batch_updates(**_zero_rows(batch, variant)) for variant in variants]
  np.testing.assert_allclose(
    np.asarray(merge_randomly(parts, rng).compute(), np.float64),
    case.reference(batches),
    rtol=case.rtol,
    atol=case.atol,
    err_msg=f"{case.name}: merged in a random tree",
  )


_SHARED = {
  _original_jit_traces_once: check_jit_traces_once,
  _original_empty_state: check_empty_state,
}
CHECKS = [_SHARED.get(check, check) for check in _ORIGINAL_CHECKS]
"""``metric_checks.CHECKS`` (same order, same names) with the two checks above in place."""

BASE_CHECKS = [
  check
  for original in CHECKS
  for check in (
    (original, check_zero_row_update_is_empty) if original is check_split_and_merge else (original,)
  )
]
"""`CHECKS` and `check_zero_row_update_is_empty` (after the eager ones: their programs for the case's
batches are compiled), the grid of tests/metrics/test_base.py."""

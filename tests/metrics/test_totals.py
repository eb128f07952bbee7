"""A batch's statistics in one reduction (padded_eval.metrics.totals.batch_totals), and what it buys
under a sharded jit: one all-reduce per step for Accuracy and Mean, and one of the real rows counted.

References are numpy (float64 sums, exact integer counts) on data whose padded rows hold NaN / inf.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import padded_eval as pe
from padded_eval.eval import backends
from padded_eval.eval import cache as step_cache
from padded_eval.eval.step import RowMask
from padded_eval.metrics import totals

ALL_REDUCE = r"= (.+?) all-reduce(?:-start)?\("
ALL_GATHER = r"= (.+?) all-gather(?:-start)?\("


def masked_data(rng, rows, cols=None):
  shape = (rows,) if cols is None else (rows, cols)
  values = rng.normal(size=shape).astype(np.float32) * np.float32(1e3)
  real = rng.random(shape) < 0.6
  values[~real] = np.nan
  return values, real


@pytest.mark.parametrize("limit", [totals.FLOAT_COUNT_LIMIT, 4])  # 4: the counts summed as int32
def test_totals_and_counts_match_numpy(limit, monkeypatch):
  monkeypatch.setattr(totals, "FLOAT_COUNT_LIMIT", limit)
  rng = np.random.default_rng(0)
  values, real = masked_data(rng, 301)
  weights = rng.random(301).astype(np.float32)
  flags = [real & (values > 0), None, real & (values < -500)]
  terms = [np.where(real, values * weights, 0), np.where(real, weights, 0)]
  sums, counts = jax.jit(totals.batch_totals)(terms, flags)
  np.testing.assert_allclose(
    [float(s.to_numpy()) for s in sums],
    [np.sum(t.astype(np.float64)) for t in terms],
    rtol=1e-6,
  )
  want = [int(np.sum(f)) if f is not None else 0 for f in flags]
  assert [int(c) for c in counts] == want
  assert all(c.dtype == jnp.int32 for c in counts)


def test_arrays_of_different_shapes_are_summed_apart_and_stay_exact():
  rng = np.random.default_rng(1)
  values, real = masked_data(rng, 40, 3)
  row_flags = real.any(-1)
  sums, counts = totals.batch_totals([np.where(real, values, 0)], [real, row_flags, None])
  assert float(sums[0].to_numpy()) == pytest.approx(
    np.sum(np.where(real, values, 0).astype(np.float64))
  )
  assert [int(c) for c in counts] == [int(real.sum()), int(row_flags.sum()), 0]


@pytest.mark.parametrize("cols", [None, 4])  # rows [B] share the reduction; [B, T] values do not
def test_the_real_rows_counted_with_the_statistics_are_the_rows_of_the_update(cols):
  rng = np.random.default_rng(2)
  shape = (97,) if cols is None else (97, cols)
  values = rng.normal(size=shape).astype(np.float32) * np.float32(1e3)
  mask = rng.random(97) < 0.6
  values[~mask] = np.nan  # padded rows
  weights = rng.random(97).astype(np.float32)
  weights[::7] = 0.0  # a row whose weight is 0 is not counted
  mean = pe.metrics.Mean().batch_updates(values=values, mask=mask, weights=weights)
  rows = mask & (weights != 0)
  assert mean.example_count() == int(rows.sum())
  x = values[mask].astype(np.float64)
  w = np.broadcast_to(weights[mask].reshape((-1,) + (1,) * (x.ndim - 1)), x.shape)
  assert float(mean.compute()) == pytest.approx(np.sum(w * x) / np.sum(w), rel=1e-5)


def test_accuracy_counts_hits_invalid_labels_and_rows_exactly():
  rng = np.random.default_rng(3)
  logits = rng.normal(size=(203, 5)).astype(np.float32)
  target = rng.integers(-2, 6, 203).astype(np.int32)  # -2, -1 and 5 are out of range
  mask = rng.random(203) < 0.8
  logits[~mask], target[~mask] = np.nan, 10**6
  acc = pe.metrics.Accuracy().batch_updates(preds=logits, target=target, mask=mask)
  valid = mask & (target >= 0) & (target < 5)
  assert float(acc.correct.to_numpy()) == np.sum((logits.argmax(-1) == target)[valid])
  assert float(acc.weight.to_numpy()) == np.sum(valid)
  assert acc.invalid_counts()["target out of range"] == int(np.sum(mask & ~valid))
  assert acc.example_count() == int(mask.sum())


def accuracy_step(params, batch):
  return pe.metrics.Accuracy().batch_updates(
    preds=batch["x"] @ params, target=batch["y"], mask=batch["mask"]
  )


def mean_step(params, batch):
  return pe.metrics.Mean().batch_updates(values=(batch["x"] @ params)[:, 0], mask=batch["mask"])


@pytest.mark.parametrize("step_fn", [accuracy_step, mean_step])
def test_a_jit_step_of_accuracy_or_mean_gathers_one_stacked_array(step_fn):
  """One process: the step counts the real rows (one int32 all-reduce), and the metric's statistics are
  one array. Its sums are compensated (one variadic reduction with an error-free combiner,
  issue 26), which XLA partitions as a local reduction and one gather of each device's
  ``(sum, error)`` pair: no all-reduce, two small gathers."""
  rng = np.random.default_rng(4)
  data = {"x": rng.normal(size=(75, 3)).astype(np.float32), "y": rng.integers(0, 3, 75)}
  params = rng.normal(size=(3, 3)).astype(np.float32)
  got = pe.masked_eval(step_fn, params, pe.pad_batches(data, 32), backend="jit")
  assert got["num_examples"] == 75
  runner = backends.make_backend("jit", "batch", None)
  cached = step_cache.cached_step(step_fn, runner, RowMask("mask"), False)
  placed = runner.place_batch(backends.StepInput(next(iter(pe.pad_batches(data, 32)))))
  placed_params = runner.place_params(params)
  empty = cached.empty_state(placed_params, placed.batch)
  _, step, packed = cached.packed(empty)
  text = step.lower(placed_params, packed, placed).compile().as_text()
  assert re.findall(ALL_REDUCE, text) == ["s32[]"]  # the real rows, counted in the step
  gathers = re.findall(ALL_GATHER, text)
  assert len(gathers) == 2 and all("(" not in shape for shape in gathers), gathers


def test_masks_with_holes_are_counted_exactly_on_every_backend(backend):
  """The counts of the real rows on every backend against numpy."""
  rng = np.random.default_rng(5)
  x = rng.normal(size=(1003, 3)).astype(np.float32)
  y = rng.integers(0, 3, 1003).astype(np.int32)
  batches = []
  for batch in pe.pad_batches({"x": x, "y": y}, 64):
    holes = batch["mask"] & (rng.random(64) < 0.3)
    batch["mask"] = batch["mask"] & ~holes
    batch["x"][~batch["mask"]] = np.inf
    batches.append(batch)
  params = np.eye(3, dtype=np.float32)
  got = pe.masked_eval(accuracy_step, params, batches, backend=backend)
  mask = np.concatenate([b["mask"] for b in batches])
  xs, ys = np.concatenate([b["x"] for b in batches]), np.concatenate([b["y"] for b in batches])
  assert got["num_examples"] == int(mask.sum())
  assert round(got["accuracy"] * mask.sum()) == int(np.sum((xs.argmax(-1) == ys)[mask]))


COLLECTION = pe.Metrics({"accuracy": pe.metrics.Accuracy(), "loss": pe.metrics.Mean("loss")})


def collection_step(params, batch):
  logits = batch["x"] @ params
  return COLLECTION.batch_updates(
    preds=logits, target=batch["y"], loss=logits[:, 0], mask=batch["mask"]
  )


def test_a_collections_members_of_one_shape_are_summed_in_one_reduction():
  """Accuracy and Mean in one collection: their totals and real rows are one stacked array
  (one pair of gathers per step under a sharded jit, not one per member), and each member's
  numbers are numpy's over the real rows (padded rows hold NaN, labels out of range)."""
  rng = np.random.default_rng(6)
  x = rng.normal(size=(75, 3)).astype(np.float32)
  y = rng.integers(-1, 4, 75)  # -1 and 3 are out of range for 3 classes
  params = rng.normal(size=(3, 3)).astype(np.float32)
  batches = list(pe.pad_batches({"x": x, "y": y}, 32))
  for batch in batches:
    batch["x"][~batch["mask"]] = np.nan
  with pytest.warns(pe.InvalidValuesWarning, match="31 x 'target out of range'"):
    got = pe.masked_eval(collection_step, params, batches, backend="jit", on_invalid="warn")
  logits = x.astype(np.float64) @ params.astype(np.float64)
  valid = (y >= 0) & (y < 3)
  assert got["num_examples"] == 75
  assert got["accuracy"] == pytest.approx(np.mean((logits.argmax(-1) == y)[valid]), abs=1e-7)
  assert got["loss"] == pytest.approx(np.mean(logits[:, 0]), rel=1e-6)
  batch = COLLECTION.batch_updates(
    preds=batches[2]["x"] @ params,
    target=batches[2]["y"],
    loss=batches[2]["x"][:, 0],
    mask=batches[2]["mask"],
  )
  real = batches[2]["mask"]
  accuracy = batch.children["accuracy"]
  assert accuracy.invalid_counts()["target out of range"] == int(
    np.sum(real & ~((batches[2]["y"] >= 0) & (batches[2]["y"] < 3)))
  )
  assert accuracy.example_count() == batch.children["loss"].example_count() == int(real.sum())
  runner = backends.make_backend("jit", "batch", None)
  cached = step_cache.cached_step(collection_step, runner, RowMask("mask"), False)
  placed = runner.place_batch(backends.StepInput(batches[0]))
  placed_params = runner.place_params(params)
  empty = cached.empty_state(placed_params, placed.batch)
  _, step, packed = cached.packed(empty)
  text = step.lower(placed_params, packed, placed).compile().as_text()
  assert re.findall(ALL_REDUCE, text) == ["s32[]"]  # the real rows, counted in the step
  gathers = re.findall(ALL_GATHER, text)
  assert len(gathers) == 2 and all("(" not in shape for shape in gathers), gathers


def test_members_of_other_shapes_are_summed_apart():
  """A member whose totals have another shape (per-token values) is summed on its own; each
  member equals numpy."""
  rng = np.random.default_rng(7)
  tokens = rng.normal(size=(40, 5)).astype(np.float32)
  mask = rng.random(40) < 0.7
  tokens[~mask] = np.nan
  metrics = pe.Metrics({"rows": pe.metrics.Mean("a"), "tokens": pe.metrics.Mean("b")})
  got = metrics.batch_updates(a=tokens[:, 0], b=tokens, mask=mask).compute()
  assert got["rows"] == pytest.approx(np.mean(tokens[mask, 0].astype(np.float64)), rel=1e-6)
  assert got["tokens"] == pytest.approx(np.mean(tokens[mask].astype(np.float64)), rel=1e-6)

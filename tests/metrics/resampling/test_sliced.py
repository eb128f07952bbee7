"""Sliced: per-slice values against scikit-learn / numpy float64 on the rows of each slice.

Data sizes divide neither the batch nor the device count; padded rows hold NaN/inf scores,
out-of-range labels and out-of-range slice ids, which must change nothing.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from sklearn.metrics import accuracy_score, f1_score

import padded_eval as pe

N, C, S = 203, 4, 6  # slice 4 is empty: its values are NaN


def make_data(seed=0, n=N):
  rng = np.random.default_rng(seed)
  slices = rng.choice([0, 1, 2, 3, 5], size=n, p=[0.4, 0.3, 0.15, 0.1, 0.05])
  return {
    "x": rng.normal(size=(n, C)).astype(np.float32),
    "y": rng.integers(0, C, n).astype(np.int32),
    "slice": slices.astype(np.int32),
  }


def sklearn_per_slice(data):
  accuracy, f1 = np.full(S, np.nan), np.full(S, np.nan)
  for s in range(S):
    rows = data["slice"] == s
    if rows.any():
      preds = data["x"][rows].argmax(-1)
      accuracy[s] = accuracy_score(data["y"][rows], preds)
      f1[s] = f1_score(
        data["y"][rows], preds, average="macro", labels=list(range(C)), zero_division=0
      )
  return accuracy, f1


def sliced_metrics(**kwargs):
  members = [pe.metrics.Accuracy(), pe.metrics.F1Score(num_classes=C, average="macro")]
  return pe.metrics.Sliced(pe.Metrics(members), S, **kwargs)


def test_per_slice_values_equal_sklearn_on_every_backend(backend):
  data = make_data()
  metric = sliced_metrics()
  traces = []

  def step(params, batch):
    traces.append(1)
    return metric.batch_updates(
      preds=batch["x"], target=batch["y"], slice=batch["slice"], mask=batch["mask"]
    )

  batches = pe.pad_batches(data, 24, num_devices=8, pad_value={"x": np.nan, "y": -5, "slice": 99})
  results = pe.masked_eval(step, None, batches, backend=backend)
  accuracy, f1 = sklearn_per_slice(data)
  assert len(traces) == 1
  assert results["num_examples"] == N
  for s in range(S):
    np.testing.assert_allclose(results[f"accuracy/{s}"], accuracy[s], rtol=1e-6)
    np.testing.assert_allclose(results[f"f1score/{s}"], f1[s], rtol=1e-6)
  values = results.metric.compute()
  np.testing.assert_allclose(values["accuracy"], accuracy, rtol=1e-6)
  assert np.isnan(values["f1score"][4])
  np.testing.assert_array_equal(results.metric.slice_counts(), np.bincount(data["slice"], None, S))


def test_methods_agree_with_garbage_padding_and_out_of_range_ids():
  data = make_data(1, n=37)
  data["slice"][[3, 10]] = [S, -1]  # two real rows outside [0, S): counted, in no slice
  padded = {k: np.concatenate([v, v[:5]]) for k, v in data.items()}
  padded["x"][-5:] = np.array([np.nan, np.inf, -np.inf, 1e30, np.nan])[:, None]
  padded["slice"][-5:] = [-3, 77, 0, 1, 2]
  mask = np.arange(len(padded["y"])) < 37
  kept = {k: v[(data["slice"] >= 0) & (data["slice"] < S)] for k, v in data.items()}
  accuracy, f1 = sklearn_per_slice(kept)
  for method in ("segments", "vmap"):
    metric = sliced_metrics(method=method).update(
      preds=padded["x"], target=padded["y"], slice=padded["slice"], mask=mask
    )
    values = metric.compute()
    np.testing.assert_allclose(values["accuracy"], accuracy, rtol=1e-6)
    np.testing.assert_allclose(values["f1score"], f1, rtol=1e-6)
    assert metric.invalid_counts() == {"slice id out of range": 2}
    assert ("metrics", "slice id out of range", 2) in metric.invalid_report()
    assert metric.example_count() == 35
  with pytest.raises(ValueError, match="slice id out of range"):
    step = lambda params, batch: sliced_metrics().batch_updates(
      preds=batch["x"], target=batch["y"], slice=batch["slice"], mask=batch["mask"]
    )
    pe.masked_eval(step, None, pe.pad_batches(data, 8), backend="jit")


def test_a_metric_that_does_not_sum_rows_is_sliced_by_vmap():
  rng = np.random.default_rng(2)
  values = rng.normal(3.0, 2.0, 59).astype(np.float32)
  ids = rng.integers(0, 3, 59).astype(np.int32)
  metric = pe.metrics.Sliced(pe.metrics.Std(), 3)
  assert metric.method == "vmap"
  mask = np.arange(64) < 59
  padded = np.concatenate([values, [np.nan, np.inf, 1e38, -np.inf, np.nan]]).astype(np.float32)
  slices = np.concatenate([ids, [0, 1, 2, 9, -9]]).astype(np.int32)
  metric = jax.jit(lambda m: m.update(values=padded, slice=slices, mask=mask))(metric)
  expected = [np.std(values[ids == s].astype(np.float64)) for s in range(3)]
  np.testing.assert_allclose(metric.compute(), expected, rtol=1e-5)
  with pytest.raises(ValueError, match="method='vmap'"):
    pe.metrics.Sliced(pe.metrics.Std(), 3, method="segments")


def test_sliced_bootstrap_interval_per_slice_equals_the_slice_alone():
  data = make_data(3, n=77)
  index = np.arange(77, dtype=np.int32) + 1000
  boot = pe.metrics.Bootstrap(pe.metrics.Accuracy(), num_replicas=64, seed=3)
  sliced = pe.metrics.Sliced(boot, S, slice_names=[f"s{s}" for s in range(S)])
  update = jax.jit(lambda m, kw: m.update(**kw))  # one compilation per metric
  inputs = {"preds": data["x"], "target": data["y"], "index": index}
  sliced = update(sliced, {**inputs, "slice": data["slice"]})
  low, high = sliced.compute_interval(0.9)
  logs = sliced.compute_logs()
  for s in range(S):
    rows = data["slice"] == s
    if not rows.any():
      assert np.isnan(low[s]) and np.isnan(logs[f"accuracy_low/s{s}"])
      continue
    alone = update(boot, {**inputs, "mask": rows})  # the slice's rows alone
    alone_low, alone_high = alone.compute_interval(0.9)
    np.testing.assert_allclose([low[s], high[s]], [alone_low, alone_high], rtol=1e-6)
    np.testing.assert_allclose(
      logs[f"accuracy/s{s}"], np.mean(data["x"][rows].argmax(-1) == data["y"][rows]), rtol=1e-6
    )
  with pytest.raises(ValueError, match="Sliced\\(Bootstrap"):
    sliced_metrics().compute_interval()


def test_ten_thousand_slices_by_segment_sums():
  rng = np.random.default_rng(4)
  n, slices = 3001, 10_000
  y = rng.integers(0, 2, n).astype(np.int32)
  x = rng.normal(size=(n, 2)).astype(np.float32)
  ids = rng.integers(0, slices, n).astype(np.int32)
  metric = pe.metrics.Sliced(pe.metrics.Accuracy(), slices)
  metric = jax.jit(lambda m: m.update(preds=x, target=y, slice=ids))(metric)
  correct = np.bincount(ids, x.argmax(-1) == y, slices)
  seen = np.bincount(ids, None, slices)
  with np.errstate(invalid="ignore", divide="ignore"):
    expected = correct / seen
  np.testing.assert_allclose(metric.compute(), expected, rtol=1e-6)
  assert np.isnan(metric.compute()[seen == 0]).all()


def test_bad_configuration_and_inputs_raise_naming_the_argument():
  with pytest.raises(ValueError, match="num_slices"):
    pe.metrics.Sliced(pe.metrics.Accuracy(), 0)
  with pytest.raises(ValueError, match="slice_names"):
    pe.metrics.Sliced(pe.metrics.Accuracy(), 2, slice_names=["en", "en"])
  with pytest.raises(ValueError, match="method"):
    pe.metrics.Sliced(pe.metrics.Accuracy(), 2, method="loop")
  metric = pe.metrics.Sliced(pe.metrics.Accuracy(), 2, key="lang")
  with pytest.raises(ValueError, match="'lang'"):
    metric.update(preds=jnp.zeros((3, 2)), target=jnp.zeros(3, jnp.int32))
  with pytest.raises(ValueError, match="lang must be int slice ids"):
    metric.update(preds=jnp.zeros((3, 2)), target=jnp.zeros(3, jnp.int32), lang=jnp.zeros(3))
  for inner in (pe.metrics.Accuracy(), pe.metrics.Std()):  # one id per row, named
    sliced = pe.metrics.Sliced(inner, 2, key="lang")
    inputs = {"preds": np.ones((3, 2), np.float32), "target": np.array([0, 1, 1])}
    inputs = (
      inputs if isinstance(inner, pe.metrics.Accuracy) else {"values": np.ones(3, np.float32)}
    )
    with pytest.raises(ValueError, match=r"lang has shape \(2,\); expected \[3\]"):
      sliced.update(**inputs, lang=np.array([0, 1], np.int32))


def test_capacity_is_judged_per_slice():
  """Each slice has its own buffer of ``capacity`` slots: elements beyond it are reported per
  slice (sklearn on the slices that fit), never from all slices pooled into one buffer."""
  from sklearn.metrics import roc_auc_score

  p = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], np.float32)
  t, ids = np.array([0, 1, 0, 1, 1, 0]), np.array([0, 0, 0, 0, 1, 1], np.int32)
  fits = pe.metrics.Sliced(pe.metrics.AUROC(exact=True, capacity=4), 2)
  metric = fits.update(preds=p, target=t, slice=ids)
  want = [roc_auc_score(t[ids == s], p[ids == s]) for s in range(2)]
  np.testing.assert_allclose(np.asarray(metric.compute()), want, rtol=1e-6)
  assert metric.invalid_report() == []
  step = lambda params, b: fits.batch_updates(
    preds=b["p"], target=b["t"], mask=b["mask"], slice=b["slice"]
  )
  data = {"p": p, "t": t, "slice": ids}
  results = pe.masked_eval(step, None, pe.pad_batches(data, 8), backend="jit")
  np.testing.assert_allclose([results["auroc/0"], results["auroc/1"]], want, rtol=1e-6)
  small = pe.metrics.Sliced(pe.metrics.AUROC(exact=True, capacity=2), 2)
  report = small.update(preds=p, target=t, slice=ids).invalid_report()
  assert [n for _, kind, n in report if "capacity=2" in kind] == [2]  # slice 0: 4 elements, 2 slots


@pytest.mark.parametrize("name", ["AUROC", "AUPRC"])
def test_binned_curves_are_sliced_by_vmap_and_segments_says_why(name):
  # Issue 65: the docs listed curves among the sums of rows that take method="segments", but the
  # binned curves were refused there with a message about "Chan's moments".
  curve = getattr(pe.metrics, name)()
  assert pe.metrics.Sliced(curve, 3).method == "vmap"
  with pytest.raises(
    ValueError, match=f"{name} keeps a ScoreBuffer, which is not a sum of rows"
  ) as e:
    pe.metrics.Sliced(curve, 3, method="segments")
  assert "Chan" not in str(e.value)
  assert "curves" not in pe.metrics.resampling.sliced.__doc__.split('``"vmap"``')[0]

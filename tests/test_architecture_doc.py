"""docs/architecture.md: its worked metric example runs and matches numpy float64."""

import pathlib
import re

import numpy as np
import pytest

DOC = pathlib.Path(__file__).resolve().parent.parent / "docs" / "architecture.md"


def python_blocks(section: str) -> list[str]:
  """The ```python blocks of one "## section" of the document."""
  text = DOC.read_text()
  start = text.index(f"\n## {section}\n")
  end = text.find("\n## ", start + 1)
  return re.findall(r"```python\n(.*?)```", text[start : None if end < 0 else end], re.S)


def metric_example():
  namespace = {}
  exec(compile(python_blocks("Adding a metric")[0], str(DOC), "exec"), namespace)
  return namespace["MeanSquaredLogError"]


def msle_data(rng, n):
  preds, target = rng.uniform(0, 3, (2, n)).astype(np.float32)
  preds[::9] = -0.5  # invalid: counted, left out
  mask = rng.random(n) < 0.7
  weights = rng.uniform(0.5, 2, n).astype(np.float32)
  return preds, target, mask, weights


def msle_reference(preds, target, mask, weights):
  kept = mask & (preds >= 0) & (target >= 0)
  error = (np.log1p(preds[kept].astype(np.float64)) - np.log1p(target[kept])) ** 2
  w = weights[kept].astype(np.float64)
  return np.sum(w * error) / np.sum(w), int(np.sum(mask & ~kept)), int(mask.sum())


def test_the_metric_example_runs_and_matches_its_reference():
  metric_class = metric_example()
  preds, target, mask, weights = msle_data(np.random.default_rng(0), 23)
  padded = [a.copy() for a in (preds, target, weights)]
  padded[0][~mask], padded[1][~mask], padded[2][~mask] = np.nan, np.inf, np.inf  # padding
  metric = metric_class()
  for part in (slice(0, 10), slice(10, 23)):  # two batches
    metric = metric.update(
      preds=padded[0][part], target=padded[1][part], mask=mask[part], weights=padded[2][part]
    )
  want, invalid, rows = msle_reference(preds, target, mask, weights)
  np.testing.assert_allclose(float(metric.compute()), want, rtol=2e-6)
  assert metric.invalid_counts() == {"negative input": invalid}
  assert metric.example_count() == rows


def test_the_metric_example_goes_through_masked_eval(backend):
  import padded_eval as pe

  metric_class = metric_example()
  preds, target, _, weights = msle_data(np.random.default_rng(1), 45)
  data = {"preds": preds, "target": target, "w": weights}

  def step(params, batch):
    return metric_class().batch_updates(
      preds=batch["preds"] * params, target=batch["target"], weights=batch["w"], mask=batch["mask"]
    )

  with pytest.warns(pe.InvalidValuesWarning, match="negative input"):
    got = pe.masked_eval(
      step, np.float32(1.0), pe.pad_batches(data, 16), backend=backend, on_invalid="warn"
    )
  want, _, _ = msle_reference(preds, target, np.ones(45, bool), weights)
  (value,) = [v for k, v in got.items() if k != "num_examples"]
  np.testing.assert_allclose(value, want, rtol=2e-6)
  assert got["num_examples"] == 45


def test_the_source_example_runs_and_pads_like_the_mapping(monkeypatch):
  import pandas as pd

  import padded_eval as pe
  from padded_eval.data.sources import registry

  namespace = {}
  exec(compile(python_blocks("Adding a source")[0], str(DOC), "exec"), namespace)
  kind = namespace["DataFrameSource"]
  try:
    rng = np.random.default_rng(2)
    frame = pd.DataFrame({"x": rng.normal(size=21).astype(np.float32), "y": np.arange(21)})
    got = pe.pad_batches(frame, 8)
    want = pe.pad_batches({c: frame[c].to_numpy() for c in frame}, 8)
    assert len(got) == len(want) == 3
    for a, b in zip(got, want, strict=True):
      assert a.keys() == b.keys()
      for key in a:
        np.testing.assert_array_equal(a[key], b[key])

    def step(params, batch):
      return pe.metrics.Mean().batch_updates(values=batch["x"] * params, mask=batch["mask"])

    result = pe.masked_eval(step, np.float32(2.0), pe.pad_batches(frame, 8), backend="jit")
    np.testing.assert_allclose(
      result["mean"], 2 * np.mean(frame["x"].to_numpy(np.float64)), rtol=1e-6
    )
    with pytest.raises(ValueError, match="mask"):
      pe.pad_batches(pd.DataFrame({"mask": [1, 2]}), 8)
  finally:
    registry.unregister(kind)


def test_the_backend_example_runs_and_matches_numpy(monkeypatch):
  import jax.numpy as jnp

  import padded_eval as pe
  from padded_eval.eval import backends

  monkeypatch.setattr(backends, "BACKENDS", dict(backends.BACKENDS))  # registered for this test
  namespace = {}
  exec(compile(python_blocks("Adding a backend")[0], str(DOC), "exec"), namespace)
  assert backends.BACKENDS["eager"] is namespace["EagerBackend"]
  rng = np.random.default_rng(1)
  x = rng.normal(size=(37, 3)).astype(np.float32)
  y = rng.integers(0, 3, 37).astype(np.int32)
  batches = list(pe.pad_batches({"x": x, "y": y}, 16, num_devices=1))
  for batch in batches:  # garbage in the padded rows
    batch["x"][~batch["mask"]], batch["y"][~batch["mask"]] = np.nan, -5

  def step(params, batch):
    logits = batch["x"] * params
    return pe.collections.Metrics([pe.metrics.Accuracy(), pe.metrics.Mean()]).batch_updates(
      preds=logits, target=batch["y"], values=jnp.tanh(logits).sum(-1), mask=batch["mask"]
    )

  got = pe.masked_eval(step, np.float32(2.0), batches, backend="eager")
  logits = x.astype(np.float64) * 2.0
  assert got["num_examples"] == 37
  assert round(got["accuracy"] * 37) == int(np.sum(logits.argmax(-1) == y))
  np.testing.assert_allclose(got["mean"], np.mean(np.tanh(logits).sum(-1)), rtol=1e-5)
  with pytest.raises(ValueError, match="one device"):
    pe.masked_eval(step, 2.0, batches, backend="eager", data_axes="batch")

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


def test_the_metric_example_runs_and_matches_its_reference():
  namespace = {}
  exec(compile(python_blocks("Adding a metric")[0], str(DOC), "exec"), namespace)
  metric_class = namespace["MeanSquaredLogError"]
  rng = np.random.default_rng(0)
  preds, target = rng.uniform(0, 3, (2, 8, 3)).astype(np.float32)
  mask = rng.random(8) < 0.6
  weights = rng.uniform(0.5, 2, 8).astype(np.float32)
  preds[~mask], weights[~mask] = np.nan, np.inf  # padding
  metric = metric_class()
  for part in (slice(0, 5), slice(5, 8)):  # two batches
    metric = metric.update(
      preds=preds[part], target=target[part], mask=mask[part], weights=weights[part]
    )
  error = (np.log1p(preds[mask].astype(np.float64)) - np.log1p(target[mask])) ** 2
  w = np.broadcast_to(weights[mask][:, None].astype(np.float64), error.shape)
  np.testing.assert_allclose(float(metric.compute()), np.sum(w * error) / np.sum(w), rtol=2e-6)


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

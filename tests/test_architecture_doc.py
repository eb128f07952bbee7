"""docs/architecture.md: its worked metric example runs and matches numpy float64."""

import pathlib
import re

import numpy as np

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

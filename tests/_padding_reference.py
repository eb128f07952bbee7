"""Independent numpy expectation for padded batches (used by tests/data/test_padded.py, test_sources_tf_data.py, ...), and
`garbage_padded`: padded batches whose padded rows hold NaN, inf and out-of-range labels."""

import numpy as np

import padded_eval as pe


def garbage_padded(data, batch_size):
  """``pe.pad_batches`` of ``{"x": [n, f] float, "y": [n] int}``, with NaN in the padded rows'
  features (inf in their first) and label 10**6: a metric that reads a padded row shows it."""
  for batch in pe.pad_batches(data, batch_size):
    x, y = batch["x"].copy(), batch["y"].copy()
    x[~batch["mask"]] = np.nan
    x[~batch["mask"], 0] = np.inf
    y[~batch["mask"]] = 10**6
    yield {**batch, "x": x, "y": y}


def expected_batches(data, batch_size, pad=0, num_batches=None, string_pad=""):
  """Batches as index arithmetic over a whole-dataset dict of arrays (flat, one level)."""
  n = len(next(iter(data.values())))
  count = -(-n // batch_size) if num_batches is None else num_batches
  out = []
  for b in range(count):
    rows = np.arange(b * batch_size, (b + 1) * batch_size)
    real = rows < n
    batch = {}
    for key, values in data.items():
      values = np.asarray(values)
      fill = (
        string_pad if values.dtype.kind in "USO" else (pad[key] if isinstance(pad, dict) else pad)
      )
      leaf = np.empty((batch_size,) + values.shape[1:], dtype=values.dtype if n else values.dtype)
      for i, row in enumerate(rows):
        leaf[i] = values[row] if real[i] else fill
      batch[key] = leaf
    batch["mask"] = real
    out.append(batch)
  return out


def assert_batches_equal(got, want):
  """Exact equality (NaN equal to NaN), same keys, shapes and dtype kinds, same number of batches."""
  got = list(got)
  assert len(got) == len(want), (len(got), len(want))
  for g, w in zip(got, want):
    assert set(g) == set(w), (set(g), set(w))
    for key in w:
      assert isinstance(g[key], np.ndarray), (key, type(g[key]))
      assert g[key].shape == w[key].shape, (key, g[key].shape, w[key].shape)
      assert g[key].dtype.kind == w[key].dtype.kind, (key, g[key].dtype, w[key].dtype)
      if w[key].dtype.kind in "fc":
        np.testing.assert_array_equal(g[key], w[key])  # treats NaN == NaN
      else:
        assert g[key].tolist() == w[key].tolist(), (key, g[key], w[key])
  assert all(g["mask"].dtype == np.bool_ for g in got)

"""masked_eval(..., outputs=True): per-row outputs back, padding removed, in source order, one trace.

The reference is a float64 numpy forward pass over the whole dataset (never the code's own output). Padded rows
hold NaN, inf and garbage; a padded row that leaked into the outputs, a lost row or a reordering shows as a
length or row mismatch. Traces are counted with a Python counter in ``step_fn``.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import padded_eval as pe

FEATURES, HIDDEN, CLASSES, TOKENS, VOCAB = 5, 7, 4, 6, 11


def make_params(seed=0):
  rng = np.random.default_rng(seed)
  return {
    "w1": rng.normal(size=(FEATURES, HIDDEN)).astype(np.float32),
    "w2": rng.normal(size=(HIDDEN, CLASSES)).astype(np.float32),
  }


def make_data(n, seed=1):
  rng = np.random.default_rng(seed)
  return {
    "x": rng.normal(size=(n, FEATURES)).astype(np.float32),
    "code": rng.integers(0, 1000, (n, TOKENS)).astype(np.int32),
    "label": rng.integers(0, CLASSES, n).astype(np.int32),
  }


GARBAGE = {"x": np.nan, "code": -(2**30), "label": -99}


def forward(params, batch):
  """The model: logits [B, C]; 'decoded' tokens [B, T] (integer arithmetic, exact); a score [B]."""
  logits = jnp.tanh(batch["x"] @ params["w1"]) @ params["w2"]
  tokens = (batch["code"] * 7 + 3) % VOCAB
  return logits, tokens, jnp.sum(logits**2, axis=-1)


def reference(params, data):
  """float64 numpy forward pass over the whole dataset."""
  hidden = np.tanh(data["x"].astype(np.float64) @ params["w1"].astype(np.float64))
  logits = hidden @ params["w2"].astype(np.float64)
  return {
    "logits": logits,
    "decoded": {
      "tokens": (data["code"].astype(np.int64) * 7 + 3) % VOCAB,
      "score": np.sum(logits**2, axis=-1),
    },
    "index": np.arange(len(data["x"])),
  }


def make_step(traces):
  """A fresh step_fn (a new compile-cache key) that counts its traces."""

  def step_fn(params, batch):
    traces.append(batch["x"].shape)
    logits, tokens, score = forward(params, batch)
    metric = pe.metrics.Accuracy().batch_updates(
      preds=logits, target=batch["label"], mask=batch["mask"]
    )
    return metric, {
      "logits": logits,
      "decoded": {"tokens": tokens, "score": score},
      "index": batch["index"],
    }

  return step_fn


def assert_outputs_match(got, want):
  assert jax.tree.structure(got) == jax.tree.structure(want)
  assert all(isinstance(leaf, np.ndarray) for leaf in jax.tree.leaves(got))
  np.testing.assert_allclose(got["logits"], want["logits"], rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(
    got["decoded"]["score"], want["decoded"]["score"], rtol=1e-5, atol=1e-5
  )
  np.testing.assert_array_equal(got["decoded"]["tokens"], want["decoded"]["tokens"])
  np.testing.assert_array_equal(got["index"], want["index"])
  assert got["logits"].dtype == np.float32 and got["index"].dtype == np.int32


@pytest.mark.parametrize("n", [1, 65, 1003])
def test_outputs_equal_a_float64_forward_pass_row_for_row_with_one_trace(backend, n):
  params, data = make_params(), make_data(n)
  traces = []
  batches = pe.pad_batches(data, 32, num_devices=8, pad_value=GARBAGE, index_key="index")
  results, outputs = pe.masked_eval(
    make_step(traces), params, batches, backend=backend, outputs=True
  )
  assert len(traces) == 1, traces
  want = reference(params, data)
  assert_outputs_match(outputs, want)
  assert results["num_examples"] == n
  accuracy = np.mean(want["logits"].argmax(-1) == data["label"])
  np.testing.assert_allclose(results["accuracy"], accuracy, rtol=1e-6)


def test_results_are_the_same_with_and_without_outputs(backend):
  params, data = make_params(), make_data(300)

  def metric_only(params, batch):
    logits = forward(params, batch)[0]
    return pe.metrics.Accuracy().batch_updates(
      preds=logits, target=batch["label"], mask=batch["mask"]
    )

  batches = pe.pad_batches(data, 32, num_devices=8, pad_value=GARBAGE, index_key="index")
  plain = pe.masked_eval(metric_only, params, batches, backend=backend)
  with_outputs, _ = pe.masked_eval(make_step([]), params, batches, backend=backend, outputs=True)
  assert plain == with_outputs


@pytest.mark.parametrize("steps_in_flight", [1, 3])
def test_masks_with_holes_keep_exactly_the_real_rows_in_order(backend, steps_in_flight):
  """Hand-made batches whose real rows are scattered (and some all padding): rows come back in batch order."""
  params, rng = make_params(), np.random.default_rng(5)
  batches, real_rows = [], []
  for step in range(9):
    data = make_data(16, seed=10 + step)
    mask = rng.random(16) < (0.0 if step in (2, 8) else 0.6)
    data["x"][~mask] = rng.choice([np.nan, np.inf, -np.inf], (int((~mask).sum()), FEATURES))
    data["index"] = np.where(mask, np.arange(100 * step, 100 * step + 16), -1).astype(np.int32)
    batches.append(dict(data, mask=mask))
    real_rows.append({key: value[mask] for key, value in data.items()})
  whole = {key: np.concatenate([rows[key] for rows in real_rows]) for key in real_rows[0]}
  results, outputs = pe.masked_eval(
    make_step([]), params, batches, backend=backend, outputs=True, steps_in_flight=steps_in_flight
  )
  want = reference(params, whole)
  want["index"] = whole["index"]
  assert_outputs_match(outputs, want)
  assert results["num_examples"] == len(whole["x"])


def test_all_padding_gives_empty_outputs_of_the_right_shapes(backend):
  data = make_data(0)
  batches = pe.pad_batches(data, 16, num_devices=8, index_key="index", num_batches=2)
  results, outputs = pe.masked_eval(
    make_step([]), make_params(), batches, backend=backend, outputs=True
  )
  assert results["num_examples"] == 0
  assert outputs["logits"].shape == (0, CLASSES) and outputs["decoded"]["tokens"].shape == (
    0,
    TOKENS,
  )
  assert outputs["index"].shape == (0,)


def test_tf_data_source_outputs_and_ids_in_source_order():
  tf = pytest.importorskip("tensorflow")
  params, data = make_params(), make_data(203)
  dataset = tf.data.Dataset.from_tensor_slices(data).filter(lambda row: True).batch(9)
  batches = pe.pad_batches(dataset, 24, num_devices=8, pad_value=GARBAGE, index_key="index")
  _, outputs = pe.masked_eval(make_step([]), params, batches, backend="jit", outputs=True)
  assert_outputs_match(outputs, reference(params, data))


def test_device_memory_does_not_grow_with_the_number_of_steps(backend):
  """Live device bytes, sampled as each batch is read, stay flat: outputs leave the devices step by step."""
  params, data = make_params(), make_data(96 * 60)
  samples = []

  def sampled(batches):
    for batch in batches:
      samples.append(sum(x.nbytes for x in jax.live_arrays()))
      yield batch

  def wide_step(params, batch):  # 4 KiB of outputs per device per step: a leak shows after 60 steps
    logits = forward(params, batch)[0]
    wide = jnp.tile(logits, (1, 256))
    metric = pe.metrics.Mean().batch_updates(values=logits[:, 0], mask=batch["mask"])
    return metric, {"wide": wide}

  batches = pe.pad_batches(data, 96, num_devices=8, pad_value=GARBAGE)
  _, outputs = pe.masked_eval(wide_step, params, sampled(batches), backend=backend, outputs=True)
  assert outputs["wide"].shape == (96 * 60, CLASSES * 256)
  step_bytes = 96 * CLASSES * 256 * 4
  early, late = max(samples[5:15]), max(samples[-15:])
  assert late <= early + step_bytes, (early, late, step_bytes)


# --- errors -----------------------------------------------------------------------------------------------------


def _batches():
  return pe.pad_batches(make_data(20), 16, num_devices=8, index_key="index")


def _metric(batch):
  return pe.metrics.Mean().batch_updates(values=batch["x"][:, 0], mask=batch["mask"])


@pytest.mark.parametrize(
  "per_row,message",
  [
    (
      lambda b: {"logits": b["x"][:1]},
      r"per_row leaf \['logits'\] has shape \(1, 5\); expected a leading axis",
    ),
    (
      lambda b: {"t": b["x"].T},
      r"per_row leaf \['t'\] has shape \(5, \d+\); expected a leading axis of \d+",
    ),
    (lambda b: {"total": jnp.sum(b["x"])}, r"per_row leaf \['total'\] has shape \(\); expected"),
    (lambda b: {}, r"per_row holds no arrays"),
  ],
)
def test_per_row_leaves_without_the_rows_as_leading_axis_are_refused(backend, per_row, message):
  step_fn = lambda params, batch: (_metric(batch), per_row(batch))
  with pytest.raises(ValueError, match=message):
    pe.masked_eval(step_fn, None, _batches(), backend=backend, outputs=True)


def test_bare_metric_with_outputs_is_refused(backend):
  with pytest.raises(
    ValueError, match=r"outputs=True\): step_fn returned a bare Mean; expected a pair"
  ):
    pe.masked_eval(lambda p, b: _metric(b), None, _batches(), backend=backend, outputs=True)


def test_pair_without_outputs_is_refused(backend):
  step_fn = lambda params, batch: (_metric(batch), {"x": batch["x"]})
  with pytest.raises(
    ValueError, match=r"returned a pair \(metric, per_row\), but .* without outputs=True"
  ):
    pe.masked_eval(step_fn, None, _batches(), backend=backend)


def test_pair_whose_first_element_is_not_a_metric_is_refused():
  step_fn = lambda params, batch: ({"x": batch["x"]}, _metric(batch))
  with pytest.raises(
    ValueError, match=r"first element of step_fn's pair must be a padded_eval Metric"
  ):
    pe.masked_eval(step_fn, None, _batches(), backend="jit", outputs=True)


def test_outputs_must_be_a_bool():
  with pytest.raises(ValueError, match=r"outputs must be True or False; got 'yes'"):
    pe.masked_eval(lambda p, b: _metric(b), None, _batches(), outputs="yes")


class Lying:
  """Batches whose len() says fewer than they yield: the outputs must still hold every real row."""

  def __init__(self, batches, length):
    self._batches, self._length = batches, length

  def __len__(self):
    return self._length

  def __iter__(self):
    return iter(self._batches)


@pytest.mark.parametrize("length", [1, None])
def test_rows_beyond_the_announced_length_or_of_unknown_length_are_kept(length):
  params, data = make_params(), make_data(70)
  padded = list(pe.pad_batches(data, 16, num_devices=8, pad_value=GARBAGE, index_key="index"))
  source = Lying(padded, length) if length is not None else iter(padded)
  _, outputs = pe.masked_eval(make_step([]), params, source, backend="jit", outputs=True)
  assert_outputs_match(outputs, reference(params, data))


@pytest.mark.parametrize("backend", ["shard_map", "jit"])
def test_two_dimensional_mesh_rows_are_not_repeated_for_each_replica(backend):
  """Rows split over the mesh's first axis and replicated over the second come back once each."""
  params, data = make_params(), make_data(77)
  mesh = jax.sharding.Mesh(np.array(jax.devices()).reshape(4, 2), ("batch", "model"))
  batches = pe.pad_batches(data, 16, num_devices=4, pad_value=GARBAGE, index_key="index")
  traces = []
  _, outputs = pe.masked_eval(
    make_step(traces), params, batches, backend=backend, mesh=mesh, outputs=True
  )
  assert len(traces) == 1
  assert_outputs_match(outputs, reference(params, data))

"""pad_batches(pad_shapes=..., length_keys=...) and batch_size=None, against numpy float64 references.

Variable-length pipelines (tf.data ``padded_batch`` to each batch's longest row, ragged lists, batches of varying
lengths) must evaluate with one trace of the step and an exact result; padded positions hold NaN, so a step that
does not mask before the arithmetic would give NaN.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import padded_eval as pe

MAX_LEN = 12


def sequences(n, seed=0):
  """``n`` rows: token ids in [1, 9] of lengths 1..MAX_LEN, per-token float scores, and a label."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, MAX_LEN + 1, size=n)
  tokens = [rng.integers(1, 10, size=k).astype(np.int32) for k in lengths]
  scores = [rng.normal(size=k).astype(np.float32) for k in lengths]
  return tokens, scores, lengths


def reference_mean(scores, scale=2.0):
  return np.mean(np.concatenate(scores).astype(np.float64) * scale)


def counting_step(traces):
  """A new step_fn: the mean of ``scores * params`` over real tokens (mask: ``inputs > 0`` of real rows)."""

  def step_fn(params, batch):
    traces.append(batch["inputs"].shape)
    tokens = (batch["inputs"] > 0) & batch["mask"][:, None]
    return pe.metrics.Mean().batch_updates(values=batch["scores"] * params, mask=tokens)

  return step_fn


def tf_padded_batch_pipeline(tokens, scores, batch_size):
  """tf.data: variable-length rows, ``padded_batch`` to each batch's longest row (scores padded with NaN)."""
  tf = pytest.importorskip("tensorflow")

  def rows():
    yield from ({"inputs": t, "scores": s} for t, s in zip(tokens, scores))

  spec = {
    "inputs": tf.TensorSpec([None], tf.int32),
    "scores": tf.TensorSpec([None], tf.float32),
  }
  dataset = tf.data.Dataset.from_generator(rows, output_signature=spec)
  padding = {"inputs": tf.constant(0, tf.int32), "scores": tf.constant(np.nan, tf.float32)}
  return dataset.padded_batch(batch_size, padding_values=padding)


@pytest.mark.parametrize("backend", ["pmap", "jit"])
def test_tf_padded_batch_pipeline_evaluates_exactly_with_one_trace(backend):
  tokens, scores, lengths = sequences(45)
  dataset = tf_padded_batch_pipeline(tokens, scores, batch_size=7)
  widths = {len(b["inputs"][0]) for b in dataset.as_numpy_iterator()}
  assert len(widths) > 1  # the pipeline's batches really vary in length
  batches = pe.pad_batches(
    dataset,
    16,
    pad_shapes={"inputs": (MAX_LEN,), "scores": (MAX_LEN,)},
    pad_value={"scores": np.nan},
  )
  traces = []
  result = pe.masked_eval(counting_step(traces), 2.0, batches, backend=backend)
  assert len(traces) == 1, traces
  assert result["num_examples"] == 45
  np.testing.assert_allclose(result["mean"], reference_mean(scores), rtol=1e-6)


def test_tf_unbatched_variable_rows_are_padded_batched():
  tf = pytest.importorskip("tensorflow")
  tokens, scores, _ = sequences(20, seed=1)
  dataset = tf.data.Dataset.from_generator(
    lambda: ({"inputs": t, "scores": s} for t, s in zip(tokens, scores)),
    output_signature={
      "inputs": tf.TensorSpec([None], tf.int32),
      "scores": tf.TensorSpec([None], tf.float32),
    },
  )
  batches = list(
    pe.pad_batches(
      dataset,
      8,
      num_devices=1,
      batched=False,
      pad_shapes={"inputs": (MAX_LEN,), "scores": (MAX_LEN,)},
      pad_value={"scores": np.nan},
      length_keys={"inputs": "length"},
    )
  )
  expected = np.zeros((24, MAX_LEN), np.int32)
  for row, t in enumerate(tokens):
    expected[row, : len(t)] = t
  np.testing.assert_array_equal(np.concatenate([b["inputs"] for b in batches]), expected)
  got_scores = np.concatenate([b["scores"] for b in batches])
  assert np.isnan(got_scores[expected == 0]).all()
  lengths = np.concatenate([b["length"] for b in batches])
  assert lengths.tolist() == [len(t) for t in tokens] + [0] * 4


def test_ragged_lists_and_varying_batches_evaluate_exactly():
  tokens, scores, lengths = sequences(29, seed=2)
  bounds = [0, 5, 6, 17, 29]  # batches of varying rows; ragged lists inside
  source = [
    {"inputs": [t.tolist() for t in tokens[a:b]], "scores": [s.tolist() for s in scores[a:b]]}
    for a, b in zip(bounds[:-1], bounds[1:])
  ]
  batches = pe.pad_batches(
    source,
    16,
    pad_shapes={"inputs": (MAX_LEN,), "scores": (MAX_LEN,)},
    pad_value={"scores": np.nan},
    length_keys={"scores": "length"},
  )
  traces = []
  result = pe.masked_eval(counting_step(traces), 2.0, batches, backend="jit")
  assert len(traces) == 1 and result["num_examples"] == 29
  np.testing.assert_allclose(result["mean"], reference_mean(scores), rtol=1e-6)
  lengths_seen = np.concatenate([b["length"][b["mask"]] for b in batches])
  assert lengths_seen.tolist() == lengths.tolist()


def test_an_empty_ragged_list_row_keeps_the_dtype_of_the_other_rows():
  # np.asarray([]) is float64: an empty row of a list of token lists made its batch float64,
  # so that the next batch (int64) raised "dtype changed", or the ids came out as floats
  source = [{"tokens": [[5, 6], [7]]}, {"tokens": [[], [2**53 + 1]]}]
  batches = list(pe.pad_batches(source, 2, num_devices=1, pad_shapes={"tokens": (3,)}))
  expected = np.array([[5, 6, 0], [7, 0, 0], [0, 0, 0], [2**53 + 1, 0, 0]], np.int64)
  assert [b["tokens"].dtype for b in batches] == [np.int64, np.int64]
  np.testing.assert_array_equal(np.concatenate([b["tokens"] for b in batches]), expected)


def test_lengths_field_gives_the_token_mask():
  """A per-sequence metric from the lengths field: mean over sequences of the mean score per sequence."""
  tokens, scores, lengths = sequences(21, seed=3)
  rows = np.full((21, 15), np.nan, np.float32)  # a pipeline that padded to 15 with NaN
  for row, s in enumerate(scores):
    rows[row, : len(s)] = s
  batches = pe.pad_batches(
    {"scores": rows},
    8,
    pad_shapes={"scores": (MAX_LEN,)},
    pad_value=np.nan,
    length_keys={"scores": "length"},
  )

  def step_fn(params, batch):
    del params
    tokens = jnp.arange(MAX_LEN)[None, :] < batch["length"][:, None]
    per_row = jnp.where(tokens, batch["scores"], 0.0).sum(axis=1) / jnp.maximum(batch["length"], 1)
    return pe.metrics.Mean().batch_updates(values=per_row, mask=batch["mask"])

  result = pe.masked_eval(step_fn, None, batches, backend="jit")
  expected = np.mean([np.mean(s.astype(np.float64)) for s in scores])
  np.testing.assert_allclose(result["mean"], expected, rtol=1e-6)
  assert result["num_examples"] == 21


def test_columns_of_only_padding_beyond_the_size_are_dropped_and_others_raise():
  wide = np.zeros((3, 9), np.int32)
  wide[:, :4] = 7
  (batch,) = pe.pad_batches({"inputs": wide}, 4, num_devices=1, pad_shapes={"inputs": (5,)})
  assert batch["inputs"].shape == (4, 5) and (batch["inputs"][:3, :4] == 7).all()
  wide[1, 6] = 3  # row 1 is 7 long
  with pytest.raises(
    ValueError,
    match=r"^row 1 of the source has length 7 along axis 0 of key 'inputs', longer than "
    r"pad_shapes\['inputs'\] = \(5,\)",
  ):
    list(pe.pad_batches({"inputs": wide}, 4, num_devices=1, pad_shapes={"inputs": (5,)}))


def test_a_long_ragged_row_names_its_row_in_the_source():
  source = [{"x": [[1], [1, 2]]}, {"x": [[1, 2, 3], [1, 2, 3, 4, 5, 6]]}]
  with pytest.raises(
    ValueError, match=r"^row 3 of the source has length 6 along axis 0 of key 'x'"
  ):
    list(pe.pad_batches(source, 4, num_devices=1, pad_shapes={"x": (4,)}))


def test_several_axes_and_none_keeps_an_axis():
  source = [{"img": np.ones((2, 3, 5, 2))}, {"img": np.ones((1, 4, 5, 2))}]
  got = list(pe.pad_batches(source, 4, num_devices=1, pad_shapes={"img": (6, None, 2)}))
  assert got[0]["img"].shape == (4, 6, 5, 2)
  assert (
    got[0]["img"][:2, :3].all() and not got[0]["img"][:2, 3:].any() and got[0]["img"][2, :4].all()
  )


@pytest.mark.parametrize(
  "kwargs, match",
  [
    ({"pad_shapes": {"nope": (4,)}}, r"pad_shapes has key 'nope', which the source does not have"),
    ({"pad_shapes": {"x": (4, 4)}}, r"names 2 trailing axes, but the key's rows have shape \(3,\)"),
    ({"pad_shapes": {"x": (0,)}}, r"pad_shapes\['x'\] is \(0,\); expected a tuple of sizes >= 1"),
    ({"pad_shapes": [4]}, r"pad_shapes must be a dict"),
    (
      {"pad_shapes": {"x": (4,)}, "length_keys": {"y": "n"}},
      r"length_keys has key 'y', which pad_shapes does not pad",
    ),
    (
      {"pad_shapes": {"x": (4,)}, "length_keys": {"x": "mask"}},
      r"length_keys\['x'\] is 'mask'; expected a new top-level key",
    ),
    (
      {"pad_shapes": {"x": (4,)}, "length_keys": {"x": "y"}},
      r"length_keys\['x'\] is 'y', a key the source already has \(its values would be overwritten",
    ),
  ],
)
def test_bad_pad_shapes_raise(kwargs, match):
  data = {"x": np.ones((5, 3)), "y": np.ones(5)}
  with pytest.raises(ValueError, match=match):
    pe.pad_batches(data, 4, num_devices=1, **kwargs)


def test_a_lengths_key_equal_to_a_source_key_is_refused_for_every_source():
  """Issue 26: an iterable (or grain, Hugging Face) source has no spec before reading, and the lengths silently
  replaced its 'y' (the labels); now refused like index_key (grain and Hugging Face chunks take the same path)."""
  tf = pytest.importorskip("tensorflow")
  tokens, _, _ = sequences(11, seed=5)
  labels = np.arange(11) % 3
  sources = {
    "iterable": [{"inputs": tokens[:6], "y": labels[:6]}, {"inputs": tokens[6:], "y": labels[6:]}],
    "generator": (b for b in [{"inputs": tokens, "y": labels}]),
    "tf.data": tf.data.Dataset.from_tensor_slices({"inputs": np.zeros((11, 3)), "y": labels}),
  }
  match = r"length_keys\['inputs'\] is 'y', a key the source already has .*e.g. 'inputs_length'"
  options = dict(num_devices=1, pad_shapes={"inputs": (MAX_LEN,)}, length_keys={"inputs": "y"})
  for source in sources.values():
    with pytest.raises(ValueError, match=match):
      list(pe.pad_batches(source, 4, **options))


def test_unknown_key_in_batches_raises_when_read():
  with pytest.raises(
    ValueError, match=r"pad_shapes has key 'z', which the source's batches do not"
  ):
    list(pe.pad_batches([{"x": np.ones((2, 3))}], 4, num_devices=1, pad_shapes={"z": (4,)}))


def test_without_pad_shapes_a_new_length_points_to_pad_shapes():
  tokens, scores, _ = sequences(30, seed=4)
  dataset = tf_padded_batch_pipeline(tokens, scores, batch_size=8)
  source = list(dataset.as_numpy_iterator())
  with pytest.raises(
    ValueError, match=r"pe\.pad_batches\(\.\.\., pad_shapes=\{'inputs': \(\d+,\)\}"
  ):
    list(pe.pad_batches(source, 8, num_devices=1))


def test_masked_eval_error_for_a_new_length_points_to_pad_shapes():
  batches = [
    {"x": np.ones((8, 3), np.float32), "mask": np.ones(8, bool)},
    {"x": np.ones((8, 5), np.float32), "mask": np.ones(8, bool)},
  ]
  step = lambda p, b: pe.metrics.Mean().batch_updates(values=b["x"], mask=b["mask"])
  with pytest.raises(ValueError, match=r"pad_shapes=\{'x': \(5,\)\}"):
    pe.masked_eval(step, None, batches, backend="jit")


# --- batch_size=None ---------------------------------------------------------------------------------------------


def test_batch_size_none_takes_the_first_batch_rounded_up_to_the_devices():
  data = {"x": np.arange(23, dtype=np.float32)}
  source = [{"x": data["x"][a : a + 6]} for a in range(0, 23, 6)]  # 6, 6, 6, 5 rows
  batches = pe.pad_batches(source, None, num_devices=4)
  assert batches.batch_size == 8
  got = list(batches)
  assert len(got) == len(batches) == 3
  real = np.concatenate([b["x"][b["mask"]] for b in got])
  np.testing.assert_array_equal(real, data["x"])
  assert pe.pad_batches(source, None, num_devices=3).batch_size == 6


def test_batch_size_none_with_too_small_num_batches_names_the_batch_size_taken():
  # the message said "batch_size None"; 6 rows round up to 8 on 4 devices: 11 rows, 2 batches
  source = [{"x": np.arange(6)}, {"x": np.arange(5)}]
  with pytest.raises(
    ValueError, match=r"num_batches=1 but the source holds 2 batches of batch_size 8;"
  ):
    pe.pad_batches(source, None, num_devices=4, num_batches=1)


def test_batch_size_none_with_a_generator_keeps_its_first_batch():
  source = ({"x": np.full(5, i, np.float32)} for i in range(3))
  batches = pe.pad_batches(source, None, num_devices=1)
  assert batches.batch_size == 5
  assert [b["x"][0] for b in batches] == [0, 1, 2]


def test_batch_size_none_with_tf_data():
  tf = pytest.importorskip("tensorflow")
  dataset = tf.data.Dataset.from_tensor_slices({"x": np.arange(11.0)}).batch(4)
  batches = pe.pad_batches(dataset, None, num_devices=2)
  assert batches.batch_size == 4  # len() unknown: the static batch size is not
  got = np.concatenate([b["x"][b["mask"]] for b in batches])
  np.testing.assert_array_equal(got, np.arange(11.0))
  static = tf.data.Dataset.from_tensor_slices({"x": np.arange(12.0)}).batch(6, drop_remainder=True)
  assert pe.pad_batches(static, None, num_devices=4).batch_size == 8


def test_batch_size_none_evaluates_exactly():
  rng = np.random.default_rng(5)
  values = rng.normal(size=37).astype(np.float32)
  source = [{"v": values[a : a + 10]} for a in range(0, 37, 10)]
  step = lambda p, b: pe.metrics.Mean().batch_updates(values=b["v"], mask=b["mask"])
  result = pe.masked_eval(step, None, pe.pad_batches(source, None, pad_value=np.nan))
  np.testing.assert_allclose(result["mean"], values.astype(np.float64).mean(), rtol=1e-6)
  assert result["num_examples"] == 37


@pytest.mark.parametrize("kind", ["mapping", "tf_rows", "empty"])
def test_batch_size_none_needs_a_batched_source(kind):
  if kind == "mapping":
    source = {"x": np.zeros(4)}
  elif kind == "tf_rows":
    tf = pytest.importorskip("tensorflow")
    source = tf.data.Dataset.from_tensor_slices({"x": np.zeros(4)})
  else:
    source = []
  with pytest.raises(
    ValueError, match=r"batch_size=None takes the batch size of an already batched"
  ):
    pe.pad_batches(source, None, num_devices=1)


def test_device_count_is_read_for_batch_size_none():
  batches = pe.pad_batches([{"x": np.zeros(3)}], None)
  assert batches.batch_size == -(-3 // jax.local_device_count()) * jax.local_device_count()


def test_grain_rows_of_varying_lengths():
  grain = pytest.importorskip("grain")
  tokens, scores, _ = sequences(19, seed=6)
  rows = [{"inputs": t, "scores": s} for t, s in zip(tokens, scores)]
  dataset = grain.MapDataset.source(rows)
  batches = pe.pad_batches(
    dataset,
    8,
    pad_shapes={"inputs": (MAX_LEN,), "scores": (MAX_LEN,)},
    pad_value={"scores": np.nan},
  )
  assert len(batches) == 3
  traces = []
  result = pe.masked_eval(counting_step(traces), 2.0, batches, backend="jit")
  assert len(traces) == 1 and result["num_examples"] == 19
  np.testing.assert_allclose(result["mean"], reference_mean(scores), rtol=1e-6)

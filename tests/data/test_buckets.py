"""Length buckets: ``pad_batches(..., pad_shapes={"tokens": ([8, 16, 32],)})`` (issue 66).

Each batch's bucketed axis is cut to the smallest size that holds its longest row. Checked here against numpy
float64 references: every row once, results as with one fixed size (padded positions hold NaN, so a step that
read them unmasked would give NaN), one compilation per bucket shape (counted with JAX's compile event, as
tests/eval/test_compiling.py counts them), the bucket of every batch (a hypothesis property) and the errors.
"""

import functools

import _compiles
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import padded_eval as pe

compiles = _compiles.compiles  # the fixture (tests/_compiles.py)

BUCKETS = [8, 16, 32, 48]


def sentences(n, seed=0, longest=48):
  """``n`` rows: token ids in [1, 49] of lengths 1..`longest` (mostly short), per-token float scores."""
  rng = np.random.default_rng(seed)
  lengths = np.minimum(1 + rng.geometric(0.2, size=n), longest)
  tokens = [rng.integers(1, 50, size=k).astype(np.int32) for k in lengths]
  scores = [rng.normal(size=k).astype(np.float32) for k in lengths]
  return tokens, scores, lengths


TABLE = np.random.default_rng(7).normal(size=50).astype(np.float32)


def sentence_means(params, batch):
  """Per sentence: the mean over its real tokens of ``params[token] * score``; NaN padding masked first."""
  real = jnp.arange(batch["tokens"].shape[1])[None, :] < batch["length"][:, None]
  values = jnp.where(real, params[batch["tokens"]] * batch["scores"], 0.0)
  return jnp.sum(values, 1) / jnp.maximum(batch["length"], 1)


def step(params, batch, traces=None, outputs=False):
  if traces is not None:
    traces.append(batch["tokens"].shape[1])  # the width (pmap and shard_map see a device's rows)
  means = sentence_means(params, batch)
  metric = pe.metrics.Mean().batch_updates(values=means, mask=batch["mask"])
  return (metric, {"mean": means}) if outputs else metric


def reference(tokens, scores):
  """numpy float64: each sentence's mean of ``TABLE[token] * score``."""
  table = TABLE.astype(np.float64)
  return np.array([np.mean(table[t] * s.astype(np.float64)) for t, s in zip(tokens, scores)])


def padded(tokens, scores, batch_size, pad_shapes, **kwargs):
  return pe.pad_batches(
    [{"tokens": tokens, "scores": scores}],
    batch_size,
    pad_shapes={"tokens": pad_shapes, "scores": pad_shapes},
    length_keys={"tokens": "length"},
    pad_value={"tokens": 0, "scores": np.nan},
    **kwargs,
  )


@pytest.mark.parametrize("backend", ["jit", "pmap", "shard_map"])
def test_one_compilation_per_bucket_shape_and_results_as_one_fixed_size(backend, compiles):
  tokens, scores, _ = sentences(203, seed=1)
  want = reference(tokens, scores).mean()
  fixed, bucketed = padded(tokens, scores, 16, (48,)), padded(tokens, scores, 16, (BUCKETS,))
  shapes = {batch["tokens"].shape for batch in bucketed}
  assert len(shapes) >= 3 and {shape[1] for shape in shapes} <= set(BUCKETS)
  pe.masked_eval(functools.partial(step, outputs=False), TABLE, fixed, backend=backend)  # warm JAX
  traces = []  # a list in the partial: keyed by identity, so each partial compiles afresh
  one_shape = functools.partial(step, traces=traces, outputs=False)
  compiles[0] = 0
  result = pe.masked_eval(one_shape, TABLE, fixed, backend=backend)
  one_shape_compiles = compiles[0]
  np.testing.assert_allclose(result["mean"], want, rtol=1e-6)
  assert traces == [48]
  traces.clear()
  by_bucket = functools.partial(step, traces=traces, outputs=True)
  compiles[0] = 0
  result, per_row = pe.masked_eval(by_bucket, TABLE, bucketed, backend=backend, outputs=True)
  assert compiles[0] - one_shape_compiles == len(shapes) - 1  # one more step program per more shape
  assert sorted(traces) == sorted(width for _, width in shapes)  # one trace per bucket shape
  assert result["num_examples"] == len(tokens)
  np.testing.assert_allclose(result["mean"], want, rtol=1e-6)
  np.testing.assert_allclose(per_row["mean"], reference(tokens, scores), rtol=1e-5, atol=1e-6)
  compiles[0] = 0
  again, _ = pe.masked_eval(by_bucket, TABLE, bucketed, backend=backend, outputs=True)
  assert compiles[0] == 0 and again["mean"] == result["mean"]  # every bucket shape cached


def _tf_sentences(tokens, scores):
  tf = pytest.importorskip("tensorflow")
  spec = {"tokens": tf.TensorSpec([None], tf.int32), "scores": tf.TensorSpec([None], tf.float32)}
  rows = lambda: ({"tokens": t, "scores": s} for t, s in zip(tokens, scores))  # noqa: E731
  return tf.data.Dataset.from_generator(rows, output_signature=spec)


SOURCES = {  # (source of the rows, pad_batches' other arguments)
  "ragged lists": lambda t, s: ([{"tokens": t, "scores": s}], {}),
  "a Mapping of ragged lists": lambda t, s: ({"tokens": t, "scores": s}, {}),
  "batches of varying sizes": lambda t, s: (
    [
      {"tokens": t[i : i + k], "scores": s[i : i + k]}
      for i, k in zip((0, 5, 12, 40), (5, 7, 28, 21))
    ],
    {},
  ),
  "tf.data rows": lambda t, s: (_tf_sentences(t, s), {"batched": False}),
  "tf.data padded_batch": lambda t, s: (
    _tf_sentences(t, s).padded_batch(9, padding_values={"tokens": 0, "scores": np.nan}),
    {},
  ),
}


@pytest.mark.parametrize("source", list(SOURCES))
def test_every_row_once_in_order_whatever_the_source(source):
  tokens, scores, lengths = sentences(61, seed=2)
  rows, options = SOURCES[source](tokens, scores)
  batches = pe.pad_batches(
    rows,
    8,
    num_devices=1,
    pad_shapes={"tokens": (BUCKETS,), "scores": (BUCKETS,)},
    length_keys={"tokens": "length"},
    pad_value={"tokens": 0, "scores": np.nan},
    index_key="index",
    **options,
  )
  seen = list(batches)
  for batch in seen:
    real = batch["mask"]
    width = batch["tokens"].shape[1]
    assert batch["scores"].shape == batch["tokens"].shape  # one length: one bucket for both keys
    assert width == min(b for b in BUCKETS if b >= batch["length"][real].max())
    assert np.isnan(batch["scores"][real][np.arange(width) >= batch["length"][real][:, None]]).all()
  ids = np.concatenate([batch["index"][batch["mask"]] for batch in seen])
  np.testing.assert_array_equal(ids, np.arange(61))  # every row once, in source order
  got = [b["tokens"][i, : b["length"][i]] for b in seen for i in np.flatnonzero(b["mask"])]
  assert all(np.array_equal(g, t) for g, t in zip(got, tokens, strict=True))
  results, per_row = pe.masked_eval(
    functools.partial(step, outputs=True), TABLE, batches, backend="jit", outputs=True
  )
  np.testing.assert_allclose(per_row["mean"], reference(tokens, scores), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(results["mean"], reference(tokens, scores).mean(), rtol=1e-6)


def test_all_padding_batches_take_the_smallest_bucket():
  tokens, scores, _ = sentences(10, seed=3)
  batches = padded(tokens, scores, 8, (BUCKETS,), num_devices=1, num_batches=4)
  shapes = [batch["tokens"].shape for batch in batches]
  assert shapes[2:] == [(8, BUCKETS[0])] * 2
  result = pe.masked_eval(functools.partial(step, outputs=False), TABLE, batches, backend="jit")
  np.testing.assert_allclose(result["mean"], reference(tokens, scores).mean(), rtol=1e-6)
  assert result["num_examples"] == 10


def test_two_bucketed_axes_and_a_fixed_one():
  rng = np.random.default_rng(4)
  images = [rng.normal(size=(h, w, 2)).astype(np.float32) for h, w in rng.integers(1, 13, (9, 2))]
  batches = list(
    pe.pad_batches([{"img": images}], 3, num_devices=1, pad_shapes={"img": ([4, 12], [6, 12], 2)})
  )
  for batch, rows in zip(batches, (images[0:3], images[3:6], images[6:9]), strict=True):
    height = max(row.shape[0] for row in rows)
    width = max(row.shape[1] for row in rows)
    assert batch["img"].shape == (3, 4 if height <= 4 else 12, 6 if width <= 6 else 12, 2)
    for index, row in enumerate(rows):
      np.testing.assert_array_equal(batch["img"][index, : row.shape[0], : row.shape[1]], row)


@settings(max_examples=60, deadline=None)
@given(
  lengths=st.lists(st.integers(1, 40), min_size=1, max_size=40),
  batch_size=st.integers(1, 9),
  buckets=st.lists(st.integers(1, 40), min_size=1, max_size=4, unique=True).map(sorted),
)
def test_each_batch_takes_the_smallest_bucket_holding_its_longest_row(lengths, batch_size, buckets):
  buckets = sorted(set(buckets) | {40})  # the last holds every row
  rows = [np.arange(1, n + 1, dtype=np.int32) for n in lengths]
  batches = list(
    pe.pad_batches(
      [{"ids": rows}],
      batch_size,
      num_devices=1,
      pad_shapes={"ids": (buckets,)},
      length_keys={"ids": "n"},
    )
  )
  assert len(batches) == -(-len(rows) // batch_size)
  start = 0
  for batch in batches:
    real = int(batch["mask"].sum())
    longest = max(lengths[start : start + real])
    assert batch["ids"].shape == (batch_size, min(b for b in buckets if b >= longest))
    for index in range(real):
      n = lengths[start + index]
      assert batch["n"][index] == n and (batch["ids"][index, :n] == rows[start + index]).all()
      assert not batch["ids"][index, n:].any()  # the pad value, 0
    start += real
  assert start == len(rows)


BAD = [
  (([],), r"pad_shapes\['tokens'\] has buckets \[\] for its axis 0; expected a non-empty list"),
  (([16, 8],), r"buckets \[16, 8\] .*distinct sizes >= 1 in ascending order"),
  (([8, 8],), r"buckets \[8, 8\] .*distinct sizes >= 1 in ascending order"),
  (([0, 8],), r"buckets \[0, 8\]"),
  (([2.5],), r"buckets \[2.5\]"),
  (
    ({8, 16},),
    r"pad_shapes\['tokens'\] is \(\{8, 16\},\); expected a tuple of sizes >= 1 .*list of sizes",
  ),
  (
    [8, 16, 32],
    r"at least 3 .*length buckets of one axis are a list inside the tuple: \(\[8, 16, 32\],\)",
  ),
]


@pytest.mark.parametrize("sizes, match", BAD)
def test_bad_buckets_raise_naming_pad_shapes(sizes, match):
  tokens, _, _ = sentences(5)
  with pytest.raises(ValueError, match=match):
    list(pe.pad_batches([{"tokens": tokens}], 4, num_devices=1, pad_shapes={"tokens": sizes}))


def test_a_row_longer_than_the_last_bucket_names_it():
  rows = [np.ones(3, np.int32), np.ones(20, np.int32)]
  with pytest.raises(
    ValueError,
    match=r"row 1 of the source has length 20 along axis 0 of key 'tokens', longer than "
    r"pad_shapes\['tokens'\] = \(\[4, 16\],\); .*a larger last one",
  ):
    list(pe.pad_batches([{"tokens": rows}], 4, num_devices=1, pad_shapes={"tokens": ([4, 16],)}))


def test_checkpoint_dir_refuses_buckets(tmp_path):
  tokens, scores, _ = sentences(20)
  with pytest.raises(
    ValueError, match=r"length buckets .*with checkpoint_dir every batch must have one"
  ):
    pe.masked_eval(
      functools.partial(step, outputs=False),
      TABLE,
      padded(tokens, scores, 8, (BUCKETS,)),
      backend="jit",
      checkpoint_dir=tmp_path / "run",
    )


def test_other_shape_changes_are_still_refused():
  from padded_eval.data._batch_spec import checked_batches

  tokens, _, _ = sentences(40)
  batches = list(
    pe.pad_batches([{"tokens": tokens}], 8, num_devices=1, pad_shapes={"tokens": (BUCKETS,)})
  )
  batches.sort(key=lambda batch: batch["tokens"].shape[1])
  batches = [batches[0], batches[-1]]
  assert batches[0]["tokens"].shape != batches[1]["tokens"].shape
  varying = {("tokens",): (-1,)}
  assert len(list(checked_batches(iter(batches), "mask", 1, varying=varying))) == 2
  with pytest.raises(
    ValueError, match=r"batch 1: key 'tokens' has shape"
  ):  # without buckets: refused
    list(checked_batches(iter(batches), "mask", 1))
  batches[0] = dict(batches[0], extra=np.zeros((8, 2)))
  batches[1] = dict(batches[1], extra=np.zeros((8, 3)))
  with pytest.raises(
    ValueError, match=r"batch 1: key 'extra' has shape \(8, 3\); expected \[8, 2\]"
  ):
    list(checked_batches(iter(batches), "mask", 1, varying=varying))

"""pad_batches over tf.data and a real tfds dataset (scikit-learn digits, built offline), and the
TfDataSource of padded_eval/data/sources/tf_data.py read directly."""

import subprocess
import sys

import _source_rows
import numpy as np
import pytest
from _padding_reference import assert_batches_equal, expected_batches

import padded_eval as pe
from padded_eval.data._batch_spec import LeafSpec
from padded_eval.data.sources.base import Padding, SourceOptions

tf = pytest.importorskip(
  "tensorflow", reason="the tf extra is not installed: pip install -e '.[tf,test]'"
)
tfds = pytest.importorskip("tensorflow_datasets", reason="the tf extra is not installed")


def dataset(n, seed=0):
  rng = np.random.default_rng(seed)
  return {
    "x": rng.normal(size=(n, 2)).astype(np.float32),
    "label": rng.integers(0, 10, n).astype(np.int64),
  }


def slices(data):
  return tf.data.Dataset.from_tensor_slices(data)


@pytest.mark.parametrize("n, batch_size", [(0, 8), (3, 8), (8, 8), (21, 8)])
def test_unbatched(n, batch_size):
  data = dataset(n)
  got = pe.pad_batches(slices(data), batch_size, pad_value={"x": np.nan, "label": -1})
  assert len(got) == -(-n // batch_size)
  assert_batches_equal(got, expected_batches(data, batch_size, pad={"x": np.nan, "label": -1}))


@pytest.mark.parametrize("input_batch", [3, 8])
def test_batched_is_rebatched(input_batch):
  data = dataset(37)
  got = pe.pad_batches(slices(data).batch(input_batch), 8)
  assert_batches_equal(got, expected_batches(data, 8))
  with pytest.raises(TypeError, match="unknown"):
    len(got)


@pytest.mark.parametrize("n", [0, 5, 16, 37])
@pytest.mark.parametrize("padded", [False, True])
def test_batches_of_the_asked_size_are_padded_on_the_host_without_a_tf_map(n, padded, monkeypatch):
  """``ds.batch(8)`` / ``padded_batch(8)`` at batch size 8: read as it is, the short batch padded in
  numpy (no rebatch, no padding map to trace for each new pipeline); the same batches as the reference,
  row ids included."""
  data = dataset(n, seed=n)
  source = slices(data)
  source = source.padded_batch(8) if padded else source.batch(8)
  built = []
  real_rebatch = tf.data.Dataset.rebatch
  monkeypatch.setattr(
    tf.data.Dataset, "rebatch", lambda *a, **k: built.append(1) or real_rebatch(*a, **k)
  )
  pad = {"x": np.nan, "label": -7}
  got = list(pe.pad_batches(source, 8, pad_value=pad, index_key="row"))
  for number, batch in enumerate(got):
    ids = np.arange(number * 8, number * 8 + 8)
    np.testing.assert_array_equal(batch.pop("row"), np.where(ids < n, ids, -1))
  assert_batches_equal(got, expected_batches(data, 8, pad=pad))
  assert built == []
  # another size goes through the graph: rebatched there
  assert_batches_equal(
    pe.pad_batches(source, 16, pad_value=pad), expected_batches(data, 16, pad=pad)
  )
  assert built == [1]


def test_batches_of_the_asked_size_whose_keys_disagree_name_them():
  source = slices(dataset(12)).batch(8).map(lambda b: {"x": b["x"], "label": b["label"][:2]})
  with pytest.raises(
    ValueError,
    match=r"leading sizes disagree within a batch: key 'label' has 2 rows, key 'x' has 8",
  ):
    list(pe.pad_batches(source, 8))


def test_drop_remainder_that_drops_nothing_is_read_whole():
  data = dataset(40)
  pad = {"x": np.nan, "label": -1}
  got = pe.pad_batches(slices(data).batch(5, drop_remainder=True), 16, pad_value=pad)
  assert len(got) == 3  # static input batch size and known cardinality: the length is known
  assert_batches_equal(got, expected_batches(data, 16, pad=pad))


@pytest.mark.parametrize(
  "pipeline, match",
  [  # issue 26: each of these used to lose rows silently, repeat them, or run forever
    (
      lambda ds: ds.batch(16, drop_remainder=True),
      r"drop_remainder=True.*: 11 of 203 rows in batches of 16",
    ),
    (lambda ds: ds.padded_batch(16, drop_remainder=True), r"drop_remainder=True.*11 of 203 rows"),
    (
      lambda ds: ds.batch(16, drop_remainder=True).map(lambda e: e).prefetch(2),
      "drop_remainder=True",
    ),
    (lambda ds: ds.batch(16, drop_remainder=True).unbatch(), "drop_remainder=True"),
    (
      lambda ds: ds.filter(lambda e: e["label"] >= 0).batch(8, drop_remainder=True),
      r"up to 7 rows",
    ),
    (lambda ds: ds.batch(10).rebatch(16, drop_remainder=True), "drop_remainder=True"),
    (  # a batch inside a dataset function: before, each group's short batch was lost silently
      lambda ds: ds.bucket_by_sequence_length(
        lambda e: tf.cast(e["label"] % 3 + 1, tf.int32), [2, 3], [4, 4, 4], drop_remainder=True
      ),
      r"drop_remainder=True inside the function of its GroupByWindowDataset",
    ),
    (
      lambda ds: ds.group_by_window(
        lambda e: e["label"] % 2, lambda _, w: w.batch(3, drop_remainder=True), window_size=3
      ),
      "drop_remainder=True inside the function",
    ),
    (
      lambda ds: ds.flat_map(
        lambda e: tf.data.Dataset.from_tensors(e).batch(2, drop_remainder=True)
      ),
      r"inside the function of its FlatMapDataset",
    ),
    (
      lambda ds: ds.interleave(
        lambda e: tf.data.Dataset.from_tensors(e).padded_batch(2, drop_remainder=True)
      ),
      r"inside the function of its InterleaveDataset",
    ),
    (lambda ds: ds.repeat(), r"infinite \(its cardinality is tf.data.INFINITE_CARDINALITY"),
    (lambda ds: ds.batch(16).repeat(), "infinite"),
    (lambda ds: ds.filter(lambda e: e["label"] >= 0).repeat(), "infinite"),
    (  # unknown cardinality: how often the rows are read is not known
      lambda ds: ds.filter(lambda e: e["label"] >= 0).repeat(2),
      r"repeats its rows 2 times \(.repeat\(2\)\), so rows would not count exactly once",
    ),
    (
      lambda ds: tf.data.Dataset.zip({"a": ds.filter(lambda e: e["label"] >= 0).repeat(3)}),
      r"repeats its rows 3 times",
    ),
  ],
)
@pytest.mark.parametrize("batch_size", [64, None])
def test_pipelines_that_drop_repeat_or_never_end_are_refused(pipeline, match, batch_size):
  with pytest.raises(ValueError, match=match):
    pe.pad_batches(pipeline(slices(dataset(203))), batch_size, num_devices=8)


@pytest.mark.parametrize(
  "pipeline, batched",
  [
    (lambda ds: ds.batch(4).flat_map(tf.data.Dataset.from_tensor_slices), False),  # unbatches
    (lambda ds: ds.interleave(lambda e: tf.data.Dataset.from_tensors(e), cycle_length=2), False),
    (lambda ds: ds.group_by_window(lambda e: e["label"] % 2, lambda _, w: w.batch(3), 3), True),
    (
      lambda ds: ds.bucket_by_sequence_length(
        lambda e: tf.cast(e["label"] % 3, tf.int32), [2], [4, 4]
      ),
      True,
    ),
  ],
)
def test_rows_or_batches_are_read_from_a_dataset_functions_output(pipeline, batched):
  """Whether elements are batches is read from the function of a flat_map / interleave /
  group_by_window, not from a batch before it: before, ``ds.batch(4).flat_map(from_tensor_slices)``
  (rows) was read as batches, and 10 rows counted 20. Every row once, against numpy."""
  data = dataset(37)
  got = pe.pad_batches(pipeline(slices(data)), 8, pad_value={"x": np.nan, "label": -1})
  rows = np.concatenate([b["x"][b["mask"]] for b in got])
  assert rows.shape == data["x"].shape
  order = np.lexsort(rows.T), np.lexsort(data["x"].T)
  np.testing.assert_array_equal(rows[order[0]], data["x"][order[1]])
  from padded_eval.data.sources import tf_pipeline

  dataset_ = pipeline(slices(data))
  assert (
    tf_pipeline.infer_batched(dataset_, dict(zip("ab", [dataset_.element_spec["x"]]))) is batched
  )


def test_ragged_rows_name_the_key_and_suggest_pad_shapes():  # issue 26: tf.data's message named no key
  def rows():
    for i in range(10):
      yield {"y": np.int32(i), "g": {"tokens": np.arange(i % 3 + 1, dtype=np.int32)}}

  spec = {"y": tf.TensorSpec([], tf.int32), "g": {"tokens": tf.TensorSpec([None], tf.int32)}}
  source = tf.data.Dataset.from_generator(rows, output_signature=spec)
  with pytest.raises(
    ValueError,
    match=r"^key 'g/tokens' holds ragged rows \(rows 0 and 1 of a batch have shapes \[1\] and \[2\]\).*"
    r"pad_shapes=\{'g': \{'tokens': \(2,\)\}\}",
  ):
    list(pe.pad_batches(source, 4, num_devices=1))
  padded = pe.pad_batches(
    source, 4, num_devices=1, pad_shapes={"g": {"tokens": (3,)}}, pad_value=-1
  )
  tokens = np.concatenate([b["g"]["tokens"][b["mask"]] for b in padded])
  np.testing.assert_array_equal(tokens, [[0, -1, -1], [0, 1, -1], [0, 1, 2]] * 3 + [[0, -1, -1]])


def test_repeat_once_reads_every_row_once():  # gemma's grain pipeline calls .repeat(1); tf.data alike
  data = dataset(203)
  pad = {"x": np.nan, "label": -1}
  for source in (slices(data).repeat(1), slices(data).batch(16).repeat(1)):
    got = pe.pad_batches(source, 64, num_devices=8, pad_value=pad)
    assert_batches_equal(got, expected_batches(data, 64, pad=pad))


FINITE_REPEATS = {  # a pipeline of finite cardinality that reads some rows more than once
  "repeat(2)": (lambda ds: ds.repeat(2), "2 times"),
  "repeat().take(45)": (lambda ds: ds.repeat().take(45), "forever .* and a take bounds it"),
  "take(3).repeat(3)": (lambda ds: ds.take(3).repeat(3), "3 times"),
  "batch(4).repeat(2)": (lambda ds: ds.batch(4).repeat(2), "2 times"),
  "repeat().batch(4, drop_remainder=True).take(7)": (
    lambda ds: ds.repeat().batch(4, drop_remainder=True).take(7),
    "forever",
  ),
  "zip(repeat(2))": (lambda ds: tf.data.Dataset.zip(ds.repeat(2)), "2 times"),
  "filter().repeat().take(7)": (
    lambda ds: ds.filter(lambda e: e["label"] % 2 == 0).repeat().take(7),
    "forever",
  ),
}


@pytest.mark.parametrize("name", FINITE_REPEATS)
@pytest.mark.parametrize("batch_size", [4, None])
def test_repeats_of_finite_cardinality_are_refused(name, batch_size):
  """Issue 65: ``ds.repeat(2)`` (finite cardinality) was read as it is and counted every row twice;
  a repeat other than ``.repeat(1)`` is now refused when wrapped, whatever the cardinality, with a
  message naming the repeat and the fix."""
  pipeline, times = FINITE_REPEATS[name]
  with pytest.raises(
    ValueError,
    match=rf"repeats its rows {times}.*, so rows would not count exactly once .*without \.repeat\(\)",
  ):
    pe.pad_batches(pipeline(slices(dataset(17))), batch_size, num_devices=1, pad_value=-1)


def test_a_finite_repeat_into_masked_eval_is_refused_before_a_row_counts_twice():
  """The issue's case: ``.repeat(2)`` over 1,797 rows gave num_examples 3,594 and a mean over every
  row twice; now pad_batches refuses it, and the pipeline without the repeat matches numpy."""
  rng = np.random.default_rng(65)
  data = {"x": rng.standard_normal(1797).astype(np.float32), "label": rng.integers(0, 10, 1797)}

  def step(params, batch):
    return pe.metrics.Mean("x").batch_updates(x=batch["x"], mask=batch["mask"])

  with pytest.raises(ValueError, match=r"repeats its rows 2 times \(\.repeat\(2\)\)"):
    pe.masked_eval(step, None, pe.pad_batches(slices(data).repeat(2), 64), backend="jit")
  got = pe.masked_eval(
    step,
    None,
    pe.pad_batches(slices(data), 64, pad_value={"x": np.nan, "label": -1}),
    backend="jit",
  )
  assert got["num_examples"] == 1797
  np.testing.assert_allclose(got["mean"], data["x"].astype(np.float64).mean(), rtol=1e-5, atol=1e-7)


def test_filtered_unknown_cardinality():
  data = dataset(30)
  source = slices(data).filter(lambda e: e["label"] % 2 == 0)
  keep = data["label"] % 2 == 0
  got = pe.pad_batches(source, 8)
  with pytest.raises(TypeError, match="unknown"):
    len(got)
  assert_batches_equal(got, expected_batches({k: v[keep] for k, v in data.items()}, 8))
  assert_batches_equal(
    got, expected_batches({k: v[keep] for k, v in data.items()}, 8)
  )  # re-iteration
  with pytest.raises(ValueError, match="more than num_batches=1"):
    list(pe.pad_batches(source.batch(3), 8, num_batches=1))


def test_nested_dicts_and_strings():
  data = {
    "a": {"x": np.arange(5.0), "s": np.array([b"p", b"q", b"r", b"s", b"t"])},
    "y": np.arange(5),
  }
  got = list(pe.pad_batches(slices(data).batch(2), 8, pad_value=7))
  assert len(got) == 1 and sorted(got[0]) == ["a", "mask", "y"]
  assert got[0]["a"]["s"].tolist() == [b"p", b"q", b"r", b"s", b"t", b"", b"", b""]
  assert got[0]["a"]["x"].tolist() == [0, 1, 2, 3, 4, 7, 7, 7]
  assert got[0]["mask"].tolist() == [True] * 5 + [False] * 3


def test_num_batches():
  data = dataset(10)
  got = pe.pad_batches(slices(data), 8, num_batches=3, pad_value=-1)
  assert len(got) == 3
  assert_batches_equal(got, expected_batches(data, 8, pad=-1, num_batches=3))
  with pytest.raises(ValueError, match="num_batches=1 but the source holds 2 batches"):
    pe.pad_batches(slices(data), 8, num_batches=1)
  empty = slices(dataset(0))
  assert list(pe.pad_batches(empty, 8)) == []
  assert_batches_equal(
    pe.pad_batches(empty, 8, num_batches=2), expected_batches(dataset(0), 8, num_batches=2)
  )
  unknown = slices(dataset(0)).batch(4)  # empty, and its rows' shapes are known from the spec
  assert [b["x"].shape for b in pe.pad_batches(unknown, 8, num_batches=1)] == [(8, 2)]


def test_batched_inference_and_override():
  vectors = slices(
    {"v": np.arange(24).reshape(8, 3)}
  )  # unbatched, no scalar leaf, static leading size
  assert [b["v"].shape for b in pe.pad_batches(vectors, 8)] == [(8, 3)]
  static = vectors.batch(4, drop_remainder=True).map(lambda e: e)  # batch op found behind the map
  assert [b["v"].shape for b in pe.pad_batches(static, 8)] == [(8, 3)]
  as_rows = pe.pad_batches(vectors, 8, batched=True)  # each element is a batch of 3 scalars
  assert [b["v"].shape for b in as_rows] == [(8,)] * 3


def test_bad_datasets():
  with pytest.raises(
    ValueError, match=r"expected a tf.data.Dataset of dicts, got elements of type tuple"
  ):
    pe.pad_batches(tf.data.Dataset.from_tensor_slices((np.zeros(4), np.zeros(4))), 8)
  with pytest.raises(ValueError, match=r"the dataset has a key 'mask' equal to mask_key"):
    pe.pad_batches(slices({"mask": np.zeros(4)}), 8)
  with pytest.raises(ValueError, match=r"pad_value nan for key 'label' does not fit dtype int64"):
    list(pe.pad_batches(slices(dataset(3)), 8, pad_value=np.nan))
  with pytest.raises(
    ValueError, match="batch_size 12 is not divisible by 8 devices; use a multiple, e.g. 8 or 16"
  ):
    pe.pad_batches(slices(dataset(3)), 12)

  def disagreeing():
    yield {"x": np.zeros(3), "g": {"yy": np.zeros(2)}}

  signature = {
    "x": tf.TensorSpec([None], tf.float64),
    "g": {"yy": tf.TensorSpec([None], tf.float64)},
  }
  source = tf.data.Dataset.from_generator(disagreeing, output_signature=signature)
  with pytest.raises(
    ValueError, match=r"leading sizes disagree within a batch: key 'g/yy' has 2 rows, key 'x' has 3"
  ):
    list(pe.pad_batches(source, 8))
  static = tf.data.Dataset.from_tensors({"x": np.zeros(3), "y": np.zeros(2)})
  with pytest.raises(
    ValueError, match=r"leading sizes disagree in the dataset's batches \('x' has 3, 'y' has 2\)"
  ):
    pe.pad_batches(static, 8, batched=True)


# ---- a real tfds dataset ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory):
  from padded_eval.demo.datasets import load_digits_tfds

  data_dir = str(tmp_path_factory.mktemp("tfds"))
  load_digits_tfds(data_dir, "test")  # builds both splits once
  return data_dir


def digits_expectation(split):
  from sklearn.datasets import load_digits

  from padded_eval.demo.datasets import digits_split_indices

  digits = load_digits()
  rows = digits_split_indices(split)
  return {
    "image": digits.images[rows].astype(np.uint8),
    "index": rows.astype(np.int64),
    "label": digits.target[rows].astype(np.int64),
  }


@pytest.mark.parametrize("as_dataset_kwargs", [{}, {"batch_size": 50}])
def test_tfds_digits_test_split(digits_dir, as_dataset_kwargs):
  from padded_eval.demo.datasets import DigitsBuilder, load_digits_tfds

  source = load_digits_tfds(digits_dir, "test", **as_dataset_kwargs)
  builder = DigitsBuilder(data_dir=digits_dir)
  assert (
    builder.info.splits["test"].num_examples == 360
    and builder.info.splits["train"].num_examples == 1437
  )
  got = pe.pad_batches(source, 64, pad_value={"label": -1})
  want = expected_batches(digits_expectation("test"), 64, pad={"image": 0, "index": 0, "label": -1})
  assert len(want) == 6 and want[-1]["mask"].sum() == 360 - 5 * 64
  assert_batches_equal(got, want)
  if not as_dataset_kwargs:
    assert len(got) == 6


def test_tfds_train_split_with_num_batches(digits_dir):
  from padded_eval.demo.datasets import load_digits_tfds

  source = tfds.as_numpy(
    load_digits_tfds(digits_dir, "train", batch_size=100)
  )  # a plain iterable of numpy
  got = pe.pad_batches(source, 512, num_batches=4)
  assert_batches_equal(got, expected_batches(digits_expectation("train"), 512, num_batches=4))


# --- what pad_batches keeps per dataset (issue 33: sst2's batch_size=None opened the pipeline twice per eval) ---


def opened_counter(batch_sizes):
  """A batched pipeline of unknown leading size (``from_generator``) that counts how often it is opened."""
  opened = []

  def generate():
    opened.append(1)
    start = 0
    for size in batch_sizes:
      yield {"x": np.arange(start, start + size, dtype=np.float32)}
      start += size

  signature = {"x": tf.TensorSpec((None,), tf.float32)}
  return tf.data.Dataset.from_generator(generate, output_signature=signature), opened


def test_batch_size_none_reads_the_first_batch_once_per_dataset():
  source, opened = opened_counter([5, 5, 3])
  for _ in range(3):
    batches = pe.pad_batches(source, None, num_devices=2)
    assert batches.batch_size == 6
    got = np.concatenate([b["x"][b["mask"]] for b in batches])
    np.testing.assert_array_equal(got, np.arange(13.0))
  assert (
    len(opened) == 1 + 3
  )  # the first batch read once, then one pass per evaluation (was 2 per evaluation)
  pe.clear_caches()  # drops what was kept: the first batch is read again
  assert pe.pad_batches(source, None, num_devices=2).batch_size == 6
  assert len(opened) == 5


def test_the_padding_pipeline_is_built_once_per_dataset_with_keys_too(monkeypatch):
  from padded_eval.data.sources import tf_data

  built = []
  make = tf_data._make_pad_fn
  monkeypatch.setattr(tf_data, "_make_pad_fn", lambda *a: built.append(1) or make(*a))
  data = dataset(21)
  pairs = tf.data.Dataset.from_tensor_slices((data["x"], data["label"]))
  for _ in range(3):
    got = pe.pad_batches(pairs, 8, keys=("x", "label"), pad_value={"x": np.nan, "label": -1})
    assert_batches_equal(got, expected_batches(data, 8, pad={"x": np.nan, "label": -1}))
  assert len(built) == 1  # was 3: the tuples were named by a new map each time, missing the cache
  pe.clear_caches()
  list(pe.pad_batches(pairs, 8, keys=("x", "label")))
  assert len(built) == 2


def test_a_dataset_is_not_kept_alive_by_what_pad_batches_built():
  import gc
  import threading
  import weakref

  source = slices(dataset(21)).batch(5)
  list(pe.pad_batches(source, 8))
  list(pe.pad_batches(source, None, num_devices=1))
  alive = weakref.ref(source)
  del source
  for thread in threading.enumerate():  # the exhausted iterators, released on threads of their own
    if thread.name == "padded_eval-release-tf-iterator":
      thread.join()
  gc.collect()
  assert (
    alive() is None
  )  # the weakly keyed table kept every dataset alive through its own pipelines


def _rows_of_lengths(lengths):
  rows = [{"tokens": np.arange(length, dtype=np.int32)} for length in lengths]
  spec = {"tokens": tf.TensorSpec([None], tf.int32)}
  return tf.data.Dataset.from_generator(lambda: iter(rows), output_signature=spec)


@pytest.mark.parametrize(
  "pipeline, batch_size",
  [
    (lambda ds: ds, 2),  # unbatched rows: lengths 2, 2 | 1, 1 (each batch one shape)
    (lambda ds: ds.padded_batch(2), 2),  # each batch padded to its longest row, passed through
    (lambda ds: ds.padded_batch(2), 1),  # ... split by rebatch
    (lambda ds: ds.padded_batch(2), 4),  # ... joined by rebatch (was tf's FailedPreconditionError)
  ],
)
def test_row_lengths_that_vary_between_batches_are_refused(pipeline, batch_size):
  # these gave batches of different shapes (the step compiles again, and the batches of a pass
  # disagree), or a TensorFlow error; the rows vary across batches, so tf.data's ragged check
  # within a batch never saw them
  source = pipeline(_rows_of_lengths([2, 2, 1, 1]))
  batched = None if source.element_spec["tokens"].shape.rank == 2 else False
  with pytest.raises(ValueError, match=r"key 'tokens' has shape .*pad_shapes=\{'tokens': \(2,\)\}"):
    list(pe.pad_batches(source, batch_size, num_devices=1, batched=batched))
  padded = pe.pad_batches(
    source, batch_size, num_devices=1, batched=batched, pad_shapes={"tokens": (2,)}
  )
  tokens = np.concatenate([b["tokens"][b["mask"]] for b in padded])
  np.testing.assert_array_equal(tokens, [[0, 1], [0, 1], [0, 0], [0, 0]])


def test_batched_true_with_a_scalar_leaf_is_a_value_error():  # was an IndexError
  with pytest.raises(ValueError, match=r"batched=True.*key 'x' is a scalar"):
    pe.pad_batches(slices({"x": np.arange(3)}), 2, num_devices=1, batched=True)


@pytest.mark.parametrize(
  "element, match",
  [  # were an AttributeError ('tuple' object has no attribute 'shape') and TensorFlow's TypeError
    ({"t": (np.arange(3), np.arange(3))}, r"key 't' holds a tuple; expected a tensor"),
    (
      {"g": {"t": tf.sparse.from_dense(np.eye(3))}},
      r"key 'g/t' holds a SparseTensorSpec; expected a tensor",
    ),
  ],
)
def test_fields_that_are_not_tensors_are_refused_naming_the_key(element, match):
  with pytest.raises(ValueError, match=match):
    pe.pad_batches(tf.data.Dataset.from_tensor_slices(element), 2, num_devices=1)


@pytest.mark.parametrize("batch", [None, 2])
def test_ragged_tensor_rows_are_refused_without_pad_shapes_and_padded_with_them(batch):
  # unbatched: tf.pad's TypeError (no pad_shapes) and padded_batch's (pad_shapes); batched: object
  # arrays of rows came out unpadded, or a message about shape (1, 1)
  rows = [[1], [2, 3], [4]]
  source = tf.data.Dataset.from_tensor_slices({"t": tf.ragged.constant(rows)})
  source = source if batch is None else source.batch(batch)
  with pytest.raises(ValueError, match=r"key 't' holds ragged rows .*pad_shapes=\{'t': \(2,\)\}"):
    list(pe.pad_batches(source, 2, num_devices=1, batched=batch is not None))
  padded = pe.pad_batches(
    source, 2, num_devices=1, batched=batch is not None, pad_shapes={"t": (3,)}, pad_value=-1
  )
  tokens = np.concatenate([b["t"][b["mask"]] for b in padded])
  np.testing.assert_array_equal(tokens, [[1, -1, -1], [2, 3, -1], [4, -1, -1]])


def test_rows_of_unknown_length_taken_as_batches_name_batched_false():
  """``from_generator`` rows of spec ``[None]`` are taken as batches (an unknown leading size, the
  documented rule); where that guess shows as an error, the message names ``batched=False``, and with
  it the rows are numpy's rows exactly."""
  lengths = [1, 3, 2, 3, 1]

  def rows():
    for i, n in enumerate(lengths):
      yield {"tokens": np.arange(1, n + 1, dtype=np.int32), "w": np.full(2, i, np.float32)}

  spec = {"tokens": tf.TensorSpec([None], tf.int32), "w": tf.TensorSpec([None], tf.float32)}
  source = tf.data.Dataset.from_generator(rows, output_signature=spec)
  guess = r"taken as batches \(key 'tokens' has an unknown leading size\).*batched=False"
  with pytest.raises(
    ValueError, match=r"^pad_shapes\['tokens'\] = \(3,\) names 1 trailing axes.*" + guess
  ):
    pe.pad_batches(source, 4, num_devices=1, pad_shapes={"tokens": (3,)})
  with pytest.raises(ValueError, match=r"^leading sizes disagree within a batch.*" + guess):
    list(pe.pad_batches(source, 4, num_devices=1))  # rebatched in the graph
  matrices = source.map(  # a trailing size unknown (tf.reshape): padded on the host
    lambda e: {"tokens": e["tokens"], "w": tf.reshape(e["w"], [2, -1])}
  )
  with pytest.raises(ValueError, match=r"^leading sizes disagree within a batch.*" + guess):
    list(pe.pad_batches(matrices, 4, num_devices=1))
  got = pe.pad_batches(source, 4, num_devices=1, pad_shapes={"tokens": (3,)}, batched=False)
  want = {
    "tokens": np.array([[1, 0, 0], [1, 2, 3], [1, 2, 0], [1, 2, 3], [1, 0, 0]], np.int32),
    "w": np.repeat(np.arange(5, dtype=np.float32)[:, None], 2, axis=1),
  }
  assert_batches_equal(got, expected_batches(want, 4))


# ---- the TfDataSource, read directly --------------------------------------------------------------------------


def test_tf_data_source():
  tf = pytest.importorskip("tensorflow", reason="the tf extra is not installed")
  from padded_eval.data.sources.tf_data import TfDataSource

  data = _source_rows.dataset(10)
  unbatched = tf.data.Dataset.from_tensor_slices(data)
  assert (
    TfDataSource.accepts(unbatched)
    and not TfDataSource.accepts(data)
    and not TfDataSource.accepts(_source_rows.split(data, [10]))
  )
  for dataset_, rows, chunk_rows in (
    (unbatched, 10, [10]),
    (unbatched.take(8).batch(4, drop_remainder=True), 8, [4, 4]),  # drops nothing
    (unbatched.batch(3), None, [3, 3, 3, 1]),
  ):
    source = TfDataSource(dataset_, SourceOptions("mask"))
    assert source.num_rows() == rows
    chunks = list(source.chunks())
    assert [n for _, n in chunks] == chunk_rows
    kept = sum(chunk_rows)
    _source_rows.assert_same_rows(
      _source_rows.concatenated(chunks),
      {"x": data["x"][:kept], "y": {"id": data["y"]["id"][:kept]}},
    )
    assert source.spec.leaves[("x",)] == LeafSpec((2,), np.dtype(np.float32))
  ragged = TfDataSource(
    unbatched.padded_batch(4, padded_shapes={"x": [None], "y": {"id": []}}), SourceOptions("m")
  )
  assert ragged.spec.leaves[("x",)].shape == (None,) and ragged.spec.has_unknown_sizes


def test_tf_data_source_pads_in_the_graph_and_returns_the_real_spec():
  tf = pytest.importorskip("tensorflow", reason="the tf extra is not installed")
  from padded_eval.data.sources.tf_data import TfDataSource

  data = _source_rows.dataset(6)
  source = TfDataSource(
    tf.data.Dataset.from_tensor_slices(data).padded_batch(4, {"x": [None], "y": {"id": []}}),
    SourceOptions("mask"),
  )
  padded = source.padded(Padding(4, "mask", -1))
  got = []
  while True:
    try:
      got.append(next(padded))
    except StopIteration as end:
      row_spec = end.value
      break
  assert [b[("mask",)].tolist() for b in got] == [[True] * 4, [True, True, False, False]]
  assert got[1][("y", "id")].tolist() == [4, 5, -1, -1]
  assert row_spec.leaves[("x",)] == LeafSpec(
    (2,), np.dtype(np.float32)
  )  # the static spec said (None,)


@pytest.mark.parametrize("ends", ["exhausted", "closed early"])
def test_tf_data_iterator_is_released_off_the_evaluating_thread(monkeypatch, ends):
  """Deleting an exhausted tf.data iterator can wait for its autotuning thread (0.4-0.6 s
  at the end of Flax mnist's eval): pad_batches drops it on a thread of its own."""
  tf = pytest.importorskip("tensorflow", reason="the tf extra is not installed")
  import threading

  from padded_eval.data.sources import tf_data

  deleted_on, threads = [], []

  class Watched:
    def __init__(self, inner):
      self.inner = inner

    def __next__(self):
      return next(self.inner)

    def __del__(self):
      deleted_on.append(threading.current_thread())

  real = tf.data.Dataset.as_numpy_iterator
  monkeypatch.setattr(tf.data.Dataset, "as_numpy_iterator", lambda ds: Watched(real(ds)))
  release = getattr(tf_data, "release_iterator", None)
  monkeypatch.setattr(
    tf_data, "release_iterator", lambda held: threads.append(release(held)), raising=False
  )
  data = _source_rows.dataset(20)
  for pipeline in (tf.data.Dataset.from_tensor_slices(data), data_batched(tf, data)):
    deleted_on.clear()
    batches = iter(pe.pad_batches(pipeline, 8))
    got = [next(batches)] if ends == "closed early" else list(batches)
    del batches  # closes the generators
    for thread in threads:
      thread.join()
    assert got and deleted_on and threading.current_thread() not in deleted_on


@pytest.mark.parametrize("where", ["the step", "the loop"])
def test_an_error_over_tf_data_ends_the_process(where):
  """An exception out of masked_eval (or out of a loop over pad_batches) that nothing catches,
  with a tf.data iterator still open: the process prints it and exits. The iterator's
  generator is closed while the interpreter shuts down, when no thread can start (Python 3.11
  then waited forever in Thread.start)."""
  pytest.importorskip("tensorflow")
  raising = (
    "pe.masked_eval(step, None, pe.pad_batches(ds, 128), backend='jit')\n"
    if where == "the step"
    else "batches = iter(pe.pad_batches(ds, 128)); next(batches); raise RuntimeError('boom')\n"
  )
  code = (
    "import numpy as np, tensorflow as tf, padded_eval as pe\n"
    "ds = tf.data.Dataset.from_tensor_slices({'x': np.arange(1003, dtype=np.float32)}).batch(100)\n"
    "def step(params, batch):\n"
    "  raise RuntimeError('boom')\n" + raising
  )
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
  assert done.returncode == 1 and "RuntimeError: boom" in done.stderr, done.stderr[-2000:]


def data_batched(tf, data):
  return tf.data.Dataset.from_tensor_slices(data).batch(8).prefetch(1)


def test_tensorflow_is_imported_only_for_tf_sources():
  code = (
    "import sys, numpy as np, padded_eval as pe\n"
    "batches = list(pe.pad_batches({'x': np.arange(5)}, 4, num_devices=1))\n"
    "batches += list(pe.pad_batches([{'x': np.arange(5)}], 4, num_devices=1))\n"
    "assert len(batches) == 4 and 'tensorflow' not in sys.modules, sorted(sys.modules)\n"
  )
  subprocess.run([sys.executable, "-c", code], check=True)


def _bootstrap_step(params, batch):
  del params
  metric = pe.metrics.Bootstrap(pe.metrics.Mean("x"), num_replicas=200)
  return metric.batch_updates(x=batch["x"], mask=batch["mask"], index=batch["index"])


def test_reshuffling_pipeline_with_row_ids_is_refused():
  """Issue 65: over ``shuffle(reshuffle_each_iteration=True)`` ids name other rows in the next pass,
  so ``compare()`` of one model with itself gave an interval around a nonzero difference while the id
  checksums agreed. Now pad_batches refuses such a pipeline (and an unseeded shuffle) when ids are asked
  for; a shuffle in one fixed order gives a difference of exactly 0, and the mean of numpy."""
  data = dataset(1797, seed=65)
  data["x"] = data["x"][:, 0]
  for shuffled, why in (
    (slices(data).shuffle(1797), "with reshuffle_each_iteration=True"),
    (slices(data).shuffle(1797, reshuffle_each_iteration=False), "without a seed"),
    (tf.data.Dataset.zip(slices(data).shuffle(64)).batch(32), "with reshuffle"),
  ):
    with pytest.raises(
      ValueError,
      match=rf"index_key='index'\): the tf.data.Dataset shuffles {why}.*seed=0, "
      r"reshuffle_each_iteration=False",
    ):
      pe.pad_batches(shuffled, 64, index_key="index")
  pe.pad_batches(slices(data).shuffle(1797), 64)  # without ids the order is the pipeline's business
  fixed = slices(data).shuffle(1797, seed=3, reshuffle_each_iteration=False)
  runs = [
    pe.masked_eval(
      _bootstrap_step,
      None,
      pe.pad_batches(fixed, 64, pad_value={"x": np.nan, "label": -1}, index_key="index"),
      backend="jit",
    ).metric
    for _ in range(2)
  ]
  diff = pe.metrics.compare(runs[0], runs[1])
  assert (diff["difference"], diff["low"], diff["high"]) == (0.0, 0.0, 0.0)
  np.testing.assert_allclose(
    float(runs[0].compute()), data["x"].astype(np.float64).mean(), rtol=1e-5, atol=1e-7
  )

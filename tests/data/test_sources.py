"""The source kinds of pad_batches (padded_eval.data.sources), one by one, and registering a new kind."""

import subprocess
import sys

import jax
import numpy as np
import pytest
from _padding_reference import assert_batches_equal, expected_batches

import padded_eval as pe
from padded_eval.data import sources
from padded_eval.data._batch_spec import BatchSpec, LeafSpec
from padded_eval.data._tree import flatten, unflatten
from padded_eval.data.sources.base import Padding, SourceOptions, pad, rechunk
from padded_eval.data.sources.iterable import IterableSource
from padded_eval.data.sources.mapping import MappingSource


def dataset(n, seed=0):
  rng = np.random.default_rng(seed)
  return {
    "x": rng.normal(size=(n, 2)).astype(np.float32),
    "y": {"id": np.arange(n, dtype=np.int64)},
  }


def split(data, sizes):
  bounds = np.cumsum([0, *sizes])
  return [
    {"x": data["x"][a:b], "y": {"id": data["y"]["id"][a:b]}}
    for a, b in zip(bounds[:-1], bounds[1:])
  ]


def concatenated(chunks):
  """The rows of flat chunks, concatenated per path, checking each chunk's row count."""
  chunks = list(chunks)
  for flat, rows in chunks:
    assert all(len(leaf) == rows for leaf in flat.values())
  return {path: np.concatenate([flat[path] for flat, _ in chunks]) for path in chunks[0][0]}


def assert_same_rows(got, data):
  want = flatten(data)
  assert got.keys() == want.keys()
  for path in want:
    np.testing.assert_array_equal(got[path], want[path])


# ---- whole-dataset Mapping --------------------------------------------------------------------------------------


def test_mapping_source():
  data = dataset(7)
  source = MappingSource(data, SourceOptions("mask"))
  assert MappingSource.accepts(data) and not MappingSource.accepts([data])
  assert source.num_rows() == 7
  assert source.spec == BatchSpec(
    {
      ("x",): LeafSpec((2,), np.dtype(np.float32)),
      ("y", "id"): LeafSpec((), np.dtype(np.int64)),
    }
  )
  assert_same_rows(concatenated(source.chunks()), data)
  assert_same_rows(concatenated(source.chunks()), data)  # re-read
  with pytest.raises(ValueError, match=r"^the source has a key 'mask' equal to mask_key"):
    MappingSource({"mask": np.zeros(3)}, SourceOptions("mask"))


# ---- iterable of batches ----------------------------------------------------------------------------------------


def test_iterable_source_keeps_order_and_rereads_lists():
  data = dataset(11)
  batches = split(data, [3, 0, 8])
  source = IterableSource(batches, SourceOptions("mask"))
  assert IterableSource.accepts(batches) and not IterableSource.accepts(data)
  assert not IterableSource.accepts("abc")
  assert source.spec is None and source.num_rows() == 11
  assert [rows for _, rows in source.chunks()] == [3, 0, 8]
  assert_same_rows(concatenated(source.chunks()), data)
  assert IterableSource(iter(batches), SourceOptions("mask")).num_rows() is None


def test_iterable_source_one_shot_is_read_once():
  data = dataset(5)
  source = IterableSource((b for b in split(data, [2, 3])), SourceOptions("mask"))
  assert_same_rows(concatenated(source.chunks()), data)
  with pytest.raises(
    ValueError, match=r"^source is a one-shot iterator \(generator\) and was already read"
  ):
    source.chunks()


def test_iterable_source_checks_each_batch_against_the_first():
  batches = [{"x": np.zeros((2, 3))}, {"x": np.zeros((2, 3))}, {"x": np.zeros((1, 4))}]
  chunks = IterableSource(batches, SourceOptions("mask")).chunks()
  next(chunks), next(chunks)
  with pytest.raises(
    ValueError,
    match=r"^batch 2: key 'x' has shape \(1, 4\); expected \[rows, 3\] like batch 0\. .*"
    r"pad_shapes=\{'x': \(4,\)\}",
  ):
    next(chunks)


# ---- the shared numpy re-chunking and padding -------------------------------------------------------------------


@pytest.mark.parametrize("sizes", [[5], [1, 2, 3, 4], [4, 4], [0, 9, 0]])
def test_rechunk_and_pad_against_index_arithmetic(sizes):
  data = {"x": np.arange(sum(sizes), dtype=np.float32), "label": np.arange(sum(sizes)) % 3}
  chunks = [(flatten(b), len(b["x"])) for b in split_flat(data, sizes)]
  fills = {("x",): np.float32(np.nan), ("label",): -1}
  got = [unflatten(pad(flat, rows, 4, "mask", fills)) for flat, rows in rechunk(iter(chunks), 4)]
  assert_batches_equal(got, expected_batches(data, 4, pad={"x": np.nan, "label": -1}))


def split_flat(data, sizes):
  bounds = np.cumsum([0, *sizes])
  return [{k: v[a:b] for k, v in data.items()} for a, b in zip(bounds[:-1], bounds[1:])]


# ---- tf.data ----------------------------------------------------------------------------------------------------


def test_tf_data_source():
  tf = pytest.importorskip("tensorflow", reason="the tf extra is not installed")
  from padded_eval.data.sources.tf_data import TfDataSource

  data = dataset(10)
  unbatched = tf.data.Dataset.from_tensor_slices(data)
  assert (
    TfDataSource.accepts(unbatched)
    and not TfDataSource.accepts(data)
    and not TfDataSource.accepts(split(data, [10]))
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
    assert_same_rows(
      concatenated(chunks), {"x": data["x"][:kept], "y": {"id": data["y"]["id"][:kept]}}
    )
    assert source.spec.leaves[("x",)] == LeafSpec((2,), np.dtype(np.float32))
  ragged = TfDataSource(
    unbatched.padded_batch(4, padded_shapes={"x": [None], "y": {"id": []}}), SourceOptions("m")
  )
  assert ragged.spec.leaves[("x",)].shape == (None,) and ragged.spec.has_unknown_sizes


def test_tf_data_source_pads_in_the_graph_and_returns_the_real_spec():
  tf = pytest.importorskip("tensorflow", reason="the tf extra is not installed")
  from padded_eval.data.sources.tf_data import TfDataSource

  data = dataset(6)
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
  data = dataset(20)
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


# ---- pandas DataFrame -------------------------------------------------------------------------------------------


def test_a_dataframe_is_padded_as_its_columns():
  """A DataFrame is a Mapping of its columns (rows in order, the index ignored): 21 rows, dividing neither
  the batch of 16 nor the 8 devices, give the numpy reference's batches, padded rows masked."""
  pd = pytest.importorskip("pandas")
  rng = np.random.default_rng(5)
  data = {
    "x": rng.normal(size=21).astype(np.float32),
    "label": rng.integers(0, 3, 21),
    "ok": rng.random(21) < 0.5,
    "f": np.where(np.arange(21) % 4 == 0, np.nan, np.arange(21.0)),  # NaN kept, as numpy holds it
  }
  frame = pd.DataFrame(data, index=np.arange(21)[::-1] * 10)
  pad = {"x": np.nan, "label": -1, "ok": False, "f": -2.0}
  got = pe.pad_batches(frame, 16, num_devices=8, pad_value=pad)
  assert len(got) == 2
  assert_batches_equal(got, expected_batches(data, 16, pad=pad))
  assert_batches_equal(got.skip(1), expected_batches(data, 16, pad=pad)[1:])  # seeks, as a Mapping
  nullable = pd.DataFrame({"n": pd.array([1, 2, 3], dtype="Int64")})  # no NA: its numpy dtype
  assert_batches_equal(
    pe.pad_batches(nullable, 4, num_devices=1), expected_batches({"n": np.arange(1, 4)}, 4)
  )


@pytest.mark.parametrize(
  ("columns", "match"),
  [
    (
      {"x": [1.0, 2.0], "name": ["a", "b"]},
      r"^the DataFrame's column 'name' has dtype (str|object)",
    ),
    (
      {"x": [1.0, 2.0], "when": ["2020", "2021"]},
      r"^the DataFrame's column 'when' has dtype datetime64",
    ),
    (
      {"n": [1, None]},
      r"^the DataFrame's column 'n' holds missing values \(NA\), which numpy int64",
    ),
    ({"mask": [1, 2]}, r"has a key 'mask' equal to mask_key"),
  ],
)
def test_dataframe_columns_numpy_cannot_pad_are_refused_naming_them(columns, match):
  pd = pytest.importorskip("pandas")
  frame = pd.DataFrame(columns)
  if "when" in columns:
    frame["when"] = pd.to_datetime(frame["when"])
  if "n" in columns:
    frame["n"] = frame["n"].astype("Int64")
  with pytest.raises(ValueError, match=match):
    pe.pad_batches(frame, 4, num_devices=1)


def test_a_dataframe_with_repeated_column_names_is_refused():
  pd = pytest.importorskip("pandas")
  frame = pd.DataFrame([[1, 2]], columns=["a", "a"])
  with pytest.raises(ValueError, match=r"^the DataFrame has repeated column names \['a'\]"):
    pe.pad_batches(frame, 4, num_devices=1)


@pytest.mark.parametrize(
  ("columns", "match"),
  [
    (None, r"^the DataFrame's column names \[0, 1\] are not strings"),  # pd.DataFrame(array)
    ([("a", "x"), ("a", "y")], r"^the DataFrame's column names \[\('a', 'x'\), \('a', 'y'\)\]"),
    (["a", 2.5], r"^the DataFrame's column names \[2\.5\] are not strings"),
  ],
)
def test_a_dataframe_whose_column_names_are_not_strings_is_refused(columns, match):
  """A batch holds the mask under a string key, and jax sorts a dict's keys: a column named 0 beside it made
  every batch a pytree jax cannot flatten ("Comparator raised exception while sorting pytree dictionary
  keys" in masked_eval), after pad_batches had taken the frame."""
  pd = pytest.importorskip("pandas")
  values = np.arange(6.0).reshape(3, 2)
  frame = pd.DataFrame(values) if columns is None else pd.DataFrame(values, columns=columns)
  with pytest.raises(
    ValueError, match=match + r".*frame\.columns = \[str\(c\) for c in frame\.columns\]"
  ):
    pe.pad_batches(frame, 4, num_devices=1)
  renamed = frame.set_axis([str(c) for c in frame.columns], axis=1)
  (batch,) = pe.pad_batches(renamed, 4, num_devices=1)
  assert len(jax.tree.leaves(batch)) == 3  # a pytree: its keys sort
  np.testing.assert_array_equal(batch[str(frame.columns[1])][:3], values[:, 1])


# ---- registering a new kind -------------------------------------------------------------------------------------


class Columns:
  """A toy container: named columns, none of the built-in kinds (not a Mapping, not iterable)."""

  def __init__(self, **columns):
    self.columns = columns


class ColumnsSource(sources.Source):  # the whole of a new kind: five short members
  description = "a Columns"

  @classmethod
  def accepts(cls, obj):
    return isinstance(obj, Columns)

  def __init__(self, obj, options):
    self._flat = flatten(obj.columns)

  @property
  def spec(self):
    return BatchSpec.of_rows(self._flat, unknown_rows=True)

  def num_rows(self):
    return len(next(iter(self._flat.values())))

  def chunks(self):
    return iter([(self._flat, self.num_rows())])


@pytest.fixture
def columns_registered():
  sources.register(ColumnsSource)  # the one registration line
  yield
  sources.unregister(ColumnsSource)


def test_a_new_kind_is_one_class_and_one_registration(columns_registered):
  data = {"x": np.arange(6.0), "label": np.arange(6) % 2}
  got = pe.pad_batches(Columns(**data), 4, num_devices=2, pad_value={"x": np.nan}, num_batches=3)
  assert len(got) == 3
  assert_batches_equal(got, expected_batches(data, 4, pad={"x": np.nan, "label": 0}, num_batches=3))
  assert ColumnsSource in sources.kinds()


def test_unregistered_kind_is_refused_with_the_list_of_kinds():
  with pytest.raises(
    TypeError,
    match=r"^source must be a Mapping of arrays, an iterable of Mappings, a tf.data.Dataset, a grain "
    r"dataset or DataLoader, a Hugging Face dataset, a torch DataLoader or a pandas DataFrame; got Columns$",
  ):
    pe.pad_batches(Columns(x=np.arange(3)), 4, num_devices=1)
  with pytest.raises(TypeError, match="subclass of padded_eval.data.sources.Source"):
    sources.register(Columns)

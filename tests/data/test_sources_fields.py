"""``pad_batches(..., keys=...)``: tuple batches (torch ``TensorDataset``, tf.data and grain tuples, iterables)
evaluate exactly, against float64 numpy / scikit-learn over the arrays (issue 28).

torch is not installed in CI (see tests/data/test_sources_torch.py): the torch cases run on `FakeLoader`, the
stand-in with the public attributes of torch's DataLoader yielding lists of `FakeTensor`s like a
``TensorDataset`` does, and on a real ``DataLoader(TensorDataset(...))`` where torch is installed.
"""

import collections

import grain
import numpy as np
import pytest
import tensorflow as tf
from _padding_reference import assert_batches_equal, expected_batches
from _source_cases import GARBAGE, make_data, make_params, numeric, reference, step_fn
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sources_torch import HAS_TORCH, FakeLoader, fake_loader

import padded_eval as pe

N, BATCH = 37, 16  # 37 rows: divides neither the batch nor the 8 devices
KEYS = ("x", "label", "y")


def tuples_of(data):
  return tuple(data[key] for key in KEYS)


def real_torch_loader(data, batch_size):
  import torch

  tensors = (torch.from_numpy(data[key]) for key in KEYS)
  return torch.utils.data.DataLoader(
    torch.utils.data.TensorDataset(*tensors), batch_size=batch_size
  )


def tuple_rows(data):
  return [tuple(data[key][i] for key in KEYS) for i in range(len(data["y"]))]


def grain_loader(rows, operations=()):
  return grain.DataLoader(
    data_source=rows,
    sampler=grain.samplers.IndexSampler(len(rows), num_epochs=1),
    operations=list(operations),
    worker_count=0,
  )


SOURCES = {  # name: (build(data), len() known)
  "fake DataLoader(TensorDataset)": (lambda d: fake_loader(d, batch_size=5, tuples=True), True),
  "tf.data rows": (lambda d: tf.data.Dataset.from_tensor_slices(tuples_of(d)), True),
  "tf.data batch(5)": (lambda d: tf.data.Dataset.from_tensor_slices(tuples_of(d)).batch(5), False),
  "grain MapDataset": (lambda d: grain.MapDataset.source(tuple_rows(d)), True),
  "grain MapDataset.batch(5)": (lambda d: grain.MapDataset.source(tuple_rows(d)).batch(5), True),
  "grain IterDataset": (lambda d: grain.MapDataset.source(tuple_rows(d)).to_iter_dataset(), False),
  "grain DataLoader": (lambda d: grain_loader(tuple_rows(d)), False),
  "grain DataLoader+Batch(5)": (
    lambda d: grain_loader(tuple_rows(d), [grain.transforms.Batch(5)]),
    False,
  ),
  "list of tuple batches": (
    lambda d: [tuple(d[k][s : s + 9] for k in KEYS) for s in range(0, N, 9)],
    True,
  ),
}
if HAS_TORCH:
  SOURCES["torch DataLoader(TensorDataset)"] = (lambda d: real_torch_loader(d, 5), True)


@pytest.mark.parametrize("name", SOURCES)
def test_tuple_batches_evaluate_exactly(name):
  build, known_len = SOURCES[name]
  data = numeric(make_data(N))
  batches = pe.pad_batches(build(data), BATCH, keys=KEYS, pad_value=GARBAGE)
  if known_len:
    assert len(batches) == -(-N // BATCH)
  first = next(iter(batches))
  assert set(first) == {*KEYS, "mask"}
  last = list(batches)[-1]
  real = N % BATCH
  assert not last["mask"][real:].any() and last["mask"][:real].all()
  assert np.isnan(last["x"][real:]).all() and (last["label"][real:] == -7).all()  # garbage padding
  params = make_params()
  got = pe.masked_eval(step_fn, params, batches, backend="jit")
  want = reference(params, data)  # float64 numpy / sklearn accuracy_score over the 37 rows
  assert got["num_examples"] == N
  np.testing.assert_allclose(got["accuracy"], want["accuracy"], rtol=1e-6)
  np.testing.assert_allclose(got["mse"], want["mse"], rtol=1e-5)


def test_one_key_names_a_dataset_of_single_tensors():
  x = np.arange(11, dtype=np.float32)
  batches = list(pe.pad_batches(tf.data.Dataset.from_tensor_slices(x), 8, keys=("x",)))
  np.testing.assert_array_equal(np.concatenate([b["x"][b["mask"]] for b in batches]), x)


@pytest.mark.parametrize(
  ("source", "keys", "message"),
  [
    (
      lambda d: fake_loader(d, batch_size=5, tuples=True),
      ("x", "label"),
      r"^batch 0 of the DataLoader is a list of 3 values but keys=\('x', 'label'\) names 2; expected one key per",
    ),
    (
      lambda d: tf.data.Dataset.from_tensor_slices(tuples_of(d)),
      ("x", "label"),
      r"^an element of the tf.data.Dataset is a tuple of 3 values but keys=",
    ),
    (
      lambda d: grain.MapDataset.source(tuple_rows(d)),
      ("a", "b", "c", "d"),
      r"^element 0 of the grain source is a tuple of 3 values but keys=",
    ),
    (
      lambda d: d,
      KEYS,
      r"^keys=.* names the fields of tuple elements, but the source is a Mapping",
    ),
    (
      lambda d: tf.data.Dataset.from_tensor_slices(d),
      KEYS,
      r"^an element of the tf.data.Dataset is a dict with keys \['label', 'x', 'y'\], but keys=.*drop keys=",
    ),
    (lambda d: [d], KEYS, r"^batch 0 is a dict with keys"),
  ],
)
def test_keys_that_do_not_fit_the_elements_are_refused(source, keys, message):
  data = numeric(make_data(N))
  with pytest.raises(ValueError, match=message):
    list(pe.pad_batches(source(data), BATCH, keys=keys))


@pytest.mark.parametrize(
  ("keys", "message"),
  [
    ("image", r"^keys must be a non-empty tuple of strings"),
    ((), r"^keys must be a non-empty tuple of strings"),
    (("image", 3), r"^keys must be non-empty strings; got 3"),
    (("image", "image"), r"^keys must be distinct; 'image' appears twice"),
    (("image", "mask"), r"names a field 'mask', the key of the mask or the row ids"),
  ],
)
def test_bad_keys_are_refused_at_the_call(keys, message):
  with pytest.raises(ValueError, match=message):
    pe.pad_batches([(np.zeros(3), np.zeros(3))], 8, keys=keys)


def test_without_keys_tuple_batches_say_to_pass_keys():
  data = numeric(make_data(8))
  for source in (
    fake_loader(data, batch_size=4, tuples=True),
    tf.data.Dataset.from_tensor_slices(tuples_of(data)),
  ):
    with pytest.raises(ValueError, match=r"keys=\('image', 'label'\)"):
      list(pe.pad_batches(source, 4, num_devices=1))


@settings(deadline=None)
@given(
  n=st.integers(1, 70),
  chunk=st.integers(1, 23),
  batch_size=st.integers(1, 19),
  kind=st.sampled_from(["list", "fake loader", "grain"]),
)
def test_property_tuple_batches_are_the_rows_in_order(n, chunk, batch_size, kind):
  """Any row count, source batch and padded batch size: the named batches are index arithmetic
  over the arrays (every row once, in order, garbage on padding, the mask)."""
  data = numeric(make_data(n, seed=n))
  if kind == "list":
    source = [tuple(data[k][s : s + chunk] for k in KEYS) for s in range(0, n, chunk)]
  elif kind == "fake loader":
    source = fake_loader(data, batch_size=chunk, tuples=True)
  else:
    source = grain.MapDataset.source(tuple_rows(data)).batch(chunk)
  batches = pe.pad_batches(source, batch_size, num_devices=1, keys=KEYS, pad_value=GARBAGE)
  assert_batches_equal(batches, expected_batches(data, batch_size, pad=GARBAGE))


TUPLE_LEAF_SOURCES = {  # a tuple of per-row arrays inside a dict batch is a pytree node, as jax has it
  "Mapping": lambda d: d,
  "list of batches of 9": lambda d: [
    {"x": tuple(a[s : s + 9] for a in d["x"]), "y": d["y"][s : s + 9]} for s in range(0, N, 9)
  ],
  "grain MapDataset rows": lambda d: grain.MapDataset.source(pair_rows(d)),
  "grain MapDataset.batch(5)": lambda d: grain.MapDataset.source(pair_rows(d)).batch(5),
  "grain DataLoader rows": lambda d: grain_loader(pair_rows(d)),
  "fake DataLoader": lambda d: PairLoader(
    [{"x0": d["x"][0][i], "x1": d["x"][1][i], "y": d["y"][i]} for i in range(N)], batch_size=5
  ),
}


def pair_rows(data):
  return [{"x": (data["x"][0][i], data["x"][1][i]), "y": data["y"][i]} for i in range(N)]


class PairLoader(FakeLoader):
  """A DataLoader whose collate_fn gives ``{"x": (x0, x1), "y": y}``."""

  def __iter__(self):
    for batch in super().__iter__():
      yield {"x": (batch["x0"], batch["x1"]), "y": batch["y"]}


PairLoader.__name__, PairLoader.__module__ = FakeLoader.__name__, FakeLoader.__module__


@pytest.mark.parametrize("name", TUPLE_LEAF_SOURCES)
def test_a_tuple_inside_a_dict_batch_stays_a_tuple_of_padded_arrays(name):
  """``{"x": (a, b)}``: ``batch["x"]`` is a tuple of padded arrays, each the numpy reference's rows
  (before, the tuple was stacked into one array whose rows were its members); pad values per member."""
  rng = np.random.default_rng(3)
  a, b = rng.normal(size=(N, 2)).astype(np.float32), np.arange(N, dtype=np.int32)
  data = {"x": (a, b), "y": np.arange(N, dtype=np.int64) * 2}
  source = TUPLE_LEAF_SOURCES[name](data)
  pad = {"x": (np.nan, -7), "y": -1}
  got = list(pe.pad_batches(source, BATCH, num_devices=1, pad_value=pad))
  want = expected_batches(
    {"x0": a, "x1": b, "y": data["y"]}, BATCH, pad={"x0": np.nan, "x1": -7, "y": -1}
  )
  assert [type(batch["x"]) for batch in got] == [tuple] * len(want)
  flat = [{"x0": g["x"][0], "x1": g["x"][1], "y": g["y"], "mask": g["mask"]} for g in got]
  assert_batches_equal(flat, want)
  assert [set(g) for g in got] == [{"x", "y", "mask"}] * len(want)


def test_a_tuple_of_scalars_inside_a_dict_batch_says_it_is_a_group_of_arrays():
  with pytest.raises(
    ValueError, match=r"key 'y/0' is a scalar.*a tuple in a batch is a group of arrays"
  ):
    list(pe.pad_batches([{"x": np.arange(3), "y": (0, 1, 1)}], 4, num_devices=1))


Pair = collections.namedtuple("Pair", "a b")


def namedtuple_rows(data):
  return [{"x": Pair(data["x"][0][i], data["x"][1][i]), "y": data["y"][i]} for i in range(N)]


NAMEDTUPLE_SOURCES = {  # the sources of TUPLE_LEAF_SOURCES whose members may be namedtuples
  "Mapping": lambda d: {"x": Pair(*d["x"]), "y": d["y"]},
  "Mapping of it alone, fields of one shape": lambda d: {"x": Pair(d["y"], d["y"])},
  "list of batches of 9": lambda d: [
    {"x": Pair(*(a[s : s + 9] for a in d["x"])), "y": d["y"][s : s + 9]} for s in range(0, N, 9)
  ],
  "grain MapDataset rows": lambda d: grain.MapDataset.source(namedtuple_rows(d)),
  "grain DataLoader rows": lambda d: grain_loader(namedtuple_rows(d)),
}


@pytest.mark.parametrize("name", NAMEDTUPLE_SOURCES)
def test_a_namedtuple_inside_a_dict_batch_is_refused_with_what_to_pass(name):
  """A namedtuple is not taken for a group of arrays (a plain tuple): before, it was one array whose
  rows were its fields (alone in the batch: 37 rows read as 2, silently), or a "leading sizes
  disagree" error. Now a ValueError names the key, the type, and the dict or tuple to pass."""
  a, b = np.arange(2 * N, dtype=np.float32).reshape(N, 2), np.arange(N, dtype=np.int32)
  source = NAMEDTUPLE_SOURCES[name]({"x": (a, b), "y": np.arange(N, dtype=np.int64)})
  with pytest.raises(ValueError, match=r"key 'x' holds a Pair \(a namedtuple\).*_asdict\(\)"):
    list(pe.pad_batches(source, BATCH, num_devices=1))

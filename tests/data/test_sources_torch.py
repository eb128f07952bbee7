"""torch DataLoader sources and iterables of dicts of array-likes (bfloat16 included), against the arrays.

CI installs no torch (PyPI's Linux wheel pulls several GB of CUDA libraries, and the CPU build lives on
PyTorch's own index), so every test runs with two loaders: `FakeLoader`, a stand-in with the public attributes
of torch's `DataLoader` (``dataset``, ``batch_size``, ``drop_last``, ``sampler``) that yields `FakeTensor`s (an
independent array-like: ``__array__`` only, bfloat16 through ml_dtypes), and, where torch is installed, a real
``torch.utils.data.DataLoader`` of torch tensors.
"""

import importlib.util

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from _padding_reference import assert_batches_equal, expected_batches
from _source_cases import GARBAGE, check_exact, check_padded, make_data, numeric

import padded_eval as pe
from padded_eval.data.sources.array_like import is_torch_tensor, to_numpy
from padded_eval.data.sources.base import SourceOptions
from padded_eval.data.sources.torch import TorchLoaderSource

N, PER_BATCH = 37, 5
HAS_TORCH = importlib.util.find_spec("torch") is not None


class FakeTensor:
  """An array-like that is not a numpy array: numpy reads it through ``__array__`` only."""

  def __init__(self, array):
    self._array = np.asarray(array)

  @property
  def shape(self):
    return self._array.shape

  def __array__(self, dtype=None, copy=None):
    return self._array if dtype is None else self._array.astype(dtype)


class FakeLoader:
  """torch's DataLoader as pad_batches sees it: the public attributes and ``__iter__`` (sequential sampler)."""

  def __init__(self, dataset, batch_size=1, drop_last=False, tuples=False, sampler_for=None):
    self.dataset, self.batch_size, self.drop_last = dataset, batch_size, drop_last
    self.sampler = range(len(dataset)) if sampler_for is None else sampler_for(dataset)
    self._tuples = tuples

  def __iter__(self):
    for start in range(0, len(self.sampler), self.batch_size):
      indices = self.sampler[start : start + self.batch_size]
      if self.drop_last and len(indices) < self.batch_size:
        return
      rows = [self.dataset[i] for i in indices]
      batch = {key: _fake_stack([row[key] for row in rows]) for key in rows[0]}
      yield list(batch.values()) if self._tuples else batch


FakeLoader.__name__ = "DataLoader"
FakeLoader.__module__ = "torch.utils.data.dataloader"


def _fake_stack(values):
  if isinstance(values[0], str):
    return values  # as torch's default_collate: strings stay a list
  return FakeTensor(np.stack(values))


def bf16_data(n=N):
  """make_data with `y` rounded to bfloat16 (so the float64 reference sees exactly the values passed)."""
  data = make_data(n)
  data["y"] = data["y"].astype(ml_dtypes.bfloat16)
  return data


def fake_loader(data, **options):
  rows = [{key: values[i] for key, values in data.items()} for i in range(len(data["y"]))]
  return FakeLoader(rows, **options)


def torch_loader(data, iterable_style=False, **options):
  import torch

  class Rows(torch.utils.data.Dataset):
    def __len__(self):
      return len(data["y"])

    def __getitem__(self, i):
      return {key: _torch_leaf(values, i) for key, values in data.items()}

  class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
      return (Rows()[i] for i in range(len(data["y"])))

  tuples = options.pop("tuples", False)
  sampler_for = options.pop("sampler_for", None)
  dataset = Stream() if iterable_style else Rows()
  if tuples:
    dataset = torch.utils.data.TensorDataset(
      torch.from_numpy(data["x"]), torch.from_numpy(data["label"])
    )
  if sampler_for is not None:
    options["sampler"] = sampler_for(dataset)
  return torch.utils.data.DataLoader(dataset, **options)


def _torch_leaf(values, i):
  import torch

  if values.dtype.kind == "U":
    return str(values[i])
  if values.dtype == ml_dtypes.bfloat16:
    return torch.tensor(float(values[i]), dtype=torch.bfloat16)
  return torch.from_numpy(values[i : i + 1])[0]


LOADERS = {"fake": fake_loader}
if HAS_TORCH:
  LOADERS["torch"] = torch_loader


@pytest.mark.parametrize("kind", LOADERS)
def test_loader_every_row_once_in_order_len_from_the_sampler(kind):
  data = bf16_data()
  loader = LOADERS[kind](data, batch_size=PER_BATCH)
  assert TorchLoaderSource.accepts(loader)
  batches = check_padded(loader, data, known_len=True)
  last = list(batches)[-1]
  assert last["y"].dtype == ml_dtypes.bfloat16  # bit for bit, not via float32
  assert last["name"].tolist() == [f"row{i}" for i in range(32, 37)] + [""] * 11


@pytest.mark.parametrize("kind", LOADERS)
def test_drop_last_that_drops_rows_is_refused_naming_it(kind):
  # 37 rows in batches of 5: drop_last=True would lose the last 2 rows without a word, as
  # tf.data's drop_remainder=True, which pad_batches refuses too
  loader = LOADERS[kind](bf16_data(), batch_size=PER_BATCH, drop_last=True)
  with pytest.raises(ValueError, match=r"drop_last.*2 of its 37 rows"):
    pe.pad_batches(loader, PER_BATCH, num_devices=1)


@pytest.mark.parametrize("kind", LOADERS)
def test_drop_last_that_drops_nothing_is_read_whole(kind):
  data = bf16_data(35)  # 7 whole batches of 5: nothing to drop
  check_padded(LOADERS[kind](data, batch_size=PER_BATCH, drop_last=True), data, known_len=True)


@pytest.mark.parametrize("kind", LOADERS)
def test_masked_eval_is_exact_with_bf16_targets(kind):
  data = numeric(bf16_data())
  reference_data = dict(data, y=data["y"].astype(np.float32))  # exact: every bf16 is a float32
  check_exact(LOADERS[kind](data, batch_size=PER_BATCH), reference_data)


@pytest.mark.parametrize("kind", LOADERS)
def test_tuple_batches_say_how_to_name_the_fields(kind):
  data = make_data(8)
  loader = LOADERS[kind](numeric(data), batch_size=4, tuples=True)
  with pytest.raises(
    ValueError,
    match=r"^batch 0 of the DataLoader is a list of \d values; expected a dict of tensors, so that each "
    r"field has a name: pass pe.pad_batches\(loader, ..., keys=\(.image., .label.\)\) with one name per value, "
    r"or have the dataset.s __getitem__ return a dict",
  ):
    list(pe.pad_batches(loader, 4, num_devices=1))


class DistributedSampler:
  """torch's DistributedSampler as pad_batches sees it: dataset, num_replicas, drop_last."""

  def __init__(self, dataset, num_replicas, rank, drop_last=False):
    self.dataset, self.num_replicas, self.drop_last = dataset, num_replicas, drop_last


DistributedSampler.__module__ = "torch.utils.data.distributed"


def distributed_sampler(kind, dataset, **options):
  if kind == "torch":
    import torch

    return torch.utils.data.DistributedSampler(dataset, **options)
  return DistributedSampler(dataset, **options)


@pytest.mark.parametrize("kind", LOADERS)
def test_distributed_sampler_that_repeats_or_drops_rows_is_refused(kind):
  data = bf16_data(9)
  for replicas, drop_last, message in (
    (4, False, "repeats 3 of them"),
    (2, True, "drops 1 of them"),
  ):

    def sampler_for(dataset, replicas=replicas, drop_last=drop_last):
      return distributed_sampler(kind, dataset, num_replicas=replicas, rank=0, drop_last=drop_last)

    loader = LOADERS[kind](data, batch_size=4, sampler_for=sampler_for)
    with pytest.raises(
      ValueError, match=rf"9 rows over {replicas} replicas and so {message}; .*Subset"
    ):
      pe.pad_batches(loader, 4, num_devices=1)
  # Replicas that divide the rows: every row once over the processes, accepted.
  sampler_for = lambda dataset: distributed_sampler(kind, dataset, num_replicas=3, rank=0)
  pe.pad_batches(LOADERS[kind](data, batch_size=4, sampler_for=sampler_for), 4, num_devices=1)


def test_len_unknown_without_a_sized_sampler():
  data = bf16_data(9)
  loader = fake_loader(data, batch_size=4)
  loader.sampler = iter(range(9))  # no len()
  assert TorchLoaderSource(loader, SourceOptions("mask")).num_rows() is None
  if HAS_TORCH:
    check_padded(torch_loader(data, iterable_style=True, batch_size=4), data, known_len=False)


def test_iterables_of_dicts_of_array_likes():
  """Any iterable of dict batches: fake tensors, jax arrays, bfloat16 included (no loader needed)."""
  data = bf16_data()
  bounds = [0, 3, 20, 21, N]
  for wrap in (FakeTensor, jnp.asarray):
    batches = [
      {
        "x": wrap(data["x"][a:b]),
        "label": wrap(data["label"][a:b]),
        "y": wrap(data["y"][a:b]),
        "name": data["name"][a:b],
      }
      for a, b in zip(bounds[:-1], bounds[1:])
    ]
    got = pe.pad_batches(batches, 16, num_devices=2, pad_value=GARBAGE)
    assert len(got) == 3
    assert_batches_equal(got, expected_batches(data, 16, pad=GARBAGE))


def torch_dtypes_numpy_lacks_are_converted_bit_for_bit():
  """A test where torch is installed (defined below); not collected without it, as CI fails on a skip."""
  import torch

  values = torch.randn(1000, dtype=torch.float32)
  for dtype, ml_type in (
    (torch.bfloat16, ml_dtypes.bfloat16),
    (torch.float8_e4m3fn, ml_dtypes.float8_e4m3fn),
    (torch.float8_e5m2, ml_dtypes.float8_e5m2),
  ):
    tensor = values.to(dtype)
    assert is_torch_tensor(tensor)
    got = to_numpy(tensor)
    assert got.dtype == ml_type
    np.testing.assert_array_equal(got.astype(np.float64), tensor.double().numpy())
  assert to_numpy(torch.arange(3, requires_grad=False).float().requires_grad_()).tolist() == [
    0,
    1,
    2,
  ]


if HAS_TORCH:
  test_torch_dtypes_numpy_lacks_are_converted_bit_for_bit = (
    torch_dtypes_numpy_lacks_are_converted_bit_for_bit
  )

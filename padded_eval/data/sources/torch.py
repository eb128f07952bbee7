"""Source kind: a torch `DataLoader` whose batches are dicts of tensors (or of any array-likes).

Each batch's leaves become numpy arrays with `array_like.to_numpy`: ``np.asarray`` for CPU tensors, a copy to the
host for others, and bfloat16 / float8 tensors reinterpreted bit for bit as the `ml_dtypes` types jax uses
(``np.asarray`` alone refuses them). The same conversion serves every iterable of dicts of array-likes (a plain
generator of torch or jax batches is an `IterableSource`). Batches that are tuples or lists (a `TensorDataset`'s
``[x, y]``) are named by ``pad_batches(..., keys=("image", "label"))``; without `keys` they are refused with a
ValueError that says how to name the fields.

`len()` of the padded batches is known when the loader's sampler knows its length (a map-style dataset with
automatic batching); an iterable-style dataset or a custom batch sampler leaves it unknown. A `DataLoader` starts a
new pass on every ``iter()``, so the padded batches re-iterate. torch is imported only once a loader is passed.
"""

from __future__ import annotations

import collections.abc as cabc
from collections.abc import Iterator
from typing import Any

from padded_eval.data.sources.base import Chunk, Source, SourceOptions, library_class
from padded_eval.data.sources.fields import named

__all__ = ["TorchLoaderSource"]


class TorchLoaderSource(Source):
  """Reads a torch DataLoader batch by batch, each checked against the first."""

  description = "a torch DataLoader"
  fits_shapes = True
  names_fields = True

  library = ("torch.utils.data", ("DataLoader",))

  def __init__(self, obj: Any, options: SourceOptions):
    """Wraps the loader (nothing is read yet).

    Args:
      obj: a `torch.utils.data.DataLoader` yielding dicts (nested dicts allowed) of tensors ``[rows, ...]``, or,
        with `keys`, tuples or lists of them (a `TensorDataset`'s ``[x, y]``).
      options: the mask's key (no batch key may equal it) and `keys`, the names of the fields of tuple
        batches, in order (see `name_fields`); `batched` is ignored (a DataLoader yields batches).

    Raises:
      ValueError: a `DistributedSampler` over a dataset its replicas do not divide (it repeats or drops rows);
        ``drop_last=True`` when the last batch would be short (or of unknown size): it drops rows.
    """
    _check_sampler(getattr(obj, "sampler", None))
    _check_drop_last(obj)
    self._loader = obj
    self._mask_key, _, self._keys = options

  @property
  def spec(self) -> None:
    return None  # known once the first batch is read

  def num_rows(self) -> int | None:
    """Rows per pass from the sampler: ``len(sampler)`` (a ``drop_last`` that would drop rows is refused)."""
    loader = self._loader
    if _is_iterable_style(loader.dataset) or loader.batch_size is None:
      return None  # iterable-style, or a custom batch_sampler / no automatic batching
    try:
      indices = len(loader.sampler)
    except TypeError:  # a sampler without a length
      return None
    return indices

  def chunks(self) -> Iterator[Chunk]:
    """Starts a new pass over the loader (its workers, if any, start again).

    Raises:
      ValueError: (while reading) a batch that is not a dict, or that breaks the contract.
    """
    return self._checked(iter(self._loader))

  def batch_rows(self) -> int | None:
    """Rows of the loader's first batch (read once)."""
    first = next(self.chunks(), None)
    return None if first is None else first[1]

  def _checked(self, batches: Iterator[Any]) -> Iterator[Chunk]:
    return self.checked_chunks(_named(batches, self._keys), self._mask_key, "batch {index}")


def _named(batches: Iterator[Any], keys: tuple[str, ...] | None) -> Iterator[cabc.Mapping]:
  """The batches, each a Mapping: tuples named by `keys`; else a ValueError that says how to name the fields."""
  for index, batch in enumerate(batches):
    yield named(
      batch,
      keys,
      f"batch {index} of the DataLoader",
      expected="a dict of tensors",
      passed="loader",
      how=_AS_DICTS,
    )


def _check_sampler(sampler: Any) -> None:
  """Refuses a DistributedSampler that repeats rows (to even out the shares) or drops them."""
  if library_class(sampler, "torch.utils.data", ("DistributedSampler",)) is None:
    return
  rows, replicas = len(sampler.dataset), sampler.num_replicas
  if rows % replicas:
    action = "drops" if sampler.drop_last else "repeats"
    raise ValueError(
      f"the DataLoader's DistributedSampler splits {rows} rows over {replicas} replicas and so {action} "
      f"{rows % replicas if sampler.drop_last else replicas - rows % replicas} of them; give each process "
      "its rows instead: DataLoader(torch.utils.data.Subset(dataset, range(len(dataset))"
      "[pe.process_slice(len(dataset))]), ...) with the default sampler"
    )


def _check_drop_last(loader: Any) -> None:
  """Refuses ``drop_last=True`` unless the sampler's rows fill every batch: it would drop the short last
  batch's rows without a word (as tf.data's ``drop_remainder=True``, refused too)."""
  if not getattr(loader, "drop_last", False) or loader.batch_size is None:
    return
  rows = None
  if not _is_iterable_style(loader.dataset):
    try:
      rows = len(loader.sampler)
    except TypeError:  # a sampler without a length
      rows = None
  if rows is not None and rows % loader.batch_size == 0:
    return
  dropped = (
    "its last, short batch (of a size not known before reading)"
    if rows is None
    else f"{rows % loader.batch_size} of its {rows} rows (a short last batch of {loader.batch_size})"
  )
  raise ValueError(
    f"the DataLoader has drop_last=True, which drops {dropped}; pass drop_last=False: pad_batches pads "
    "the last batch with masked rows, so every row is evaluated once"
  )


def _is_iterable_style(dataset: Any) -> bool:
  """Whether `dataset` is a torch `IterableDataset` (no sampler decides its length)."""
  return library_class(dataset, "torch.utils.data", ("IterableDataset",)) is not None


_AS_DICTS = (  # how a loader's batches become dicts
  "have the dataset's __getitem__ return a dict, e.g. {'image': x, 'label': y} (the default collate_fn "
  "stacks it into a dict of tensors), or pass collate_fn=lambda rows: {'image': torch.stack([r[0] for r "
  "in rows]), 'label': torch.stack([r[1] for r in rows])}"
)

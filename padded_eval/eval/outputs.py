"""Per-row outputs of `masked_eval(..., outputs=True)`: checked at trace time, copied to the host step by step.

With ``outputs=True`` the user's ``step_fn`` returns ``(metric, per_row)``: a pytree of arrays whose leading axis is
the rows the step sees (one shard's under pmap/shard_map, the global batch under jit). The compiled step returns
``per_row`` next to the carried state, laid out like the batch (rows split over the data axis). After dispatching
a step the driver asks for an asynchronous copy of its outputs to the host (`RowOutputs.start`); when it waits on
that step anyway (its bounded steps in flight) it reads the copies, keeps the rows the step's host mask marks real
(`RowOutputs.collect`), and drops the device arrays, so device memory does not grow with the dataset. `result`
concatenates the kept rows at the end: exactly this process's real rows, in the order of its batches.

With several processes a step's outputs are global arrays; each process reads only its addressable shards, which
hold its own rows (the batch was built from its local rows), so each process gets its own rows back.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from padded_eval.collections import Metrics
from padded_eval.data.sharding import local_blocks
from padded_eval.metrics.averages import Mean
from padded_eval.metrics.base import Metric

__all__ = ["NO_STATISTICS", "KeptRows", "Pending", "RowOutputs", "split_step_result"]

NO_STATISTICS = "(outputs only)"
"""The log name of the empty placeholder metric of a step that returns per-row outputs alone; `masked_eval`
leaves it out of its results."""


def split_step_result(returned: Any, outputs: bool, rows: int) -> tuple[Metric, Any]:
  """Checks what ``step_fn`` returned (at trace time) and splits it into ``(metric, per_row)``.

  Args:
    returned: ``step_fn(params, batch)``'s value: a Metric, or with `outputs` a pair ``(metric, per_row)``
      or the per-row outputs alone (a pytree of arrays holding no Metric: a decode), then merged as an
      empty ``Metrics({})``.
    outputs: whether ``masked_eval`` was called with ``outputs=True``.
    rows: the rows the step sees (the leading size of its batch's mask).

  Returns:
    ``(metric, per_row)``; ``per_row`` is None without `outputs`.

  Raises:
    ValueError: a bare Metric with `outputs`, a pair without it, no Metric at all, or a ``per_row`` leaf whose
      leading axis is not `rows` (the leaf's path, shape and the expected leading size are named).
  """
  if not outputs:
    if _is_pair_with_metric(returned):
      raise ValueError(
        "step_fn returned a pair (metric, per_row), but masked_eval was called without outputs=True; "
        "pass outputs=True to get the per-row outputs back, or return only the metric"
      )
    _check_metric(returned, "step_fn must return")
    return returned, None
  if isinstance(returned, Metric):
    raise ValueError(
      f"masked_eval(..., outputs=True): step_fn returned a bare {type(returned).__name__}; expected a pair "
      "(metric, per_row) where per_row is a pytree of arrays [rows, ...], e.g. "
      "(metric, {'logits': logits}); or call masked_eval without outputs=True"
    )
  if not _holds_metric(returned):  # per-row outputs alone (a decode): no statistics to merge
    _check_rows(returned, rows)
    return Metrics({NO_STATISTICS: Mean("rows")}).batch_updates(rows=jnp.zeros((0,))), returned
  if not (isinstance(returned, tuple) and len(returned) == 2):
    raise ValueError(
      f"masked_eval(..., outputs=True): step_fn must return a pair (metric, per_row); it returned a "
      f"{_type_name(returned)}"
    )
  metric, per_row = returned
  _check_metric(metric, "with outputs=True, the first element of step_fn's pair must be")
  _check_rows(per_row, rows)
  return metric, per_row


def _holds_metric(value: Any) -> bool:
  return any(
    isinstance(x, Metric) for x in jax.tree.leaves(value, is_leaf=lambda x: isinstance(x, Metric))
  )


def _is_pair_with_metric(value: Any) -> bool:
  return isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], Metric)


def _type_name(value: Any) -> str:
  return f"{type(value).__module__}.{type(value).__qualname__}"


def _check_metric(value: Any, what: str) -> None:
  if not isinstance(value, Metric):
    raise ValueError(
      f"{what} a padded_eval Metric holding the batch's masked statistics "
      f"(e.g. pe.metrics.Accuracy().batch_updates(preds=..., target=..., mask=batch['mask'])); "
      f"got a {_type_name(value)}"
    )


def _check_rows(per_row: Any, rows: int) -> None:
  leaves = jax.tree_util.tree_flatten_with_path(per_row)[0]
  if not leaves:
    raise ValueError(
      "masked_eval(..., outputs=True): step_fn's per_row holds no arrays; expected a pytree of arrays "
      f"[{rows}, ...]"
    )
  for path, leaf in leaves:
    shape = np.shape(leaf)
    if not shape or shape[0] != rows:
      raise ValueError(
        f"masked_eval(..., outputs=True): per_row leaf {jax.tree_util.keystr(path) or 'per_row'} has shape "
        f"{shape}; expected a leading axis of {rows}, the rows step_fn sees (one shard's under pmap and "
        "shard_map, the global batch under jit)"
      )


@dataclasses.dataclass
class Pending:
  """One step's outputs on their way to the host.

  Attributes:
    blocks: per leaf, the device arrays that hold this process's rows, in row order (copies requested).
    mask: the step's host mask, bool ``[local rows]``.
  """

  blocks: list[list[jax.Array]]
  mask: np.ndarray


class RowOutputs:
  """Collects the real rows of every step's ``per_row``, on the host, in step order.

  Each step's rows are copied once, from the device buffers straight into one host buffer per leaf, sized
  when the number of batches is known (else kept per step and concatenated at the end).

  Args:
    row_axes: how many leading axes of a step's output index its rows (2 under pmap: device and row; 1 else).
    mask_key: the batch key of the mask.
    num_batches: the number of batches when known (sizes the buffers), else None.
  """

  def __init__(self, row_axes: int, mask_key: str | None, num_batches: int | None = None):
    self._row_axes = row_axes
    self._mask_key = mask_key
    self._num_batches = num_batches
    self._treedef = None
    self._leaves: list[KeptRows] = []

  def start(self, per_row: Any, batch: Any) -> Pending:
    """Requests the asynchronous copy of one dispatched step's outputs; never blocks.

    Args:
      per_row: the step's output pytree (device arrays).
      batch: the step's host batch (its mask says which rows are real).
    """
    mask = np.array(batch[self._mask_key], dtype=bool)  # a copy: the source may refill its own
    leaves, treedef = jax.tree.flatten(per_row)
    if self._treedef is None:
      capacity = None if self._num_batches is None else self._num_batches * len(mask)
      self._treedef, self._leaves = treedef, [KeptRows(capacity) for _ in leaves]
    blocks = [local_blocks(leaf) for leaf in leaves]
    for block in (b for leaf_blocks in blocks for b in leaf_blocks):
      block.copy_to_host_async()
    return Pending(blocks, mask)

  def collect(self, pending: Pending) -> None:
    """Reads a finished step's copies and keeps the rows its mask marks real."""
    for kept, blocks in zip(self._leaves, pending.blocks, strict=True):
      first = 0
      for block in blocks:
        host = np.asarray(block)
        host = host.reshape((-1, *host.shape[self._row_axes :]))
        kept.add(host, pending.mask[first : first + len(host)])
        first += len(host)
      if first != len(pending.mask):
        raise AssertionError(f"a step returned {first} rows for a batch of {len(pending.mask)}")

  def result(self) -> Any:
    """The kept rows of every leaf: numpy ``[real rows, ...]`` in ``per_row``'s structure."""
    return jax.tree.unflatten(self._treedef, [kept.rows() for kept in self._leaves])


class KeptRows:
  """The real rows of one output leaf, in order: in one buffer of `capacity` rows, else in parts.

  Args:
    capacity: the most rows there can be (batches x rows per batch), or None when unknown.
  """

  def __init__(self, capacity: int | None):
    self._capacity = capacity
    self._buffer: np.ndarray | None = None
    self._count = 0
    self._parts: list[np.ndarray] = []

  def add(self, rows: np.ndarray, real: np.ndarray) -> None:
    """Keeps ``rows[real]`` (copied: `rows` may be a view of a device buffer)."""
    count = int(np.count_nonzero(real))
    if self._capacity is not None and self._buffer is None:  # pages are touched when written
      self._buffer = np.empty((self._capacity, *rows.shape[1:]), rows.dtype)
    if self._buffer is not None and self._count + count > len(self._buffer):
      # more batches than len() said: keep parts from now on
      self._parts, self._buffer, self._capacity = [self._buffer[: self._count]], None, None
    if self._buffer is None:
      self._parts.append(np.array(rows) if count == len(rows) else rows[real])
    else:
      target = self._buffer[self._count : self._count + count]
      if count == len(rows):
        target[...] = rows
      elif count:
        np.compress(real, rows, axis=0, out=target)
    self._count += count

  def rows(self) -> np.ndarray:
    """All kept rows, ``[count, ...]``."""
    if self._buffer is not None:
      return self._buffer[: self._count]
    return np.concatenate(self._parts)

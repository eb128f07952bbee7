"""The masked_eval step, written once for every backend (`padded_eval.eval.backends` maps it).

``step_fn(params, batch)`` is wrapped (`checked_step_fn`), turned into one batch's
statistics (`batch_statistics`, whose trace gives the state's structure: `traced_statistics`)
and into the step that merges one batch into the carried state (`merge_step`). The carried
state is ``(metric, ExactCount of real rows)``; under pmap and shard_map each shard carries
its own, stacked on a leading axis (`unstack` / `restack` inside the mapped function), and
`reduce_state` combines them across a mapped axis.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from padded_eval.eval.outputs import split_step_result
from padded_eval.exact.accumulate import ExactCount

__all__ = [
  "RowMask",
  "batch_statistics",
  "checked_step_fn",
  "merge_step",
  "reduce_carried",
  "reduce_state",
  "restack",
  "row_count",
  "traced_statistics",
  "unstack",
]


@dataclasses.dataclass(frozen=True)
class RowMask:
  """Which rows of a batch are real: ``batch[key]``, or ``fn(batch)`` (``masked_eval(mask_fn=...)``).

  The one switch between a mask key and a mask function: everything that reads a batch's mask
  (the step, the host row count, the progress bar, per-row outputs) calls `of`.

  Attributes:
    key: the batch key of the bool ``[B]`` mask, or None with ``fn``.
    fn: ``fn(batch) -> bool [rows, ...]`` for batches that are not dicts, or None.
  """

  key: str | None = "mask"
  fn: Callable | None = None

  @classmethod
  def of_call(cls, mask_key: Any, mask_fn: Any) -> RowMask:
    """The mask of ``masked_eval(mask_key=..., mask_fn=...)``: a key (str) or a function.

    Raises:
      ValueError: ``mask_fn`` not callable, or ``mask_key`` neither a non-empty str nor a function.
    """
    if mask_fn is None and callable(mask_key):
      mask_fn = mask_key
    if mask_fn is None:
      if not isinstance(mask_key, str) or not mask_key:
        raise ValueError(
          "mask_key must be a non-empty string (the batches' key of the bool [B] mask, default "
          f"'mask') or a function batch -> bool [rows, ...] (or pass mask_fn=); got {mask_key!r}"
        )
      return cls(mask_key)
    if not callable(mask_fn):
      raise ValueError(
        f"mask_fn must be a function batch -> bool [rows, ...] or None; got {mask_fn!r}"
      )
    return cls(None, mask_fn)

  def of(self, batch: Any) -> Any:
    """The bool mask of real rows of ``batch`` (traced inside the step, numpy on the host)."""
    return self.fn(batch) if self.fn is not None else batch[self.key]

  def count(self, batch: Any) -> int:
    """The real rows of a host batch, exactly (a Python int)."""
    return int(np.count_nonzero(np.asarray(self.of(batch))))


def checked_step_fn(step_fn: Callable, mask: RowMask, outputs: bool = False) -> Callable:
  """``(params, batch) -> (metric, per_row)`` from ``step_fn``, checked at trace time.

  Args:
    step_fn: the user's step: returns a Metric, or with ``outputs`` ``(metric, per_row)``.
    mask: the batches' `RowMask` (its length is the rows ``per_row`` must have).
    outputs: whether ``step_fn`` returns per-row outputs.

  Returns:
    The wrapped step; ``per_row`` is None without ``outputs``. It raises ValueError (see
    `padded_eval.eval.outputs.split_step_result`) when ``step_fn`` returns the wrong thing.
  """

  @functools.wraps(step_fn)
  def checked(params, batch):
    rows = np.shape(mask.of(batch))[0]
    _check_signature(step_fn, params, batch)
    try:
      returned = step_fn(params, batch)
    except KeyError as e:  # a key the batch lacks: say which keys it has
      missing = e.args[0] if len(e.args) == 1 else None
      if not isinstance(batch, Mapping) or isinstance(e, MissingBatchKey) or missing in batch:
        raise
      raise MissingBatchKey(
        f"step_fn {_name(step_fn)} read the batch key {missing!r}, which the batch lacks; "
        f"the batch's keys: {sorted(map(str, batch))}"
      ) from e
    return split_step_result(returned, outputs, rows)

  return checked


class MissingBatchKey(KeyError):
  """A KeyError of a ``step_fn`` that read a key its batch lacks, listing the batch's keys."""

  def __str__(self) -> str:
    return str(self.args[0])


def _name(step_fn: Callable) -> str:
  return getattr(step_fn, "__qualname__", None) or repr(step_fn)


def _check_signature(step_fn: Callable, params: Any, batch: Any) -> None:
  """TypeError naming ``step_fn`` when it cannot be called as ``step_fn(params, batch)``."""
  try:
    signature = inspect.signature(step_fn)
  except (TypeError, ValueError):  # builtins and some callables have none: let the call tell
    return
  try:
    signature.bind(params, batch)
  except TypeError as e:
    keys = f" (its keys: {sorted(map(str, batch))})" if isinstance(batch, Mapping) else ""
    raise TypeError(
      f"masked_eval calls step_fn(params, batch), but step_fn {_name(step_fn)}{signature} "
      f"cannot be called with those two positional arguments ({e}). Define it as "
      f"def step_fn(params, batch): ..., reading the batch{keys}; bind other arguments first "
      "(functools.partial)"
    ) from None


def row_count(batch, mask: RowMask) -> ExactCount:
  """The exact count of real rows of ``batch`` (True entries of its mask), inside the step."""
  return ExactCount.of(jnp.sum(mask.of(batch), dtype=jnp.int32))


def batch_statistics(
  inner: Callable, mask: RowMask, axis: str | tuple[str, ...] | None
) -> Callable:
  """``(params, batch) -> (metric, row count)`` of one batch, reduced over ``axis`` if given."""

  def statistics(params, batch):
    metric, count = inner(params, batch)[0], row_count(batch, mask)
    if axis is not None:
      metric, count = metric.reduce(axis), count.reduce(axis)
    return metric, count

  return statistics


def traced_statistics(statistics: Callable, per_device: bool = False) -> Callable:
  """``(params, batch) -> shapes`` of `batch_statistics` ``statistics``, from one trace
  (``jax.eval_shape``): the state's ``jax.ShapeDtypeStruct`` tree (``per_device``: a pmap's,
  without its leading device axis)."""

  def traced(params, batch):
    shapes = jax.eval_shape(statistics, params, batch)
    if per_device:
      shapes = jax.tree.map(lambda s: jax.ShapeDtypeStruct(s.shape[1:], s.dtype), shapes)
    return shapes

  return traced


def merge_step(inner: Callable, mask: RowMask, sync_total: Callable, carrier: Any) -> Callable:
  """``(params, state, inputs) -> (state, token, per_row)``: one batch merged into ``state``,
  locally (no collective but ``sync_total`` of the multi-host flags).

  ``carrier`` says how the state is carried (`padded_eval.eval.packing`): a `StatePacking`
  (one ``uint32 [nwords]`` vector, merged as vectors inside the program) or a `TreeLayout`
  (the state's tree, merged metric by metric); the step reads only its ``merge`` and
  ``last_part``."""

  def masked_eval_step(params, state, inputs: Any):  # inputs: a backends.StepInput
    metric, per_row = inner(params, inputs.batch)
    state = carrier.merge(state, (metric, row_count(inputs.batch, mask)))
    count_total = carrier.last_part(state)
    token = (count_total.total(), tuple(sync_total(flag) for flag in inputs.sync))
    return state, token, per_row

  return masked_eval_step


def reduce_state(axis: str | tuple[str, ...]) -> Callable:
  """``(metric, count) -> (metric, count)`` combined across the mapped axis ``axis``."""
  return lambda state: (state[0].reduce(axis), state[1].reduce(axis))


def reduce_carried(carrier: Any, axis: str | tuple[str, ...]) -> Callable:
  """``(params, carried) -> carried``: one shard's carried state combined exactly across the
  mapped axis ``axis`` (`reduce_state`), read and written by ``carrier``: the final reduce."""
  return lambda params, state: carrier.pack(reduce_state(axis)(carrier.unpack(state)))


def unstack(tree: Any) -> Any:
  """Every leaf's one block ``[1, ...] -> [...]`` (inside shard_map)."""
  return jax.tree.map(lambda x: x[0], tree)


def restack(tree: Any) -> Any:
  """Every leaf ``[...] -> [1, ...]``, the block of a leading stacked axis (inside shard_map)."""
  return jax.tree.map(lambda x: x[None], tree)

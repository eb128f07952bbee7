"""Token rows scored (or continued) in padded length buckets through `masked_eval`, on any backend and host.

`padded_eval.lm.harness.HarnessLM` hands this module token rows; it

1. puts each row in the shortest of a few bucket widths that holds it (`bucket_widths`: powers of two from
   `MIN_WIDTH`, then ``max_length``), so a run compiles once per bucket width and pads little;
2. lays each bucket's rows out as fixed ``[rows, width]`` columns (sorted by length) and runs them through
   ``masked_eval(..., outputs=True)`` (one compiled step per width; padded batches of ``batch_size`` rows from
   `padded_eval.data.padded.pad_batches`), on pmap, shard_map or jit (params sharded over a mesh included);
3. with several processes, each scores an even share of every bucket (`process_slice`) and the per-request
   results are gathered (`gather_owned`), so every process returns every request's result.

The step returns per-token log-probabilities (float32, or the logits' wider float type) and greedy flags; the
host sums each request's scored positions in float64. Nothing here imports lm-eval. (When
``pad_batches(..., pad_shapes=...)`` takes several bucket sizes, `bucket_widths` and the per-bucket columns of
`run_buckets` can become one ``pad_batches`` call: docs/architecture.md, "Language models".)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from padded_eval.data.padded import pad_batches
from padded_eval.data.sharding import data_axes, local_shard_count
from padded_eval.eval._evaluate import masked_eval
from padded_eval.lm.requests import TokenRequest
from padded_eval.multihost.distributed import process_slice

__all__ = [
  "MIN_WIDTH",
  "BucketRunner",
  "bucket_widths",
  "gather_owned",
  "generate_step",
  "score_step",
]

MIN_WIDTH = 16
"""The narrowest bucket: rows of at most 16 tokens share one width."""


def bucket_widths(max_length: int) -> list[int]:
  """The bucket widths for rows of at most ``max_length`` tokens: 16, 32, 64, ... below it, then ``max_length``.

  Examples:
    >>> bucket_widths(100), bucket_widths(8)
    ([16, 32, 64, 100], [8])
  """
  widths = []
  width = MIN_WIDTH
  while width < max_length:
    widths.append(width)
    width *= 2
  return widths + [max_length]


def score_step(apply_fn: Callable[[Any, Any], Any], params: Any, batch: dict) -> dict:
  """Per-token log-probability of each target and whether it is the argmax: ``{"logprob", "greedy"}`` ``[B, T]``.

  Raises:
    ValueError: (at trace time) ``apply_fn``'s logits are not ``[B, T, V]`` for tokens ``[B, T]``.
  """
  tokens, targets = batch["tokens"], batch["targets"]
  logits = apply_fn(params, tokens)
  shape = getattr(logits, "shape", None)
  if shape is None or len(shape) != 3 or tuple(shape[:2]) != tuple(tokens.shape):
    raise ValueError(
      f"HarnessLM: apply_fn(params, tokens) must return logits [B, T, V] for tokens [B, T] = "
      f"{list(tokens.shape)}; got {type(logits).__name__} of shape {None if shape is None else list(shape)}"
    )
  dtype = jnp.promote_types(logits.dtype, jnp.float32)
  log_probs = jax.nn.log_softmax(logits.astype(dtype), axis=-1)
  picked = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
  greedy = jnp.argmax(logits, axis=-1) == targets
  return {"logprob": picked, "greedy": greedy}


def generate_step(
  generate_fn: Callable[..., Any], max_new_tokens: int, params: Any, batch: dict
) -> dict:
  """``generate_fn(params, tokens, mask, max_new_tokens)``'s new tokens ``[B, max_new_tokens]`` int32.

  Raises:
    ValueError: (at trace time) the result is not ``[B, max_new_tokens]``.
  """
  tokens = batch["tokens"]
  new = generate_fn(params, tokens, batch["prompt_mask"], max_new_tokens)
  shape = getattr(new, "shape", None)
  if shape is None or tuple(shape) != (tokens.shape[0], max_new_tokens):
    raise ValueError(
      f"HarnessLM: generate_fn(params, tokens, mask, max_new_tokens) must return the new tokens "
      f"[B, max_new_tokens] = {[tokens.shape[0], max_new_tokens]}; got {type(new).__name__} of shape "
      f"{None if shape is None else list(shape)}"
    )
  return {"tokens": jnp.asarray(new).astype(jnp.int32)}


def gather_owned(values: dict[str, np.ndarray], owned: np.ndarray) -> dict[str, np.ndarray]:
  """Every process's rows of ``values`` (``[N, ...]`` each; this process filled the rows ``owned`` marks).

  One process: ``values`` as they are. Several: one all-gather of the raw bytes (as uint32 words, so float64
  crosses without rounding), each row taken from the process that owns it.
  """
  if jax.process_count() == 1:
    return values
  from jax.experimental import multihost_utils

  owners = multihost_utils.process_allgather(owned.astype(np.int32))  # [P, N]
  owner = np.argmax(owners, axis=0)
  gathered = {}
  for key, value in values.items():
    words = np.ascontiguousarray(value).view(np.uint8).reshape(len(value), -1)
    padded = np.zeros((len(value), -(-words.shape[1] // 4) * 4), np.uint8)
    padded[:, : words.shape[1]] = words
    every = np.asarray(multihost_utils.process_allgather(padded.view(np.uint32)))  # [P, N, W]
    rows = every[owner, np.arange(len(value))].view(np.uint8)[:, : words.shape[1]]
    gathered[key] = rows.copy().view(value.dtype).reshape(value.shape)
  return gathered


class BucketRunner:
  """Runs a per-row step over rows grouped into bucket widths: one ``masked_eval`` per non-empty bucket.

  Args:
    params: the model's params, passed to ``masked_eval`` as they are.
    batch_size: rows per batch (this process's, divisible by its data shards).
    backend: ``masked_eval``'s backend.
    mesh: ``masked_eval``'s mesh (``"jit"`` / ``"shard_map"``), or None.
    max_length: the widest bucket.
  """

  def __init__(self, params: Any, *, batch_size: int, backend: str, mesh: Any, max_length: int):
    self.params = params
    self.batch_size = batch_size
    self.backend = backend
    self.mesh = mesh
    self.widths = bucket_widths(max_length)
    if backend == "pmap" or mesh is None:
      self.shards = jax.local_device_count()
    else:
      self.shards = local_shard_count(mesh, data_axes(mesh))
    if batch_size % self.shards:
      raise ValueError(
        f"HarnessLM: batch_size {batch_size} is not divisible by the {self.shards} data shards of this "
        f"process; use a multiple of {self.shards}, e.g. {self.shards * max(1, batch_size // self.shards)}"
      )

  def buckets(self, lengths: Sequence[int], widths: Sequence[int]) -> dict[int, np.ndarray]:
    """``{width: request indices}``, each bucket's requests sorted by length (longest first), widths ascending."""
    sizes = np.asarray(lengths, np.int64)
    order = np.lexsort((np.arange(len(sizes)), -sizes))
    slots = np.searchsorted(np.asarray(widths), sizes[order])
    return {w: order[slots == i] for i, w in enumerate(widths) if np.any(slots == i)}

  def run(
    self,
    step: Any,
    lengths: Sequence[int],
    columns: Callable[[np.ndarray, int], dict[str, np.ndarray]],
    max_width: int | None = None,
  ) -> tuple[dict[int, tuple[np.ndarray, dict[str, np.ndarray]]], np.ndarray]:
    """Runs ``step`` over every bucket; returns ``{width: (this process's indices, per-row outputs)}`` and
    the bool ``[N]`` of the requests this process scored. ``max_width``: the widest bucket, if narrower than
    ``max_length`` (prompts that leave room for the new tokens).

    ``step(params, batch) -> {key: [rows, ...]}`` returns per-row outputs alone (``masked_eval``'s decode form);
    ``columns(indices, width)`` lays out those requests' rows as ``{key: [len(indices), width]}`` arrays.
    """
    owned = np.zeros(len(lengths), bool)
    results = {}
    widths = self.widths if max_width is None else bucket_widths(max_width)
    for width, indices in self.buckets(lengths, widths).items():
      mine = indices[process_slice(len(indices))]
      owned[mine] = True
      batches = pad_batches(
        columns(mine, width),
        self.batch_size,
        num_devices=self.shards,
        num_batches=None if len(mine) else 1,
      )
      _, per_row = masked_eval(
        step, self.params, batches, backend=self.backend, mesh=self.mesh, outputs=True
      )
      results[width] = (mine, per_row)
    return results, owned


def score_columns(rows: Sequence[TokenRequest], max_length: int, pad_id: int):
  """The ``columns`` function of `BucketRunner.run` for scored rows: ``tokens``, ``targets``, ``scored``."""

  def columns(indices: np.ndarray, width: int) -> dict[str, np.ndarray]:
    tokens = np.full((len(indices), width), pad_id, np.int32)
    targets = np.zeros((len(indices), width), np.int32)
    for row, index in enumerate(indices):
      whole = (rows[index].context + rows[index].continuation)[-(max_length + 1) :]
      tokens[row, : len(whole) - 1] = whole[:-1]
      targets[row, : len(whole) - 1] = whole[1:]
    return {"tokens": tokens, "targets": targets}

  return columns


def scored_positions(
  rows: Sequence[TokenRequest], indices: np.ndarray, width: int, max_length: int
):
  """Bool ``[len(indices), width]``: the positions predicting each row's continuation."""
  lengths = np.array([len(rows[i].row(max_length)) for i in indices], np.int64)
  continuation = np.array([len(rows[i].continuation) for i in indices], np.int64)
  positions = np.arange(width)[None, :]
  return (positions < lengths[:, None]) & (positions >= (lengths - continuation)[:, None])


def loglikelihoods(
  runner: BucketRunner, step: Callable, rows: Sequence[TokenRequest], max_length: int, pad_id: int
) -> tuple[np.ndarray, np.ndarray]:
  """Each row's continuation log-probability (float64 ``[N]``) and whether it is greedy (bool ``[N]``)."""
  lengths = [len(r.row(max_length)) for r in rows]
  results, owned = runner.run(step, lengths, score_columns(rows, max_length, pad_id))
  logprob = np.zeros(len(rows), np.float64)
  greedy = np.zeros(len(rows), bool)
  for width, (indices, per_row) in results.items():
    scored = scored_positions(rows, indices, width, max_length)
    values = np.asarray(per_row["logprob"], np.float64)
    logprob[indices] = np.where(scored, values, 0.0).sum(axis=1)
    greedy[indices] = np.all(np.asarray(per_row["greedy"]) | ~scored, axis=1)
  gathered = gather_owned({"logprob": logprob, "greedy": greedy}, owned)
  return gathered["logprob"], gathered["greedy"]


def generations(
  runner: BucketRunner,
  step: Callable,
  prompts: Sequence[Sequence[int]],
  max_new_tokens: int,
  pad_id: int,
) -> np.ndarray:
  """The new tokens ``[N, max_new_tokens]`` of each prompt (prompts left-padded in their bucket, with a mask)."""

  def columns(indices: np.ndarray, width: int) -> dict[str, np.ndarray]:
    tokens = np.full((len(indices), width), pad_id, np.int32)
    mask = np.zeros((len(indices), width), bool)
    for row, index in enumerate(indices):
      prompt = prompts[index]
      tokens[row, width - len(prompt) :] = prompt
      mask[row, width - len(prompt) :] = True
    return {"tokens": tokens, "prompt_mask": mask}

  # prompt buckets end at max_length - max_new_tokens: a prompt and its new tokens fit in max_length
  max_width = max(1, runner.widths[-1] - max_new_tokens)
  results, owned = runner.run(step, [len(p) for p in prompts], columns, max_width)
  new = np.zeros((len(prompts), max_new_tokens), np.int32)
  for indices, per_row in results.values():
    new[indices] = per_row["tokens"]
  return gather_owned({"tokens": new}, owned)["tokens"]


def bound(fn: Callable, *args: Any) -> Callable:
  """``functools.partial(fn, *args)``: made once per model, so ``masked_eval``'s step cache keeps its programs."""
  return functools.partial(fn, *args)

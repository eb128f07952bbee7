"""How one `masked_eval` call carries its state: the `CompiledRun` the loop steps with.

The loop (`padded_eval.eval._evaluate`) sees three things and nothing else::

    run = start(compiled, params, first, saver)        # the carrier, chosen here, once
    state, token, per_row = run.step(state, run.place(step_input))
    metric, num_examples = run.finish(state, wait)

Which carrier a run uses is decided in `start`, from the state and the saver, and nowhere
else (`padded_eval.eval.packing`):

* **packed** (the small-state fast path, `padded_eval.eval.placement.is_small_state`): the state
  is one ``uint32`` vector per shard, placed once per compiled step and never donated, so every
  call starts from the same device buffers (a resumed call: from its checkpoint's, packed on the
  host and placed); one transfer at the end;
* **tree, donated** (large states): the state's tree, placed fresh (or restored from a
  checkpoint) and donated from step to step.

A checkpoint does not change the carrier: the `padded_eval.eval.checkpoint.Saver` saves the
state's tree leaves whichever carries it (unpacked on its writer thread) and restores them into
the run's carrier, so a step compiles the same programs with a checkpoint as without.

Either way a call runs at most three programs of its own, each compiled once per step and input
shapes: the step, the final reduce (pmap and shard_map: ``CompiledStep.final_for``) and the
logs of the final metric (`padded_eval.eval.cache.metric_logs`). The last two are compiled on
worker threads (`padded_eval.eval.compiling.Compiling`) while the step compiles.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from padded_eval.eval.placement import is_small_state
from padded_eval.metrics.base import Metric
from padded_eval.multihost.distributed import StepInput

if TYPE_CHECKING:
  from padded_eval.eval.backends import Backend
  from padded_eval.eval.cache import RunEntry
  from padded_eval.eval.results import EvalResults

__all__ = ["CompiledRun", "start"]


class CompiledRun:
  """One call's compiled step, its placed params and how its state is carried.

  Attributes:
    initial_state: the carried device state the first step takes (None when ``stored``).
    first: the placed first step input.
    stored: the `EvalResults` of a finished checkpoint directory that asked the same question,
      or None.
    row_axes: leading axes of a step's ``per_row`` that index rows (the backend's).
    empty: the empty host state ``(metric, ExactCount)`` of one shard (read-only).
  """

  def __init__(
    self,
    backend: Backend,
    params: Any,
    first: Any,
    empty: Any,
    entry: RunEntry | None = None,
    state: Any = None,
    stored: EvalResults | None = None,
  ):
    self._backend, self._params, self._entry = backend, params, entry
    self.initial_state, self.first, self.empty, self.stored = state, first, empty, stored
    self.row_axes = backend.row_axes

  def _compiled(self) -> RunEntry:
    assert self._entry is not None  # a stored result runs no step
    return self._entry

  def place(self, step_input: StepInput) -> Any:
    """``step_input`` on the devices."""
    return placed_batch(self._backend, step_input)

  def step(self, state: Any, placed: Any) -> tuple[Any, Any, Any]:
    """Dispatches one step: ``(state, token, per_row)`` (see `padded_eval.eval.backends.CompiledStep`)."""
    return self._compiled().step(self._params, state, placed)

  def join_compiles(self, *others: Any) -> None:
    """Waits for the programs this run compiles on worker threads (its final reduce, and the
    `padded_eval.eval.compiling.Compiling` ``others`` that are not None): a failed run leaves
    no thread running."""
    if self._entry is not None:
      self._entry.join_compile()
    for other in others:
      if other is not None:
        other.join()

  def finish(self, state: Any, wait: Callable[[Any], None]) -> tuple[Metric, int]:
    """The final reduce of ``state``, waited for with ``wait``, fetched: ``(metric, num_examples)``."""
    final = self._compiled().final_program()
    if final is not None:  # the one reduction across shards
      # XLA lays out a zero-size output (an empty score buffer) replicated; the reduce, as
      # compiled, takes every carried leaf split over the devices
      split = self._backend.split
      state = jax.tree.map(lambda x: jax.device_put(x, split) if x.size == 0 else x, state)
      state = final(self._params, state)
    wait(state)
    metric, count = self._compiled().carrier.unpack_host(self._backend.to_host(state))
    return metric, int(count.to_numpy())


def start(
  compiled: Any, params: Any, first: StepInput, saver: Any = None, wait: Callable | None = None
) -> CompiledRun:
  """Places ``params`` and the first input, and chooses how the state is carried.

  Args:
    compiled: the `padded_eval.eval.cache.CachedStep` of the call.
    params: the user's params (host or device).
    first: the first host `StepInput`.
    saver: the call's `padded_eval.eval.checkpoint.Saver`, or None: with one the call's
      question is checked against the directory's (`Saver.verify`), and the state is restored
      from its checkpoint if it has one, in the carrier the state takes without a saver.
    wait: ``wait(arrays)`` blocks on arrays computed across processes (the params checksum of
      `Saver.verify`), with the feed's deadline.

  Returns:
    The complete `CompiledRun`, with ``first`` placed and its final reduce compiling on a
    worker thread when new; its ``stored`` is the answer of a finished checkpoint directory
    (then nothing is to run).
  """
  backend = compiled.backend
  placed_params, placed_first = backend.place_params(params), placed_batch(backend, first)
  empty = compiled.empty_state(placed_params, placed_first.batch)
  stored = None
  if saver is not None:
    stored = saver.verify(empty, first.batch, params, placed_params, backend, wait)
  if stored is not None:  # a finished evaluation: nothing to place or run
    return CompiledRun(backend, placed_params, placed_first, empty, stored=stored)
  entry = compiled.entry(empty, packed=is_small_state(empty))
  saved = None if saver is None else saver.restore(empty, entry.carrier)
  if saved is not None:  # restored from the checkpoint, in the carrier's form
    state = backend.place_saved_state(saved)
  elif entry.placed is not None:  # packed: placed once, never donated
    state = entry.placed
  else:  # the tree, donated: placed fresh
    state = backend.place_state(empty)
  entry.compile_final_ahead(placed_params, state)
  return CompiledRun(backend, placed_params, placed_first, empty, entry, state)


def placed_batch(backend: Backend, step_input: StepInput) -> Any:
  """``backend.place_batch(step_input)``, quiet about float64 that overflows float32 on the way.

  Real rows beyond float32 were refused when the batch was checked
  (`padded_eval.data._batch_spec`), so what overflows here is padded rows' garbage, which the
  mask keeps out: numpy's ``RuntimeWarning: overflow encountered in cast`` would be an error
  under ``-W error`` for nothing.
  """
  with np.errstate(over="ignore"):
    return backend.place_batch(step_input)

"""How one `masked_eval` call carries its state: the `CompiledRun` the loop steps with.

The loop (`padded_eval.eval._evaluate`) sees three things and nothing else::

    run = start(compiled, params, first, saver)        # the carrier, chosen here, once
    state, token, per_row = run.step(state, run.place(step_input))
    metric, num_examples = run.finish(state, wait)

Which carrier a run uses is decided in `start`, from the backend and the state, and nowhere
else:

* **packed** (the small-state fast path, `padded_eval.eval.placement.is_small_state`: one
  process, a small state, no checkpoint): the state is one ``uint32`` vector per shard
  (`padded_eval.eval.packing`), placed once per compiled step and never donated, so every
  call starts from the same device buffers; one transfer per shard at the end;
* **tree, donated** (everything else: large states, several processes, checkpoints): the
  state's tree, placed fresh (or restored from a checkpoint) and donated from step to step.

The one row-count rule lives here too (`CompiledRun.place` / `finish`): a packed run on a
backend whose step would pay a collective for the count (``counts_rows_on_host``, the jit
backend) with a mask key counts the real rows on the host, and its compiled step does not;
every other run counts them in the step, in the carried state.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

from padded_eval.eval.compiling import Compiling, choose_tier
from padded_eval.eval.placement import is_small_state
from padded_eval.metrics.base import Metric
from padded_eval.multihost.distributed import StepInput

__all__ = ["STEP_COMPILE_THREAD", "CompiledRun", "start"]

STEP_COMPILE_THREAD = "padded_eval-compile-step"
"""The name of the worker thread `CompiledRun.compile_ahead` compiles a step on."""


class CompiledRun:
  """One call's compiled step, its placed params and how its state is carried.

  Attributes:
    initial_state: the carried device state the first step takes.
    first: the placed first step input.
    stored: the `EvalResults` of a finished checkpoint directory that asked the same question,
      or None.
    row_axes: leading axes of a step's ``per_row`` that index rows (the backend's).
    empty: the empty host state ``(metric, ExactCount)`` of one shard (read-only).
  """

  def __init__(self, backend, params, step: Callable, state, packing=None, host_mask=None):
    self._backend, self._params, self._step = backend, params, step
    self._packing, self._host_mask = packing, host_mask  # host_mask: rows counted on the host
    self._host_rows = 0
    self._fresh = False  # see compile_ahead
    self._compiling: Compiling | None = None
    self._program = step  # the tier of the step that runs (`start` chooses it)
    self.initial_state, self.row_axes = state, backend.row_axes
    self.first = self.stored = self.empty = None  # set by `start`

  def place(self, step_input: StepInput) -> Any:
    """``step_input`` on the devices (its real rows counted here where the run counts on the host)."""
    self._count(step_input)
    return self._backend.place_batch(step_input)

  def _count(self, step_input: StepInput) -> None:
    if self._host_mask is not None:
      self._host_rows += self._host_mask.count(step_input.batch)

  def compile_ahead(self) -> None:
    """Starts compiling the step (the tier `start` chose) for the first input on a worker thread,
    when it has not run for these shapes yet (one process): traced and lowered here, then
    compiled by XLA (which releases the GIL) while this thread traces and lowers the programs
    that compile beside it (`padded_eval.eval.cache.prepare_logs`). The first `step` waits for
    it; a compile that fails there is redone by the step's own call, which raises. Flax mnist's
    first call: about 0.02 s less, the logs program's tracing and lowering off its critical path."""
    lower = getattr(self._program, "lower", None)  # None: a step wrapped by a test
    ahead = self._fresh and lower is not None and self.initial_state is not None
    if ahead and not jax.config.jax_disable_jit and jax.process_count() == 1:
      lowered = lower(self._params, self.initial_state, self.first)
      self._compiling = Compiling(lowered, STEP_COMPILE_THREAD)
    self._fresh = False

  def step(self, state: Any, placed: Any) -> tuple[Any, Any, Any]:
    """Dispatches one step: ``(state, token, per_row)`` (see `padded_eval.eval.backends.CompiledStep`)."""
    if self._compiling is not None:  # the first step: its compile, from compile_ahead
      self._compiling, compiling = None, self._compiling
      compiling.result()  # the call below finds it compiled (None: it compiles again, raises)
    return self._program(self._params, state, placed)

  def finish(self, state: Any, wait: Callable[[Any], None]) -> tuple[Metric, int]:
    """The final reduce of ``state``, waited for with ``wait``, fetched: ``(metric, num_examples)``."""
    state = self._backend.finalize(state, self._packing)  # the one reduction across devices
    wait(state)
    metric, count = self._backend.to_host(state, self._packing)
    rows = self._host_rows if self._host_mask is not None else int(count.to_numpy())
    return metric, rows


def start(
  compiled: Any, params: Any, first: StepInput, saver: Any = None, wait: Callable | None = None
) -> CompiledRun:
  """Places ``params`` and the first input, and chooses how the state is carried.

  Args:
    compiled: the `padded_eval.eval.cache.CachedStep` of the call.
    params: the user's params (host or device).
    first: the first host `StepInput`.
    saver: the call's `padded_eval.eval.checkpoint.Saver`, or None: with one the call's
      question is checked against the directory's (`Saver.verify`), and the state is a donated
      tree, restored from its checkpoint if it has one.
    wait: ``wait(arrays)`` blocks on arrays computed across processes (the params checksum of
      `Saver.verify`), with the feed's deadline.

  Returns:
    The `CompiledRun`, with ``first`` placed (and counted where the run counts on the host);
    its ``stored`` is the answer of a finished checkpoint directory (then nothing is to run).
  """
  backend = compiled.backend
  placed_params, placed_first = backend.place_params(params), backend.place_batch(first)
  empty, fresh, written = compiled.first_state(placed_params, placed_first.batch)
  stored = None
  if saver is not None:
    stored = saver.verify(empty, first.batch, params, placed_params, backend, wait)
  if stored is not None:  # a finished evaluation: nothing to place or run
    run = CompiledRun(backend, placed_params, compiled.compiled.step, None)
  elif saver is None and is_small_state(empty):  # packed, placed once, not donated
    host_mask = compiled.mask if backend.counts_rows_on_host and compiled.mask.fn is None else None
    packing, step, state, new = compiled.packed_entry(empty, count_rows=host_mask is None)
    run = CompiledRun(backend, placed_params, step, state, packing, host_mask)
    fresh = fresh or new
  else:  # the tree, donated
    saved = None if saver is None else saver.restore(empty)
    state = backend.place_state(empty) if saved is None else backend.place_saved_state(saved)
    run = CompiledRun(backend, placed_params, compiled.compiled.step, state)
  run._count(first)
  run.first, run.stored, run.empty, run._fresh = placed_first, stored, empty, fresh
  run._program = choose_tier(run._step, written)  # the same for every call of these shapes
  return run

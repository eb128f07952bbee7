"""What runs beside `masked_eval`'s loop: per-row outputs, checkpoints and progress, as hooks.

The loop (`padded_eval.eval._evaluate`) holds one list of hooks and calls each at fixed points:
`Hook.dispatched` right after a step is dispatched, `Hook.waited` once that step has finished,
`Hook.close` when the loop ends (``failed`` if it raised) and `Hook.finish` on the results. A
call without outputs, checkpoint or progress bar has an empty list: nothing is called per step.
"""

from __future__ import annotations

import time
from typing import Any, NamedTuple

from padded_eval.eval.outputs import RowOutputs

__all__ = ["Dispatched", "Hook", "Outputs", "Progress"]


class Dispatched(NamedTuple):
  """One dispatched step, as hooks see it.

  Attributes:
    index: the step's number in this call (0 first).
    state: the carried state the step returned (device arrays; the next step may donate it).
    per_row: the step's per-row outputs (device arrays), or None.
    batch: the step's host batch.
    batches_consumed: real batches of the source read so far (resumed runs: and before).
  """

  index: int
  state: Any
  per_row: Any
  batch: Any
  batches_consumed: int


class Hook:
  """A hook of the loop; every method is optional (the defaults do nothing)."""

  def dispatched(self, step: Dispatched) -> None:
    """Step ``step.index`` was dispatched (it may still run)."""

  def waited(self, index: int) -> None:
    """Step ``index`` has finished."""

  def close(self, failed: bool) -> None:
    """The loop ended; ``failed``: it raised (wait boundedly on what depends on the failed step)."""

  def finish(self, results: Any) -> Any:
    """The final results -> what `masked_eval` returns (unchanged by default)."""
    return results


class Outputs(Hook):
  """``outputs=True``: each step's per-row outputs start their copy to the host at dispatch and
  are collected once the step has finished (`padded_eval.eval.outputs.RowOutputs`); `finish`
  returns ``(results, per_row)``."""

  def __init__(self, row_axes: int, mask_key: str | None, num_batches: int | None):
    self._rows = RowOutputs(row_axes, mask_key, num_batches)
    self._pending: dict = {}  # step index -> its copies on their way to the host

  def dispatched(self, step: Dispatched) -> None:
    self._pending[step.index] = self._rows.start(step.per_row, step.batch)

  def waited(self, index: int) -> None:
    self._rows.collect(self._pending.pop(index))  # its device arrays go now

  def finish(self, results: Any) -> tuple[Any, Any]:
    return results, self._rows.result()


class Progress(Hook):
  """``progress=True`` (or None, the default, for batches without a length when stderr is a
  terminal: `masked_eval`): a tqdm bar over steps (batches) showing the real examples this call read
  and examples per second (host count), drawn by process 0 only.

  Args:
    total: the steps of the whole evaluation (``len(batches)``, else Python's length hint, e.g. a
      tf.data pipeline of known cardinality), or None (the bar counts without a total).
    mask: the call's `padded_eval.eval.step.RowMask`.
    initial: steps already run (a resumed checkpoint): where the bar starts.
  """

  def __init__(self, total: int | None, mask: Any, initial: int = 0):
    import jax
    import tqdm  # imported only when asked for

    self._bar = tqdm.tqdm(
      total=total,
      initial=initial,
      unit="batch",
      desc="masked_eval",
      disable=jax.process_index() != 0,  # one bar for the whole run, not one per host
    )
    self._mask = mask  # a padded_eval.eval.step.RowMask
    self._examples = 0
    self._start = time.perf_counter()

  def dispatched(self, step: Dispatched) -> None:
    self._examples += self._mask.count(step.batch)
    elapsed = max(time.perf_counter() - self._start, 1e-9)
    # strings: tqdm writes numbers in its short form (20000 as 2e+4)
    self._bar.set_postfix(
      examples=f"{self._examples:d}", ex_per_s=f"{self._examples / elapsed:.0f}", refresh=False
    )
    self._bar.update(1)

  def close(self, failed: bool) -> None:
    del failed
    self._bar.close()

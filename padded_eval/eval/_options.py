"""`masked_eval`'s settings, grouped and checked once: the driver's functions take `EvalOptions`.

The public signature keeps its keywords; `EvalOptions.checked` groups them as they are used:
where the work runs (``layout``), which rows are real (``mask``, one `RowMask`), how steps are fed
(``steps_in_flight``, ``timeout``), what is reported (``progress``, ``on_invalid``, ``outputs``)
and the checkpoint (``checkpoint_dir``, ``checkpoint_every``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from padded_eval.eval.step import RowMask
from padded_eval.multihost.distributed import check_timeout, several_processes
from padded_eval.validation import check_choice, check_int, check_positive_int

__all__ = ["ON_INVALID", "EvalOptions"]

ON_INVALID = ("raise", "warn", "ignore")


@dataclasses.dataclass(frozen=True)
class EvalOptions:
  """The checked settings of one `masked_eval` call (see its docstring for each).

  Attributes:
    layout: ``(backend, axis_name, mesh, data_axes)``, as `padded_eval.eval.backends.make_backend`
      takes them.
    mask: the batches' `RowMask` (a key, or a ``mask_fn``).
    steps_in_flight: the bound on dispatched, unfinished steps (one process), or None: the
      default of the devices (`padded_eval.multihost.distributed.default_steps_in_flight`).
    timeout: seconds to wait for other processes, or None (the default).
    progress: a progress bar: True, False, or None (when the length is unknown and stderr is a
      terminal).
    on_invalid: ``"raise"``, ``"warn"`` or ``"ignore"``.
    outputs: ``step_fn`` returns ``(metric, per_row)``.
    checkpoint_dir: the checkpoint directory, or None.
    checkpoint_every: steps between two saves.
  """

  layout: tuple
  mask: RowMask
  steps_in_flight: int | None
  timeout: float | None
  progress: bool | None
  on_invalid: str
  outputs: bool
  checkpoint_dir: Any
  checkpoint_every: int

  @classmethod
  def checked(
    cls, layout: tuple, mask: tuple, feeding: tuple, reporting: tuple, checkpoint: tuple
  ) -> EvalOptions:
    """Groups and checks `masked_eval`'s keywords.

    Args:
      layout: ``(backend, axis_name, mesh, data_axes)`` (checked by the backend).
      mask: ``(mask_key, mask_fn)``.
      feeding: ``(steps_in_flight, timeout)``.
      reporting: ``(progress, on_invalid, outputs)``.
      checkpoint: ``(checkpoint_dir, checkpoint_every)``.

    Raises:
      ValueError: a setting out of range, or settings that cannot be combined (each message
        names the argument, what came and what is expected).
    """
    (steps_in_flight, timeout), (progress, on_invalid, outputs) = feeding, reporting
    directory, every = checkpoint
    check_choice("on_invalid", on_invalid, ON_INVALID)
    if progress is not None and not isinstance(progress, bool):
      raise ValueError(f"progress must be True, False or None (automatic); got {progress!r}")
    if not isinstance(outputs, bool):
      raise ValueError(f"outputs must be True or False; got {outputs!r}")
    if steps_in_flight is not None:
      steps_in_flight = check_int("steps_in_flight", steps_in_flight, minimum=1)
    if timeout is not None:
      timeout = check_timeout(timeout)
    if directory is not None:
      check_positive_int("checkpoint_every", every)
    options = cls(
      tuple(layout), RowMask.of_call(*mask), steps_in_flight, timeout, progress,
      on_invalid, outputs, directory, every,
    )  # fmt: skip
    options.check_combinations()
    return options

  def check_combinations(self) -> None:
    """Raises ValueError for settings that cannot go together."""
    if self.mask.fn is not None:
      self._check_mask_fn()
    if self.checkpoint_dir is not None and self.outputs:
      raise ValueError(
        "checkpoint_dir cannot be combined with outputs=True: the per-row outputs gathered so "
        "far are not saved; evaluate without outputs, or without checkpoint_dir"
      )

  def _check_mask_fn(self) -> None:
    unsupported = [
      name
      for name, given in [
        ("outputs=True", self.outputs),
        ("checkpoint_dir", self.checkpoint_dir is not None),
        (f"{jax.process_count()} processes", several_processes()),
      ]
      if given
    ]
    if unsupported:
      raise ValueError(
        f"mask_fn cannot be combined with {', '.join(unsupported)}; pass dict batches with a "
        "mask key instead (pe.pad_batches, mask_key=)"
      )

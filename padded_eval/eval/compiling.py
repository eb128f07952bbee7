"""Compiling a lowered program on a worker thread, while the caller's thread goes on.

Every program of `masked_eval` is compiled as ``jax.jit`` compiles it, with XLA's defaults on
every platform: what `masked_eval` runs for the user's step is what ``jax.jit`` of it gives, so
per-row outputs equal the user's own ``jax.jit`` of the same function, bit for bit
(``tests/eval/test_compiling.py``). The one thing done here is when: the programs whose shapes
are known before the first step (the final reduce of the carried state, the logs of the final
metric) are traced and lowered on the caller's thread, and compiled on a worker thread
(`Compiling`) while the step compiles, instead of after the last step.
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["Compiling"]


class Compiling:
  """A program being compiled on a worker thread named ``thread_name``.

  Only ``Lowered.compile`` runs there (XLA, which releases the GIL); tracing and lowering ran on
  the caller's thread, so the warnings they raise stay under the caller's
  ``warnings.catch_warnings``. The thread is not a daemon: an interpreter exiting waits for it.
  """

  def __init__(self, lowered: Any, thread_name: str):
    self._compiled = None
    self._thread = threading.Thread(
      target=self._compile, args=(lowered,), name=thread_name, daemon=False
    )
    self._thread.start()

  def _compile(self, lowered: Any) -> None:
    try:
      self._compiled = lowered.compile()
    except Exception:  # noqa: BLE001 - the caller compiles it again on its own thread and raises there
      self._compiled = None

  def join(self) -> None:
    """Waits for the compile to end (its result stays for `result`)."""
    self._thread.join()

  def result(self) -> Any:
    """The `jax.stages.Compiled` program (waits for the compile), or None if it failed."""
    self._thread.join()
    return self._compiled

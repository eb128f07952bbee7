"""How the driver compiles its programs: XLA's options on CPU, and compiling ahead on a thread.

`compiler_options` is what every program of `masked_eval` (the step, the final combination of
the partial states, the logs) is compiled with. On CPU it turns XLA's fusion emitters off: the
step of a small evaluation is mostly long elementwise chains (the exact sums' error-free
transformations), which the fusion emitters compile about 1.5x slower than XLA's loop emitters,
to the same bits (``tests/exact/test_numerics_regressions.py`` checks the error-free
transformations compiled both ways, ``tests/eval/test_compiling.py`` the models of
``examples/from_flax``). A ``--xla_cpu_use_fusion_emitters`` in ``XLA_FLAGS`` is the user's
choice, and wins. And XLA splits a program's machine code into as many parts as there are
cores to compile them (``xla_cpu_parallel_codegen_split_count``, at most 32): on 2 cores, Flax
mnist's converted step then compiled with about a fifth less CPU time (0.24-0.27 s in 6 runs of
7, against 0.27-0.39 s), the same bits. Each option the user's ``XLA_FLAGS`` names is left to it.

`Compiling` compiles a lowered program on a worker thread: programs whose shapes are known before
the first step (the logs of the final metric, the combination of the partial states) compile
while the step traces and compiles, instead of after the last step.
"""

from __future__ import annotations

import os
import threading
from typing import Any

__all__ = ["CPU_COMPILER_OPTIONS", "Compiling", "compiler_options"]


def _cores() -> int:
  """The CPU cores this process may run on."""
  affinity = getattr(os, "sched_getaffinity", None)
  return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


CPU_COMPILER_OPTIONS = {
  "xla_cpu_use_fusion_emitters": False,
  "xla_cpu_parallel_codegen_split_count": min(_cores(), 32),
}
"""The XLA options of the driver's programs on CPU (see the module's docstring)."""


def compiler_options(platform: str) -> dict | None:
  """The ``compiler_options`` of the driver's ``jax.jit``s for devices of ``platform``.

  Args:
    platform: the devices' platform (``"cpu"``, ``"gpu"``, ``"tpu"``).

  Returns:
    On CPU, `CPU_COMPILER_OPTIONS` less the ones ``XLA_FLAGS`` sets (the user's choice wins), or
    None if it sets them all; None (XLA's defaults) elsewhere.
  """
  if platform != "cpu":
    return None
  flags = os.environ.get("XLA_FLAGS", "")
  options = {name: value for name, value in CPU_COMPILER_OPTIONS.items() if name not in flags}
  return options or None


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

  def result(self) -> Any:
    """The `jax.stages.Compiled` program (waits for the compile), or None if it failed."""
    self._thread.join()
    return self._compiled

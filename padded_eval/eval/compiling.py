"""How the driver compiles its programs: XLA's options on CPU, and compiling ahead on a thread.

`compiler_options` is what every program of `masked_eval` (the step, the final combination of
the partial states, the logs) is compiled with. On CPU it turns XLA's fusion emitters off: the
step of a small evaluation is mostly long elementwise chains (the exact sums' error-free
transformations), which the fusion emitters compile about 1.5x slower than XLA's loop emitters,
to the same bits (``tests/exact/test_numerics_regressions.py`` checks the error-free
transformations compiled both ways, ``tests/eval/test_compiling.py`` the models of
``examples/from_flax``). A ``--xla_cpu_use_fusion_emitters`` in ``XLA_FLAGS`` is the user's
choice, and wins. And XLA splits a program's machine code into parts that compile side by side
(``xla_cpu_parallel_codegen_split_count``, `split_count`): four per core, at most 32, and one
on a single core. A step's exact merge is one large kernel, and a part holding it alone bounds
the compile: in parts of four per core the rest of the program is spread over the other cores.
In 11 interleaved runs on 2 cores, Flax mnist's converted step compiled in 0.14-0.19 s (median
0.15) in 8 parts, against 0.18-0.24 s (median 0.21) in 2; on one core, one part (0.21-0.22 s)
was about 0.01 s faster than four. The same bits. Each option the user's ``XLA_FLAGS`` names is left to it.
The logs program (``compute_logs`` of the final metric, run once per call on a few totals) is
also compiled without LLVM's optimizations (`logs_compiler_options`): half the compile time, and
each float operation as the metric's ``compute`` writes it.

`Compiling` compiles a lowered program on a worker thread: programs whose shapes are known before
the first step (the logs of the final metric, the combination of the partial states) compile
while the step traces and compiles, instead of after the last step.

**Two tiers of a step** (`TieredStep`). On CPU a step is also jitted in a quick tier, without
LLVM's optimizations (`QUICK_OPTIONS`): it compiles in about half the time (Flax mnist's
converted step 0.08-0.10 s instead of 0.18-0.21 s), but its elementwise loops run 2-6x slower
(measured: a bias and relu over ``[1024, 1024]`` 0.14 -> 0.85 ms; ``Accuracy`` over ``[1024,
1000]`` logits 1.5 -> 9.3 ms; matrix products and convolutions, which XLA hands to its runtime
library, as fast). `choose_tier` takes the quick tier when the step is small: the values one
batch's statistics write (the model and the metrics' updates, traced: `written_bytes`) at most
`QUICK_BYTES`, so a step's extra time stays within a few hundredths of a millisecond, a tenth of
what the driver spends on each step (782 mnist steps from numpy arrays, warm, in two runs:
medians 0.258 and 0.306 s against 0.256 and 0.284 s optimized; the first call 0.42-0.46 s
against 0.69-0.72 s). The choice depends on the step and its input shapes alone, never on timing
or on earlier calls: one compilation per step and shapes, and the same program for the same
question. Unoptimized, each float operation is the one the step writes (no multiply-add
contracted into one rounding), so a model's outputs may differ from the optimized tier's in the
last bit, as they may between batch sizes or devices; the statistics are exact in both
(``tests/eval/test_compiling.py`` checks results in both tiers against float64,
``tests/exact/test_numerics_regressions.py`` the error-free transformations). An
``xla_backend_optimization_level`` in ``XLA_FLAGS`` leaves one tier, the user's.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

__all__ = [
  "CPU_COMPILER_OPTIONS",
  "CPU_LOGS_OPTIONS",
  "QUICK_BYTES",
  "QUICK_OPTIONS",
  "Compiling",
  "TieredStep",
  "choose_tier",
  "compiler_options",
  "logs_compiler_options",
  "split_count",
  "written_bytes",
]


def _cores() -> int:
  """The CPU cores this process may run on."""
  affinity = getattr(os, "sched_getaffinity", None)
  return len(affinity(0)) if affinity is not None else os.cpu_count() or 1


def split_count(cores: int) -> int:
  """The parts XLA compiles a program's machine code in on ``cores`` cores: four per core (at most
  32), one on a single core (see the module's docstring)."""
  return 1 if cores <= 1 else min(4 * cores, 32)


CPU_COMPILER_OPTIONS = {
  "xla_cpu_use_fusion_emitters": False,
  "xla_cpu_parallel_codegen_split_count": split_count(_cores()),
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
  return _left_by_xla_flags(CPU_COMPILER_OPTIONS) if platform == "cpu" else None


def _left_by_xla_flags(options: dict) -> dict | None:
  """``options`` less the ones ``XLA_FLAGS`` names (the user's choice wins); None if none is left."""
  flags = os.environ.get("XLA_FLAGS", "")
  return {name: value for name, value in options.items() if name not in flags} or None


QUICK_OPTIONS = {"xla_backend_optimization_level": 0}
"""Added on CPU for the quick tier of a step (`TieredStep`) and the logs program: LLVM's
optimizations off."""

CPU_LOGS_OPTIONS = QUICK_OPTIONS
"""Added on CPU for the logs program (`logs_compiler_options`): LLVM's optimizations off."""


def logs_compiler_options(platform: str) -> dict | None:
  """The ``compiler_options`` of the logs program (``compute_logs`` of the final metric), and of
  the combination of a small state's partial states (`padded_eval.eval.packing`).

  Each runs once per call, on a few totals, and its compile is on a small evaluation's first
  call: on CPU it is compiled without LLVM's optimizations (`CPU_LOGS_OPTIONS`, on top of
  `compiler_options`): Flax mnist's logs compiled in about 0.015 s instead of 0.03 s, while the
  step compiled beside it. The combination is exact integer and error-free float arithmetic,
  the same bits at any level. Unoptimized, every float operation of the logs is the one the
  metric's ``compute`` writes (no multiply-add contracted into one rounding), as when
  ``compute`` runs eagerly. ``tests/eval/test_compiling.py`` checks the logs of many metrics bit
  for bit against the eager ones and against XLA's defaults, and the combination against both
  levels. An option ``XLA_FLAGS`` names is left to it.

  Args:
    platform: the devices' platform.

  Returns:
    The options, or None (XLA's defaults) off CPU or when ``XLA_FLAGS`` sets them all.
  """
  if platform != "cpu":
    return None
  return _left_by_xla_flags({**CPU_COMPILER_OPTIONS, **CPU_LOGS_OPTIONS})


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


QUICK_BYTES = 1 << 18
"""The most bytes one batch's statistics may write (`written_bytes`) for the quick tier (256 KiB:
Flax mnist's converted step writes 0.22 MB, its sst2 step 0.60 MB; unoptimized elementwise loops
took up to about 0.2 ms more per MB written, so a step this small stays within about 0.05 ms of
its optimized tier)."""


class TieredStep:
  """A step jitted in two tiers: ``optimized`` (the backend's ``compiler_options``) and, on CPU,
  ``quick`` (`QUICK_OPTIONS` on top; None where they would be the same program). Called or
  lowered directly, it is the optimized tier; `choose_tier` picks the tier of a call.

  Args:
    fn: the step function.
    options: the backend's ``compiler_options`` (`compiler_options`).
    platform: the devices' platform (the quick tier exists on CPU only).
    **jit_kwargs: the rest of ``jax.jit``'s arguments (``donate_argnums``, ``out_shardings``).
  """

  def __init__(self, fn: Callable, options: dict | None, platform: str, **jit_kwargs):
    self.optimized = jax.jit(fn, compiler_options=options, **jit_kwargs)
    quick = logs_compiler_options(platform)
    same = quick is None or quick == options
    self.quick = None if same else jax.jit(fn, compiler_options=quick, **jit_kwargs)

  def __call__(self, *args):
    return self.optimized(*args)

  def lower(self, *args):
    return self.optimized.lower(*args)


def choose_tier(step: Any, written: int) -> Callable:
  """The tier of ``step`` that runs (see the module's docstring): its ``quick`` tier when it has
  one, one process runs and one batch's statistics write at most `QUICK_BYTES` (``written``,
  `written_bytes` of their traced program), else ``step`` itself (the optimized tier).

  Args:
    step: a `TieredStep`, or any step (which is its own program).
    written: the bytes one batch's statistics write, for the step's input shapes.

  Returns:
    The program to call: the same for every call of these shapes.
  """
  quick = getattr(step, "quick", None)
  if quick is None or written > QUICK_BYTES or jax.process_count() > 1:
    return step
  return quick


def written_bytes(jaxpr: Any) -> int:
  """The bytes of every value ``jaxpr`` computes, counting nested programs (a call's, a loop
  body's) once: what a step writes, the measure of its elementwise work."""
  total = 0
  for eqn in jaxpr.eqns:
    for var in eqn.outvars:
      aval = var.aval
      shape, dtype = getattr(aval, "shape", None), getattr(aval, "dtype", None)
      if shape is not None and dtype is not None:
        total += int(np.prod(shape, dtype=np.int64)) * _itemsize(dtype)
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        inner = getattr(sub, "jaxpr", sub)  # a ClosedJaxpr holds a Jaxpr
        if hasattr(inner, "eqns"):
          total += written_bytes(inner)
  return total


def _itemsize(dtype: Any) -> int:
  try:
    return np.dtype(dtype).itemsize
  except TypeError:  # an extended dtype (a PRNG key): its own size, or a word
    return int(getattr(dtype, "itemsize", 8) or 8)

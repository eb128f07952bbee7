"""masked_eval's cache of compiled steps: one compilation per step function, not per object.

A compiled step (`padded_eval.eval.backends.CompiledStep`) is cached under a key of the step
function (`step_key`), the backend, the mask key and ``outputs``. Equal step functions share
one entry even when they are different objects: a ``functools.partial`` of the same function
with equal hashable arguments (``functools.partial(eval_step, config=frozen_config)`` built
inside the user's ``evaluate()`` on every call, as flax's lm1b example does) compiles once.
Functions that cannot be compared (lambdas and closures made anew on every call, partials with
unhashable arguments) are keyed by identity; when the same code is compiled for the same input
shapes `RECOMPILES_BEFORE_WARNING` times, a `RecompileWarning` says why and how to avoid it.

Each entry also keeps, per input shapes, the empty state the driver starts from and the bytes one
batch's statistics write (traced once, `padded_eval.eval.step.traced_statistics`), so a repeated
call neither traces them again nor rebuilds the state.
"""

from __future__ import annotations

import collections
import functools
import warnings
from collections.abc import Callable, Hashable
from typing import Any

import jax
import numpy as np

from padded_eval.caches import registry
from padded_eval.eval import packing as packing_lib
from padded_eval.eval import placement
from padded_eval.eval.compiling import Compiling
from padded_eval.exact.accumulate import ExactCount
from padded_eval.metrics.eager import full_state_shapes, trimmed
from padded_eval.multihost.distributed import several_processes

__all__ = [
  "FINAL_COMPILE_THREAD",
  "RECOMPILES_BEFORE_WARNING",
  "CachedStep",
  "RunEntry",
  "RecompileWarning",
  "cached_step",
  "clear_caches",
  "metric_logs",
  "prepare_logs",
  "step_key",
]

RECOMPILES_BEFORE_WARNING = 3
FINAL_COMPILE_THREAD = "padded_eval-compile-final"
"""The name of the worker thread a run's final reduce compiles on (`RunEntry`)."""


class RecompileWarning(UserWarning):
  """The same step code was compiled again for the same shapes (a new function object per call).

  Examples:
    >>> import warnings
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> batches = pe.pad_batches({"x": np.arange(3.0)}, 8)
    >>> with warnings.catch_warnings(record=True) as caught:
    ...   warnings.simplefilter("always")
    ...   for _ in range(3):  # a new function object for the same code each time
    ...     step = lambda params, batch: pe.metrics.Mean("x").batch_updates(x=batch["x"], mask=batch["mask"])
    ...     _ = pe.masked_eval(step, None, batches, backend="jit")
    >>> any(issubclass(w.category, pe.RecompileWarning) for w in caught)
    True
  """


class _Identity:
  """A key that is equal only to itself: for step functions that cannot be compared."""

  __slots__ = ("fn",)

  def __init__(self, fn: Any):
    self.fn = fn

  def __hash__(self) -> int:
    return id(self.fn)

  def __eq__(self, other: object) -> bool:
    return isinstance(other, _Identity) and other.fn is self.fn


def step_key(fn: Callable) -> Hashable:
  """The cache key of step function ``fn``: equal for steps that compute the same thing.

  A ``functools.partial`` is keyed on ``(function, args, sorted keywords)``, recursively, each
  argument with its type (so ``1`` and ``1.0`` differ); a hashable callable on itself (plain
  functions by identity, bound methods by ``(object, function)``); anything else, or a
  partial with an unhashable argument, by identity.

  Args:
    fn: the step function.

  Returns:
    A hashable key.
  """
  if isinstance(fn, functools.partial):
    keywords = sorted(fn.keywords.items(), key=lambda item: item[0])
    key = (
      "partial",
      step_key(fn.func),
      tuple((type(a), a) for a in fn.args),
      tuple((name, type(value), value) for name, value in keywords),
    )
  else:
    key = fn
  try:
    hash(key)
  except TypeError:
    return _Identity(fn)
  return key


def _origin(fn: Callable) -> Any:
  """What stays the same when the same step is rebuilt: the code underneath ``fn``."""
  while isinstance(fn, functools.partial):
    fn = fn.func
  fn = getattr(fn, "__func__", fn)  # bound method -> function
  return getattr(fn, "__code__", type(fn))


def _shapes_key(tree: Any) -> Hashable:
  leaves, treedef = jax.tree.flatten(tree)
  return treedef, tuple((np.shape(x), getattr(x, "dtype", type(x))) for x in leaves)


_compiles: collections.Counter = registry.kept(
  collections.Counter(), "padded_eval.eval.cache._compiles"
)  # (origin, backend, ..., shapes) -> count
CACHE_SIZE = 64
"""The most compiled steps kept (least recently used dropped first)."""
ENTRY_SIZE = 16
"""Per compiled step, the most input shapes (empty states) and packed states kept."""
COMPILES_KEPT = 4096
"""The most distinct (step code, shapes) compile counts kept for `RecompileWarning`."""


class CachedStep:
  """One compiled step and what a call on it reuses: per input shapes, the empty state; per
  empty state and carrier, a `RunEntry` (the step, its final reduce, a packed state placed once).

  Attributes:
    backend: the `padded_eval.eval.backends.Backend` it was compiled for.
    mask: the `padded_eval.eval._options.RowMask` of its batches.
    compiled: the `padded_eval.eval.backends.CompiledStep`.
  """

  def __init__(self, backend: Any, mask: Any, compiled: Any, origin: tuple):
    self.backend, self.mask, self.compiled = backend, mask, compiled
    self._origin = origin  # what stays the same when the same step is rebuilt
    self._empty: collections.OrderedDict = collections.OrderedDict()
    self._entries: collections.OrderedDict = collections.OrderedDict()  # (id(empty), packed)

  def empty_state(self, params: Any, batch: Any) -> Any:
    """The empty carried state ``(metric, ExactCount)`` of one shard, as host arrays.

    Args:
      params: the placed params.
      batch: the placed first batch.

    Returns:
      The empty state with numpy leaves, from one trace of the step's statistics (which traces
      ``step_fn`` once), computed once per input shapes (treat it as read-only).

    Raises:
      ValueError: the metric's ``empty()`` does not have the updated state's structure.
    """
    key = _shapes_key((params, batch))
    found = self._empty.get(key)
    if found is not None:
      return found
    _count_compile((*self._origin, key))
    # copies: on CPU np.asarray would view the device buffers of the zeros, keeping them alive
    shapes = self.compiled.traced_statistics(params, batch)
    with placement.on_host():  # constants: no program on an accelerator for them
      empty = jax.tree.map(np.array, _checked_empty(shapes))
    self._empty[key] = empty
    _bound(self._empty, ENTRY_SIZE)
    return empty

  def entry(self, empty: Any, packed: bool) -> RunEntry:
    """The `RunEntry` of ``empty`` (as `empty_state` returned it) carried packed or as its tree:
    made once, so a later call with the same shapes compiles nothing."""
    key = (id(empty), packed)
    found = self._entries.get(key)
    if found is None or found[0] is not empty or found[1].deleted():
      carrier = packing_lib.StatePacking(empty) if packed else packing_lib.TreeLayout(empty)
      found = self._entries[key] = (empty, RunEntry(self.compiled, self.backend, carrier, packed))
      _bound(self._entries, ENTRY_SIZE)
    else:
      self._entries.move_to_end(key)
    return found[1]

  def packed(self, empty: Any) -> tuple[Any, Callable, Any]:
    """``(packing, step, placed state)`` carrying ``empty`` packed (`padded_eval.eval.packing`)."""
    entry = self.entry(empty, packed=True)
    return entry.carrier, entry.step, entry.placed


class RunEntry:
  """What a run reuses per empty state and carrier (kept by `CachedStep`):
  the carrier, the step, the final reduce and, packed, the placed empty state.

  Attributes:
    carrier: a `padded_eval.eval.packing.StatePacking` or `TreeLayout`.
    step: the compiled step for ``carrier``.
    placed: the placed packed empty state (packed), else None.
  """

  def __init__(self, compiled: Any, backend: Any, carrier: Any, packed: bool):
    self.carrier, self.step = carrier, compiled.step_for(carrier)
    self._final = None if compiled.final_for is None else compiled.final_for(carrier)
    self._compiled_final: Any = None  # a Compiling, then the compiled program
    self.placed = backend.place_state(carrier.empty) if packed else None

  def compile_final_ahead(self, params: Any, state: Any) -> None:
    """Starts compiling the final reduce for ``state`` on a worker thread, once (traced and
    lowered here; one process, and not under ``jax.disable_jit()``, where it runs op by op)."""
    disabled = jax.config.jax_disable_jit  # pyrefly: ignore[missing-attribute]  # a runtime flag
    if self._final is None or self._compiled_final is not None or disabled:
      return
    if several_processes():  # a multi-process pmap's AOT program takes global shapes: jitted
      return
    self._compiled_final = Compiling(self._final.lower(params, state), FINAL_COMPILE_THREAD)

  def join_compile(self) -> None:
    """Waits for the final reduce compiling on its worker thread, if it is (a failed run: no
    thread of the call outlives it; the program stays for the next call)."""
    if isinstance(self._compiled_final, Compiling):
      self._compiled_final.join()

  def final_program(self) -> Callable | None:
    """The final reduce ``(params, state) -> state``, or None (the state is global already)."""
    if isinstance(self._compiled_final, Compiling):
      self._compiled_final = self._compiled_final.result()  # None: failed, jitted below raises
    return self._compiled_final or self._final

  def deleted(self) -> bool:
    """Whether the placed packed state was deleted (a test or the user deleted its buffers)."""
    return self.placed is not None and any(x.is_deleted() for x in jax.tree.leaves(self.placed))


def _bound(cache: collections.OrderedDict, size: int) -> None:
  """Drops the oldest entries of ``cache`` beyond ``size``."""
  while len(cache) > size:
    cache.popitem(last=False)


def _checked_empty(shapes) -> tuple:
  """The empty (metric, count) state of one shard, from the traced shapes of a step."""
  metric_shape, count_shape = shapes
  empty = (metric_shape.empty(), ExactCount.zeros(count_shape.shape))

  def leaves(tree):  # (shape in a total, dtype): one batch's score buffer holds fewer slots
    dtypes = [np.dtype(x.dtype) for x in jax.tree.leaves(tree)]
    return [(shape, dtype) for (_, shape), dtype in zip(full_state_shapes(tree), dtypes)]

  got, want = leaves(empty), leaves(shapes)
  if jax.tree.structure(empty) != jax.tree.structure(shapes) or got != want:
    raise ValueError(
      f"{type(metric_shape).__name__}.empty() has state leaves (shape, dtype) {got} but "
      f"step_fn's metric has {want}; empty() must match an updated metric's structure, "
      "shapes and dtypes"
    )
  return empty


def _count_compile(what: Hashable) -> None:
  if what not in _compiles and len(_compiles) >= COMPILES_KEPT:
    _compiles.clear()  # bounded: the counts only serve the warning
  _compiles[what] += 1
  if _compiles[what] == RECOMPILES_BEFORE_WARNING:
    warnings.warn(
      f"masked_eval compiled the same step code {RECOMPILES_BEFORE_WARNING} times for the same "
      "input shapes: the step function (or mask_fn) is a new object on every call (a lambda, "
      "a closure or a jax.vmap defined inside a function, or a functools.partial with "
      "unhashable arguments), so every call traces and compiles again. Define the step and "
      "mask_fn once at module level, or pass functools.partial(step, **hashable_args) (e.g. a "
      "frozen dataclass or tuple config).",
      RecompileWarning,
      stacklevel=4,
    )


_cache: collections.OrderedDict = registry.kept(
  collections.OrderedDict(), "padded_eval.eval.cache._cache"
)


def cached_step(step_fn: Callable, backend: Any, mask: Any, outputs: bool) -> CachedStep:
  """The compiled step of ``step_fn`` on ``backend``, compiled on the first call for its key.

  Args:
    step_fn: the user's step function.
    backend: a `padded_eval.eval.backends.Backend` (hashable).
    mask: the `padded_eval.eval._options.RowMask` of the batches (a key, or a ``mask_fn``
      keyed like ``step_fn``: equal partials share a compilation).
    outputs: whether ``step_fn`` returns per-row outputs.

  Returns:
    The `CachedStep` for ``(step_key(step_fn), backend, mask, outputs)``; the cache keeps the
    `CACHE_SIZE` most recently used.
  """
  mask_id = mask.key if mask.fn is None else step_key(mask.fn)
  key = (step_key(step_fn), backend, mask_id, outputs)
  found = _cache.get(key)
  if found is None:
    compiled = backend.compile_step(step_fn, mask, outputs)
    mask_origin = mask.key if mask.fn is None else _origin(mask.fn)  # a new mask_fn per call too
    origin = (_origin(step_fn), backend, mask_origin, outputs)
    found = _cache[key] = CachedStep(backend, mask, compiled, origin)
    _bound(_cache, CACHE_SIZE)
  else:
    _cache.move_to_end(key)
  return found


def clear_caches() -> None:
  """Empties everything padded_eval keeps between calls: the one list of
  `padded_eval.caches.registry` (`registry.registered()` names each cache).

  Every cache is bounded (`CACHE_SIZE`, `ENTRY_SIZE`, `COMPILES_KEPT`, the backends'
  `padded_eval.eval.backends.CACHE_SIZE`); this empties them all at once: the compiled steps
  with their empty states, final reduces and placed packed states, the compile counts behind
  `RecompileWarning`, the jitted ``compute_logs`` programs, the backends, the package's own
  jitted helpers, the programs of eager metric calls, and the padding pipelines `pad_batches`
  built over tf.data datasets still alive. A later call compiles (and builds) again.

  >>> import padded_eval as pe
  >>> pe.clear_caches()
  """
  registry.clear()


_logs_programs: dict = registry.kept(
  {}, "padded_eval.eval.cache._logs_programs"
)  # (treedef, leaf shapes) -> jitted compute_logs, None: not jittable,
# or a Compiling: compiled ahead of the steps by `prepare_logs`
_MISSING = object()
LOGS_COMPILE_THREAD = "padded_eval-compile-logs"
"""The name of the worker thread `prepare_logs` compiles a logs program on."""


def _logs_program() -> Any:
  """A new ``jax.jit`` of ``compute_logs``."""
  return jax.jit(lambda m: m.compute_logs())


def prepare_logs(empty_metric: Any) -> Compiling | None:
  """Starts compiling ``compute_logs`` of a metric shaped like ``empty_metric`` on a worker thread.

  Called before the first step: the logs program then compiles while the step traces and
  compiles, instead of after the last step (a small evaluation's first call spent about a tenth
  of its time there). Nothing happens when the program is cached already, when the final
  metric's shapes are not known in advance (an accumulator that `trimmed` cuts to what it saw);
  a ``compute_logs`` that does not trace is marked to run eagerly, as `metric_logs` would.

  Args:
    empty_metric: the empty host metric (numpy leaves) the evaluation starts from.

  Returns:
    The `Compiling` started, or None.
  """
  try:
    key = _shapes_key(empty_metric)
    if key in _logs_programs or _shapes_key(trimmed(empty_metric)) != key:
      return None
  except TypeError:  # unhashable configuration: metric_logs does not cache either
    return None
  canonical = jax.dtypes.canonicalize_dtype
  shapes = jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(np.shape(x), canonical(x.dtype)), empty_metric
  )
  if len(_logs_programs) >= CACHE_SIZE:
    _logs_programs.pop(next(iter(_logs_programs)))  # bounded: the oldest goes
  try:
    with placement.on_host():  # the final metric is on the host: its logs are computed there
      lowered = _logs_program().lower(shapes)
  except Exception:  # noqa: BLE001 - does not trace: computed eagerly at the end, as metric_logs does
    _logs_programs[key] = None
    return None
  started = _logs_programs[key] = Compiling(lowered, LOGS_COMPILE_THREAD)
  return started


def metric_logs(metric: Any) -> dict:
  """``metric.compute_logs()`` of a host metric, by one cached jitted program where it traces.

  Eagerly, a metric's ``compute`` dispatches a dozen small ops one by one (most of the fixed
  cost of a short evaluation); jitted, it is one program per metric structure and shapes. A
  ``compute_logs`` that does not trace (host-side numpy, non-array logs) runs eagerly, as before.

  Args:
    metric: a `padded_eval.metrics.Metric` (or collection) with host leaves.

  Returns:
    The logs, as ``metric.compute_logs()`` returns them; from the jitted program, fetched to
    the host in one transfer (numpy arrays instead of Python numbers).
  """
  with placement.on_host():  # the metric is on the host: no round trip to an accelerator
    return _logs_of(metric)


def _logs_of(metric: Any) -> dict:
  metric = trimmed(metric)
  try:
    key = _shapes_key(metric)
    program = _logs_programs.get(key, _MISSING)
  except TypeError:  # unhashable configuration: no cache
    return metric.compute_logs()
  if program is None:
    return metric.compute_logs()
  if isinstance(program, Compiling):  # compiled by prepare_logs while the steps ran
    program = program.result()
    try:
      logs = program(metric) if program is not None else _MISSING
    except Exception:  # noqa: BLE001 - e.g. leaves that did not come back as the empty's: jit it
      logs = _MISSING
    if logs is not _MISSING:
      _logs_programs[key] = program
      return jax.device_get(logs)
    program = _MISSING
  if program is _MISSING:
    if len(_logs_programs) >= CACHE_SIZE:
      _logs_programs.pop(next(iter(_logs_programs)))  # bounded: the oldest goes
    program = _logs_program()
    try:
      logs = program(metric)
    except Exception:  # noqa: BLE001 - does not trace: compute eagerly from now on
      _logs_programs[key] = None
      return metric.compute_logs()
    _logs_programs[key] = program
    return jax.device_get(logs)
  return jax.device_get(program(metric))

"""masked_eval's cache of compiled steps: one compilation per step function, not per object.

A compiled step (`padded_eval.backends.CompiledStep`) is cached under a key of the step
function (`step_key`), the backend, the mask key and ``outputs``. Equal step functions share
one entry even when they are different objects: a ``functools.partial`` of the same function
with equal hashable arguments (``functools.partial(eval_step, config=frozen_config)`` built
inside the user's ``evaluate()`` on every call, as flax's lm1b example does) compiles once.
Functions that cannot be compared (lambdas and closures made anew on every call, partials with
unhashable arguments) are keyed by identity; when the same code is compiled for the same input
shapes `RECOMPILES_BEFORE_WARNING` times, a `RecompileWarning` says why and how to avoid it.

Each entry also keeps, per input shapes, the empty state the driver starts from (traced once
with ``jax.eval_shape``), so a repeated call neither re-runs ``eval_shape`` nor rebuilds it.
"""

from __future__ import annotations

import collections
import functools
import warnings
from collections.abc import Callable, Hashable
from typing import Any

import jax
import numpy as np

from padded_eval import packing as packing_lib
from padded_eval import placement

__all__ = [
  "RECOMPILES_BEFORE_WARNING",
  "CachedStep",
  "RecompileWarning",
  "cached_step",
  "metric_logs",
  "step_key",
]

RECOMPILES_BEFORE_WARNING = 3
CACHE_SIZE = 64


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


_compiles: collections.Counter = collections.Counter()  # (origin, backend, ..., shapes) -> count


class CachedStep:
  """One compiled step and, per input shapes, its empty state.

  Attributes:
    compiled: the `padded_eval.backends.CompiledStep`.
    step: ``compiled.step``.
  """

  def __init__(self, compiled: Any, step_fn: Callable, context: tuple):
    self.compiled, self.step = compiled, compiled.step
    self._origin, self._context = _origin(step_fn), context
    self._empty: dict = {}
    self._packings: dict = {}  # id(empty) -> (empty, StatePacking, its step)

  def empty_state(self, params: Any, batch: Any, make_empty: Callable) -> Any:
    """The empty carried state for these placed ``params`` and ``batch``, as host arrays.

    Args:
      params: the placed params.
      batch: the placed first batch.
      make_empty: ``state shapes -> empty state`` (checks the metric's ``empty()``).

    Returns:
      ``make_empty(compiled.state_shapes(params, batch))`` with numpy leaves, computed once
      per input shapes (treat it as read-only).
    """
    key = _shapes_key((params, batch))
    found = self._empty.get(key)
    if found is None:
      _count_compile((self._origin, self._context, key))
      empty = make_empty(self.compiled.state_shapes(params, batch))
      found = self._empty[key] = jax.tree.map(np.asarray, empty)
    return found

  def packed_for(self, empty: Any) -> tuple[Any, Callable] | None:
    """``(packing, step)`` carrying the state packed (`padded_eval.packing`), or None.

    Only for an ``empty`` that `empty_state` returned and that `padded_eval.placement.reusable_state`
    allows (small, one process); the packing and its compiled step are made once per ``empty``.
    """
    found = self._packings.get(id(empty))
    if found is not None and found[0] is empty:
      return found[1:]
    if not placement.reusable_state(empty):
      return None
    packing = packing_lib.StatePacking(empty)
    self._packings[id(empty)] = (empty, packing, self.compiled.packed_step(packing))
    return self._packings[id(empty)][1:]

  def step_for(self, empty: Any) -> Callable:
    """The step to run from the host empty state ``empty`` (as `empty_state` returned it).

    Returns:
      ``compiled.step_keeping_state`` where the backend places ``empty`` once and reuses it
      (`padded_eval.placement.reusable_state`: small, one process), else ``compiled.step``,
      which donates the state.
    """
    return self.compiled.step_keeping_state if placement.reusable_state(empty) else self.step


def _count_compile(what: Hashable) -> None:
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


_cache: collections.OrderedDict = collections.OrderedDict()


def cached_step(
  step_fn: Callable, backend: Any, mask_key: str | Callable, outputs: bool
) -> CachedStep:
  """The compiled step of ``step_fn`` on ``backend``, compiled on the first call for its key.

  Args:
    step_fn: the user's step function.
    backend: a `padded_eval.backends.Backend` (hashable).
    mask_key: the batch key of the mask, or ``masked_eval``'s ``mask_fn`` (keyed like
      ``step_fn``: equal partials share a compilation).
    outputs: whether ``step_fn`` returns per-row outputs.

  Returns:
    The `CachedStep` for ``(step_key(step_fn), backend, mask_key, outputs)``; the cache keeps
    the `CACHE_SIZE` most recently used.
  """
  mask = step_key(mask_key) if callable(mask_key) else mask_key
  key = (step_key(step_fn), backend, mask, outputs)
  found = _cache.get(key)
  if found is None:
    compiled = backend.compile_step(step_fn, mask_key, outputs)
    origin = _origin(mask_key) if callable(mask_key) else mask_key  # a new mask_fn per call too
    found = _cache[key] = CachedStep(compiled, step_fn, (backend, origin, outputs))
    while len(_cache) > CACHE_SIZE:
      _cache.popitem(last=False)
  else:
    _cache.move_to_end(key)
  return found


_logs_programs: dict = {}  # (treedef, leaf shapes) -> jitted compute_logs, or None: not jittable
_MISSING = object()


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
  try:
    key = _shapes_key(metric)
    program = _logs_programs.get(key, _MISSING)
  except TypeError:  # unhashable configuration: no cache
    return metric.compute_logs()
  if program is None:
    return metric.compute_logs()
  if program is _MISSING:
    program = jax.jit(lambda m: m.compute_logs())
    try:
      logs = program(metric)
    except Exception:  # noqa: BLE001 - does not trace: compute eagerly from now on
      _logs_programs[key] = None
      return metric.compute_logs()
    _logs_programs[key] = program
    return jax.device_get(logs)
  return jax.device_get(program(metric))

"""Eager calls of a metric as one jitted program each, and the state shapes they check.

Called outside jit with concrete arrays, `Metric.merge`, `Metric.aggregate` and `compute` run as
one program each (`runs_eagerly`, compiled once per configuration and shapes by jit's own cache),
where op by op they would compile and dispatch dozens of small operations; a metric whose code
cannot be traced is remembered and runs op by op. What they compile and remember is registered
in `padded_eval.caches.registry`, which `padded_eval.clear_caches` empties. docs/architecture.md, "Metrics".
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from padded_eval.caches import registry
from padded_eval.exact.accumulate import Accumulator, on_several_devices


def runs_eagerly(*trees) -> bool:
  """Whether ``trees`` hold only concrete arrays (no tracer, no Python object) and a hashable
  configuration: then an eager call runs as one jitted program (compiled once per configuration
  and shapes), where op-by-op it would compile and dispatch each of its many small operations."""
  concrete = (np.ndarray, np.generic, jax.Array)
  for leaf in jax.tree.leaves(trees):
    if isinstance(leaf, jax.core.Tracer) or not isinstance(leaf, concrete):
      return False
  try:
    hash(jax.tree.structure(trees))
  except TypeError:
    return False
  return True


# A metric whose own code needs concrete values (numpy on its inputs: one written for eager use
# only) cannot be traced; its structure is remembered here and it runs op by op, as before.
_UNTRACEABLE: set = registry.kept(set(), "padded_eval.metrics.eager._UNTRACEABLE")
_TRACING_ERRORS = (
  jax.errors.ConcretizationTypeError,
  jax.errors.TracerArrayConversionError,
  jax.errors.TracerBoolConversionError,
  jax.errors.TracerIntegerConversionError,
)


def jitted_if_traceable(
  jitted: Callable, plain: Callable, metric: Any, *args: Any, errors=_TRACING_ERRORS
) -> Any:
  """``jitted(metric, *args)``, or ``plain(*args)`` where ``metric``'s code cannot be traced
  (tracing raised one of ``errors``; remembered by ``metric``'s structure)."""
  key = (jax.tree.structure(metric), jitted)
  if key not in _UNTRACEABLE:
    try:
      return jitted(metric, *args)
    except errors:
      if len(_UNTRACEABLE) >= 1024:
        _UNTRACEABLE.clear()
      _UNTRACEABLE.add(key)
  return plain(*args)


def on_one_device(tree: Any) -> Any:
  """``tree`` with every array held by several devices fetched to the host (numpy)."""
  return jax.tree.map(lambda x: jax.device_get(x) if on_several_devices(x) else x, tree)


eager_aggregate = registry.jit(lambda metric: metric._aggregated())
eager_merge = registry.jit(lambda metric, other: metric._merged(other))


def unstacked_only(compute: Callable) -> Callable:
  """``compute`` that raises a ValueError on a stacked state (per-device values would
  come back silently): the state's shapes must be those of ``empty()``."""

  @functools.wraps(compute)
  def checked(self, *args, **kwargs):
    expected = _empty_shapes(self)
    for (where, shape), want in zip(full_state_shapes(self), expected):
      if shape != want:
        raise ValueError(
          f"{type(self).__name__}.compute() got a stacked state "
          f"({where}: shape {shape}, expected {want}); a "
          "per-device state (out of pmap, or from lax.all_gather) must be combined first: "
          "metric.aggregate().compute()"
        )
    if args or kwargs or not runs_eagerly(self):
      return compute(self, *args, **kwargs)
    # eagerly: one program for the dozens of small operations (score buffers first cut to
    # their used slots on the host, as masked_eval's logs program does); host values or
    # non-array results (TypeError) keep the op-by-op path
    plain = lambda: compute(self)  # noqa: E731
    return jitted_if_traceable(in_order, plain, trimmed(self), errors=(*_TRACING_ERRORS, TypeError))

  jitted = registry.jit(lambda metric: _dicts_in_order(compute(metric), _InOrder))
  in_order = lambda metric: _dicts_in_order(jitted(metric), dict)  # noqa: E731
  checked._checks_stacking = True  # pyrefly: ignore[missing-attribute]  # a marker on the function
  return checked


class _InOrder(dict):
  """A dict that goes through jit in insertion order (a plain dict comes back sorted by key):
  a ``compute`` that returns ``{"loss": ..., "accuracy": ...}`` keeps its order eagerly."""


jax.tree_util.register_pytree_node(
  _InOrder, lambda d: (list(d.values()), tuple(d)), lambda keys, values: _InOrder(zip(keys, values))
)


def _dicts_in_order(tree: Any, kind: type) -> Any:
  """``tree`` with its dicts (in dicts, lists and tuples) made ``kind``, keys in the same order."""
  if type(tree) in (dict, _InOrder):  # other mappings (OrderedDict, ...) keep their own order
    return kind((k, _dicts_in_order(v, kind)) for k, v in tree.items())
  if type(tree) in (list, tuple):
    return type(tree)(_dicts_in_order(v, kind) for v in tree)
  return tree


def trimmed(tree: Any) -> Any:
  """``tree`` with every accumulator `Accumulator.trimmed`: an exact curve metric's score
  buffers cut to the slots their elements use (rounded up to a power of two), so that computing
  a small evaluation with a large ``capacity`` sorts what was seen, not the capacity."""
  is_accumulator = lambda x: isinstance(x, Accumulator)  # noqa: E731
  return jax.tree.map(
    lambda x: x.trimmed() if is_accumulator(x) else x, tree, is_leaf=is_accumulator
  )


def full_state_shapes(tree: Any) -> list[tuple[str, tuple[int, ...]]]:
  """``(path, shape)`` of every array leaf of ``tree`` (a metric, or its ``eval_shape``), each
  accumulator's fields at their shapes in a total (`Accumulator.full_shapes`: one batch's score
  buffer holds fewer slots than a total's). Two states that merge have equal lists."""
  shapes = []
  nodes = jax.tree_util.tree_flatten_with_path(tree, is_leaf=lambda x: isinstance(x, Accumulator))
  for path, node in nodes[0]:
    where = jax.tree_util.keystr(path)
    if isinstance(node, Accumulator):
      shapes += [(f"{where}.{f}", shape) for f, shape in zip(node._fields, node.full_shapes())]
    else:
      shapes.append((where, tuple(np.shape(node))))
  return shapes


# pytree structure -> state leaf shapes; bounded below
_EMPTY_SHAPES: dict = registry.kept({}, "padded_eval.metrics.eager._EMPTY_SHAPES")


def _empty_shapes(metric: Any) -> tuple[tuple[int, ...], ...]:
  """The state leaf shapes of ``metric.empty()`` (cached by the pytree structure, which
  holds the configuration of the metric and of any nested ones)."""
  key = jax.tree.structure(metric)
  try:
    return _EMPTY_SHAPES[key]
  except TypeError:  # an unhashable configuration value: not cached
    key = None
  except KeyError:
    pass
  shapes = tuple(shape for _, shape in full_state_shapes(jax.eval_shape(metric.empty)))
  if key is not None:
    if len(_EMPTY_SHAPES) >= 1024:
      _EMPTY_SHAPES.clear()
    _EMPTY_SHAPES[key] = shapes
  return shapes

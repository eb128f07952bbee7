"""The Metric protocol: immutable pytrees of masked sufficient statistics.

A metric is a frozen dataclass whose fields are of two kinds:

* configuration (``num_classes``, ``average``, ``name``, ...): static pytree
  metadata, hashable, set in the constructor;
* state, declared with :func:`state`: exact accumulators
  (:class:`~padded_eval.accumulate.ExactCount`, :class:`~padded_eval.accumulate.ExactSum`)
  or nested metrics. The constructor fills them with the empty state.

Subclasses are made dataclasses and registered as pytrees automatically. Most
metrics only define their batch statistics (``_batch_state``) and ``compute``:
``merge``, ``reduce`` and ``aggregate`` are written once here, by mapping the
accumulators' own exact operations over the state.

Example:
  >>> import jax.numpy as jnp
  >>> import padded_eval as pe
  >>> m = pe.metrics.Mean()
  >>> m = m.update(values=jnp.array([1.0, 2.0, jnp.nan]), mask=jnp.array([True, True, False]))
  >>> float(m.compute())
  1.5
"""

from __future__ import annotations

import abc
import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from padded_eval import validation
from padded_eval.accumulate import Accumulator, ExactCount, upcast

_STATE = "padded_eval_state"


def state(factory: Callable[[Any], Any]):
  """Declares a state field; ``factory(metric)`` builds its empty value from the config."""
  return dataclasses.field(init=False, repr=False, compare=False, metadata={_STATE: factory})


def _is_state(field: dataclasses.Field) -> bool:
  return _STATE in field.metadata


def _is_node(x) -> bool:
  return isinstance(x, (Accumulator, Metric))


@dataclasses.dataclass(frozen=True, eq=False)
class Metric(abc.ABC):
  """Base class of every metric; see the module docstring and DESIGN.md.

  Subclasses implement ``_batch_state(**kw) -> dict`` (the state of one batch,
  keyed by state field names) and ``compute()``. Unknown keywords must be
  accepted and ignored (``**_``), so collections can forward one set.
  """

  name: str | None = dataclasses.field(default=None, kw_only=True)
  arg_routes: tuple = dataclasses.field(default=(), kw_only=True, repr=False)

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    dataclasses.dataclass(frozen=True, eq=False, repr=True)(cls)
    fields = dataclasses.fields(cls)
    cls._state_fields = tuple(f.name for f in fields if _is_state(f))
    cls._config_fields = tuple(f.name for f in fields if not _is_state(f))
    # The update keywords: keyword-only parameters of _batch_state (and of _values, where
    # a base class's _batch_state forwards **kwargs to it).
    readers = [cls._batch_state] + ([cls._values] if hasattr(cls, "_values") else [])
    keywords = [
      p
      for reader in readers
      for p in inspect.signature(reader).parameters.values()
      if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    cls._required_inputs = tuple(p.name for p in keywords if p.default is inspect.Parameter.empty)
    cls._optional_inputs = tuple(
      p.name for p in keywords if p.default is not inspect.Parameter.empty
    )
    jax.tree_util.register_pytree_with_keys(
      cls, _flatten_with_keys, _unflatten_for(cls), flatten_func=_flatten
    )

  def __post_init__(self):
    if self.name is None:
      object.__setattr__(self, "name", type(self).__name__.lower())
    self._check_config()
    for f in dataclasses.fields(self):
      if _is_state(f):
        object.__setattr__(self, f.name, f.metadata[_STATE](self))

  def _check_config(self) -> None:
    """Raises ValueError for a bad configuration (override to check)."""

  # --- state plumbing ---------------------------------------------------------------

  def _state(self) -> dict[str, Any]:
    return {f: getattr(self, f) for f in self._state_fields}

  def replace_state(self, **new_state) -> Metric:
    """A copy with the given state fields replaced (configuration kept)."""
    metric = object.__new__(type(self))
    for f in self._config_fields:
      object.__setattr__(metric, f, getattr(self, f))
    for f in self._state_fields:
      object.__setattr__(metric, f, new_state.get(f, getattr(self, f)))
    return metric

  def _map_state(self, fn: Callable, *others: Metric) -> Metric:
    mapped = jax.tree.map(fn, self._state(), *(o._state() for o in others), is_leaf=_is_node)
    return self.replace_state(**mapped)

  # --- the protocol -----------------------------------------------------------------

  def empty(self) -> Metric:
    """A metric with the empty state (same structure, shapes and dtypes as updated)."""
    return self.replace_state(
      **{f.name: f.metadata[_STATE](self) for f in dataclasses.fields(self) if _is_state(f)}
    )

  def reset(self) -> Metric:
    """An empty copy (alias of :meth:`empty`)."""
    return self.empty()

  @abc.abstractmethod
  def _batch_state(self, **kwargs) -> Mapping[str, Any]:
    """The state of one batch: ``{state_field: accumulator}``."""

  def batch_updates(self, **kwargs) -> Metric:
    """A new metric holding only this batch's statistics. Keyword-only.

    Raises:
      ValueError: a keyword the metric needs is missing, or an input is ``None``, a
        string, a ragged list, complex, or float64 outside float32's range (see
        :mod:`padded_eval.validation`).
    """
    kwargs = self._checked_inputs(route_kwargs(self.arg_routes, kwargs))
    return self.replace_state(**self._batch_state(**kwargs))

  # --- inputs ---------------------------------------------------------------------------

  _required_inputs: ClassVar[tuple[str, ...]] = ()
  _optional_inputs: ClassVar[tuple[str, ...]] = ()

  def required_inputs(self) -> tuple[str, ...]:
    """The update keywords this metric needs (by default, ``_batch_state``'s keyword-only
    parameters without a default; metrics reading a configurable keyword override it)."""
    return self._required_inputs

  def optional_inputs(self) -> tuple[str, ...]:
    """The update keywords this metric reads when given (``mask``, ``weights``, ...)."""
    return self._optional_inputs

  def _checked_inputs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with this metric's inputs checked and converted (validation.as_input)."""
    owner = f"{type(self).__name__}.update"
    missing = [k for k in self.required_inputs() if k not in kwargs]
    if missing:
      raise ValueError(
        f"{owner} needs the keyword(s) {', '.join(map(repr, missing))}; got keywords "
        f"{sorted(kwargs)}. Pass them by name (map_arg renames another keyword)."
      )
    checked = dict(kwargs)
    for key in self.required_inputs():
      checked[key] = validation.as_input(key, kwargs[key], owner=owner)
    for key in self.optional_inputs():
      if kwargs.get(key) is not None:
        checked[key] = validation.as_input(key, kwargs[key], owner=owner)
    return checked

  # --- invalid values (counted, since nothing can raise inside jit) ---------------------

  #: The kinds of invalid real elements this metric counts (e.g. ``"target out of
  #: range"``). A metric with kinds declares ``invalid = state(invalid_state)`` and fills
  #: it in ``_batch_state`` with :meth:`count_invalid`.
  invalid_kinds: ClassVar[tuple[str, ...]] = ()

  def count_invalid(self, **bad: jax.Array) -> ExactCount:
    """The batch's invalid counts, in ``invalid_kinds`` order.

    Args:
      **bad: ``{kind: bool array}`` marking the invalid *real* elements of each kind
        (already masked); kinds not given count 0.

    Raises:
      ValueError: a kind not in ``invalid_kinds``.
    """
    unknown = sorted(set(bad) - set(self.invalid_kinds))
    if unknown:
      raise ValueError(f"{type(self).__name__} does not declare invalid kinds {unknown}")
    counts = [
      jnp.sum(bad[kind], dtype=jnp.int32) if kind in bad else jnp.zeros((), jnp.int32)
      for kind in self.invalid_kinds
    ]
    return ExactCount.of(jnp.stack(counts))

  def invalid_counts(self) -> dict[str, int]:
    """``{kind: count}`` of the invalid real elements seen (exact; reads the state on the host).

    Empty for a metric that declares no kinds. See :meth:`invalid_report` for a
    collection's members.
    """
    if not self.invalid_kinds:
      return {}
    counts = self.invalid.to_numpy()
    return {kind: int(count) for kind, count in zip(self.invalid_kinds, counts)}

  def invalid_report(self) -> list[tuple[str, str, int]]:
    """``(metric name, kind, count)`` for every nonzero invalid count, members included.

    Members of a collection are named by their key in it (``"train/accuracy"``).
    """
    report = [(self.name, kind, n) for kind, n in self.invalid_counts().items() if n]
    for value in self._state().values():
      children = value.items() if isinstance(value, Mapping) else [(None, value)]
      for key, child in children:
        if isinstance(child, Metric):
          for name, kind, n in child.invalid_report():
            if key is not None:
              name = key if name == child.name else f"{key}/{name}"
            report.append((name, kind, n))
    return report

  def map_arg(self, **sources: str) -> Metric:
    """A copy that reads each keyword from another one: ``map_arg(preds="logits")``.

    The copy behaves the same (same state, merge, reduce) but ``update(logits=...)``
    feeds ``preds``. The renaming is static configuration (``arg_routes``).

    Raises:
      ValueError: if a source name is not a string.
    """
    return self._with_route(map_arg_step(sources))

  def index_into(self, **paths) -> Metric:
    """A copy that indexes into a keyword: ``index_into(preds=("out", "logits"))``.

    ``update(preds={"out": {"logits": x}})`` then feeds ``x`` as ``preds``. A path is a
    key or a tuple/list of keys (str or int).
    """
    return self._with_route(index_into_step(paths))

  def _with_route(self, step) -> Metric:
    metric = self.replace_state()
    object.__setattr__(metric, "arg_routes", (step,) + tuple(self.arg_routes))
    return metric

  def update(self, **kwargs) -> Metric:
    """A new metric: this batch's statistics merged in. Keyword-only."""
    return self.merge(self.batch_updates(**kwargs))

  def merge(self, other: Metric) -> Metric:
    """Both metrics' statistics combined; associative and commutative."""
    if type(other) is not type(self):
      raise ValueError(f"cannot merge {type(self).__name__} with {type(other).__name__}")
    mine, theirs = self._statistics_config(), other._statistics_config()
    if mine != theirs:
      diff = {k: (v, theirs[k]) for k, v in mine.items() if theirs[k] != v}
      raise ValueError(
        f"cannot merge {type(self).__name__} metrics configured differently: "
        + ", ".join(f"{k}={a!r} vs {b!r}" for k, (a, b) in diff.items())
      )
    return self._map_state(lambda a, b: a.merge(b), other)

  def _statistics_config(self) -> dict[str, Any]:
    """The configuration that shapes the statistics (all but ``name`` and arg routes)."""
    return {f: getattr(self, f) for f in self._config_fields if f not in ("name", "arg_routes")}

  def reduce(self, axis_name) -> Metric:
    """Combined across the mapped axis ``axis_name`` (inside pmap / shard_map)."""
    return self._map_state(lambda a: a.reduce(axis_name))

  def aggregate(self) -> Metric:
    """Combined over a leading stacked axis (after ``lax.all_gather``, or out of pmap)."""
    return self._map_state(lambda a: a.aggregate())

  @abc.abstractmethod
  def compute(self):
    """The metric's value (NaN when no real element was seen)."""

  def compute_logs(self) -> dict[str, Any]:
    """``{name: value}``."""
    return {self.name: self.compute()}


def _flatten_with_keys(metric):
  children = [(jax.tree_util.GetAttrKey(f), getattr(metric, f)) for f in metric._state_fields]
  return children, tuple(getattr(metric, f) for f in metric._config_fields)


def _flatten(metric):
  return (
    [getattr(metric, f) for f in metric._state_fields],
    tuple(getattr(metric, f) for f in metric._config_fields),
  )


def _unflatten_for(cls):
  def unflatten(config, children):
    metric = object.__new__(cls)
    for name, value in zip(cls._config_fields, config):
      object.__setattr__(metric, name, value)
    for name, value in zip(cls._state_fields, children):
      object.__setattr__(metric, name, value)
    return metric

  return unflatten


# --- keyword routing (map_arg / index_into) ------------------------------------------
#
# A route step is a tuple of ``(argname, source_keyword, index_path)`` triples: the
# wrapped object's keyword ``argname`` is ``kwargs[source_keyword][path[0]][path[1]]...``.
# Steps are applied in order, the most recently added first (it sees the caller's
# keywords). Other keywords pass through unchanged.


def map_arg_step(sources: Mapping[str, str]) -> tuple:
  """The route step of ``map_arg(argname=source, ...)``."""
  for argname, source in sources.items():
    if not isinstance(source, str):
      raise ValueError(
        f"map_arg({argname}=...) takes the name of the keyword to read, a str; got {source!r}"
      )
  return tuple((argname, source, ()) for argname, source in sources.items())


def index_into_step(paths: Mapping[str, Any]) -> tuple:
  """The route step of ``index_into(argname=path, ...)``."""
  step = []
  for argname, path in paths.items():
    path = tuple(path) if isinstance(path, (tuple, list)) else (path,)
    if not path or not all(isinstance(k, (str, int)) for k in path):
      raise ValueError(
        f"index_into({argname}=...) takes a key or a tuple of keys (str or "
        f"int); got {paths[argname]!r}"
      )
    step.append((argname, argname, path))
  return tuple(step)


def route_kwargs(routes: tuple, kwargs: Mapping[str, Any]) -> dict[str, Any]:
  """Applies route steps to update keywords (see :meth:`Metric.map_arg`).

  Raises:
    ValueError: if a source keyword is missing or an index path does not fit.
  """
  kwargs = dict(kwargs)
  for step in routes:
    routed = dict(kwargs)
    for argname, source, path in step:
      if source not in kwargs:
        raise ValueError(
          f"{argname!r} is read from the keyword {source!r} (map_arg/index_into)"
          f", but got keywords {sorted(kwargs)}"
        )
      value = kwargs[source]
      for depth, key in enumerate(path):
        try:
          value = value[key]
        except (KeyError, IndexError, TypeError) as e:
          raise ValueError(
            f"index_into({argname}={path!r}): {source}{_index_str(path[:depth])} has no key {key!r}"
          ) from e
      routed[argname] = value
    kwargs = routed
  return kwargs


def _index_str(path) -> str:
  return "".join(f"[{k!r}]" for k in path)


# --- the one mask rule -----------------------------------------------------------------


def _prefix_to(x: jax.Array, shape: tuple[int, ...], argname: str, ref: str) -> jax.Array:
  """Broadcasts ``x`` of a prefix shape of ``shape`` to ``shape`` (trailing axes added)."""
  if x.ndim > len(shape) or tuple(x.shape) != tuple(shape[: x.ndim]):
    expected = " or ".join(str(tuple(shape[:k])) for k in range(1, len(shape) + 1)) or "()"
    raise ValueError(
      f"{argname} has shape {tuple(x.shape)}, which does not fit {ref} of shape "
      f"{tuple(shape)}; expected {expected} (a prefix of {ref}'s shape)"
    )
  return jnp.broadcast_to(x.reshape(x.shape + (1,) * (len(shape) - x.ndim)), shape)


def broadcast_mask(mask, shape, ref: str = "preds") -> jax.Array:
  """The boolean mask broadcast to ``shape`` (all True if ``mask`` is None).

  Args:
    mask: ``None`` or a bool array whose shape is a prefix of ``shape``
      (``[B]`` for examples, ``[B, T]`` for tokens, ...).
    shape: the shape of the values the mask selects.
    ref: the name of those values, for error messages.

  Raises:
    ValueError: if the mask is not bool or its shape is not a prefix of ``shape``.
  """
  shape = tuple(shape)
  if mask is None:
    return jnp.ones(shape, bool)
  mask = jnp.asarray(mask)
  if mask.dtype != jnp.bool_:
    raise ValueError(
      f"mask must be a bool array; got dtype {mask.dtype}. "
      "Pass mask.astype(bool) (True marks real elements)."
    )
  return _prefix_to(mask, shape, "mask", ref)


def element_weights(mask, weights, shape, ref: str = "preds") -> tuple[jax.Array, jax.Array]:
  """``(real, w)``: the broadcast bool mask and float32 weights, 0 where not real.

  ``weights`` (optional float sample weights) follows the mask's shape rule. Weights
  of masked-out elements are replaced by 0 with ``where``, so NaN there is harmless.
  """
  real = broadcast_mask(mask, shape, ref)
  if weights is None:
    return real, real.astype(jnp.float32)
  weights = upcast(jnp.asarray(weights))
  weights = _prefix_to(weights, tuple(shape), "weights", ref)
  return real, jnp.where(real, weights, 0.0)


def masked(values: jax.Array, real: jax.Array, fill=0) -> jax.Array:
  """``values`` where ``real``, else ``fill``; NaN or inf in masked-out places never leaks."""
  return jnp.where(real, values, jnp.asarray(fill, values.dtype))


def invalid_state(metric: Metric) -> ExactCount:
  """The empty invalid counts of ``metric``: ``invalid = state(invalid_state)``."""
  return ExactCount.zeros((len(metric.invalid_kinds),))


check_choice = validation.check_choice

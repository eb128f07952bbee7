"""The Metric protocol: immutable pytrees of masked sufficient statistics.

A metric is a frozen dataclass whose fields are of two kinds:

* configuration (``num_classes``, ``average``, ``name``, ...): static pytree
  metadata, hashable, set in the constructor;
* state, declared with :func:`state`: exact accumulators
  (:class:`~padded_eval.exact.accumulate.ExactCount`, :class:`~padded_eval.exact.accumulate.ExactSum`)
  or nested metrics. The constructor fills them with the empty state.

Subclasses are made dataclasses and registered as pytrees automatically. Most
metrics only define their batch statistics (``_batch_state``) and ``compute``:
``merge``, ``reduce`` and ``aggregate`` are written once here, by mapping the
accumulators' own exact operations over the state.

Examples:
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
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, cast

import jax
import numpy as np
from jax.typing import ArrayLike

from padded_eval import validation
from padded_eval.exact.accumulate import Accumulator, ExactCount, ExactSum
from padded_eval.metrics.classification._formatting import reported_invalid_counts
from padded_eval.metrics.eager import (
  eager_aggregate,
  eager_merge,
  full_state_shapes,
  jitted_if_traceable,
  on_one_device,
  runs_eagerly,
  unstacked_only,
)
from padded_eval.metrics.totals import (
  ROWS_FIELD,
  Pending,
  RowsToCount,
  Totals,
  finished_together,
  stacked_counts,
)
from padded_eval.routing import KeywordReader, dataclass_transform

if TYPE_CHECKING:
  from typing_extensions import Self

_STATE = "padded_eval_state"


def state(factory: Callable[[Any], Any], *, init: bool = False) -> Any:
  """Declares a state field; ``factory(metric)`` builds its empty value from the config.

  ``init`` stays False (state is never a constructor argument); it is a parameter so that
  type checkers, told by ``dataclass_transform``, know it.
  """
  return dataclasses.field(init=init, repr=False, compare=False, metadata={_STATE: factory})


def config_field(default: Any, *, kw_only: bool = True) -> Any:
  """A keyword-only configuration field of a metric dataclass (a field specifier: type checkers
  read its ``default`` and ``kw_only``)."""
  return dataclasses.field(default=default, kw_only=kw_only)


def is_state(field: dataclasses.Field) -> bool:
  """Whether a dataclass field of a metric was declared with :func:`state`."""
  return _STATE in field.metadata


def _is_node(x) -> bool:
  return isinstance(x, (Accumulator, Metric))


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field, state, config_field))
@dataclasses.dataclass(frozen=True, eq=False)
class Metric(KeywordReader, abc.ABC):
  """Base class of every metric; see [the module docstring][padded_eval.metrics.base] and docs/architecture.md.

  Subclasses implement ``_batch_state(**kw) -> dict`` (the state of one batch,
  keyed by state field names) and ``compute()``. Unknown keywords must be
  accepted and ignored (``**_``), so collections can forward one set.

  ``name``, ``arg_routes``, :meth:`map_arg`, :meth:`index_into`, the configuration
  hook ``_check_config`` and :meth:`required_inputs` come from
  :class:`padded_eval.routing.KeywordReader`, shared with losses.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> first = pe.metrics.Mean("x").update(x=np.array([1.0, 2.0, 99.0]), mask=np.array([True, True, False]))
    >>> second = pe.metrics.Mean("x").update(x=np.array([6.0]))
    >>> float(first.merge(second).compute())  # (1 + 2 + 6) / 3: the masked row never counts
    3.0
    >>> float(pe.metrics.Mean("x").compute())  # nothing seen
    nan
  """

  # The update keywords: keyword-only parameters of _batch_state (and of _values, where
  # a base class's _batch_state forwards **kwargs to it).
  input_readers: ClassVar[tuple[str, ...]] = ("_batch_state", "_values")

  #: Whether a higher ``compute()`` is better (True: accuracy, AUROC; False: errors, losses,
  #: perplexity), or None where a value has no direction (a mean of any values, a
  #: confusion matrix). Every metric of :mod:`padded_eval.metrics` declares it; a metric
  #: defined elsewhere that does not inherits None. ``pe.best`` reads it.
  higher_is_better: ClassVar[bool | None] = None

  def __init_subclass__(cls, **kwargs):
    super().__init_subclass__(**kwargs)
    dataclasses.dataclass(frozen=True, eq=False, repr=True)(cls)
    fields = dataclasses.fields(cls)
    cls._state_fields = tuple(f.name for f in fields if is_state(f))
    cls._config_fields = tuple(f.name for f in fields if not is_state(f))
    jax.tree_util.register_pytree_with_keys(
      cls, _flatten_with_keys, _unflatten_for(cls), flatten_func=_flatten
    )
    own_compute = cls.__dict__.get("compute")
    if own_compute is not None and not getattr(own_compute, "_checks_stacking", False):
      cls.compute = unstacked_only(own_compute)

  def __post_init__(self):
    super().__post_init__()  # name, configuration check
    for f in dataclasses.fields(self):
      if is_state(f):
        object.__setattr__(self, f.name, f.metadata[_STATE](self))

  # --- state plumbing ---------------------------------------------------------------

  def _state(self) -> dict[str, Any]:
    return {f: getattr(self, f) for f in self._state_fields}

  def replace_state(self, **new_state: Any) -> Self:
    """A copy with the given state fields replaced (configuration kept)."""
    metric = object.__new__(type(self))
    for f in self._config_fields:
      object.__setattr__(metric, f, getattr(self, f))
    for f in self._state_fields:
      object.__setattr__(metric, f, new_state.get(f, getattr(self, f)))
    return metric

  def _map_state(self, fn: Callable, *others: Metric) -> Self:
    mapped = jax.tree.map(fn, self._state(), *(o._state() for o in others), is_leaf=_is_node)
    return self.replace_state(**mapped)

  # --- the protocol -----------------------------------------------------------------

  def empty(self) -> Self:
    """A metric with the empty state (same structure, shapes and dtypes as updated)."""
    return self.replace_state(
      **{f.name: f.metadata[_STATE](self) for f in dataclasses.fields(self) if is_state(f)}
    )

  def reset(self) -> Self:
    """An empty copy (alias of :meth:`empty`)."""
    return self.empty()

  @abc.abstractmethod
  def _batch_state(self, *args: Any, **kwargs: Any) -> Mapping[str, Any] | Totals:
    """The state of one batch: ``{state_field: accumulator}``, or the `Totals` it is built from
    (summed by `batch_updates` in one reduction with the update's real rows)."""

  def batch_updates(self, **kwargs: ArrayLike) -> Self:
    """A new metric holding only this batch's statistics. Keyword-only.

    Inputs may be sharded any way, over the class axis too: under ``jax.set_mesh`` of a mesh
    with ``Explicit`` axes (``jax.make_mesh``, e.g. logits ``[B@fsdp, T, V@tensor]``) the
    statistics are computed with those axes ``Auto`` (`explicit_context_axes`), where a
    gather or a scatter over a sharded axis would raise ``ShardingTypeError``; the returned
    state is replicated.

    Raises:
      ValueError: a keyword the metric needs is missing, or an input is ``None``, a
        string, a ragged list, complex, or float64 outside float32's range (see
        :mod:`padded_eval.validation`).
    """
    axes = explicit_context_axes()
    if axes:  # jax.set_mesh of a jax.make_mesh mesh: XLA propagates the shardings inside
      replicated = jax.sharding.PartitionSpec()
      updates = lambda kw: self._batch_updates(kw)
      batch = jax.sharding.auto_axes(updates, axes=axes, out_sharding=replicated)(kwargs)
      return cast("Self", batch)  # auto_axes keeps the function's output type
    return self._batch_updates(kwargs)

  def _batch_updates(self, kwargs: dict[str, Any]) -> Self:
    # Op by op even eagerly: jitted, every new batch shape would compile the whole update, where
    # op by op it compiles only the few reductions of that shape (`python -m benchmarks --quick`
    # took 393 s instead of 68 with this jitted too). merge, aggregate and compute, whose shapes
    # are the state's, run as one program (`runs_eagerly`).
    return self._statistics(self._checked_inputs(self.routed(kwargs)))

  def _statistics(self, kwargs: dict[str, Any]) -> Self:
    """The batch's state from checked inputs (see :meth:`batch_updates`)."""
    return finished_together([self._pending(kwargs)])[0]

  def _pending(self, kwargs: dict[str, Any]) -> Pending:
    """The batch's statistics from checked inputs, before its `Totals` are summed (a collection
    sums the totals of its members together: `finished_together`)."""
    counts_rows = ROWS_FIELD in self._state_fields
    rows = RowsToCount(kwargs, self.row_inputs()) if counts_rows else None
    return Pending(self, self._batch_state(**kwargs), rows)

  def _gathers_totals(self) -> bool:
    """Whether a collection may take this member's batch statistics from `_pending` (its
    ``batch_updates`` is the base class's), to sum them with its other members'."""
    cls = type(self)
    return (
      cls.batch_updates is Metric.batch_updates
      and cls._batch_updates is Metric._batch_updates
      and cls._statistics is Metric._statistics
    )

  # --- inputs ---------------------------------------------------------------------------

  def _checked_inputs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with this metric's inputs checked and converted (validation.as_input)."""
    owner = f"{type(self).__name__}.update"
    self.check_inputs_present(kwargs, owner)
    checked = dict(kwargs)
    for key in self.required_inputs():
      checked[key] = validation.as_input(key, kwargs[key], owner=owner)
    for key in self.optional_inputs():
      if kwargs.get(key) is not None:
        checked[key] = validation.as_input(key, kwargs[key], owner=owner)
    numbers = set(self.number_inputs()) | {"weights"}
    rounded = set(self.rounded_inputs()) | {"weights"}
    for key in set(self.required_inputs()) | set(self.optional_inputs()):
      if checked.get(key) is not None and key != "mask":
        kind = ("rounded" if key in rounded else "number") if key in numbers else "id"
        checked[key] = _fit_int32(key, checked[key], kind, checked.get("mask"), owner)
    return checked

  def rounded_inputs(self) -> tuple[str, ...]:
    """The `number_inputs` whose float32 rounding only rounds the result (a mean's values).

    A host int64 / uint64 number there beyond int32 is rounded to float32 on the host; in
    the other number inputs (spreads, differences, ranks, where rounding ``2**40 + 1`` to
    ``2**40`` changes the answer entirely) such a value is refused unless float32 holds it.
    ``weights`` are always rounded. Default: none.
    """
    return ()

  def number_inputs(self) -> tuple[str, ...]:
    """The update keywords read as numbers to average (not as class or token ids).

    Host integers wider than int32 there (int64, uint32, uint64) become int32 when their real
    elements fit it; else uint32 stays uint32 (as under jit), and int64 / uint64 become float32
    on the host where float32 holds them or rounding is harmless (`rounded_inputs`), and are
    refused otherwise; in any other keyword they are refused (see `_fit_int32`).
    ``weights`` is always a number. Default: none.
    """
    return ()

  # --- invalid values (counted, since nothing can raise inside jit) ---------------------

  #: The kinds of invalid real elements this metric counts (e.g. ``"target out of
  #: range"``). A metric with kinds declares ``invalid = state(invalid_state)`` and fills
  #: it in ``_batch_state`` with :meth:`count_invalid`.
  invalid_kinds: ClassVar[tuple[str, ...]] = ()

  def count_invalid(self, **bad: ArrayLike) -> ExactCount:
    """The batch's invalid counts, in ``invalid_kinds`` order.

    Args:
      **bad: ``{kind: bool array}`` marking the invalid *real* elements of each kind
        (already masked); kinds not given count 0.

    Raises:
      ValueError: a kind not in ``invalid_kinds``.
    """
    return ExactCount.of(stacked_counts(self.invalid_flags(**bad)))

  def invalid_flags(self, **bad: ArrayLike) -> list[ArrayLike | None]:
    """``bad`` in ``invalid_kinds`` order, None for a kind not given (see :meth:`count_invalid`).

    Raises:
      ValueError: a kind not in ``invalid_kinds``.
    """
    unknown = sorted(set(bad) - set(self.invalid_kinds))
    if unknown:
      raise ValueError(f"{type(self).__name__} does not declare invalid kinds {unknown}")
    return [bad.get(kind) for kind in self.invalid_kinds]

  def invalid_counts(self) -> dict[str, int]:
    """``{kind: count}`` of the invalid real elements seen (exact; reads the state on the host).

    Empty for a metric that declares no kinds. See :meth:`invalid_report` for a
    collection's members.
    """
    if not self.invalid_kinds:
      return {}
    invalid: ExactCount = getattr(self, "invalid")  # noqa: B009  (a metric with invalid kinds)
    counts = invalid.to_numpy()
    counts = {kind: int(count) for kind, count in zip(self.invalid_kinds, counts)}
    return reported_invalid_counts(counts)

  def invalid_report(self) -> list[tuple[str, str, int]]:
    """``(metric name, kind, count)`` for every nonzero invalid count, members included.

    Members of a collection are named by their key in it (``"train/accuracy"``).
    """
    report = [(self.name, kind, n) for kind, n in self.invalid_counts().items() if n]
    for key, child in self._member_metrics():
      for name, kind, n in child.invalid_report():
        report.append((_member_name(key, child, name), kind, n))
    return report

  def _member_metrics(self):
    """``(key or None, metric)`` for every metric held in the state (collections)."""
    for value in self._state().values():
      children = value.items() if isinstance(value, Mapping) else [(None, value)]
      for key, child in children:
        if isinstance(child, Metric):
          yield key, child

  # --- example counts (the misuse check of masked_eval) -------------------------------

  def example_count(self) -> int | None:
    """The exact number of rows this metric counted as real, or None if it cannot say.

    A *row* is an entry of the leading axis of the update's inputs (the example axis
    of a ``[B, ...]`` batch). A row counts when ``mask`` (``[B]`` or a prefix such as a
    token mask ``[B, T]``) is True somewhere in it and, with ``weights``, a weight in
    it is nonzero; without ``mask`` (and ``weights``) every row counts. So a token-level
    or multilabel metric still counts rows, not elements; an update whose inputs are
    scalars counts none (a batch-mean loss has no rows to count). ``masked_eval`` compares
    this with its ``num_examples``: a larger count means padded rows were counted
    (an update without ``mask=batch["mask"]``).

    Metrics declare the count with a state field ``example_rows =
    state(empty_count)``; :meth:`batch_updates` fills it. None (exempt) for metrics
    without it: collections (their members report, see :meth:`example_report`) and
    metrics defined outside :mod:`padded_eval.metrics` that do not declare it.
    """
    if ROWS_FIELD not in self._state_fields:
      return None
    return int(getattr(self, ROWS_FIELD).to_numpy())

  def row_inputs(self) -> tuple[str, ...]:
    """The update keywords whose leading axis is the row axis (default: the required
    inputs). A metric that reads its inputs through another object overrides it."""
    return self.required_inputs()

  def example_report(self) -> list[tuple[str, int]]:
    """``(metric name, example count)`` of this metric and every member that can say.

    Members of a collection are named by their key in it, as in :meth:`invalid_report`.
    """
    count = self.example_count()
    report = [] if count is None else [(self.name, count)]
    for key, child in self._member_metrics():
      for name, n in child.example_report():
        report.append((_member_name(key, child, name), n))
    return report

  # --- values without rows (the per-batch check of masked_eval) ----------------------------

  def saw_values_without_rows(self) -> bool:
    """Whether updates gave this metric values but no rows (read on the host).

    A batch-level scalar (``Mean("loss").batch_updates(loss=jnp.mean(per_row_loss))``) has no
    row axis: the metric counts no row (:meth:`example_count` 0) yet averages one value per
    batch, a mean of batch means that weights a half-padded last batch like a full one.
    ``masked_eval`` refuses it when the batches held real rows (see :meth:`per_batch_report`).
    The default: False (a metric that cannot say); the weighted means say, unless configured
    with ``per_batch=True``.
    """
    return False

  def per_batch_report(self) -> list[str]:
    """Names of this metric and every member that saw values without rows
    (:meth:`saw_values_without_rows`), members named by their key as in :meth:`invalid_report`."""
    report = [self.name] if self.saw_values_without_rows() else []
    for key, child in self._member_metrics():
      for name in child.per_batch_report():
        name = _member_name(key, child, name)
        if name not in report:  # a wrapper's copies of one metric (Bootstrap's replicas)
          report.append(name)
    return report

  def update(self, **kwargs: ArrayLike) -> Self:
    """A new metric: this batch's statistics merged in. Keyword-only."""
    return self.merge(self.batch_updates(**kwargs))

  def merge(self, other: Metric) -> Self:
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
    self._check_shapes(other, "merge")
    if runs_eagerly(self, other):
      return jitted_if_traceable(eager_merge, self._merged, self, other)
    return self._merged(other)

  def _merged(self, other: Metric) -> Self:
    return self._map_state(lambda a, b: a.merge(b), other)

  def _check_shapes(self, other, action: str) -> None:
    """ValueError unless ``other``'s state leaves (a metric, or the shapes ``empty()`` has)
    have this metric's shapes in a total (`full_state_shapes`: one batch's score buffer may hold
    fewer slots): a stacked per-device state is combined by ``aggregate()``."""
    for (where, a), (_, b) in zip(full_state_shapes(self), full_state_shapes(other)):
      if a != b:
        raise ValueError(
          f"cannot {action} {type(self).__name__} states of different shapes ({where}: "
          f"{a} vs {b}); a stacked per-device state (out of pmap, or "
          "from lax.all_gather) must be combined with .aggregate() first"
        )

  def _statistics_config(self) -> dict[str, Any]:
    """The configuration that shapes the statistics (all but ``name`` and arg routes)."""
    return {f: getattr(self, f) for f in self._config_fields if f not in ("name", "arg_routes")}

  def reduce(self, axis_name: str | tuple[str, ...]) -> Self:
    """Combined across the mapped axis ``axis_name`` (inside pmap / shard_map)."""
    return self._map_state(lambda a: a.reduce(axis_name))

  def aggregate(self) -> Self:
    """Combined over a leading stacked axis (after ``lax.all_gather``, or out of pmap).

    Eagerly, a state spread over several devices (pmap's outputs) is fetched to the host first,
    as each accumulator's ``aggregate`` does, then combined in one program on one device.
    """
    if runs_eagerly(self):
      fetched = on_one_device(self)
      return jitted_if_traceable(eager_aggregate, fetched._aggregated, fetched)
    return self._aggregated()

  def _aggregated(self) -> Self:
    return self._map_state(lambda a: a.aggregate())

  @abc.abstractmethod
  def compute(self) -> Any:
    """The metric's value (NaN when no real element was seen)."""

  def compute_logs(self) -> dict[str, Any]:
    """``{name: value}``."""
    return {self.name: self.compute()}


_INT32 = np.iinfo(np.int32)


def _fit_int32(key: str, value, kind: str, mask, owner: str):
  """``value``, with host integers outside int32 made exact or refused, never wrapped.

  JAX's default 32-bit mode casts int64 to int32 by wrapping (``2**32`` becomes 0). A
  number (``kind`` ``"number"`` or ``"rounded"``) becomes int32 if its real elements fit
  (every digit kept: the metrics split int32 values beyond ``2**24`` exactly); else a uint32
  array stays uint32, as a jitted update sees it (the metrics keep its digits, or count the
  elements float32 would round as invalid), and an int64 / uint64 one becomes float32 when
  float32 holds every real element, or when ``kind`` is ``"rounded"`` (a mean: rounded to
  nearest, as a float64 would be). A class or token id (``kind`` ``"id"``) outside int32
  cannot be one, so it raises. Only the real elements of ``mask`` (a host bool prefix of
  ``value``'s shape) are checked; padding may hold anything.

  Raises:
    ValueError: an id outside int32's range, or an int64 / uint64 number outside it that
      float32 would round (in a metric of spreads or ranks), naming ``key``.
  """
  if not isinstance(value, np.ndarray) or value.dtype.kind not in "iu" or value.dtype.itemsize < 4:
    return value
  if value.dtype.itemsize == 4 and value.dtype.kind == "i":
    return value
  seen = value
  if (
    isinstance(mask, np.ndarray)
    and mask.dtype == np.bool_
    and mask.shape == value.shape[: mask.ndim]
  ):
    seen = value[mask]
  fits = not seen.size or (seen.min() >= _INT32.min and seen.max() <= _INT32.max)
  if fits:
    return value.astype(np.int32) if kind != "id" else value
  if kind != "id" and value.dtype == np.uint32:
    return value
  if kind == "rounded":
    return value.astype(np.float32)
  if kind == "number":
    changed = seen[~_float32_holds(seen)]
    if not changed.size:
      return value.astype(np.float32)
    example = changed.flat[0]
    raise ValueError(
      f"{owner}: {key} holds integers in [{seen.min()}, {seen.max()}] (dtype {value.dtype}), "
      f"outside int32's range, that float32 rounds ({example} would become "
      f"{int(np.float32(example))}): JAX's default 32-bit mode computes in float32, and in this "
      "metric's spreads, differences or ranks the rounding changes the answer, not only its "
      "last digits. Subtract an offset (e.g. the minimum) so they fit int32, or enable "
      "jax_enable_x64"
    )
  raise ValueError(
    f"{owner}: {key} holds integers in [{seen.min()}, {seen.max()}] (dtype {value.dtype}), "
    f"outside int32's range [{_INT32.min}, {_INT32.max}]: JAX's default 32-bit mode would wrap "
    f"them. Class and token ids must fit int32: remap them (np.unique(..., return_inverse=True)), "
    "or enable jax_enable_x64"
  )


def _float32_holds(x: np.ndarray) -> np.ndarray:
  """bool: the elements of the int64 / uint64 array ``x`` that float32 holds exactly."""
  back = x.astype(np.float32).astype(np.float64)  # float64 holds every float32
  inside = (back >= np.iinfo(x.dtype).min) & (
    back < 2.0 ** (8 * x.dtype.itemsize - (x.dtype.kind == "i"))
  )
  return inside & (np.where(inside, back, 0).astype(x.dtype) == x)


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


def _member_name(key, child: Metric, name: str) -> str:
  """``name`` (reported by ``child``) as seen from the collection holding it at ``key``."""
  if key is None:
    return name
  return key if name == child.name else f"{key}/{name}"


def empty_count(metric: Metric) -> ExactCount:
  """An empty scalar :class:`~padded_eval.exact.accumulate.ExactCount`: ``example_rows =
  state(empty_count)``."""
  del metric  # the same for every configuration
  return ExactCount.zeros()


def invalid_state(metric: Metric) -> ExactCount:
  """The empty invalid counts of ``metric``: ``invalid = state(invalid_state)``."""
  return ExactCount.zeros((len(metric.invalid_kinds),))


def empty_sum(metric: Metric) -> ExactSum:
  """An empty scalar :class:`~padded_eval.exact.accumulate.ExactSum`: ``total = state(empty_sum)``."""
  del metric  # the same for every configuration
  return ExactSum.zeros()


def explicit_context_axes() -> tuple[str, ...]:
  """The ``Explicit`` axes of the context mesh (``jax.set_mesh``), or ``()``.

  Inside them an array's sharding is part of its type, and ops whose output sharding is
  ambiguous (a gather or one-hot over a class axis split over ``"tensor"``, a scatter of
  split rows into a replicated histogram) raise ``ShardingTypeError``; `Metric.batch_updates`
  computes its statistics with these axes made ``Auto`` (``jax.sharding.auto_axes``).
  """
  get_mesh = getattr(jax.sharding, "get_abstract_mesh", None)
  axis_type = getattr(jax.sharding, "AxisType", None)
  if get_mesh is None or axis_type is None:
    return ()
  mesh = get_mesh()
  types = getattr(mesh, "axis_types", ()) or ()
  return tuple(name for name, kind in zip(mesh.axis_names, types) if kind == axis_type.Explicit)

"""Bootstrap: confidence intervals for any metric, from the same single pass.

``Bootstrap(metric)`` keeps the wrapped metric's state (the point estimate, unchanged)
and ``num_replicas`` more copies of it on a leading axis. In replica ``r`` row ``i``
counts ``k_ri`` times, a Poisson(1) count that is a pure function of
``(seed, r, index_i)`` (:mod:`padded_eval.metrics.resampling._poisson_counts`), read from the
``index`` keyword (``pe.pad_batches(..., index_key="index")``). Every replica is a
sufficient statistic like any other, merged and ``psum``-reduced exactly, so the
replicas, and the interval, do not depend on batch size, batch order, padding, device
count or host count. Token-level metrics resample whole rows (the ``[B]`` count is
broadcast over the trailing axes).

How the counts enter the wrapped metric (``resample``):

* ``"weights"``: as sample ``weights`` (times the caller's weights). Metrics whose
  statistics are weighted sums (means, losses, accuracy, perplexity, moments) take
  integer weights exactly: float32 per-batch sums of integer counts are exact below
  ``2**24``, and the accumulators carry them exactly.
* ``"repeat"``: as a repeat count through the ``mask``, for metrics that count elements
  and refuse weights (the confusion family, curves, calibration): ``k = sum_b 2**b
  bit_b(k)``, one masked update per bit (4 bits), combined by doubling with ``merge``
  (Horner), so integer counts stay integer and exact.
* ``"auto"`` (default): ``"weights"``, and ``"repeat"`` if the metric refuses weights.

The replicas are computed with ``jax.vmap`` over the replica axis, not a Python loop.
State memory is ``(num_replicas + 1)`` times the wrapped metric's state (see
:meth:`Bootstrap.state_nbytes` and HOWTO.md for a table); a ValueError explains a
configuration beyond ``max_state_bytes``.

Examples:
  >>> import jax.numpy as jnp
  >>> import padded_eval as pe
  >>> m = pe.metrics.Bootstrap(pe.metrics.Mean(), num_replicas=50)
  >>> m = m.update(values=jnp.arange(8.0), index=jnp.arange(8))
  >>> float(m.compute()), m.replicas().shape
  (3.5, (50,))
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

from padded_eval import validation
from padded_eval.exact.accumulate import ExactCount
from padded_eval.metrics.base import Metric, empty_count, state
from padded_eval.metrics.resampling._poisson_counts import (
  COUNT_BITS,
  ID_DIGITS,
  id_digits,
  poisson_counts,
)
from padded_eval.metrics.totals import real_row_flags

if TYPE_CHECKING:
  from typing_extensions import Self

RESAMPLE_MODES = ("auto", "weights", "repeat")
#: The default bound on the state's size (point estimate plus replicas), in bytes.
DEFAULT_MAX_STATE_BYTES = 2**31
#: The invalid kind of `Bootstrap`: real rows of one update sharing a row id.
REPEATED_ID = (
  "repeated row id (rows of one batch share an index; pass the row ids of "
  "pe.pad_batches(..., index_key=...), one per row, not labels)"
)


def stacked(metric: Metric, num_replicas: int) -> Metric:
  """``metric``'s pytree with every leaf repeated on a new leading axis ``[R, ...]``."""
  return jax.tree.map(lambda x: jnp.broadcast_to(x, (num_replicas,) + jnp.shape(x)), metric)


def _empty_point(bootstrap: Bootstrap) -> Metric:
  return bootstrap.point.empty()


def _empty_replicas(bootstrap: Bootstrap) -> Metric:
  return stacked(bootstrap.point.empty(), bootstrap.num_replicas)


def _empty_ids(bootstrap: Bootstrap) -> ExactCount:
  del bootstrap  # the same for every configuration
  return ExactCount.zeros((1 + ID_DIGITS,))


def set_wrapper_config(wrapper: Metric, metric: Metric, name: str | None, **config: Any) -> None:
  """Sets the configuration fields of ``wrapper``, a metric around ``metric`` (`Bootstrap`,
  `Sliced`), as a frozen dataclass's ``__init__`` would: ``config``, its ``name`` (the wrapped
  metric's unless given) and no argument routes of its own (the wrapped metric reads its
  keywords)."""
  config.update(name=metric.name if name is None else name, arg_routes=())
  for field, value in config.items():
    object.__setattr__(wrapper, field, value)


def check_mergeable(wrapper: Metric, other: Metric) -> None:
  """Raises ValueError unless ``other`` is a wrapper of ``wrapper``'s kind whose statistics are
  configured alike (`Bootstrap`, `Sliced`: the configuration their states merge under)."""
  kind = type(wrapper).__name__
  if type(other) is not type(wrapper):
    raise ValueError(f"cannot merge {kind} with {type(other).__name__}")
  mine, theirs = wrapper._statistics_config(), other._statistics_config()
  if mine != theirs:
    raise ValueError(f"cannot merge {kind} metrics configured differently: {mine} vs {theirs}")


def nbytes(tree) -> int:
  """Total bytes of the array leaves of ``tree``."""
  return sum(
    int(np.prod(jnp.shape(x))) * jnp.asarray(x).dtype.itemsize for x in jax.tree.leaves(tree)
  )


def flat_values(name: str, value) -> dict[str, Any]:
  """``{name: value}``, or ``{key: v}`` flattened when ``value`` is a dict (a collection)."""
  if isinstance(value, Mapping):
    return dict(value)
  return {name: value}


class Bootstrap(Metric):
  """A Poisson bootstrap of ``metric``: its exact value plus replicas for intervals.

  Args:
    metric: the metric to wrap (any :class:`Metric`, a collection included).
    num_replicas: the number of bootstrap replicas ``R``.
    seed: an int in ``[0, 2**32)``; the replicas are a pure function of it and the row ids.
    confidence: the default coverage of :meth:`compute_interval`, in ``(0, 1)``.
    resample: ``"auto"``, ``"weights"`` or ``"repeat"`` (see [the module docstring][padded_eval.metrics.resampling.bootstrap]).
    max_state_bytes: refuse configurations whose state exceeds this many bytes.
    name: the key in logs (default: the wrapped metric's name).

  Update keywords: the wrapped metric's, plus ``index`` int ``[B]`` row ids, unique
  over the dataset (rows sharing an id share their counts; padding rows may hold
  anything). Real rows of one update whose id an earlier real row of it holds (labels
  passed as ``index``: every row of a class drawn together, an interval too wide) are
  counted and reported by :meth:`invalid_report` as ``"repeated row id"``, so
  ``masked_eval`` raises (rows of different batches, or of different devices under pmap,
  are not compared). ``pe.pad_batches(..., index_key="index")`` gives them; with several
  processes add ``index_offset=`` so they are global.

  Raises:
    ValueError: a bad argument, or a state larger than ``max_state_bytes``.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> hits = (np.arange(200) % 4 != 0).astype(np.float32)  # 150 of 200
    >>> m = pe.metrics.Bootstrap(pe.metrics.Mean("x"), num_replicas=500, seed=0)
    >>> m = m.update(x=hits, index=np.arange(200))
    >>> float(m.compute())  # the wrapped metric's exact value
    0.75
    >>> low, high = (float(v) for v in m.compute_interval())
    >>> bool(low < 0.75 < high), bool(0.09 < high - low < 0.15)  # about 2 * 1.96 * sqrt(p (1 - p) / n) = 0.12
    (True, True)
  """

  num_replicas: int = 1000
  seed: int = 0
  confidence: float = 0.95
  resample: str = "auto"
  max_state_bytes: int = DEFAULT_MAX_STATE_BYTES
  point: Metric = state(_empty_point)
  replica_states: Metric = state(_empty_replicas)
  ids: ExactCount = state(_empty_ids)
  repeated_ids: ExactCount = state(empty_count)

  def __init__(
    self,
    metric: Metric,
    num_replicas: int = 1000,
    seed: int = 0,
    confidence: float = 0.95,
    *,
    resample: str = "auto",
    max_state_bytes: int = DEFAULT_MAX_STATE_BYTES,
    name: str | None = None,
  ):
    if not isinstance(metric, Metric):
      raise ValueError(
        f"Bootstrap wraps a Metric (e.g. pe.metrics.Accuracy()); got metric={metric!r}"
      )
    set_wrapper_config(
      self,
      metric,
      name,
      num_replicas=num_replicas,
      seed=seed,
      confidence=confidence,
      resample=resample,
      max_state_bytes=max_state_bytes,
    )
    self._check_config()
    self._check_size(metric)
    object.__setattr__(self, "point", metric.empty())
    object.__setattr__(self, "replica_states", _empty_replicas(self))
    object.__setattr__(self, "ids", _empty_ids(self))
    object.__setattr__(self, "repeated_ids", empty_count(self))

  @property
  # pyrefly: ignore[bad-override]  # the wrapped metric's direction: a property over the class constant
  def higher_is_better(self) -> bool | None:
    """The wrapped metric's direction (its interval's too)."""
    return self.point.higher_is_better

  def _check_config(self) -> None:
    if not isinstance(self.name, str) or not self.name:
      raise ValueError(f"name must be a non-empty str; got {self.name!r}")
    validation.check_positive_int("num_replicas", self.num_replicas)
    validation.check_nonnegative_int("seed", self.seed)
    if self.seed >= 2**32:
      raise ValueError(f"seed must be an int in [0, 2**32); got {self.seed}")
    validation.check_probability("confidence", self.confidence)
    if not 0.0 < self.confidence < 1.0:
      raise ValueError(f"confidence must be in (0, 1); got {self.confidence}")
    validation.check_choice("resample", self.resample, RESAMPLE_MODES)
    validation.check_positive_int("max_state_bytes", self.max_state_bytes)

  def _check_size(self, metric: Metric) -> None:
    one = nbytes(metric.empty())
    total = one * (self.num_replicas + 1)
    if total > self.max_state_bytes:
      raise ValueError(
        f"Bootstrap({type(metric).__name__}, num_replicas={self.num_replicas}) needs a state "
        f"of {total:,} bytes ({one:,} bytes per copy x {self.num_replicas + 1} copies), over "
        f"max_state_bytes={self.max_state_bytes:,}. Use fewer replicas, a smaller metric "
        "(e.g. per-class counts rather than a [C, C] matrix), or raise max_state_bytes."
      )

  def state_nbytes(self) -> int:
    """Bytes of the state: the point estimate plus ``num_replicas`` copies (and 80 bytes: the
    row-id checksum and the count of repeated ids)."""
    return nbytes(self._state())

  def examples_checksum(self) -> np.ndarray:
    """int64 ``[9]``: the real rows seen and 8 order-free sums of hashes of their ids.

    Equal for two runs over the same examples (whatever their batching, padding, devices or
    hosts); :func:`padded_eval.metrics.compare` refuses two runs whose checksums differ.
    """
    return self.ids.to_numpy()

  # --- inputs ---------------------------------------------------------------------------

  def required_inputs(self) -> tuple[str, ...]:
    return ("index",)

  def optional_inputs(self) -> tuple[str, ...]:
    return ()

  def batch_updates(self, **kwargs: ArrayLike) -> Bootstrap:
    """This batch's statistics: the wrapped metric's and every replica's. Keyword-only.

    Raises:
      ValueError: no ``index`` keyword (how to get row ids is in the message), an
        index that is not int ``[B]`` (``B`` the rows of the mask, else of the first input),
        or the wrapped metric's input errors.
    """
    if "index" not in self.routed(kwargs):
      raise ValueError(
        f"Bootstrap({self.name!r}).update needs the keyword 'index': int [B] row ids that "
        "name each example across batches (the bootstrap counts are a function of them). "
        'Get them with pe.pad_batches(..., index_key="index") and pass '
        f'index=batch["index"]; got keywords {sorted(kwargs)}'
      )
    return super().batch_updates(**kwargs)

  def _batch_state(self, *, index, **kwargs):
    index = jnp.asarray(index)
    if index.ndim != 1 or not jnp.issubdtype(index.dtype, jnp.integer):
      raise ValueError(
        f"index must be int row ids of shape [B]; got dtype {index.dtype} shape {index.shape}"
      )
    hint = ": pass the ids of the same batch, index=batch['index'] (pe.pad_batches(..., index_key='index'))"
    check_one_per_row("index", index, kwargs, "row id", hint)
    counts = poisson_counts(self.seed, self.num_replicas, index)  # [R, B]
    point = self.point.batch_updates(**kwargs)
    inner = self.point.routed(kwargs)
    unrouted = copy.copy(self.point)
    object.__setattr__(unrouted, "arg_routes", ())
    replicas = self._replica_updates(unrouted, counts, inner)
    # The same pytree structure as the point estimate (its routes kept), leaves [R, ...].
    replicas = jax.tree.unflatten(jax.tree.structure(point), jax.tree.leaves(replicas))
    return {
      "point": point,
      "replica_states": replicas,
      "ids": _ids_checksum(index, kwargs),
      "repeated_ids": ExactCount.of(repeated_ids(index, kwargs)),
    }

  def _replica_updates(self, metric: Metric, counts: jax.Array, inner: dict) -> Metric:
    if self.resample == "weights":
      return jax.vmap(lambda k: metric.batch_updates(**with_weights(inner, k)))(counts)
    if self.resample == "repeat":
      return jax.vmap(lambda k: repeated_updates(metric, inner, k))(counts)
    try:
      return jax.vmap(lambda k: metric.batch_updates(**with_weights(inner, k)))(counts)
    except ValueError:  # a counting metric that refuses weights
      return jax.vmap(lambda k: repeated_updates(metric, inner, k))(counts)

  # --- merging (the replica axis mapped with vmap) ----------------------------------------

  def merge(self, other: Metric) -> Self:
    """Both states combined, replica by replica."""
    check_mergeable(self, other)
    assert isinstance(other, Bootstrap)  # check_mergeable: the same kind
    return self.replace_state(
      point=self.point.merge(other.point),
      replica_states=jax.vmap(lambda a, b: a.merge(b))(self.replica_states, other.replica_states),
      ids=self.ids.merge(other.ids),
      repeated_ids=self.repeated_ids.merge(other.repeated_ids),
    )

  def reduce(self, axis_name) -> Bootstrap:
    """Combined across the mapped axis ``axis_name`` (inside pmap / shard_map)."""
    return self.replace_state(
      point=self.point.reduce(axis_name),
      replica_states=jax.vmap(lambda a: a.reduce(axis_name))(self.replica_states),
      ids=self.ids.reduce(axis_name),
      repeated_ids=self.repeated_ids.reduce(axis_name),
    )

  def aggregate(self) -> Bootstrap:
    """Combined over a leading stacked axis ``[S, ...]`` (replicas then sit at axis 1)."""
    return self.replace_state(
      point=self.point.aggregate(),
      replica_states=jax.vmap(lambda a: a.aggregate(), in_axes=1)(self.replica_states),
      ids=self.ids.aggregate(),
      repeated_ids=self.repeated_ids.aggregate(),
    )

  # --- results ---------------------------------------------------------------------------

  def compute(self):
    """The wrapped metric's value, exactly (the point estimate)."""
    return self.point.compute()

  def replicas(self):
    """The replicate values: ``[num_replicas, ...]`` (a dict of them for a collection)."""
    return jax.vmap(lambda m: m.compute())(self.replica_states)

  def compute_interval(self, confidence: float | None = None):
    """``(low, high)``: the percentile interval of the replicas.

    Args:
      confidence: the coverage, in ``(0, 1)``; default the configured ``confidence``.

    Returns:
      ``(low, high)``, each of the value's shape (dicts for a collection): the
      ``(1 - c) / 2`` and ``(1 + c) / 2`` quantiles (linear interpolation, as
      ``numpy.quantile``). A replica that is NaN makes the bounds NaN.
    """
    confidence = self.confidence if confidence is None else confidence
    validation.check_probability("confidence", confidence)
    if not 0.0 < confidence < 1.0:
      raise ValueError(f"confidence must be in (0, 1); got {confidence}")
    tail = (1.0 - confidence) / 2.0
    replicas = self.replicas()
    low = jax.tree.map(lambda r: jnp.quantile(r, tail, axis=0), replicas)
    high = jax.tree.map(lambda r: jnp.quantile(r, 1.0 - tail, axis=0), replicas)
    return low, high

  def compute_logs(self) -> dict[str, Any]:
    """``{name: value, name + "_low": low, name + "_high": high}`` (every key of a collection)."""
    low, high = self.compute_interval()
    logs = {}
    values = flat_values(self.name, self.compute())
    lows, highs = flat_values(self.name, low), flat_values(self.name, high)
    for key, value in values.items():
      logs[key] = value
      logs[f"{key}_low"] = lows[key]
      logs[f"{key}_high"] = highs[key]
    return logs

  # --- invalid values: the point estimate's, and what only replicas hit --------------------

  def invalid_counts(self) -> dict[str, int]:
    """The wrapped metric's invalid counts."""
    return self.point.invalid_counts()

  def invalid_report(self) -> list[tuple[str, str, int]]:
    """The wrapped metric's report, named by this metric's name, then what only replicas report.

    Replicas see the point estimate's rows, so its invalid values are theirs; but a replica
    holds each row as many times as it is drawn (about ``rows + 5 * sqrt(rows)`` elements at
    most), so a capacity the point estimate fits in (an exact AUROC's, a rank correlation's)
    can overflow in some replicas, whose values are then NaN, and so is the interval. Such a
    kind is reported as ``"<kind>, in k of R bootstrap replicas ..."`` with the replicas'
    summed count (each replica read on the host, once: about 0.03-0.07 s for 1000).
    """
    point = [
      (self.name if name == self.point.name else name, kind, n)
      for name, kind, n in self.point.invalid_report()
    ]
    repeated = int(self.repeated_ids.to_numpy())
    if repeated:
      point.append((self.name, REPEATED_ID, repeated))
    seen = {(name, kind) for name, kind, _ in point}
    host = jax.device_get(self.replica_states)
    replicas: dict[tuple[str, str], list[int]] = {}  # (name, kind) -> [replicas, count]
    for r in range(self.num_replicas):
      one = jax.tree.map(lambda leaf, r=r: leaf[r], host)
      for name, kind, n in one.invalid_report():
        key = (self.name if name == self.point.name else name, kind)
        if key not in seen:
          found = replicas.setdefault(key, [0, 0])
          found[0], found[1] = found[0] + 1, found[1] + n
    return point + [
      (
        name,
        f"{kind}, in {k} of {self.num_replicas} bootstrap replicas (a replica holds each row "
        "as many times as it is drawn, about rows + 5 * sqrt(rows) elements at most; their "
        "values and the interval are NaN)",
        n,
      )
      for (name, kind), (k, n) in replicas.items()
    ]

  def example_count(self) -> int | None:
    """The wrapped metric's count of real rows (None if it cannot say)."""
    return self.point.example_count()

  def example_report(self) -> list[tuple[str, int]]:
    """The wrapped metric's example counts, named by this metric's name."""
    return [
      (self.name if name == self.point.name else name, n) for name, n in self.point.example_report()
    ]


def check_one_per_row(key: str, ids: jax.Array, kwargs: dict, what: str, hint: str = "") -> None:
  """Raises ValueError naming ``key`` unless ``ids`` has one entry (a ``what``) per row of the
  batch whose other keywords are ``kwargs`` (`batch_rows`); ``hint`` ends the message."""
  rows = batch_rows(kwargs)
  if rows is not None and rows[1][0] != ids.shape[0]:
    name, shape = rows
    raise ValueError(
      f"{key} has shape {ids.shape}; expected [{shape[0]}], one {what} per row of the batch "
      f"({name!r} has shape {shape}){hint}"
    )


def batch_rows(kwargs: dict) -> tuple[str, tuple] | None:
  """The keyword whose leading axis is the batch's rows (the mask, else the first array input) and its shape."""
  names = ["mask"] if kwargs.get("mask") is not None else []
  names += [name for name in kwargs if name != "mask" and kwargs[name] is not None]
  for name in names:
    shape = tuple(jnp.shape(kwargs[name]))
    if shape:
      return name, shape
  return None


def repeated_ids(index: jax.Array, kwargs: dict) -> jax.Array:
  """int32 scalar: the real rows (the ``mask``'s, as `_ids_checksum`) whose id an earlier real
  row of the same update holds. One sort of ``[B]`` (real rows first, by id)."""
  real = real_row_flags(kwargs.get("mask"), None, [index])
  if real is None:
    real = jnp.ones(index.shape, bool)
  if index.shape[0] < 2:
    return jnp.zeros((), jnp.int32)
  padding, ids = jax.lax.sort((~real, index), num_keys=2)
  same = (ids[1:] == ids[:-1]) & ~padding[1:] & ~padding[:-1]
  return jnp.sum(same, dtype=jnp.int32)


def _ids_checksum(index: jax.Array, kwargs: dict) -> ExactCount:
  """``[1 + ID_DIGITS]``: the batch's real rows (the ``mask``'s, weights aside: a weight-0
  row is still the same example) and the sums of their id digits."""
  real = real_row_flags(kwargs.get("mask"), None, [index])
  if real is None:
    real = jnp.ones(index.shape, bool)
  digits = jnp.where(real[None, :], id_digits(index), 0)
  sums = jnp.concatenate([jnp.sum(real, dtype=jnp.int32)[None], jnp.sum(digits, axis=1)])
  return ExactCount.of(sums)


def with_weights(kwargs: dict, counts: jax.Array) -> dict:
  """``kwargs`` with ``weights`` = ``counts`` (float32 ``[B]``) times the caller's weights."""
  counts = counts.astype(jnp.float32)
  weights = kwargs.get("weights")
  if weights is not None:
    weights = jnp.asarray(weights, jnp.float32)
    counts = weights * counts.reshape(counts.shape + (1,) * (weights.ndim - 1))
  return {**kwargs, "weights": counts}


def with_row_mask(kwargs: dict, rows: jax.Array) -> dict:
  """``kwargs`` with ``mask`` = the caller's mask and bool ``rows`` ``[B]`` (broadcast)."""
  mask = kwargs.get("mask")
  if mask is not None:
    mask = jnp.asarray(mask)
    rows = mask & rows.reshape(rows.shape + (1,) * (mask.ndim - 1))
  return {**kwargs, "mask": rows}


def repeated_updates(metric: Metric, kwargs: dict, counts: jax.Array) -> Metric:
  """The state of the batch with row ``i`` counted ``counts[i]`` times, by its bits.

  ``S = s_0 + 2 (s_1 + 2 (s_2 + 2 s_3))`` with ``s_b`` the update of the rows whose bit
  ``b`` is set: additions (``merge``) only, so integer statistics stay exact.
  """
  total = None
  for bit in reversed(range(COUNT_BITS)):
    part = metric.batch_updates(**with_row_mask(kwargs, (counts >> bit) & 1 == 1))
    total = part if total is None else total.merge(total).merge(part)
  assert total is not None  # COUNT_BITS > 0
  return total

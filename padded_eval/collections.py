"""Collections: Metrics, Losses and LossesAndMetrics (the jax_metrics API, weighted).

This module sits above both metrics and losses (it holds either); neither imports it.
See docs/architecture.md, "Modules and layers".

Each combinator is itself a :class:`~padded_eval.metrics.base.Metric`: an immutable
pytree whose state is its children, so ``update``, ``batch_updates``, ``merge``,
``reduce``, ``aggregate``, ``reset``, ``jit``, ``grad(has_aux=True)`` and ``pmap`` work
as for one metric. ``update(**kw)`` forwards every keyword to every child; each reads
the keywords it needs (``map_arg`` / ``index_into`` rename them).

Names (the keys of ``compute()``; static, fixed at construction):

* a list or tuple uses each child's ``name``; a repeated name gets a numeric suffix,
  as in jax_metrics: ``accuracy``, ``accuracy2``, ``accuracy3``. A name that already
  ends in a digit gets ``_2`` instead (``top5``, ``top5_2``; jax_metrics would count
  up to ``top6``, which reads as another metric);
* a dict uses its keys;
* nesting joins group keys and names with ``"/"``: ``{"train": [Accuracy()]}`` gives
  ``"train/accuracy"``. A child whose ``compute()`` is a dict (a nested collection)
  contributes ``"{key}/{inner key}"``.

Members by name: ``collection["accuracy"]`` (``collection["train/accuracy"]`` when nested)
is the member metric, as in ``nnx.MultiMetric``; after ``masked_eval``,
``results.metric["auroc"].curve()`` reads one member's final state (``"name" in
collection`` tests for one; a missing name raises KeyError listing the names).

Unlike jax_metrics, :class:`Losses` and :class:`LossesAndMetrics` weight every batch by
its real examples (its ``mask``), not equally: a loss is accumulated as the sum of its
per-element value over real elements and the sum of their weights, so a half-padded
last batch counts half, and the result equals one update over the whole dataset.
Regularizers are weighted by the batch's number of real examples (see
:mod:`padded_eval.losses.regularizers`).

Examples:
  >>> import jax.numpy as jnp
  >>> import padded_eval as pe
  >>> metrics = pe.Metrics([pe.metrics.Accuracy(), pe.metrics.Accuracy(top_k=2)])
  >>> metrics = metrics.update(preds=jnp.array([[0.1, 0.9, 0.0]]), target=jnp.array([0]))
  >>> {k: float(v) for k, v in metrics.compute().items()}
  {'accuracy': 0.0, 'accuracy2': 1.0}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Container, Iterator, Mapping
from typing import Any, ClassVar, cast

import jax
import jax.numpy as jnp

from padded_eval.exact.accumulate import ExactCount, ExactSum
from padded_eval.losses.base import Loss, safe_mean
from padded_eval.metrics.base import Metric, empty_count, empty_sum, is_state, state
from padded_eval.metrics.totals import finished_together

# --- names -------------------------------------------------------------------------------


def unique_name(name: str, taken: Container[str]) -> str:
  """``name``, or ``name`` with the smallest numeric suffix >= 2 not in ``taken``."""
  if name not in taken:
    return name
  separator = "_" if name[-1:].isdigit() else ""
  suffix = 2
  while f"{name}{separator}{suffix}" in taken:
    suffix += 1
  return f"{name}{separator}{suffix}"


def _flatten_named(structure, leaf_fn: Callable, path: tuple = ()) -> Iterator[tuple[str, Any]]:
  """``(key, leaf)`` pairs of a nested list/tuple/dict structure, in order."""
  if isinstance(structure, Mapping):
    for key, value in structure.items():
      if not isinstance(key, str) or not key:
        raise ValueError(
          f"dict keys name metrics and groups and must be non-empty str; got "
          f"{key!r} at {'/'.join(path) or 'the top level'}"
        )
      if isinstance(value, (Mapping, list, tuple)):
        yield from _flatten_named(value, leaf_fn, path + (key,))
      else:
        yield "/".join(path + (key,)), leaf_fn(value, path + (key,))
  elif isinstance(structure, (list, tuple)):
    for index, value in enumerate(structure):
      if isinstance(value, (Mapping, list, tuple)):
        yield from _flatten_named(value, leaf_fn, path)
      else:
        leaf = leaf_fn(value, path + (str(index),))
        yield "/".join(path + (leaf.name,)), leaf
  else:
    leaf = leaf_fn(structure, path)
    yield leaf.name, leaf


def _member_logs(key: str, child: Metric) -> Iterator[tuple[str, Any]]:
  """``(flat name, value)`` of the logs of the member ``child`` at ``key`` (see
  `_Collection.compute_logs`)."""
  if isinstance(child, _Collection):
    yield from _flat_logs(key, child.compute_logs())
    return
  own, name = child.compute_logs(), child.name
  if all(log == name or log.startswith((f"{name}_", f"{name}/")) for log in own):
    for log, value in own.items():
      yield from _flat_logs(key + log[len(name) :], value)
    return
  yield from _flat_logs(key, child.compute())  # logs named otherwise: the value alone


def _flat_logs(key: str, value) -> Iterator[tuple[str, Any]]:
  if isinstance(value, Mapping):
    for inner, inner_value in value.items():
      yield from _flat_logs(f"{key}/{inner}", inner_value)
  else:
    yield key, value


def _set_fields(obj, **values) -> None:
  """Sets every dataclass field of ``obj``: given values, else config defaults."""
  for field in dataclasses.fields(obj):
    if field.name in values:
      value = values[field.name]
    elif is_state(field):
      continue
    elif field.default is not dataclasses.MISSING:
      value = field.default
    else:
      factory = field.default_factory
      assert factory is not dataclasses.MISSING, field.name  # a config field not given has one
      value = factory()
    object.__setattr__(obj, field.name, value)


# --- the accumulated mean of one loss ------------------------------------------------------


class LossAverage(Metric):
  """The mean of a :class:`~padded_eval.losses.base.Loss` over every real element seen.

  State: ``total`` (the weighted per-element loss summed over real elements) and
  ``weight`` (the summed weights), exact float totals. :class:`Losses` holds one per loss.

  Args:
    loss: the loss (hashable, static configuration).
  """

  higher_is_better: ClassVar[bool | None] = False

  loss: Loss = cast(Loss, None)  # required: _check_config refuses anything but a Loss
  total: ExactSum = state(empty_sum)
  weight: ExactSum = state(empty_sum)
  example_rows: ExactCount = state(empty_count)  # Metric.example_count (masked_eval's check)

  def __post_init__(self):
    if self.name is None and isinstance(self.loss, Loss):
      object.__setattr__(self, "name", self.loss.name)  # named after its loss
    super().__post_init__()

  def _check_config(self):
    if not isinstance(self.loss, Loss):
      raise ValueError(f"loss must be a padded_eval.losses.base.Loss; got {self.loss!r}")

  def row_inputs(self) -> tuple[str, ...]:
    return self.loss.required_inputs()  # a regularizer's parameters have no rows

  def _batch_state(self, **kwargs):
    total, weight = self.loss.batch_terms(**kwargs)
    return {"total": ExactSum.of(total), "weight": ExactSum.of(weight)}

  def compute(self) -> jax.Array:
    """The mean over every real element seen; NaN if none was seen."""
    return self.total.total() / self.weight.total()

  def batch_mean(self, axis_name: str | tuple[str, ...] | None = None) -> jax.Array:
    """Like :meth:`compute`, but 0 (with a finite gradient) when nothing was seen.

    With ``axis_name`` (inside pmap / shard_map) the weight is summed over that axis:
    the result is this device's share of the global mean (they add up to it).
    """
    weight = self.weight.total()
    if axis_name is not None:
      weight = jax.lax.psum(weight, axis_name)
    return safe_mean(self.total.total(), weight)


# --- collections -----------------------------------------------------------------------------


def _empty_children(collection):
  return {key: child.empty() for key, child in collection.children.items()}


class _Collection(Metric):
  """Shared body of Metrics and Losses: named children in the ``children`` state."""

  higher_is_better: ClassVar[bool | None] = None

  names: tuple = dataclasses.field(default=(), init=False)
  children: dict = state(_empty_children)

  def _setup(self, structure, name) -> None:
    children = {}
    for key, leaf in _flatten_named(structure, self._leaf):
      children[unique_name(key, children)] = leaf.empty()
    if not children:
      raise ValueError(f"{type(self).__name__} needs at least one child; got {structure!r}")
    _set_fields(
      self, name=name or type(self).__name__.lower(), names=tuple(children), children=children
    )

  def __getitem__(self, key: str) -> Metric:
    """The member named ``key`` (its key in ``compute_logs``: ``"accuracy"``, ``"group/auroc"``
    for nested dicts), e.g. ``results.metric["auroc"].curve()`` after ``masked_eval``.

    Raises:
      KeyError: no member is named ``key``; the message lists the names.
    """
    if key not in self.children:
      raise KeyError(
        f"{type(self).__name__} has no member {key!r}; its members: {list(self.names)}"
      )
    return self.children[key]

  def __contains__(self, key: object) -> bool:
    return key in self.children

  _holds: ClassVar[type]  # the metrics a child may be as it is (a Loss is held as its LossAverage)
  _takes: ClassVar[str]  # what a child may be, in the error message: "Metric instances (e.g. ...)"

  def _leaf(self, value, path) -> Metric:
    """The child metric for ``value`` found at ``path``: a Loss's `LossAverage`, or ``value`` itself
    if it is one of `_holds`; else ValueError."""
    if isinstance(value, Loss):
      return LossAverage(loss=value)
    if isinstance(value, self._holds):
      return value
    raise ValueError(
      f"{type(self).__name__} takes {self._takes}; got {value!r} at {'/'.join(path) or 'the top level'}"
    )

  def _batch_state(self, **kwargs):
    # the members' totals of one shape are summed together (one reduction; `finished_together`);
    # members are checked in order, so the first bad one raises
    children, pending = {}, {}
    for key, child in self.children.items():
      if child._gathers_totals():
        pending[key] = child._pending(child._checked_inputs(child.routed(kwargs)))
      else:
        children[key] = child.batch_updates(**kwargs)
    children.update(zip(pending, finished_together(list(pending.values()))))
    return {"children": {key: children[key] for key in self.children}}

  def compute(self) -> dict[str, Any]:
    """``{key: value}``, flat (nested results joined with "/"); see the module docstring."""
    logs = {}
    for key in self.names:
      for flat_key, value in _flat_logs(key, self.children[key].compute()):
        logs[unique_name(flat_key, logs)] = value
    return logs

  def compute_logs(self) -> dict[str, Any]:
    """The flat dict of :meth:`compute`, with each member's logs under its key.

    A member's logs named after the member (``name``, ``name + suffix``, ``name + "/" + part``)
    are logged with ``key`` for ``name``: ``pe.metrics.Bootstrap``'s ``key_low`` and
    ``key_high``, ``pe.metrics.Sliced``'s ``key/<slice name>``; a nested collection's under
    ``key/``.
    """
    logs = {}
    for key in self.names:
      for flat_key, flat_value in _member_logs(key, self.children[key]):
        logs[unique_name(flat_key, logs)] = flat_value
    return logs


class Metrics(_Collection):
  """A metric made of several metrics (a list, a dict, or nested lists and dicts).

  Args:
    metrics: :class:`Metric` instances (a :class:`~padded_eval.losses.base.Loss` is
      accepted too and reported as its mean), in a list, a dict or nested structure.
    name: the collection's name (default ``"metrics"``).

  Like every metric's constructor, this one starts empty: the children's
  configuration is taken, not any state they hold. Update the collection itself
  (``Metrics([...]).update(**batch)``) rather than its members beforehand.

  Raises:
    ValueError: if a child is not a Metric or Loss, or a dict key is not a str.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> metrics = pe.Metrics(
    ...   [pe.metrics.Accuracy(), pe.metrics.Recall(task="multiclass", num_classes=3, average="macro")])
    >>> logits = np.array([[2.0, 0, 0], [0, 2.0, 0], [0, 2.0, 0], [0, 0, 2.0]])
    >>> metrics = metrics.update(preds=logits, target=np.array([0, 1, 2, 2]))
    >>> {key: round(float(value), 4) for key, value in metrics.compute_logs().items()}
    {'accuracy': 0.75, 'recall': 0.8333}
  """

  _holds = Metric
  _takes = "Metric instances (e.g. pe.metrics.Accuracy())"

  def __init__(self, metrics: Any, *, name: str | None = None) -> None:
    self._setup(metrics, name)


class Losses(_Collection):
  """The running means of several losses, each weighted by real elements.

  Args:
    losses: :class:`~padded_eval.losses.base.Loss` instances (e.g.
      ``pe.losses.Crossentropy()``, ``pe.regularizers.L2(1e-4)``), in a list, a dict
      or nested structure.
    name: the collection's name (default ``"losses"``).

  Raises:
    ValueError: if a child is not a Loss, or a dict key is not a str.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> losses = pe.Losses([pe.losses.MeanSquaredError(), pe.losses.MeanAbsoluteError()])
    >>> losses = losses.update(preds=np.array([1.0, 2.0]), target=np.array([0.0, 0.0]))
    >>> {key: float(value) for key, value in losses.compute_logs().items()}
    {'meansquarederror': 2.5, 'meanabsoluteerror': 1.5}
  """

  _takes = "padded_eval.losses.base.Loss instances (e.g. pe.losses.Crossentropy(), pe.regularizers.L2(1e-4))"

  _holds = LossAverage

  def __init__(self, losses: Any, *, name: str | None = None) -> None:
    self._setup(losses, name)

  def total_loss(self) -> jax.Array:
    """The sum of the losses' means (float32 scalar; NaN if nothing was seen)."""
    return sum(self.compute().values(), jnp.float32(0.0))

  def batch_loss(self, axis_name: str | tuple[str, ...] | None = None) -> jax.Array:
    """:meth:`total_loss` for gradients: a loss that saw no real element counts 0, not NaN.

    Args:
      axis_name: inside pmap / shard_map, divide by the real examples of the whole
        global batch (summed over ``axis_name``), not this device's: each device gets
        its share, ``psum`` of the shares is the global batch loss, and ``psum`` of the
        per-device gradients is the exact gradient of the global batch, however the
        padding falls on devices (``pmean`` of per-device means is not).
    """
    return sum((self.children[key].batch_mean(axis_name) for key in self.names), jnp.float32(0.0))

  def loss_and_update(
    self, *, axis_name: str | tuple[str, ...] | None = None, **kwargs: Any
  ) -> tuple[jax.Array, Losses]:
    """``(batch loss, updated)``: this batch's total loss, and ``self`` with it merged in.

    The batch loss is the sum over losses of each one's mean over the batch's real
    elements (differentiable; an all-padding batch gives 0 and a zero gradient). See
    :meth:`batch_loss` for ``axis_name``; the merged state stays this device's.
    """
    batch = self.batch_updates(**kwargs)
    return batch.batch_loss(axis_name), self.merge(batch)


def _empty_or_none(field_name):
  def factory(collection):
    child = getattr(collection, field_name)
    return None if child is None else child.empty()

  return factory


class LossesAndMetrics(Metric):
  """Losses and metrics in one metric, with one flat log dict and a ``"loss"`` key.

  ``compute()`` is ``{"loss": total_loss, **losses, **metrics}`` (in that order); a key
  that collides with an earlier one gets a numeric suffix (``"loss2"``,
  ``"crossentropy2"``), so no value is dropped. Without losses ``"loss"`` is 0.0, as in
  jax_metrics.

  Args (keyword-only; jax_metrics' positional order was ``losses, metrics``):
    metrics: a :class:`Metrics`, or a structure to build one from (or None).
    losses: a :class:`Losses`, or a structure to build one from (or None).
    name: default ``"lossesandmetrics"``.

  Raises:
    ValueError: if both are None.

  Examples:
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> both = pe.LossesAndMetrics(metrics=[pe.metrics.Accuracy()], losses=[pe.losses.Crossentropy()])
    >>> logits = np.log(np.array([[0.5, 0.5], [0.8, 0.2]]))  # log-probabilities
    >>> both = both.update(preds=logits, target=np.array([0, 0]))
    >>> {key: round(float(value), 4) for key, value in both.compute_logs().items()}
    {'loss': 0.4581, 'crossentropy': 0.4581, 'accuracy': 1.0}
  """

  higher_is_better: ClassVar[bool | None] = None

  losses: Losses | None = state(_empty_or_none("losses"))
  metrics: Metrics | None = state(_empty_or_none("metrics"))

  def __init__(self, *, metrics: Any = None, losses: Any = None, name: str | None = None) -> None:
    if metrics is None and losses is None:
      raise ValueError("LossesAndMetrics needs metrics=..., losses=... or both; got neither")
    if losses is not None and not isinstance(losses, Losses):
      losses = Losses(losses)
    if metrics is not None and not isinstance(metrics, Metrics):
      metrics = Metrics(metrics)
    _set_fields(
      self,
      name=name or "lossesandmetrics",
      losses=None if losses is None else losses.empty(),
      metrics=None if metrics is None else metrics.empty(),
    )

  def __getitem__(self, key: str) -> Metric:
    """The member named ``key``: a metric (``"accuracy"``), or a loss's running mean
    (``"crossentropy"``), as :meth:`Metrics.__getitem__`.

    Raises:
      KeyError: no member is named ``key``; the message lists the names.
    """
    parts = [part for part in (self.metrics, self.losses) if part is not None]
    for part in parts:
      if key in part:
        return part[key]
    names = [name for part in parts for name in part.names]
    raise KeyError(f"LossesAndMetrics has no member {key!r}; its members: {names}")

  def __contains__(self, key: object) -> bool:
    return any(part is not None and key in part for part in (self.metrics, self.losses))

  def _batch_state(self, **kwargs):
    return {
      "losses": None if self.losses is None else self.losses.batch_updates(**kwargs),
      "metrics": None if self.metrics is None else self.metrics.batch_updates(**kwargs),
    }

  def total_loss(self) -> jax.Array:
    """The sum of the losses' means (0.0 without losses; NaN if nothing was seen)."""
    return jnp.float32(0.0) if self.losses is None else self.losses.total_loss()

  def batch_loss(self, axis_name: str | tuple[str, ...] | None = None) -> jax.Array:
    """The batch loss for gradients; see :meth:`Losses.batch_loss`."""
    return jnp.float32(0.0) if self.losses is None else self.losses.batch_loss(axis_name)

  def loss_and_update(
    self, *, axis_name: str | tuple[str, ...] | None = None, **kwargs: Any
  ) -> tuple[jax.Array, LossesAndMetrics]:
    """``(batch loss, updated)``; see :meth:`Losses.loss_and_update`."""
    batch = self.batch_updates(**kwargs)
    return batch.batch_loss(axis_name), self.merge(batch)

  def compute(self) -> dict[str, Any]:
    """``{"loss": total, **losses, **metrics}``, flat, names kept unique."""
    return self._with_loss(lambda part: part.compute())

  def compute_logs(self) -> dict[str, Any]:
    """The flat dict of :meth:`compute`, plus the keys members log beside their values
    (``pe.metrics.Bootstrap``: ``name_low`` and ``name_high``)."""
    return self._with_loss(lambda part: part.compute_logs())

  def _with_loss(self, read: Callable[[Metric], dict]) -> dict[str, Any]:
    """``{"loss": total}``, then ``read(part)`` of the losses and of the metrics, names kept unique."""
    logs = {"loss": self.total_loss()}
    for part in (self.losses, self.metrics):
      if part is not None:
        for key, value in read(part).items():
          logs[unique_name(key, logs)] = value
    return logs

"""masked_eval: exact full-dataset evaluation with one compiled step.

The driver turns ``step_fn(params, batch) -> Metric`` (masked statistics of one
padded batch) into one compiled function

    (params, state, step input) -> (state merged with this batch's statistics, token)

whose carried ``state`` (the metric and an exact count of real rows) stays on the
devices, with its buffers donated from step to step (a small empty state is placed
once per process and reused, so those steps keep it: `padded_eval.placement`). Where
the work runs is a `padded_eval.backends.Backend` (``"pmap"``, ``"shard_map"``, ``"jit"``):
it places params, batches and state, compiles the step, and reduces the per-device partial
states exactly, once, after the last step (`Backend.finalize`). Batches are placed on
the devices while the previous step runs, at most two steps are in flight (step t-1
is waited for after step t is dispatched), and the state comes to the host once, at
the end. With several processes, `padded_eval.distributed.Lockstep` wraps the batch
iterator and the wait so that every process runs the same steps; the loop is the same.

``step_fn`` is traced once per call whatever the dataset length: the empty state's
structure comes from ``jax.eval_shape`` of the step on the first batch, and that
trace is reused by the compiled step (``step_fn`` is wrapped in one ``jax.jit``, whose
trace cache both share). Compiled steps are cached per ``(step_fn, backend, mask_key)``
(`padded_eval.step_cache`: equal ``functools.partial``s share an entry), with the empty
state per input shapes, so a second call with the same shapes compiles and traces nothing.

Values a metric cannot reject inside jit (NaN in real rows, out-of-range labels) are
counted in its state; after the final reduce ``masked_eval`` reads
``metric.invalid_report()`` and raises, warns (`InvalidValuesWarning`) or ignores them
(``on_invalid``).
"""

from __future__ import annotations

import collections
import collections.abc as cabc
import itertools
import time
import warnings
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh

from padded_eval import backends, checkpoint, distributed, step_cache
from padded_eval.accumulate import ExactCount
from padded_eval.batch_spec import BatchSpec
from padded_eval.metrics.base import Metric
from padded_eval.outputs import NoOutputs, RowOutputs
from padded_eval.results import EvalResults
from padded_eval.validation import check_choice

__all__ = ["InvalidValuesWarning", "masked_eval"]

NUM_EXAMPLES = "num_examples"
ON_INVALID = ("raise", "warn", "ignore")


class InvalidValuesWarning(RuntimeWarning):
  """``masked_eval(..., on_invalid="warn")``: the metrics counted invalid values in real rows.

  Examples:
    >>> import warnings
    >>> import numpy as np
    >>> import padded_eval as pe
    >>> data = {"logits": np.eye(3, dtype=np.float32), "label": np.array([0, 1, 7])}  # 7: no such class
    >>> def step(params, batch):
    ...   return pe.metrics.Accuracy().batch_updates(
    ...     preds=batch["logits"], target=batch["label"], mask=batch["mask"])
    >>> with warnings.catch_warnings(record=True) as caught:
    ...   warnings.simplefilter("always")
    ...   results = pe.masked_eval(step, None, pe.pad_batches(data, 8), backend="jit", on_invalid="warn")
    >>> any(issubclass(w.category, pe.InvalidValuesWarning) for w in caught)
    True
  """


# --- host-side batch checks (each batch must match the first: no recompilation) -------


def _checked_batches(
  batches: cabc.Iterator, mask_key: str, backend: backends.Backend, mask_fn: Callable | None = None
):
  """Yields ``batches``, each checked; the first fixes the `BatchSpec` every later one must match.

  The one place where batches are checked: a batch that fails raises ValueError when it
  is read (batch 0 inside the multi-host pre-flight, which reports it to every process).
  """
  spec = None
  for index, batch in enumerate(batches):
    if spec is None:
      spec = BatchSpec.from_batch(batch, mask_key, index, mask_fn=mask_fn)
      spec.check_divisible(backend.num_shards, _shards(backend))
    else:
      spec.check(batch, index)
    yield batch


def _shards(backend: backends.Backend) -> str | None:
  """The shards of the data axes, in words, for messages; None: "the {n} devices"."""
  if backend.mesh.devices.ndim == 1:
    return None
  axes = backend.data_axes
  named = f"axis {axes[0]!r}" if len(axes) == 1 else f"axes {axes!r} (data_axes)"
  return (
    f"the {backend.num_shards} shards of the mesh's data {named} (mesh {dict(backend.mesh.shape)})"
  )


# --- the empty state (the compiled steps are cached in padded_eval.step_cache) ------------


def _empty_state(shapes) -> tuple[Metric, ExactCount]:
  """The empty (metric, count) state of one shard, from the ``eval_shape`` of a step."""
  metric_shape, count_shape = shapes
  empty = (metric_shape.empty(), ExactCount.zeros(count_shape.shape))
  got = [(tuple(np.shape(x)), np.dtype(x.dtype)) for x in jax.tree.leaves(empty)]
  want = [(tuple(s.shape), np.dtype(s.dtype)) for s in jax.tree.leaves(shapes)]
  if jax.tree.structure(empty) != jax.tree.structure(shapes) or got != want:
    raise ValueError(
      f"{type(metric_shape).__name__}.empty() has state leaves (shape, dtype) {got} but "
      f"step_fn's metric has {want}; empty() must match an updated metric's structure, "
      "shapes and dtypes"
    )
  return empty


# --- the driver -----------------------------------------------------------------------


def masked_eval(
  step_fn: Callable[[Any, Any], Metric],
  params: Any,
  batches: cabc.Iterable,
  *,
  backend: str = "pmap",
  axis_name: str = "batch",
  mesh: Mesh | None = None,
  data_axes: str | tuple[str, ...] | None = None,
  progress: bool = False,
  mask_key: str = "mask",
  steps_in_flight: int | None = None,
  timeout: float | None = None,
  on_invalid: str = "raise",
  outputs: bool = False,
  checkpoint_dir: Any = None,
  checkpoint_every: int = 100,
  mask_fn: Callable[[Any], Any] | None = None,
) -> dict[str, Any] | tuple[dict[str, Any], Any]:
  """Evaluates ``step_fn`` over every real row of ``batches``, exactly, compiling once.

  Args:
    step_fn: ``step_fn(params, batch) -> Metric``: the masked statistics of one
      batch (e.g. ``pe.metrics.Accuracy().batch_updates(preds=..., target=...,
      mask=batch["mask"])``). Under ``"pmap"`` and ``"shard_map"`` it sees one
      device's rows ``[B // shards, ...]`` and the driver reduces across
      ``axis_name``; under ``"jit"`` it sees the global batch ``[B, ...]``.
    params: any pytree, passed to ``step_fn`` as it is, placed once per call. Under
      ``"jit"``, leaves that are ``jax.Array``s on the mesh's devices keep their shardings
      (e.g. FSDP params sharded over ``("fsdp",)`` with ``NamedSharding``): the same
      buffers, no copy, no gather outside what ``step_fn``'s own ops need; every other leaf
      (numpy, Python scalars, arrays elsewhere) is replicated over the mesh. Under
      ``"pmap"`` and ``"shard_map"`` ``step_fn`` sees whole params: they are replicated
      (already replicated ``jax.Array``s are not copied again). The replicated copy of a
      ``jax.Array`` leaf is kept while that array lives and reused by later calls
      (`padded_eval.placement`); numpy leaves are copied on every call.
    batches: an iterable of dict batches whose every leaf is ``[B, ...]`` with the
      same ``B``, shapes and dtypes in every batch, and ``batch[mask_key]`` bool
      ``[B]`` True for real rows (as ``pe.pad_batches`` yields); with ``mask_fn``,
      any pytrees (see ``mask_fn``).
    backend: ``"pmap"``, ``"shard_map"`` or ``"jit"``.
    axis_name: the mapped axis name ``step_fn`` may use in collectives (pmap), and
      the name of the default mesh's one axis. With an explicit ``mesh`` it must be one
      of the data axes if it names a mesh axis.
    mesh: ``"shard_map"``/``"jit"`` only: the device mesh; rows are split over its
      data axes and replicated over the others. Default: all devices on one axis.
    data_axes: ``"shard_map"``/``"jit"`` only: the mesh axis (str) or axes (tuple of
      str) the batch's leading dimension is split over; the batch size must be divisible
      by the product of their sizes. Default (None): every axis named ``"data"``,
      ``"fsdp"`` or ``"batch"`` that the mesh has, in mesh order, else the mesh's first
      axis (`padded_eval.sharding.data_axes`); e.g. the ``(data=1, fsdp=8, tensor=1)``
      mesh of flax's lm1b example splits rows 8 ways over ``("data", "fsdp")``.
    progress: show a tqdm progress bar (batches, and real examples per second).
    mask_key: the batch key of the mask.
    steps_in_flight: at most this many dispatched steps not yet finished (>= 1).
      The next batch is always copied to the devices while the current step runs.
      Default 2: step t-1 is waited for after step t is dispatched, so the
      devices never idle on dispatch and the queue stays bounded (unbounded
      queues of pmap steps thrash CPU devices that share cores).
    timeout: several processes only: seconds to wait for the other processes (the
      pre-flight check, or one step) before raising; default
      ``padded_eval.distributed.DEFAULT_TIMEOUT_S`` (300). Must exceed the slowest
      process's compilation and per-batch loading time.
    on_invalid: what to do when the metrics counted invalid values in real rows
      (``metric.invalid_report()``, e.g. NaN or out-of-range labels): ``"raise"`` a
      ValueError naming each metric, kind and count; ``"warn"`` with an
      `InvalidValuesWarning` and return the results; or ``"ignore"`` them.
    outputs: ``step_fn`` returns ``(metric, per_row)``, where ``per_row`` is a pytree of
      arrays whose leading axis is the rows ``step_fn`` sees (``[B // shards, ...]``
      under pmap/shard_map, ``[B, ...]`` under jit), e.g. ``{"logits": logits}``; the
      real rows come back (see Returns). Each step's outputs are copied to the host
      asynchronously and collected when the driver waits on the step anyway, so device
      memory does not grow with the dataset. Still one trace.
    checkpoint_dir: a directory (str or path) that identifies this ONE evaluation (one model
      checkpoint, one dataset): the carried state is saved there every
      ``checkpoint_every`` steps (atomically, in the background), and a later call with
      the same directory resumes where the last saved step ended, with the exact same
      result as an uninterrupted run; a finished evaluation stores its result (values and
      final metric), and calling again returns it after reading only the first batch (which,
      with the params, shows the question: the same metric, batch spec, batch size and
      params, by value, or a ValueError). See `padded_eval.checkpoint`. Not with
      ``outputs=True``.
    checkpoint_every: steps between two saves (>= 1).
    mask_fn: ``mask_fn(batch) -> bool [rows, ...]``: the real elements of a batch that
      need not be a dict: with it, ``batches`` may be any pytree (a jraph
      ``GraphsTuple``, a tuple, a dataclass) whose every leaf has the batch's rows as
      leading axis ``[B, ...]``, with the same structure, shapes and dtypes in every
      batch, and ``mask_key`` is not used. The driver calls it inside the step, on the
      rows ``step_fn`` sees, and counts its True elements as ``num_examples`` (so a
      ``[rows, G]`` mask of graphs counts graphs); on the host it is called on batch 0
      (its result must be bool with leading size ``B``) and, with ``progress``, on every
      batch. ``step_fn`` applies the same mask to its metrics. Graphs: stack one padded
      ``GraphsTuple`` per row (e.g. one per device) on a new leading axis, and pass
      ``mask_fn=jax.vmap(jraph.get_graph_padding_mask)`` (HOWTO.md, "Graphs"). A
      function, not a lambda made anew per call, keeps the compiled step cached. Not
      with ``outputs=True``, ``checkpoint_dir`` or several processes (the all-padding
      batches of the multi-host lockstep need a mask key).

  Returns:
    ``metric.compute_logs()`` with scalars as Python floats and arrays as numpy
    arrays, plus ``"num_examples"``: the exact int number of real rows seen; a
    `padded_eval.results.EvalResults` (a dict) whose ``.metric`` is the final metric on
    the host, for its exact host views and `padded_eval.plot` (the stored one for a
    result read back from a finished checkpoint).
    With ``outputs=True``, the pair ``(results, per_row)``: ``per_row`` has the
    structure ``step_fn`` returned, with numpy leaves of exactly this process's
    real rows (padding removed), in the order of its batches: ``[num_examples, ...]``
    with one process. With several processes each process gets its own rows back
    (gather them with ids from ``pe.pad_batches(..., index_key=...)``; see HOWTO.md).

  Raises:
    ValueError: ``step_fn`` not callable; ``batches`` not an iterable of batches (None, or one dict batch);
      ``mask_key`` not a non-empty string (without ``mask_fn``); an unknown backend; a mesh or ``data_axes``
      with ``"pmap"``; ``data_axes``
      naming axes the mesh does not have; no batches; a batch
      without ``mask_key`` or with a batch size not divisible by the devices (or
      the shards of the data axes); a batch whose shapes differ from the first; a
      ``step_fn`` that does not return a Metric (with ``outputs=True``: a pair
      ``(metric, per_row)`` whose leaves have the step's rows as leading axis;
      ``outputs`` not a bool); with several processes, batches or settings that
      differ between processes (on every process, naming the one that differs);
      ``on_invalid="raise"`` and invalid values counted; ``checkpoint_dir`` written for
      another evaluation, finished or not (naming what differs: metric, batch structure or
      size, params structure or checksum, backend layout, process count), or given with
      ``outputs=True``;
      ``mask_fn`` not callable, or given with ``outputs=True``, ``checkpoint_dir`` or
      several processes; with ``mask_fn``, a batch whose leaves do not share a leading
      size, or whose structure differs from the first, or a ``mask_fn`` result on
      batch 0 that is not bool ``[B, ...]``.
    TimeoutError: several processes: another process did not arrive, or a step did
      not finish, within ``timeout`` seconds.
    RuntimeError: several processes: a step failed, e.g. because another process died.

  Several processes (``jax.distributed``): each passes its own batches, of any
  number, known or not; every process runs the same steps and gets the same, global
  result (see `padded_eval.distributed`).

  Examples:
    >>> import jax, numpy as np, padded_eval as pe
    >>> def step_fn(params, batch):
    ...   return pe.metrics.Mean().batch_updates(values=batch["x"] * params,
    ...                                          mask=batch["mask"])
    >>> batches = pe.pad_batches({"x": np.arange(5.0)}, 8, num_devices=1)
    >>> pe.masked_eval(step_fn, 2.0, batches, backend="jit",
    ...                mesh=jax.make_mesh((1,), ("batch",)))
    {'mean': 4.0, 'num_examples': 5}
  """
  _check_arguments(step_fn, batches, mask_key, mask_fn)
  runner = backends.make_backend(backend, axis_name, mesh, data_axes)
  check_choice("on_invalid", on_invalid, ON_INVALID)
  if not isinstance(outputs, bool):
    raise ValueError(f"outputs must be True or False; got {outputs!r}")
  _check_mask_fn(mask_fn, outputs, checkpoint_dir)
  total = _length(batches)  # before iterating
  saver = _saver(checkpoint_dir, checkpoint_every, outputs, runner, params, timeout)
  source = saver.skip(batches, mask_key)
  padding = _padding_fills(batches)
  feed = _step_feed(
    source, total, runner, backend, mask_key, steps_in_flight, timeout, saver, padding, mask_fn
  )
  host_rows = _HostRows(mask_key)  # read only where the packed step leaves the count to it
  inputs = (
    host_rows.counted(iter(feed)) if runner.counts_rows_on_host and mask_fn is None else iter(feed)
  )
  first = _first_input(inputs)
  row_mask = mask_key if mask_fn is None else mask_fn
  compiled = step_cache.cached_step(step_fn, runner, row_mask, outputs)
  host_params, params, placed = params, runner.place_params(params), runner.place_batch(first)
  empty = compiled.empty_state(params, placed.batch, _empty_state)
  stored = saver.verify(empty, first.batch, host_params, params, runner, feed.wait_final)
  if stored is not None:  # a finished checkpoint_dir asked the same question: its answer
    _check_example_counts(stored.metric, stored[NUM_EXAMPLES], on_invalid)
    _report_invalid(stored.metric, on_invalid)
    return stored
  packed = compiled.packed_for(empty) if saver.packable else None  # small, one process
  if packed is None:  # the state's tree (a small one placed once and not donated)
    packing, step = None, compiled.step_for(empty)
    state = saver.restore(empty, runner)
  else:  # one byte vector per shard (padded_eval.packing), placed once, not donated
    (packing, step), state = packed, runner.place_packed(packed[0])
  bar = _ProgressBar(total, row_mask) if progress else _NoProgressBar()
  bar.add(first.batch)
  rows = RowOutputs(runner.row_axes, mask_key, total) if outputs else NoOutputs()
  try:
    state = _run_steps(step, params, state, (first, placed), inputs, feed, runner, bar, rows, saver)
  except BaseException:
    saver.close(failed=True)  # a save in flight may wait on the failed step: bounded wait
    raise
  saver.close()
  state = runner.finalize(state, packing)  # the one reduction across devices (and processes)
  feed.wait_final(state)
  metric, count = runner.to_host(state, packing)
  bar.close()
  on_host = packing is not None and runner.counts_rows_on_host and mask_fn is None
  num_examples = host_rows.total if on_host else int(count.to_numpy())
  _check_example_counts(metric, num_examples, on_invalid)
  _report_invalid(metric, on_invalid)
  results = _results(metric, num_examples)
  saver.finish(results)
  return (results, rows.result()) if outputs else results


def _check_arguments(step_fn, batches, mask_key, mask_fn) -> None:
  """Raises ValueError naming ``step_fn``, ``batches`` or ``mask_key`` when it is not what the driver needs."""
  if not callable(step_fn):
    raise ValueError(
      f"step_fn must be a function (params, batch) -> Metric, e.g. lambda params, batch: "
      f'pe.metrics.Mean().batch_updates(values=..., mask=batch["mask"]); got {step_fn!r}'
    )
  iterable = isinstance(batches, cabc.Iterable) or hasattr(type(batches), "__getitem__")
  if isinstance(batches, cabc.Mapping) or not iterable:
    what = "a dict (one batch?)" if isinstance(batches, cabc.Mapping) else repr(batches)
    raise ValueError(
      f"batches must be an iterable of padded dict batches, e.g. pe.pad_batches(data, batch_size) or "
      f"[batch]; got {what}"
    )
  if mask_fn is None and (not isinstance(mask_key, str) or not mask_key):
    raise ValueError(
      f"mask_key must be a non-empty string, the batches' key of the bool [B] mask (default 'mask'), or "
      f"pass mask_fn=; got {mask_key!r}"
    )


def _check_mask_fn(mask_fn, outputs, checkpoint_dir) -> None:
  """Raises ValueError for a ``mask_fn`` that is not callable or comes with what it does not support."""
  if mask_fn is None:
    return
  if not callable(mask_fn):
    raise ValueError(
      f"mask_fn must be a function batch -> bool [rows, ...] or None; got {mask_fn!r}"
    )
  unsupported = [
    name
    for name, given in [
      ("outputs=True", outputs is True),
      ("checkpoint_dir", checkpoint_dir is not None),
      (f"{jax.process_count()} processes", jax.process_count() > 1),
    ]
    if given
  ]
  if unsupported:
    raise ValueError(
      f"mask_fn cannot be combined with {', '.join(unsupported)}; pass dict batches with a mask "
      "key instead (pe.pad_batches, mask_key=)"
    )


def _saver(checkpoint_dir, every, outputs, runner, params, timeout):
  """`padded_eval.checkpoint.Saver` for ``checkpoint_dir``, or one that saves nothing."""
  if checkpoint_dir is None:
    return checkpoint.NoSaver()
  if outputs:
    raise ValueError(
      "checkpoint_dir cannot be combined with outputs=True: the per-row outputs gathered so "
      "far are not saved; evaluate without outputs, or without checkpoint_dir"
    )
  return checkpoint.Saver.open(checkpoint_dir, every, runner, params, timeout)


def _run_steps(step, params, state, current, inputs, feed, runner, bar, rows, saver):
  """Dispatches one step per input of ``feed``; returns the carried state after the last.

  ``current`` is the first ``(host input, placed input)``. Input t+1 is placed on the
  devices while step t runs; after dispatching step t the loop waits on steps until
  fewer than ``feed.steps_in_flight`` are in flight, and on all of them after the last.
  Each step's per-row outputs start their copy to the host at dispatch and are
  collected (``rows``) right after the step is waited on. ``saver`` may start saving the
  state a step returned before the next step is dispatched (and donates it).
  """
  in_flight: collections.deque = collections.deque()  # (index, token, outputs) not waited for
  host, placed = current
  for index in itertools.count():
    state, token, per_row = step(params, state, placed)  # dispatch step t
    in_flight.append((index, token, rows.start(per_row, host.batch)))
    del per_row  # the pending copy holds what is needed
    saver.after_step(state, feed.batches_consumed)
    host = next(inputs, None)
    if host is not None:  # place input t+1 while step t runs
      placed = runner.place_batch(host)
      bar.add(host.batch)
    while in_flight and (host is None or len(in_flight) >= feed.steps_in_flight):
      waited, token, pending = in_flight.popleft()
      feed.wait(waited, token)
      rows.collect(pending)
      del pending  # its device arrays go now, not at the next collect
    if host is None:
      return state


def _padding_fills(batches) -> dict:
  """What the all-padding batches of the multi-host lockstep hold: the row ids of
  ``pe.pad_batches(..., index_key=...)`` are -1 on padding, as in every padded batch."""
  index_key = getattr(batches, "index_key", None)
  return {} if index_key is None else {index_key: -1}


def _step_feed(
  batches, length, runner, name, mask_key, steps_in_flight, timeout, saver, padding, mask_fn=None
):
  """The checked ``batches`` (an iterator, ``length`` of them if known) as step inputs, with
  the wait: one process, or several in lockstep (all-padding batches filled per ``padding``)."""
  settings = {  # must be equal on every process
    "backend": name,
    "axis_name": runner.data_axis,
    "data_axes": list(runner.data_axes),
    "mask_key": mask_key,
    "mesh": {str(k): int(v) for k, v in runner.mesh.shape.items()},
    "steps_in_flight": steps_in_flight,
    "padding": padding,
  }
  steps_in_flight = _steps_in_flight(steps_in_flight)
  if timeout is not None:
    distributed.check_timeout(timeout)
  return distributed.step_feed(
    _checked_batches(batches, mask_key, runner, mask_fn),
    length,
    mask_key=mask_key,
    settings=settings,
    num_shards=runner.num_shards,
    steps_in_flight=steps_in_flight,
    timeout=timeout,
    resume=saver.resume_at,
    pad_value=padding,
  )


class _HostRows:
  """The real rows of the batches a step consumes, counted on the host (exact int).

  Where the backend's packed step does not count them (``counts_rows_on_host``: under jit a
  count in the step is one more all-reduce per step), this is ``num_examples``.
  """

  def __init__(self, mask_key: str):
    self.mask_key, self.total = mask_key, 0

  def counted(self, inputs: cabc.Iterator) -> cabc.Iterator:
    """``inputs``, unchanged, each batch's mask counted as it passes."""
    for step_input in inputs:
      self.total += int(np.count_nonzero(step_input.batch[self.mask_key]))
      yield step_input


def _first_input(inputs: cabc.Iterator) -> backends.StepInput:
  first = next(inputs, None)
  if first is None:
    raise ValueError(
      "batches yielded no batch; masked_eval needs at least one (an all-padding batch "
      "is fine: pe.pad_batches(..., num_batches=1))"
    )
  return first


def _check_example_counts(metric: Metric, num_examples: int, on_invalid: str) -> None:
  """Raises or warns (per ``on_invalid``) if a metric counted more rows than were real.

  Each metric (each member of a collection) that can say reports the rows it counted
  (``Metric.example_report()``); more than ``num_examples`` means it counted padded
  rows, the sign of an update without ``mask=batch["mask"]``.
  """
  report = [] if on_invalid == "ignore" else metric.example_report()
  over = [(name, n) for name, n in report if n > num_examples]
  if not over:
    return
  counted = "; ".join(f"{name!r} counted {n} rows" for name, n in over)
  message = (
    f"masked_eval: {counted}, but the batches held {num_examples} real rows: padded rows "
    'were counted. Pass mask=batch["mask"] to every metric\'s update / batch_updates in '
    "step_fn"
  )
  if on_invalid == "raise":
    raise ValueError(f"{message} (on_invalid='warn' or 'ignore' skips this check)")
  warnings.warn(message, InvalidValuesWarning, stacklevel=3)


def _report_invalid(metric: Metric, on_invalid: str) -> None:
  """Raises or warns (per ``on_invalid``) if ``metric`` counted invalid values in real rows."""
  report = [] if on_invalid == "ignore" else metric.invalid_report()
  if not report:
    return
  counted = "; ".join(f"{name!r}: {count} x {kind!r}" for name, kind, count in report)
  message = f"masked_eval: the metrics counted invalid values in real rows: {counted}"
  if on_invalid == "raise":
    raise ValueError(
      f"{message}. Fix the inputs, or pass on_invalid='warn' to get the results with a "
      "warning (on_invalid='ignore' to get them silently)"
    )
  warnings.warn(message, InvalidValuesWarning, stacklevel=3)


def _steps_in_flight(steps_in_flight: int | None) -> int:
  if steps_in_flight is None:
    return 2
  if (
    isinstance(steps_in_flight, bool) or not isinstance(steps_in_flight, int) or steps_in_flight < 1
  ):
    raise ValueError(f"steps_in_flight must be an int >= 1; got {steps_in_flight!r}")
  return steps_in_flight


def _results(metric: Metric, num_examples: int) -> EvalResults:
  logs = dict(step_cache.metric_logs(metric))
  if NUM_EXAMPLES in logs:
    raise ValueError(
      f"the metric logs a value named {NUM_EXAMPLES!r}, which masked_eval reserves for "
      "the count of real rows; rename the metric (name=...)"
    )
  logs = jax.tree.map(_to_python, logs)
  logs[NUM_EXAMPLES] = num_examples
  return EvalResults(logs, metric)


def _to_python(value):
  """A scalar -> Python float; an array -> numpy array."""
  value = np.asarray(value)
  return float(value) if value.ndim == 0 else value


def _length(batches) -> int | None:
  try:
    return len(batches)
  except TypeError:
    return None


class _ProgressBar:
  """A tqdm bar over batches showing real examples per second (counted on the host)."""

  def __init__(self, total: int | None, mask_key: Any):
    import tqdm  # imported only when asked for

    self._bar = tqdm.tqdm(total=total, unit="batch", desc="masked_eval")
    self._mask_key = mask_key  # a key, or a mask_fn
    self._examples = 0
    self._start = time.perf_counter()

  def add(self, batch) -> None:
    mask = self._mask_key(batch) if callable(self._mask_key) else batch[self._mask_key]
    self._examples += int(np.count_nonzero(np.asarray(mask)))
    elapsed = max(time.perf_counter() - self._start, 1e-9)
    self._bar.set_postfix(
      examples=self._examples, ex_per_s=f"{self._examples / elapsed:.0f}", refresh=False
    )
    self._bar.update(1)

  def close(self) -> None:
    self._bar.close()


class _NoProgressBar:
  """``progress=False``: counts nothing."""

  def add(self, batch) -> None:
    del batch

  def close(self) -> None:
    pass

"""masked_eval: exact full-dataset evaluation with one compiled step, in a straight line.

The driver turns ``step_fn(params, batch) -> Metric`` (masked statistics of one padded batch)
into one compiled step ``(params, state, step input) -> (state merged with this batch, token)``
and runs it over the batches. Reading `masked_eval` top to bottom:

1. the settings are grouped and checked once (`padded_eval.eval._options.EvalOptions`);
2. the backend (`padded_eval.eval.backends`) says where the work runs;
3. a checkpoint directory may hold the finished result, or a state to resume from
   (`padded_eval.eval.checkpoint.Saver`);
4. the batches are checked (`padded_eval.data._batch_spec.checked_batches`) and fed, by one
   process or several in lockstep (`padded_eval.multihost.distributed.step_feed`);
5. the compiled step (cached: `padded_eval.eval.cache`) starts a `padded_eval.eval.run.CompiledRun`,
   which owns how the state is carried (packed, or a donated tree), the row count and the final
   reduce;
6. the loop dispatches one step per input, places input t+1 while step t runs, keeps at most
   ``steps_in_flight`` steps in flight, and calls its hooks (outputs, checkpoint, progress:
   `padded_eval.eval._hooks`);
7. the final metric is fetched once, its invalid values and row counts checked, and its logs
   computed (`EvalResults`).

``step_fn`` is traced once per call whatever the dataset length, and a second call with the
same shapes compiles and traces nothing.
"""

from __future__ import annotations

import collections
import collections.abc as cabc
import itertools
import operator
import sys
import warnings
from collections.abc import Callable
from typing import Any, Literal, overload

from jax.sharding import Mesh

from padded_eval.data._batch_spec import checked_batches
from padded_eval.data.padded import bucket_axes, padding_fills
from padded_eval.eval import backends, checkpoint, checks, model_modes
from padded_eval.eval import cache as cache_lib
from padded_eval.eval import run as run_lib
from padded_eval.eval._hooks import Dispatched, Hook, Outputs, Progress
from padded_eval.eval._options import EvalOptions
from padded_eval.eval.checks import NUM_EXAMPLES, InvalidValuesWarning, package_dir
from padded_eval.metrics.base import Metric
from padded_eval.multihost import distributed

__all__ = ["InvalidValuesWarning", "masked_eval"]


@overload
def masked_eval(
  step_fn: Callable[[Any, Any], Metric],
  params: Any,
  batches: cabc.Iterable,
  *,
  backend: str = "pmap",
  axis_name: str = "batch",
  mesh: Mesh | None = None,
  data_axes: str | tuple[str, ...] | None = None,
  progress: bool | None = None,
  mask_key: str | Callable[[Any], Any] = "mask",
  steps_in_flight: int | None = None,
  timeout: float | None = None,
  on_invalid: str = "raise",
  outputs: Literal[False] = False,
  checkpoint_dir: Any = None,
  checkpoint_every: int = 100,
  mask_fn: Callable[[Any], Any] | None = None,
) -> dict[str, Any]: ...


@overload
def masked_eval(
  step_fn: Callable[[Any, Any], Metric],
  params: Any,
  batches: cabc.Iterable,
  *,
  backend: str = "pmap",
  axis_name: str = "batch",
  mesh: Mesh | None = None,
  data_axes: str | tuple[str, ...] | None = None,
  progress: bool | None = None,
  mask_key: str | Callable[[Any], Any] = "mask",
  steps_in_flight: int | None = None,
  timeout: float | None = None,
  on_invalid: str = "raise",
  outputs: Literal[True],
  checkpoint_dir: Any = None,
  checkpoint_every: int = 100,
  mask_fn: Callable[[Any], Any] | None = None,
) -> tuple[dict[str, Any], Any]: ...


@overload
def masked_eval(
  step_fn: Callable[[Any, Any], Metric],
  params: Any,
  batches: cabc.Iterable,
  *,
  backend: str = "pmap",
  axis_name: str = "batch",
  mesh: Mesh | None = None,
  data_axes: str | tuple[str, ...] | None = None,
  progress: bool | None = None,
  mask_key: str | Callable[[Any], Any] = "mask",
  steps_in_flight: int | None = None,
  timeout: float | None = None,
  on_invalid: str = "raise",
  outputs: bool = False,
  checkpoint_dir: Any = None,
  checkpoint_every: int = 100,
  mask_fn: Callable[[Any], Any] | None = None,
) -> dict[str, Any] | tuple[dict[str, Any], Any]: ...


def masked_eval(
  step_fn: Callable[[Any, Any], Metric],
  params: Any,
  batches: cabc.Iterable,
  *,
  backend: str = "pmap",
  axis_name: str = "batch",
  mesh: Mesh | None = None,
  data_axes: str | tuple[str, ...] | None = None,
  progress: bool | None = None,
  mask_key: str | Callable[[Any], Any] = "mask",
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
      (already replicated ``jax.Array``s are not copied again). The copy made for a call is
      dropped when it returns: to place params once for many calls (a short evaluation run
      often, where the copy is most of a call's time), pass `padded_eval.place_params`'s
      result, which masked_eval takes as it is. An nnx model (or a pytree holding one) with a
      ``Dropout`` or ``BatchNorm`` in training mode (``model.eval()`` forgotten) gets a
      ``UserWarning`` naming the layers (`padded_eval.eval.model_modes`).
    batches: an iterable of dict batches whose every leaf is ``[B, ...]`` with the
      same ``B``, shapes and dtypes in every batch (but for the axes of ``pe.pad_batches``'
      length buckets), and ``batch[mask_key]`` bool
      ``[B]`` True for real rows (as ``pe.pad_batches`` yields); with ``mask_fn``,
      any pytrees (see ``mask_fn``). A batch's arrays must not change once it is yielded: JAX on
      CPU may read a numpy array in place until the step that reads it has run (``pad_batches``
      copies what a loader of its own yields, so such a loader may refill its buffers).
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
      axis (`padded_eval.data.sharding.data_axes`); e.g. the ``(data=1, fsdp=8, tensor=1)``
      mesh of flax's lm1b example splits rows 8 ways over ``("data", "fsdp")``.
    progress: show a tqdm progress bar (batches, and real examples per second), drawn by process 0
      only; its total is `len(batches)` or their length hint (a tf.data pipeline of known
      cardinality), and a resumed run starts it at the steps already run. None (the default):
      a bar when ``batches`` have neither length nor length hint (a generator, an
      ``itertools.cycle``, a filtered pipeline) and stderr is a terminal, so an evaluation whose
      end is unknown shows that it is reading; nothing otherwise (scripts, logs, tests).
      True: always; False: never.
    mask_key: which rows are real: the batch key of the bool ``[B]`` mask, or a function
      ``batch -> bool [rows, ...]`` (the same as ``mask_fn``).
    steps_in_flight: at most this many dispatched steps not yet finished (>= 1).
      The next batch is always copied to the devices while the current step runs.
      Default (None): on CPU devices 2 (step t-1 is waited for after step t is
      dispatched: unbounded queues of pmap steps thrash CPU devices that share
      cores); on an accelerator as many as keep 1 GiB of batches in flight (an
      eighth of the device memory at most), from 2 to 32, so that transfers
      overlap the steps as in a hand loop that never waits
      (`padded_eval.multihost.distributed.default_steps_in_flight`).
    timeout: several processes only: seconds to wait for the other processes (the
      pre-flight check, or one step) before raising; default
      ``padded_eval.multihost.distributed.DEFAULT_TIMEOUT_S`` (300). Must exceed the slowest
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
      with the params, shows the question: the same metric, batch spec, batch size,
      params by value, number of batches when both calls know it, and first batch's real
      rows by value, or a ValueError). See `padded_eval.eval.checkpoint`. Not with
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
    `padded_eval.eval.results.EvalResults` (a dict) whose ``.metric`` is the final metric on
    the host, for its exact host views and `padded_eval.plot` (the stored one for a
    result read back from a finished checkpoint).
    With ``outputs=True``, the pair ``(results, per_row)``: ``per_row`` has the
    structure ``step_fn`` returned, with numpy leaves of exactly this process's
    real rows (padding removed), in the order of its batches: ``[num_examples, ...]``
    with one process, bit for bit what the user's own ``jax.jit`` of ``step_fn`` computes for
    those rows. With several processes each process gets its own rows back
    (gather them with ids from ``pe.pad_batches(..., index_key=...)``; see HOWTO.md).

  Raises:
    ValueError: ``step_fn`` not callable; ``batches`` not an iterable of batches (None, or one dict batch);
      ``mask_key`` not a non-empty string (without ``mask_fn``); ``progress`` not a bool; an unknown backend;
      ``axis_name`` not a non-empty string; a mesh or ``data_axes``
      with ``"pmap"``; ``data_axes``
      naming axes the mesh does not have; no batches; a batch
      without ``mask_key`` or with a batch size not divisible by the devices (or
      the shards of the data axes); a batch whose shapes differ from the first (but for the
      length buckets of ``pe.pad_batches(..., pad_shapes=...)``: one compilation per bucket
      shape; refused with ``checkpoint_dir`` or several processes); a
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
  result (see `padded_eval.multihost.distributed`).

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
  _check_arguments(step_fn, batches)
  layers = model_modes.training_layers(params)
  if layers:
    warnings.warn(model_modes.training_message(layers), UserWarning, stacklevel=2)
  options = EvalOptions.checked(
    layout=(backend, axis_name, mesh, data_axes),
    mask=(mask_key, mask_fn),
    feeding=(steps_in_flight, timeout),
    reporting=(progress, on_invalid, outputs),
    checkpoint=(checkpoint_dir, checkpoint_every),
  )
  runner = backends.make_backend(*options.layout)
  num_batches = _length(batches)  # before iterating
  saver = _saver(options, runner, params, num_batches, _rows(batches))  # None without a directory
  feed = _step_feed(batches, num_batches, runner, options, saver)
  first = _first_input(feed)
  compiled = cache_lib.cached_step(step_fn, runner, options.mask, options.outputs)
  run = run_lib.start(compiled, params, first, saver, feed.wait_final)
  if run.stored is not None:  # a finished checkpoint_dir asked the same question: its answer
    return checks.checked(run.stored, run.stored[NUM_EXAMPLES], options.on_invalid)
  hooks = _hooks(options, run, batches, num_batches, saver)
  try:
    state = _run_steps(run, feed, first, hooks)
  except BaseException as error:  # a source or a step failed: its own error reaches the caller
    del run, hooks, compiled  # who keeps the error keeps this frame, not the devices' buffers
    _release_driver_frames(error.__traceback__)
    raise
  metric, num_examples = run.finish(state, feed.wait_final)
  results = checks.results(metric, num_examples, options.on_invalid)
  for hook in hooks:
    results = hook.finish(results)
  return results


def _saver(
  options: EvalOptions, runner: Any, params: Any, num_batches: int | None, num_rows: int | None
) -> checkpoint.Saver | None:
  """The `padded_eval.eval.checkpoint.Saver` of ``options.checkpoint_dir``, or None."""
  if options.checkpoint_dir is None:
    return None
  return checkpoint.Saver.open(
    options.checkpoint_dir,
    options.checkpoint_every,
    runner,
    params,
    options.timeout,
    num_batches,
    num_rows,
  )


def _check_arguments(step_fn, batches) -> None:
  """Raises ValueError naming ``step_fn`` or ``batches`` when it is not what the driver needs
  (``mask_key`` is checked by `padded_eval.eval.step.RowMask.of_call`)."""
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


def _step_feed(batches, num_batches, runner, options: EvalOptions, saver) -> Any:
  """The checked ``batches`` (after those a checkpoint consumed) as step inputs, with the wait:
  one process, or several in lockstep (all-padding batches filled per `padding_fills`)."""
  mask = options.mask
  padding = padding_fills(batches)
  settings = {  # must be equal on every process
    "backend": options.layout[0],
    "axis_name": runner.data_axis,
    "data_axes": list(runner.data_axes),
    "mask_key": mask.key,
    "mesh": {str(k): int(v) for k, v in runner.mesh.shape.items()},
    "steps_in_flight": options.steps_in_flight,
    "padding": padding,
  }
  varying = _bucket_axes(batches, options)
  source = iter(batches) if saver is None else saver.skip(batches, mask.key)
  checked = checked_batches(
    source, mask.key, runner.num_shards, runner.shards_in_words, mask.fn, varying
  )
  agreed = distributed.FeedOptions(mask.key, settings, runner.num_shards, options.timeout, padding)
  resume = None if saver is None else saver.resume_at
  devices = runner.mesh.devices.flat
  return distributed.step_feed(
    checked, num_batches, agreed, options.steps_in_flight, resume, devices
  )


def _bucket_axes(batches, options: EvalOptions) -> dict:
  """The axes whose sizes vary between ``batches`` (``pe.pad_batches``' length buckets: one compilation
  per bucket shape), refused where every process, or a resumed call, must see one shape."""
  varying = bucket_axes(batches)
  if not varying:
    return varying
  refused = "several processes" if distributed.several_processes() else None
  if options.checkpoint_dir is not None:
    refused = "checkpoint_dir"
  if refused is not None:
    raise ValueError(
      f"batches come from pe.pad_batches(..., pad_shapes=...) with length buckets (keys "
      f"{sorted('/'.join(map(str, path)) for path in varying)}), whose shapes vary from batch to batch; "
      f"with {refused} every batch must have one shape: give each bucketed axis one size "
      "(e.g. (60,) instead of ([16, 32, 60],))"
    )
  return varying


def _first_input(feed) -> distributed.StepInput:
  first = next(feed, None)
  if first is None:
    raise ValueError(
      "batches yielded no batch; masked_eval needs at least one (an all-padding batch "
      "is fine: pe.pad_batches(..., num_batches=1))"
    )
  return first


def _hooks(
  options: EvalOptions, run: run_lib.CompiledRun, batches, num_batches, saver
) -> list[Hook]:
  """The loop's hooks, in the order `Hook.finish` runs them (the saver stores the results
  before the outputs hook pairs them with the rows)."""
  hooks: list[Hook] = []
  total = num_batches if num_batches is not None else operator.length_hint(batches) or None
  if options.progress or (options.progress is None and total is None and _on_terminal()):
    initial = 0 if saver is None else saver.resume_at.steps
    hooks.append(Progress(total, options.mask, initial))
  if saver is not None:
    hooks.append(saver)
  if options.outputs:
    hooks.append(Outputs(run.row_axes, options.mask.key, num_batches))
  return hooks


def _on_terminal() -> bool:
  """Whether stderr (where tqdm draws) is a terminal: the automatic progress bar's condition."""
  try:
    return bool(sys.stderr.isatty())
  except (AttributeError, ValueError):  # no stderr, or a closed one
    return False


def _run_steps(run: run_lib.CompiledRun, feed, first, hooks: list[Hook]) -> Any:
  """Dispatches one step per input of ``feed`` (``first`` placed already); returns the carried
  state after the last.

  Input t+1 is placed on the devices while step t runs; after dispatching step t the loop waits
  on steps until fewer than ``feed.steps_in_flight`` are in flight, and on all of them after the
  last. A hook may save the state a step returned before the next step is dispatched (and
  donates it).
  """
  in_flight: collections.deque = collections.deque()  # (index, token) not waited for
  host, placed, state = first, run.first, run.initial_state
  logs = cache_lib.prepare_logs(run.empty[0])  # compiles on a worker thread while the step does
  try:
    for index in itertools.count():
      state, token, per_row = run.step(state, placed)  # dispatch step t
      in_flight.append((index, token))
      if hooks:
        step = Dispatched(index, state, per_row, host.batch, feed.batches_consumed)
        for hook in hooks:
          hook.dispatched(step)
        del step
      del per_row  # a pending copy holds what is needed
      host = next(feed, None)
      if host is not None:  # place input t+1 while step t runs
        placed = run.place(host)
      while in_flight and (host is None or len(in_flight) >= feed.steps_in_flight):
        waited, token = in_flight.popleft()
        feed.wait(waited, token)
        for hook in hooks:
          hook.waited(waited)
      if host is None:
        break
  except BaseException:
    for hook in hooks:
      hook.close(failed=True)  # a save in flight may wait on the failed step: bounded wait
    run.join_compiles(logs)  # no thread of the call outlives it
    raise
  for hook in hooks:
    hook.close(failed=False)
  return state


def _release_driver_frames(traceback: Any) -> None:
  """Clears the locals of the driver's own frames that ``traceback`` keeps and that have
  returned (`_run_steps`: the carried state, the placed batch; a step's arguments), so that an
  error kept by the caller (a notebook keeps ``sys.last_traceback``) holds no device buffer of
  the call. The caller's frames, the source's among them, are left as they are, for a debugger.
  """
  while traceback is not None:
    frame = traceback.tb_frame
    if frame.f_code.co_filename.startswith(package_dir):
      try:
        frame.clear()
      except RuntimeError:  # still running: masked_eval's own frame, cleared by its caller
        pass
    traceback = traceback.tb_next


def _rows(batches) -> int | None:
  """The real rows of ``batches`` when they know it without being read (`pad_batches`'s result
  over a source of known size), else None."""
  rows = getattr(batches, "num_rows", None)
  return rows if isinstance(rows, int) and not isinstance(rows, bool) else None


def _length(batches) -> int | None:
  try:
    return len(batches)
  except TypeError:
    return None

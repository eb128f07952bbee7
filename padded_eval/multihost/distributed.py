"""Multi-host agreement for `masked_eval`: equal steps on every process, errors instead of hangs.

Under JAX's multi-controller runtime (`jax.distributed`) every process runs the same compiled step, and each step
holds collectives (`psum`) that wait for all processes. A process that runs one step fewer, feeds a batch of another
shape, dies, or never arrives leaves the others waiting in that collective forever. `masked_eval` calls this module
so that none of this can happen:

1. **Pre-flight** (`padded_eval.multihost._agreement`). Before any collective, every process publishes the `BatchSpec` of
   its first batch, its number of batches when known, and the call's settings (backend, mask key, ...), with a
   fixed-size digest of them, and waits (at most `timeout` seconds) until all did. Process 0 compares the digests
   and publishes the verdict; a difference raises the same `ValueError`, naming the process and the leaf, on
   every process. A process without any batch learns the batch structure here and feeds all-padding batches.
   O(P) requests to the coordinator in total.
2. **Known lengths** (every process's batches have a ``len()``): every process runs ``max(len)`` steps, padding with
   all-padding batches (mask all False). No per-step cost.
3. **Unknown lengths** (a generator, a filtered ``tf.data`` pipeline): each step's input also carries a
   per-process flag, "I hold a real batch `Lockstep.LOOKAHEAD` steps after this one", which the step sums over
   all processes (one small psum: the only collective of a pmap/shard_map step with several processes). The sum
   is read back with the step's token (which `masked_eval` waits for anyway, one step late), and the first step
   whose sum is 0 fixes the end for everyone. Processes out of data feed all-padding batches until then; with
   the lookahead the last step is the last real one (but at least `Lockstep.LOOKAHEAD` steps run). All of this
   lives in `Lockstep`, a wrapper around the batch iterator and the wait: the driver's loop is the same for one
   process (`OneProcess`) and several.
4. **Deadlines.** Waiting on a step's result polls ``is_ready()`` with a deadline instead of blocking, so a step
   stuck in a collective because a peer hangs raises `TimeoutError` after `timeout` seconds; a collective broken
   because a peer died (gloo reports the closed connection at once) raises `RuntimeError` naming the step. So
   that no dispatch can block on a peer, one step is kept in flight (`MULTIHOST_STEPS_IN_FLIGHT`).
5. **Failures before the first step** (bad local data) are published in the pre-flight: the other processes raise
   `RuntimeError` at once instead of waiting for the timeout.

Usage (every process runs the same program; each reads only its share of the data)::

  jax.distributed.initialize(coordinator_address, num_processes, process_id)
  split = tfds.split_for_jax_process("test")           # tfds: this process's even share, e.g. 1667 or 1666 rows
  batches = pe.pad_batches(tfds.load("mnist", split=split), batch_size)
  # numpy: pe.pad_batches({k: v[pe.process_slice(len(labels))] for k, v in data.items()}, batch_size)
  results = pe.masked_eval(step_fn, params, batches, timeout=600)   # the same, global, result on every process

What `jax.distributed` itself does when a peer dies (measured with jax 0.10.2, CPU/gloo): the coordination service
notices a missing process only after ``heartbeat_timeout_seconds`` (default 100 s) and then aborts every remaining
process ("Terminating process because the JAX distributed service detected fatal errors"). Until then a survivor can
run, but cannot shut down cleanly: `jax.distributed.shutdown` (also run at interpreter exit) waits for the dead peer
and aborts after that heartbeat timeout. After the errors raised here, report and exit (e.g. ``os._exit(1)``), or
pass a smaller ``heartbeat_timeout_seconds`` to `jax.distributed.initialize`. Also note that the preemption service
(on by default) catches SIGTERM: stop stuck processes with SIGKILL, or set ``jax_enable_preemption_service=False``.
"""

from __future__ import annotations

import collections
import itertools
import time
from collections.abc import Iterator
from typing import Any, NamedTuple

import jax
import numpy as np

from padded_eval.data.sharding import local_blocks
from padded_eval.multihost._agreement import agree, record
from padded_eval.multihost._coordination import first_line
from padded_eval.validation import check_int

__all__ = [
  "DEFAULT_TIMEOUT_S",
  "FeedOptions",
  "StepInput",
  "Lockstep",
  "OneProcess",
  "ResumeAt",
  "lockstep",
  "next_call_number",
  "process_slice",
  "several_processes",
  "step_feed",
]

DEFAULT_TIMEOUT_S = 300.0
"""Seconds a process waits for the others (pre-flight, or one step) when `masked_eval` gets ``timeout=None``."""

MULTIHOST_STEPS_IN_FLIGHT = 1
"""Steps `masked_eval` keeps in flight with several processes. With 2, dispatching step t+1 itself blocked (jit
backend, CPU/gloo, jax 0.10.2) while step t waited in a collective for a stuck peer, out of reach of any deadline;
with 1, every wait on a peer is a deadline-bounded wait on a finished dispatch."""

_call_numbers = itertools.count()
_POLL_FIRST_S, _POLL_MAX_S = 2e-5, 1e-3


def several_processes() -> bool:
  """Whether this evaluation spans several processes (``jax.distributed``): the one place the
  driver reads the process count. Every branch between one process and several (the feed, the
  placement of a batch or a saved state, the pmap program, the checkpoint's agreement) asks
  here; everything else runs the same code for any process count."""
  return jax.process_count() > 1


def process_slice(
  num_examples: int, *, process_index: int | None = None, process_count: int | None = None
) -> slice:
  """The rows of a dataset of `num_examples` that this process evaluates (even, contiguous shares).

  The split matches ``tfds.split_for_jax_process`` (``tfds.even_splits``): the first ``num_examples % count``
  processes get one row more. With `pad_batches` and `masked_eval`, the union of all shares is evaluated exactly
  once, whatever the remainder.

  Args:
    num_examples: rows in the whole dataset (>= 0).
    process_index: this process; default ``jax.process_index()``.
    process_count: number of processes; default ``jax.process_count()``.

  Returns:
    A ``slice`` of the rows, e.g. ``data["x"][process_slice(len(data["x"]))]``.

  Raises:
    ValueError: a negative `num_examples`, or `process_index` outside ``[0, process_count)``.

  Examples:
    >>> [process_slice(5, process_index=i, process_count=2) for i in range(2)]
    [slice(0, 3, None), slice(3, 5, None)]
  """
  if process_index is None:
    process_index = jax.process_index()
  if process_count is None:
    process_count = jax.process_count()
  num_examples = check_int("num_examples", num_examples, minimum=0)
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index must be in [0, {process_count}); got {process_index}")
  share, extra = divmod(int(num_examples), process_count)
  start = process_index * share + min(process_index, extra)
  return slice(start, start + share + (process_index < extra))


# --- step feeds: the batch iterator and the wait, per process count -------------------------


class StepInput(NamedTuple):
  """What one compiled step consumes, besides params and state (a pytree, placed as one).

  Attributes:
    batch: the padded batch, a dict of arrays ``[B, ...]`` with a bool mask ``[B]``.
    sync: small int32 arrays ``[shards]`` that the step sums over every shard of every
      process, returned in its token (the multi-host has-data flag); ``()`` for none,
      which adds no collective.
  """

  batch: Any
  sync: tuple = ()


class FeedOptions(NamedTuple):
  """What the processes must agree on before the first step, and how they wait.

  Attributes:
    mask_key: the batch key of the mask.
    settings: JSON-able call settings that must be equal on every process (backend, ...).
    num_shards: this process's shards of the data axis (the size of the has-data flag).
    timeout: seconds to wait for the other processes; None: `DEFAULT_TIMEOUT_S`.
    pad_value: what the all-padding batches hold (``BatchSpec.padding_batch``); e.g. -1
      for the row ids of ``pe.pad_batches(..., index_key=...)``.
  """

  mask_key: str | None
  settings: dict
  num_shards: int
  timeout: float | None = None
  pad_value: Any = 0


def step_feed(
  batches: Iterator,
  length: int | None,
  options: FeedOptions,
  steps_in_flight: int | None,
  resume: ResumeAt | None = None,
  devices: Any = (),
) -> OneProcess | Lockstep:
  """The inputs of `masked_eval`'s steps and the wait on them: a `OneProcess`, or a `Lockstep`.

  Both are iterators of `StepInput` (step 0's first) with ``wait(step, token)``,
  ``wait_final(state)`` and ``steps_in_flight``: after dispatching step ``t`` and fetching
  input ``t + 1``, the driver waits on steps until fewer than ``steps_in_flight`` are in
  flight. Arguments as `lockstep`; ``steps_in_flight`` is the caller's bound with one process
  (None: `default_steps_in_flight` for ``devices``, the devices a batch is split over).
  Both count the real batches they yielded (``batches_consumed``), from ``resume`` if given.
  """
  resume = resume or ResumeAt()
  if not several_processes():
    return OneProcess(batches, steps_in_flight, resume.batches, devices)
  return lockstep(batches, length, options, resume)


class ResumeAt(NamedTuple):
  """Where a resumed `masked_eval` starts (see `padded_eval.eval.checkpoint`).

  Attributes:
    steps: steps already run (the same on every process).
    batches: real batches of this process's source already consumed (those batches are
      skipped by the caller: the iterator given to `step_feed` starts after them).
    spec: `BatchSpec.to_json()` of the saved batches, for all-padding steps when no process
      has a batch left; None when not resuming.
  """

  steps: int = 0
  batches: int = 0
  spec: dict | None = None


CPU_STEPS_IN_FLIGHT = 2
"""Steps in flight on CPU devices by default: step t-1 is waited for after step t is dispatched
(unbounded queues of pmap steps thrash CPU devices that share cores, and several programs with
collectives in flight can abort XLA's CPU rendezvous)."""

AHEAD_BYTES = 1 << 30
"""On an accelerator, the default bound keeps at most this many bytes of placed batches in flight
(and at most an eighth of the device's memory, where it reports it)."""

MAX_STEPS_IN_FLIGHT = 32


def default_steps_in_flight(batch: Any, devices: Any) -> int:
  """The bound on dispatched, unfinished steps when `masked_eval` gets ``steps_in_flight=None``.

  On CPU devices, `CPU_STEPS_IN_FLIGHT`. On an accelerator, the hand loop waits on nothing until
  its last fetch, and a wait on step t-1 costs the transfer's overlap (TPU v5e, a 12.6 MB batch:
  2.2x the hand loop with it, 0.92x without; benchmarks/RESULTS.md): as many steps as keep
  `AHEAD_BYTES` of batches (an eighth of the device's memory at most) in flight, at least 2, at
  most `MAX_STEPS_IN_FLIGHT`.

  Args:
    batch: one host batch (a pytree of arrays), the size of every batch.
    devices: the devices the batch is split over.
  """
  devices = list(devices)
  if not devices or all(device.platform == "cpu" for device in devices):
    return CPU_STEPS_IN_FLIGHT
  budget = AHEAD_BYTES
  try:
    limit = (devices[0].memory_stats() or {}).get("bytes_limit")
  except Exception:  # noqa: BLE001 - a backend without memory statistics
    limit = None
  if limit:
    budget = min(budget, int(limit) * len(devices) // 8)
  size = sum(int(np.asarray(leaf).nbytes) for leaf in jax.tree.leaves(batch)) or 1
  return max(CPU_STEPS_IN_FLIGHT, min(MAX_STEPS_IN_FLIGHT, budget // size))


class OneProcess:
  """One process: every batch is a step; waiting is blocking on the step's token.

  Attributes:
    steps_in_flight: the bound the driver keeps on dispatched, unfinished steps (with None
      given: `default_steps_in_flight` of the first batch, set when it is read).
  """

  def __init__(
    self, batches: Iterator, steps_in_flight: int | None, batches_consumed: int = 0, devices=()
  ):
    self._batches, self._devices = batches, devices
    self.steps_in_flight = steps_in_flight
    self.batches_consumed = batches_consumed  # real batches yielded (resumed runs: and before)

  def __iter__(self) -> OneProcess:
    return self

  def __next__(self) -> StepInput:
    batch = next(self._batches)
    self.batches_consumed += 1
    if self.steps_in_flight is None:
      self.steps_in_flight = default_steps_in_flight(batch, self._devices)
    return StepInput(batch)

  def wait(self, step: int, token: Any) -> None:
    """Blocks until step ``step`` (whose token is ``token``) has finished."""
    del step
    jax.block_until_ready(token)

  def wait_final(self, state: Any) -> None:
    """Nothing: fetching the final state blocks anyway."""
    del state


def lockstep(
  batches: Iterator, length: int | None, options: FeedOptions, resume: ResumeAt | None = None
) -> Lockstep:
  """Agrees with the other processes on batch structure and step count (several processes).

  Args:
    batches: an iterator over this process's checked batches. If reading the first one
      raises, the failure is published in the pre-flight exchange, so the other processes
      raise at once instead of waiting.
    length: its number of batches if known (``len(batches)``), else None.
    options: the mask key, the settings every process must share, this process's shards, the
      timeout and the padding value (`FeedOptions`).
    resume: a resumed run's start: step numbers continue from ``resume.steps`` (``length``
      still counts every batch, the consumed ones included).

  Returns:
    A `Lockstep`: iterating yields the `StepInput` of steps 0, 1, ... until the agreed end
    (all-padding batches on a process out of data).

  Raises:
    ValueError: the processes' batches or settings differ (the same message on every process), or no process
      has any batch.
    RuntimeError: another process failed before its first step (this one re-raises its own failure).
    TimeoutError: a process did not arrive within `timeout` seconds, or process 0 (which
      checks the pre-flight, `padded_eval.multihost._agreement`) did not publish its verdict within another `timeout`.
  """
  timeout = DEFAULT_TIMEOUT_S if options.timeout is None else check_timeout(options.timeout)
  mask_key = options.mask_key
  try:
    first, failure = next(batches, None), None
  except Exception as err:  # reported to the others first, then re-raised here
    first, failure = None, err
  failed = None if failure is None else f"{type(failure).__name__}: {first_line(failure)}"
  mine = record(first, mask_key, length, options.settings, failed)
  resume = resume or ResumeAt()
  agreed = agree(mine, f"{next_call_number()}/preflight", timeout, mask_key, resume.spec)
  if failure is not None:
    raise failure
  assert agreed is not None  # agree answers every process whose first batch was read
  spec, num_steps = agreed
  source = iter(()) if first is None else itertools.chain([first], batches)
  padding = spec.padding_batch(options.pad_value)
  lockstep = Lockstep(source, padding, num_steps, options.num_shards, timeout)
  lockstep.start_at(resume)
  return lockstep


def check_timeout(timeout) -> float:
  """Returns `timeout` as a float; ValueError unless a positive number of seconds."""
  if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
    raise ValueError(
      f"timeout must be a positive number of seconds (or None for "
      f"padded_eval.multihost.distributed.DEFAULT_TIMEOUT_S={DEFAULT_TIMEOUT_S:g}); got {timeout!r}"
    )
  return float(timeout)


def next_call_number() -> int:
  """Numbers this process's multi-process `masked_eval` calls 0, 1, ... (the pre-flight's key).

  Every process calls `masked_eval` in the same order, so equal numbers match across processes. A process that
  skips a call (a test of a process that never arrives) takes one number to stay aligned with the others.
  """
  return next(_call_numbers)


class Lockstep:
  """This process's step inputs, cut or padded so that every process runs the same steps.

  With known lengths it yields the agreed number of steps. Otherwise each `StepInput`
  carries a has-data flag in ``sync``, "this process holds a real batch `LOOKAHEAD` steps
  after this one", which the step sums over all processes; `wait` reads the sum back, and
  the first step whose sum is 0 fixes the end for every process. Processes out of data
  yield all-padding batches until then.

  Attributes:
    steps_in_flight: `MULTIHOST_STEPS_IN_FLIGHT`: the driver waits on step ``t`` right
      after fetching input ``t + 1``.
    LOOKAHEAD: steps between a step and the one its flag speaks for. When the driver reads
      step ``t``'s sum it has fetched ``steps_in_flight`` inputs past ``t``; the next
      fetch, input ``t + LOOKAHEAD``, is the first it may refuse.
    timeout: seconds any wait on the other processes may take.
  """

  steps_in_flight = MULTIHOST_STEPS_IN_FLIGHT
  LOOKAHEAD = MULTIHOST_STEPS_IN_FLIGHT + 1

  def __init__(
    self, source: Iterator, padding: Any, num_steps: int | None, num_shards: int, timeout: float
  ):
    """See `lockstep`; ``num_steps`` is the agreed end when known, else None (flagged)."""
    self._source = source
    self._padding = padding
    self._buffer: collections.deque = collections.deque()  # real batches read ahead
    self._exhausted = False
    self._num_steps = num_steps
    self._flagged = num_steps is None
    self._num_shards = num_shards
    self._yielded = 0
    self.batches_consumed = 0  # real batches yielded (resumed runs: and before)
    self.timeout = timeout

  def start_at(self, resume: ResumeAt) -> None:
    """Numbers steps from ``resume.steps`` on (the source already starts after the consumed batches)."""
    self._yielded = resume.steps
    self.batches_consumed = resume.batches

  def __iter__(self) -> Lockstep:
    return self

  def __next__(self) -> StepInput:
    if self._num_steps is not None and self._yielded >= self._num_steps:
      self._check_drained()
      raise StopIteration
    self._yielded += 1
    if not self._flagged:
      self._read_until(1)
      return StepInput(self._next_batch())
    self._read_until(1 + self.LOOKAHEAD)
    batch = self._next_batch()
    has_data = int(len(self._buffer) >= self.LOOKAHEAD)  # a real batch LOOKAHEAD steps on
    return StepInput(batch, (np.full(self._num_shards, has_data, np.int32),))

  def _next_batch(self) -> Any:
    if not self._buffer:
      return self._padding
    self.batches_consumed += 1
    return self._buffer.popleft()

  def _read_until(self, count: int) -> None:
    while len(self._buffer) < count and not self._exhausted:
      batch = next(self._source, None)
      if batch is None:
        self._exhausted = True
      else:
        self._buffer.append(batch)

  def _check_drained(self) -> None:
    if self._buffer or next(self._source, None) is not None:
      raise ValueError(
        f"process {jax.process_index()}: batches yielded more batches than their len() "
        f"said; they were cut at {self._num_steps} steps"
      )

  def wait(self, step: int, token: Any) -> None:
    """Waits for step ``step`` with a deadline; with a flag, reads its sum and maybe fixes the end.

    Args:
      step: the step's index.
      token: the step's ``(rows_so_far, sync_totals)`` (see `padded_eval.eval.backends.CompiledStep`).

    Raises:
      TimeoutError: not ready after `timeout` seconds (a peer hangs, or is much slower).
      RuntimeError: the step failed, e.g. a collective broke because a peer process died.
    """
    self._wait_ready(step, token)
    if self._flagged and self._num_steps is None:
      _, (live,) = token
      if int(np.ravel(jax.device_get(_local_part(live)))[0]) == 0:
        self._num_steps = step + self.LOOKAHEAD

  def wait_final(self, state: Any) -> None:
    """Waits, with the same deadline, for the final reduce of ``state`` across processes."""
    self._wait_ready(self._yielded, state)

  def _wait_ready(self, step: int, result: Any) -> None:
    deadline = time.monotonic() + self.timeout
    arrays = [x for x in jax.tree.leaves(result) if isinstance(x, jax.Array)]
    pause = _POLL_FIRST_S
    try:
      while not all(x.is_ready() for x in arrays):  # pyrefly: ignore[missing-attribute]  # not in jax.Array's stub
        if time.monotonic() > deadline:
          raise TimeoutError(
            f"masked_eval step {step} on process {jax.process_index()} of {jax.process_count()} did not "
            f"finish within {self.timeout:g} s: another process is stuck, died without closing its "
            "connections, or is far slower (data loading, compilation). Raise timeout= if it is only slow"
          )
        time.sleep(pause)
        pause = min(2 * pause, _POLL_MAX_S)
      jax.block_until_ready(result)  # raises a failed step's error
    except jax.errors.JaxRuntimeError as err:
      raise RuntimeError(
        f"masked_eval step {step} failed on process {jax.process_index()} of {jax.process_count()}: "
        f"{first_line(err)}. A collective across processes broke, most likely because another process "
        "died. jax.distributed cannot shut down cleanly after this: exit the process (jax aborts it "
        "after heartbeat_timeout_seconds)"
      ) from err


def _local_part(x):
  """A global array spanning processes -> its first block of this process's rows (host-readable)."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return local_blocks(x)[0]
  return x

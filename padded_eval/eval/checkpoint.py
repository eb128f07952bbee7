"""Resumable `masked_eval`: the carried state saved atomically every few steps, restored exactly.

A checkpoint directory identifies ONE evaluation (one model checkpoint on one dataset). It holds, per process,
``process_{p}/step_{n}.state``: this process's part of the carried state (every device's partial state, and the exact
row count) after ``n`` steps, with a JSON header: the steps and this process's real batches consumed (the multi-host
lockstep's position) and a fingerprint of the evaluation (process count, backend layout, params structure, the
params' values (`params_checksum`), the number of batches when known, batch spec, the first batch's real rows
(`batch_checksum`), metric state structure). A finished evaluation writes
``process_{p}/result.state`` instead: the fingerprint, the result's values and the final (reduced) metric's leaves,
returned by a later call only if it asks the same question (the whole fingerprint matches).

Writes are atomic: a file is written under a temporary name, flushed to disk and renamed (``os.replace``), so a
process killed during a write leaves a ``.tmp`` file that is never read (and deleted on the next save). Writes run
in a background thread, at most one in flight; the state is first copied on the devices (one small dispatched
copy, because the original is donated to the next step), so neither the devices nor the driver wait for the
transfer or the disk. With one process a save that falls due while the previous write still runs is deferred to
the first step after it (older step files are deleted after each write); with several processes every process
saves the same steps (waiting for its previous write if need be) and keeps its step files until the evaluation
finishes, so that a step every process saved always exists. A finished evaluation deletes its step files.

Why not orbax-checkpoint (measured on this project's CPU machine, orbax 0.12.8): ``StandardCheckpointer`` took
58 ms per save of a small state (a directory of tensorstore files) against 0.56 ms for one file written,
fsynced and renamed, and 0.6 s to import; and in a multi-process run orbax treats host arrays as replicated and
joins every save with a barrier through the coordination service, without the deadlines `masked_eval` keeps on
every wait. Here each process saves its own part, and processes agree on the step to resume from in the
pre-flight (`padded_eval.multihost._coordination.exchange`).
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import json
import os
import re
import threading
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from padded_eval.data._batch_spec import BatchSpec
from padded_eval.data.padded import skipped
from padded_eval.eval._hooks import Dispatched, Hook
from padded_eval.eval.results import EvalResults
from padded_eval.multihost._coordination import exchange
from padded_eval.multihost.distributed import DEFAULT_TIMEOUT_S, ResumeAt, next_call_number
from padded_eval.validation import check_positive_int

__all__ = [
  "CheckpointDir",
  "batch_checksum",
  "Restored",
  "Saver",
  "fingerprint",
  "read_state_file",
  "tree_fingerprint",
  "write_state_file",
]

_STEP_FILE = re.compile(r"^step_(\d{10})\.state$")
_MAGIC = b"padded_eval state 1\n"
_RESULT = (
  "result.state"  # (directories finished before the stored metric wrote result.json: not read)
)
FINGERPRINT_NAMES = {
  "process_count": "the process count",
  "backend": "the backend layout",
  "params": "the params structure",
  "params_checksum": "the params checksum (the params' values: another model checkpoint?)",
  "num_batches": "the number of batches (another dataset, or more or fewer rows?)",
  "num_rows": "the number of real rows (another dataset, or more or fewer rows?)",
  "batch_size": "the batch size",
  "batch": "the batch structure",
  "first_batch": "the first batch (its real rows' values: another dataset, or a pipeline that shuffles?)",
  "metric": "the metric",
}


def tree_fingerprint(tree: Any) -> dict:
  """The structure of a pytree as JSON: its treedef and its leaves' shapes and dtypes."""
  leaves, treedef = jax.tree.flatten(tree)
  return {
    "tree": str(treedef),
    "leaves": [[list(np.shape(x)), _dtype_name(x)] for x in leaves],
  }


def fingerprint(
  *,
  backend: dict,
  params: Any,
  batch_spec: dict | None,
  state_shapes: Any | None,
  checksum: str | None = None,
  num_batches: int | None = None,
  first_batch: str | None = None,
  num_rows: int | None = None,
) -> dict:
  """What a checkpoint must match to be resumed: a JSON dict of the evaluation.

  Two directories' fingerprints are compared on the parts both have (`CheckpointDir.check`).

  Args:
    backend: the backend's name and layout (mesh shape, data axis, shards).
    params: the params pytree (only its structure is kept).
    batch_spec: `BatchSpec.to_json()` of the first batch, or None when not read yet.
    state_shapes: the metric state's ``ShapeDtypeStruct`` pytree, or None when not traced.
    checksum: `params_checksum` of the placed params, or None when not computed yet.
    num_batches: ``len(batches)``, or None when the batches do not know it.
    first_batch: `batch_checksum` of the first batch (batch 0), or None when it is not read.
    num_rows: the real rows of the batches (``pad_batches(...).num_rows``), or None when unknown.
  """
  found = {
    "process_count": jax.process_count(),
    "backend": backend,
    "params": tree_fingerprint(params),
  }
  if checksum is not None:
    found["params_checksum"] = checksum
  if num_batches is not None:
    found["num_batches"] = num_batches
  if num_rows is not None:
    found["num_rows"] = num_rows
  if batch_spec is not None:
    found["batch_size"] = batch_spec["batch_size"]
    found["batch"] = batch_spec
  if first_batch is not None:
    found["first_batch"] = first_batch
  if state_shapes is not None:
    found["metric"] = tree_fingerprint(state_shapes)
  return found


def batch_checksum(batch: Any, mask_key: str) -> str:
  """A checksum of a host batch's real rows (``batch[mask_key]`` True): every leaf's path, dtype and
  the bytes of its real rows (strings and other objects by their ``repr``), and the mask. Padding
  rows are left out: their fill (``pad_value``) does not change the question.

  Args:
    batch: a dict batch of host arrays ``[B, ...]`` with the bool ``[B]`` mask at ``mask_key``.
    mask_key: the mask's key.

  Returns:
    32 hex digits (BLAKE2b).
  """
  mask = np.asarray(batch[mask_key], bool)
  digest = hashlib.blake2b(mask.tobytes(), digest_size=16)
  for path, leaf in jax.tree_util.tree_leaves_with_path(batch):
    rows = np.asarray(leaf)[mask]
    digest.update(f"{jax.tree_util.keystr(path)} {rows.dtype.str} {rows.shape}".encode())
    if rows.dtype.kind == "O":
      digest.update(repr(rows.tolist()).encode())
    else:
      digest.update(np.ascontiguousarray(rows).tobytes())
  return digest.hexdigest()


def _dtype_name(leaf: Any) -> str:
  dtype = getattr(leaf, "dtype", None)
  return np.dtype(dtype).str if dtype is not None else type(leaf).__name__


# --- the params' values: a checksum of their bits, computed where they lie ----------------------

_GOLDEN = 0x9E3779B9  # 2**32 / golden ratio: spreads consecutive positions over the words


def params_checksum(params: Any, wait: Any = None) -> str:
  """A checksum of every bit of ``params``, computed on the devices: 16 hex digits.

  Every leaf is read as 32-bit words (1-, 2- and 4-byte elements one word each, zero-extended;
  8-byte elements two; complex ones their real and imaginary parts). Word ``i`` of the tree (leaves
  in ``jax.tree.leaves`` order, elements in row-major order) adds ``m_i = fmix32(w_i ^ (i *
  0x9E3779B9 mod 2**32))`` (murmur3's finaliser, a bijection of 32-bit words) to two sums mod
  2**32: ``sum m_i`` and ``sum m_i * (2 i + 1)``. Changing any one word changes the first sum;
  a permutation of words or of leaves moves words to other positions, which changes both sums
  except by a ~2**-64 accident. The value does not depend on where the leaves lie: a fully
  replicated leaf is read on one device holding it (and summed by halves, `_sum_by_halves`), a
  sharded one where its shards are (XLA adds the partial sums across devices and processes).
  One jitted program per leaf shape,
  dtype and sharding (its position is an argument), so leaves of one shape share a
  compilation (measured: benchmarks/RESULTS.md).

  Args:
    params: a pytree of ``jax.Array`` leaves (other leaves are put on the default device).
    wait: ``wait(sums)`` blocks until the programs finished (a deadline of several processes),
      or None.

  Returns:
    ``"%08x%08x"`` of the two sums.
  """
  sums, offset = [], 0
  for leaf in jax.tree.leaves(params):
    leaf = leaf if isinstance(leaf, jax.Array) else jnp.asarray(leaf)
    if leaf.is_fully_replicated:
      leaf = leaf.addressable_shards[0].data  # one copy, no transfer
    one_device = len(leaf.sharding.device_set) == 1
    sums.append(_leaf_sums(leaf, np.uint32(offset), one_device))
    offset = (offset + leaf.size * max(1, leaf.dtype.itemsize // 4)) % 2**32
  if wait is not None:
    wait(sums)
  total = np.zeros(2, np.uint64)
  for part in jax.device_get([part.addressable_shards[0].data for part in sums]):
    total += part
  first, second = (int(x) % 2**32 for x in total)
  return f"{first:08x}{second:08x}"


@functools.partial(jax.jit, static_argnums=2)
def _leaf_sums(leaf: jax.Array, offset: jax.Array, one_device: bool) -> jax.Array:
  """``uint32 [2]``: the two sums of `params_checksum` over ``leaf``, its first word at ``offset``."""
  words = _words(leaf)
  index = jnp.broadcast_to(offset, words.shape)
  stride = 1
  for axis in reversed(range(words.ndim)):
    position = jax.lax.broadcasted_iota(jnp.uint32, words.shape, axis)
    index = index + position * jnp.uint32(stride % 2**32)
    stride *= words.shape[axis]
  mixed = _fmix32(words ^ (index * jnp.uint32(_GOLDEN)))
  lanes = (mixed, mixed * (index * jnp.uint32(2) + jnp.uint32(1)))
  if one_device:
    return jnp.stack([_sum_by_halves(lane) for lane in lanes])
  return jnp.stack([jnp.sum(lane, dtype=jnp.uint32) for lane in lanes])  # XLA: partial sums


def _sum_by_halves(x: jax.Array) -> jax.Array:
  """The sum of uint32 ``x`` (mod 2**32) by adding halves, then their halves, along each axis.

  Elementwise adds instead of one integer reduction, which XLA's CPU backend does not
  vectorise: about 8x faster there on a 2048 x 2048 leaf.
  """
  for axis in range(x.ndim):
    while x.shape[axis] > 1:
      size = x.shape[axis]
      half = size // 2
      summed = jax.lax.slice_in_dim(x, 0, half, axis=axis) + jax.lax.slice_in_dim(
        x, half, 2 * half, axis=axis
      )
      if size % 2:  # the odd last slice joins the first
        first = jax.lax.slice_in_dim(summed, 0, 1, axis=axis)
        first = first + jax.lax.slice_in_dim(x, size - 1, size, axis=axis)
        summed = jax.lax.concatenate(
          [first, jax.lax.slice_in_dim(summed, 1, half, axis=axis)], axis
        )
      x = summed
  return x.reshape(())


def _words(leaf: jax.Array) -> jax.Array:
  """The bits of ``leaf`` as uint32 words: ``leaf.shape`` (+ ``[2]`` for 8-byte elements)."""
  if jnp.issubdtype(leaf.dtype, jnp.complexfloating):
    leaf = jnp.stack([jnp.real(leaf), jnp.imag(leaf)], axis=-1)
  if leaf.dtype == jnp.bool_:
    return leaf.astype(jnp.uint32)
  if jnp.issubdtype(leaf.dtype, jnp.integer) and jnp.iinfo(leaf.dtype).bits < 8:
    leaf = leaf.astype(jnp.int8)  # int4 / uint4: exact
  size = leaf.dtype.itemsize
  if size >= 4:
    return jax.lax.bitcast_convert_type(leaf, jnp.uint32)  # 8 bytes: a trailing [2]
  unsigned = jnp.uint16 if size == 2 else jnp.uint8
  return jax.lax.bitcast_convert_type(leaf, unsigned).astype(jnp.uint32)


def _fmix32(x: jax.Array) -> jax.Array:
  """murmur3's 32-bit finaliser: a bijection whose every output bit depends on every input bit."""
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x85EBCA6B)
  x = x ^ (x >> 13)
  x = x * jnp.uint32(0xC2B2AE35)
  return x ^ (x >> 16)


class Restored:
  """A checkpoint read back: where to resume and this process's state leaves.

  Attributes:
    steps: steps merged into the state (every process's the same).
    batches: real batches of this process's source merged into the state (<= steps).
    fingerprint: the saved fingerprint.
    leaves: this process's state leaves (numpy), in ``jax.tree.leaves`` order.
  """

  def __init__(self, header: dict, leaves: list[np.ndarray]):
    self.steps = int(header["steps"])
    self.batches = int(header["batches"])
    self.fingerprint = header["fingerprint"]
    self.leaves = leaves


class CheckpointDir:
  """This process's view of one evaluation's checkpoint directory.

  Args:
    directory: the directory (created if missing); one per evaluation.
    every: save after every ``every`` steps (>= 1).

  Raises:
    ValueError: ``directory`` not a string/path, ``every`` not an int >= 1.
  """

  def __init__(self, directory: Any, every: int):
    if not isinstance(directory, (str, os.PathLike)):
      raise ValueError(f"checkpoint_dir must be a str or os.PathLike; got {directory!r}")
    check_positive_int("checkpoint_every", every)
    self.every = every
    self.root = os.fspath(directory)
    self.path = os.path.join(self.root, f"process_{jax.process_index()}")
    os.makedirs(self.path, exist_ok=True)
    self._pending: concurrent.futures.Future | None = None

  # --- reading -----------------------------------------------------------------------------------

  def saved_steps(self) -> list[int]:
    """The steps of this process's complete checkpoints, ascending (``.tmp`` files are never read)."""
    found = (_STEP_FILE.match(name) for name in os.listdir(self.path))
    return sorted(int(match.group(1)) for match in found if match)

  def result(self) -> tuple[dict, dict, list[np.ndarray]] | None:
    """``(fingerprint, values, metric leaves)`` of a finished evaluation, or None."""
    try:
      header, leaves = read_state_file(os.path.join(self.path, _RESULT))
    except FileNotFoundError:
      return None
    return header["fingerprint"], _decode_result(header["results"]), leaves

  def load(self, steps: int) -> Restored:
    """The checkpoint after ``steps`` steps (one of `saved_steps`)."""
    return Restored(*read_state_file(self._step_path(steps)))

  def check(self, saved: dict, found: dict) -> None:
    """Raises ValueError naming the first part of ``found`` that differs from ``saved``."""
    for key, label in FINGERPRINT_NAMES.items():
      if key in saved and key in found and saved[key] != found[key]:
        raise ValueError(
          f"checkpoint_dir {self.root!r} was written for another evaluation: {label} differs "
          f"({_difference(key, saved[key], found[key])}). A checkpoint directory "
          "identifies one evaluation (one model checkpoint, one dataset, one setup): pass a "
          "new directory, or delete this one to start over"
        )

  # --- writing -----------------------------------------------------------------------------------

  def save_async(self, state: Any, header: dict, local_part) -> None:
    """Starts saving ``state`` (on the devices, about to be donated) in the background.

    Waits for the previous write first (at most one in flight). The state is copied on
    the devices now (dispatched, not waited for); the thread fetches this process's
    part with ``local_part`` (the device-to-host copy happens there) and writes it
    atomically.
    """
    self.wait()
    copied = _copy(state)  # dispatched; the thread's fetch waits for it, the main thread never does
    self._pending = _in_daemon_thread(self._write, copied, header, local_part)

  def _write(self, state: Any, header: dict, local_part) -> None:
    leaves = [local_part(leaf) for leaf in jax.tree.leaves(state)]
    write_state_file(self._step_path(header["steps"]), header, leaves)
    self._prune(keep_from=self._prunable_before(header["steps"]))

  def _prunable_before(self, steps: int) -> int:
    """Checkpoints before this step may go (with several processes: none, see `finish`)."""
    return steps if jax.process_count() == 1 else 0

  def _prune(self, keep_from: int) -> None:
    for name in os.listdir(self.path):
      match = _STEP_FILE.match(name)
      if (match and int(match.group(1)) < keep_from) or name.endswith(".tmp"):
        _remove(os.path.join(self.path, name))

  def busy(self) -> bool:
    """Whether a write is in flight."""
    return self._pending is not None and not self._pending.done()

  def wait(self) -> None:
    """Waits for the write in flight; re-raises its error."""
    pending, self._pending = self._pending, None
    if pending is not None:
      pending.result()

  def finish(self, results: Any, found: dict) -> None:
    """Stores the final result (its values and its metric's leaves) and fingerprint, atomically,
    and deletes the step checkpoints."""
    self.close()
    header = {"fingerprint": found, "results": _encode_result(dict(results))}
    leaves = [np.asarray(leaf) for leaf in jax.tree.leaves(results.metric)]
    write_state_file(os.path.join(self.path, _RESULT), header, leaves)
    self._prune(keep_from=np.iinfo(np.int64).max)

  def close(self, deadline_s: float | None = None) -> None:
    """Waits for the write in flight: re-raises its error; or, with ``deadline_s``, after a
    failed step, waits at most that long and leaves it running (errors ignored).

    After a failed step the write may be fetching a state whose step never finishes (another
    process died inside a collective): waiting without a deadline would hang past every
    deadline ``masked_eval`` keeps. A healthy write finishes well within it, so a run stopped
    by an exception (a preemption) keeps its last checkpoint. The writer is a daemon thread,
    so a write left running cannot keep the process alive; unfinished, it leaves at most a
    ``.tmp`` file, never a checkpoint.
    """
    pending, self._pending = self._pending, None
    if pending is None:
      return
    if deadline_s is None:
      pending.result()
      return
    try:
      pending.result(timeout=deadline_s)
    except BaseException:  # stuck or failed: the step's own error is the one to report
      pass

  def _step_path(self, steps: int) -> str:
    return os.path.join(self.path, f"step_{steps:010d}.state")


@jax.jit
def _copy(state: Any) -> Any:
  """A copy of the carried state on the devices (the original is donated to the next step)."""
  return jax.tree.map(jnp.copy, state)


def write_state_file(path: str, header: dict, leaves: list[np.ndarray]) -> None:
  """Writes a state file atomically: a magic line, the JSON header's length and the header (with each
  leaf's dtype, shape and byte count), then the leaves' raw bytes."""
  leaves = [np.asarray(leaf, order="C") for leaf in leaves]  # (ascontiguousarray makes 0-d 1-d)
  layout = [[leaf.dtype.str, list(leaf.shape), leaf.nbytes] for leaf in leaves]
  encoded = json.dumps(dict(header, leaves=layout)).encode()
  _atomic_write(path, [_MAGIC, b"%d\n" % len(encoded), encoded, *(leaf.data for leaf in leaves)])


def read_state_file(path: str) -> tuple[dict, list[np.ndarray]]:
  """``(header, leaves)`` of a file `write_state_file` wrote.

  Raises:
    ValueError: not such a file, or truncated.
  """
  with open(path, "rb") as file:
    data = file.read()
  if not data.startswith(_MAGIC):
    raise ValueError(f"{path} is not a padded_eval checkpoint file")
  size_end = data.index(b"\n", len(_MAGIC))
  start = size_end + 1 + int(data[len(_MAGIC) : size_end])
  header = json.loads(data[size_end + 1 : start])
  leaves = []
  for dtype, shape, nbytes in header.pop("leaves"):
    leaves.append(
      np.frombuffer(data, np.dtype(dtype), nbytes // max(np.dtype(dtype).itemsize, 1), start)
    )
    leaves[-1] = leaves[-1].reshape(shape).copy()
    start += nbytes
  if start != len(data):
    raise ValueError(f"{path} holds {len(data)} bytes, expected {start}: truncated or corrupt")
  return header, leaves


def _atomic_write(path: str, parts: list) -> None:
  """Writes ``data`` to ``path`` so that ``path`` is either absent, the old file, or all of ``data``."""
  temporary = f"{path}.{os.getpid()}.tmp"
  with open(temporary, "wb") as file:
    file.writelines(parts)
    file.flush()
    os.fsync(file.fileno())
  os.replace(temporary, path)
  directory = os.open(os.path.dirname(path), os.O_RDONLY)
  try:
    os.fsync(directory)  # the rename itself survives a crash
  finally:
    os.close(directory)


def _remove(path: str) -> None:
  try:
    os.remove(path)
  except FileNotFoundError:
    pass


def _encode_result(results: dict) -> dict:
  """masked_eval's results (floats, ints, numpy arrays, nested dicts) -> JSON, exactly."""

  def encode(value):
    if isinstance(value, dict):
      return {"dict": {str(k): encode(v) for k, v in value.items()}}
    if isinstance(value, np.ndarray):
      return {"array": value.tolist(), "dtype": value.dtype.str, "shape": list(value.shape)}
    if isinstance(value, bool) or not isinstance(value, (int, float)):
      raise TypeError(f"cannot store a result of type {type(value).__name__}")
    return {"int": value} if isinstance(value, int) else {"float": float(value).hex()}

  return encode(results)


def _decode_result(stored: dict) -> Any:
  if "dict" in stored:
    return {key: _decode_result(value) for key, value in stored["dict"].items()}
  if "array" in stored:
    array = np.array(stored["array"], dtype=np.dtype(stored["dtype"]))
    return array.reshape(stored["shape"])
  if "int" in stored:
    return int(stored["int"])
  return float.fromhex(stored["float"])


def _difference(key: str, saved: Any, found: Any) -> str:
  """What differs, in words: a batch spec's first difference, else both values (shortened)."""
  if key == "batch":
    now = BatchSpec.from_json(found).difference(BatchSpec.from_json(saved))
    return f"now: {now}"
  if key == "metric" and saved["tree"] != found["tree"]:
    return f"saved state {_short(saved['tree'])}, now {_short(found['tree'])}"
  return f"saved {_short(saved)}, now {_short(found)}"


def _short(value: Any) -> str:
  text = json.dumps(value, sort_keys=True)
  return text if len(text) <= 300 else text[:297] + "..."


# --- the driver's side: what masked_eval calls ---------------------------------------------------


class Saver(Hook):
  """Saves and restores one `masked_eval` call's state in a `CheckpointDir`.

  A hook of the loop (`padded_eval.eval._hooks.Hook`): it saves after dispatched steps, waits
  for its last write at `close` and stores the result at `finish`. With a saver the run carries
  the state's tree (`padded_eval.eval.run.start`), which is what it saves and restores.

  Attributes:
    result: ``(fingerprint, values, metric leaves)`` of a finished evaluation (returned by
      `verify` if this call asks the same question), or None.
    resume_at: the `padded_eval.multihost.distributed.ResumeAt` where the run starts.
  """

  def __init__(
    self,
    directory: CheckpointDir,
    runner: Any,
    partial: dict,
    restored=None,
    result=None,
    timeout: float | None = None,
  ):
    self._dir, self._runner, self._found = directory, runner, partial
    self._restored, self.result = restored, result
    self._timeout_s = timeout or DEFAULT_TIMEOUT_S  # masked_eval's timeout
    self._steps = 0 if restored is None else restored.steps
    self._no_save = False  # the one all-padding step of a resumed run with no batch left
    self._due = False  # a save is due (deferred while the previous write runs)
    self._mask_key = "mask"
    spec = None if restored is None else restored.fingerprint.get("batch")
    self.resume_at = (
      ResumeAt() if restored is None else ResumeAt(restored.steps, restored.batches, spec)
    )

  @classmethod
  def open(
    cls,
    directory: Any,
    every: int,
    runner: Any,
    params: Any,
    timeout: float | None,
    num_batches: int | None = None,
    num_rows: int | None = None,
  ) -> Saver:
    """Reads ``directory``: a stored result, the checkpoint to resume from, or nothing.

    With several processes, every process publishes its saved steps (a pre-flight
    exchange): a stored result is used only when every process has it, and the run
    resumes from the latest step every process saved.

    Args:
      directory: the checkpoint directory.
      every: steps between two saves.
      runner: the backend.
      params: the params as given.
      timeout: seconds to wait for other processes.
      num_batches: ``len(batches)`` when known (compared with the directory's, when it knows it).
      num_rows: the batches' real rows when known (``pad_batches(...).num_rows``), compared alike.

    Raises:
      ValueError: the directory was written for another process count, backend layout,
        params structure or number of batches (the rest is checked at `verify`).
    """
    directory = CheckpointDir(directory, every)
    partial = fingerprint(
      backend=runner.layout,
      params=params,
      batch_spec=None,
      state_shapes=None,
      num_batches=num_batches,
      num_rows=num_rows,
    )
    steps, stored = directory.saved_steps(), directory.result()
    if jax.process_count() > 1:
      steps, everyone_done = _agree(steps, stored is not None, timeout)
      stored = stored if everyone_done else None
    if stored is not None:
      directory.check(stored[0], partial)
      return cls(directory, runner, partial, result=stored, timeout=timeout)
    restored = directory.load(steps[-1]) if steps else None
    if restored is not None:
      directory.check(restored.fingerprint, partial)
    return cls(directory, runner, partial, restored=restored, timeout=timeout)

  def skip(self, batches: Any, mask_key: str) -> Any:
    """An iterator over ``batches`` after the consumed ones (`padded_eval.data.padded.skipped`:
    sources that can seek are not read, other batches are read and dropped)."""
    self._mask_key = mask_key
    consumed = 0 if self._restored is None else self._restored.batches
    if not consumed:
      return iter(batches)
    remaining = skipped(batches, consumed)
    if jax.process_count() > 1 or self.resume_at.spec is None:
      return remaining  # the lockstep feeds all-padding batches when none is left
    return self._or_padding(remaining, BatchSpec.from_json(self.resume_at.spec))

  def _or_padding(self, remaining, spec: BatchSpec):
    """``remaining``, or one all-padding batch (not saved) when it is empty."""
    first = next(remaining, None)
    if first is None:
      self._no_save = True
      yield spec.padding_batch()
      return
    yield first
    yield from remaining

  def verify(
    self, empty: Any, batch: Any, params: Any, placed: Any, runner: Any, wait: Any
  ) -> EvalResults | None:
    """Checks that this call asks the directory's question; returns a finished one's answer.

    The whole fingerprint is compared: the saved one against this call's process count,
    backend layout, params structure and values (`params_checksum` of the ``placed``
    params, computed on the devices), number of batches (when both calls know it), batch
    spec of the first ``batch`` and size, the values of batch 0's real rows
    (`batch_checksum`; a resumed call does not read batch 0 again and carries the
    checksum of the call it resumes), and the structure of the ``empty`` state (the
    metric, its configuration included).

    Args:
      empty: the empty carried state ``(metric, count)`` of one shard (host arrays).
      batch: the first host batch.
      params: the params as given (their structure is compared).
      placed: the params as placed on the devices (their values are compared).
      runner: the backend.
      wait: ``wait(arrays)`` blocks until they are computed (with the deadline of
        several processes).

    Returns:
      The stored result of a finished evaluation (its ``.metric`` rebuilt from the saved
      leaves: curves and plots work), or None: evaluate (resuming if restored).

    Raises:
      ValueError: the directory was written for another evaluation (naming what differs).
    """
    spec = BatchSpec.from_batch(batch, self._mask_key).to_json()
    if self._restored is None:  # batch is batch 0
      first_batch = batch_checksum(batch, self._mask_key)
    else:  # batch 0 was not read again: the resumed run's, carried to its result
      first_batch = self._restored.fingerprint.get("first_batch")
    self._found = fingerprint(
      backend=runner.layout,
      params=params,
      batch_spec=spec,
      state_shapes=empty,
      checksum=params_checksum(placed, wait),
      num_batches=self._found.get("num_batches"),
      first_batch=first_batch,
      num_rows=self._found.get("num_rows"),
    )
    if self.result is None:
      if self._restored is not None:
        self._dir.check(self._restored.fingerprint, self._found)
      return None
    saved, values, leaves = self.result
    self._dir.check(saved, self._found)
    return EvalResults(values, self._stored_metric(empty[0], leaves))

  def _stored_metric(self, empty_metric: Any, leaves: list[np.ndarray]) -> Any:
    """The stored final metric: ``leaves`` in the (checked) structure of ``empty_metric``."""
    want = [(np.shape(x), np.asarray(x).dtype) for x in jax.tree.leaves(empty_metric)]
    if [(x.shape, x.dtype) for x in leaves] != want:
      raise ValueError(
        f"checkpoint_dir {self._dir.root!r}: the stored result's metric does not fit the "
        "metric of this call (a corrupt result file); delete the directory to evaluate again"
      )
    # jax arrays, as a computed result's metric holds: compute() then runs JAX arithmetic
    # (no numpy warnings on an undefined ratio), bit for bit the stored values
    placed = [jax.device_put(x) for x in leaves]
    return jax.tree.unflatten(jax.tree.structure(empty_metric), placed)

  def restore(self, empty: Any) -> Any:
    """This process's saved part of the carried state (checked by `verify`), as host arrays in
    ``empty``'s structure, or None when there is no checkpoint to resume from."""
    if self._restored is None:
      return None
    saved = jax.tree.unflatten(jax.tree.structure(empty), self._restored.leaves)
    self._restored.leaves = None
    return saved

  def dispatched(self, step: Dispatched) -> None:
    """Counts one dispatched step; every ``every`` steps starts saving its state.

    With one process a save that falls due while the previous write is still running is
    deferred to the first step after that write finished: the driver never waits for the
    disk. With several processes every process saves the same steps (so that they share a
    step to resume from), waiting for its previous write if need be.
    """
    state, batches_consumed = step.state, step.batches_consumed
    self._steps += 1
    self._due = self._due or self._steps % self._dir.every == 0
    if not self._due or self._no_save:
      return
    if jax.process_count() == 1 and self._dir.busy():
      return
    self._due = False
    header = {"steps": self._steps, "batches": batches_consumed, "fingerprint": self._found}
    self._dir.save_async(state, header, self._runner.local_part)

  def close(self, failed: bool = False) -> None:
    """Ends the saving: waits for the write in flight; after a failed step (``failed``) at
    most ``timeout`` seconds (see `CheckpointDir.close`)."""
    self._dir.close(self._timeout_s if failed else None)

  def finish(self, results: dict) -> dict:
    """Stores ``results`` as the finished evaluation's and returns them."""
    self._dir.finish(results, self._found)
    return results


def _in_daemon_thread(fn, *args) -> concurrent.futures.Future:
  """Runs ``fn(*args)`` in a new daemon thread; the Future holds its result or error."""
  future: concurrent.futures.Future = concurrent.futures.Future()

  def run():
    try:
      future.set_result(fn(*args))
    except BaseException as error:  # handed to whoever waits
      future.set_exception(error)

  threading.Thread(target=run, name="padded_eval-checkpoint", daemon=True).start()
  return future


def _agree(steps: list[int], done: bool, timeout: float | None) -> tuple[list[int], bool]:
  """Every process's saved steps -> the steps all share, and whether all stored a result."""
  payload = {"steps": steps, "done": done}
  everyone = exchange(payload, f"{next_call_number()}/resume", timeout or DEFAULT_TIMEOUT_S)
  common = set(steps).intersection(*(set(p["steps"]) for p in everyone))
  return sorted(common), all(p["done"] for p in everyone)

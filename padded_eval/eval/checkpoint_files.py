"""The files of a checkpoint directory: one state file per process and step, written atomically.

`CheckpointDir` lists, loads, saves (in the background) and prunes ``process_{p}/step_{n}.state``
and the finished ``result.state``; `write_state_file` / `read_state_file` are the file format: a
magic line, a JSON header and the leaves' raw bytes. What is saved when, and how a run resumes,
is `padded_eval.eval.checkpoint`'s.
"""

from __future__ import annotations

import json
import os
import re
import threading
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from padded_eval.caches import registry
from padded_eval.data._batch_spec import BatchSpec
from padded_eval.eval.fingerprint import FINGERPRINT_NAMES
from padded_eval.multihost.distributed import several_processes
from padded_eval.validation import check_positive_int

__all__ = [
  "CheckpointDir",
  "InThread",
  "Restored",
  "in_daemon_thread",
  "read_state_file",
  "write_state_file",
]

_STEP_FILE = re.compile(r"^step_(\d{10})\.state$")
_MAGIC = b"padded_eval state 1\n"
_RESULT = (
  "result.state"  # (directories finished before the stored metric wrote result.json: not read)
)


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
    self._pending: InThread | None = None

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

  def save_async(self, state: Any, header: dict, host_leaves: Any, donated: bool) -> None:
    """Starts saving ``state`` (on the devices) in the background.

    Waits for the previous write first (at most one in flight). A ``donated`` state (about to
    be donated to the next step) is copied on the devices now (dispatched, not waited for); one
    that is not (a packed state, `padded_eval.eval.packing.StatePacking`) is saved as it is.
    The thread fetches this process's part with ``host_leaves(state) -> [numpy leaves]`` (the
    device-to-host copy happens there) and writes it atomically.
    """
    self.wait()
    # dispatched; the thread's fetch waits for it, the main thread never does
    saved = _copy(state) if donated else state
    self._pending = in_daemon_thread(self._write, saved, header, host_leaves)

  def _write(self, state: Any, header: dict, host_leaves) -> None:
    write_state_file(self._step_path(header["steps"]), header, host_leaves(state))
    self._prune(keep_from=self._prunable_before(header["steps"]))

  def _prunable_before(self, steps: int) -> int:
    """Checkpoints before this step may go (with several processes: none, see `finish`)."""
    return 0 if several_processes() else steps

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


@registry.jit
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


def in_daemon_thread(fn, *args) -> InThread:
  """Runs ``fn(*args)`` in a new daemon thread; the `InThread` holds its result or error."""
  return InThread(fn, *args)


class InThread:
  """``fn(*args)`` running on a daemon thread named ``padded_eval-checkpoint``.

  Done means the thread has ended, not only that ``fn`` returned: a caller that waited for
  `result` leaves no thread of its own behind.
  """

  def __init__(self, fn, *args):
    self._outcome: tuple = ()  # (result,) or (None, error), set by the thread
    self._thread = threading.Thread(
      target=self._run, args=(fn, args), name="padded_eval-checkpoint", daemon=True
    )
    self._thread.start()

  def _run(self, fn, args) -> None:
    try:
      self._outcome = (fn(*args),)
    except BaseException as error:  # handed to whoever waits
      self._outcome = (None, error)

  def done(self) -> bool:
    """Whether the thread has ended."""
    return not self._thread.is_alive()

  def result(self, timeout: float | None = None) -> Any:
    """``fn``'s result once the thread has ended (at most ``timeout`` seconds); re-raises its error.

    Raises:
      TimeoutError: the thread still runs after ``timeout`` seconds.
    """
    self._thread.join(timeout)
    if self._thread.is_alive():
      raise TimeoutError(f"the checkpoint write still runs after {timeout} s")
    if len(self._outcome) == 2:
      raise self._outcome[1]
    return self._outcome[0]

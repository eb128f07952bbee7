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
in a background thread, at most one in flight; a donated state (a tree) is first copied on the devices (one
small dispatched copy, because the original is donated to the next step; a packed state is not donated and is
saved as it is), so neither the devices nor the driver wait for the transfer or the disk. A file holds the
state's tree leaves whichever carrier ran (`padded_eval.eval.packing`): the writer unpacks a packed state on
the host, and a resumed run packs the leaves again. With one process a save that falls due while the previous
write still runs is deferred to the first step after it (older step files are deleted after each write); with
several processes every process saves the same steps (waiting for its previous write if need be) and keeps its
step files until the evaluation finishes, so that a step every process saved always exists. A finished
evaluation deletes its step files.

The module is the `Saver` (what is saved when, and how a call resumes); the directory's files and
their format are `padded_eval.eval.checkpoint_files`, the fingerprint `padded_eval.eval.fingerprint`.

Why not orbax-checkpoint (measured on this project's CPU machine, orbax 0.12.8): ``StandardCheckpointer`` took
58 ms per save of a small state (a directory of tensorstore files) against 0.56 ms for one file written,
fsynced and renamed, and 0.6 s to import; and in a multi-process run orbax treats host arrays as replicated and
joins every save with a barrier through the coordination service, without the deadlines `masked_eval` keeps on
every wait. Here each process saves its own part, and processes agree on the step to resume from in the
pre-flight (`padded_eval.multihost._coordination.exchange`).
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np

from padded_eval.data._batch_spec import BatchSpec
from padded_eval.data.padded import skipped
from padded_eval.eval._hooks import Dispatched, Hook
from padded_eval.eval.checkpoint_files import (
  CheckpointDir,
)
from padded_eval.eval.fingerprint import (
  batch_checksum,
  fingerprint,
  params_checksum,
)
from padded_eval.eval.packing import TreeLayout
from padded_eval.eval.results import EvalResults
from padded_eval.multihost._coordination import exchange
from padded_eval.multihost.distributed import (
  DEFAULT_TIMEOUT_S,
  ResumeAt,
  next_call_number,
  several_processes,
)

__all__ = ["Saver"]


class Saver(Hook):
  """Saves and restores one `masked_eval` call's state in a `CheckpointDir`.

  A hook of the loop (`padded_eval.eval._hooks.Hook`): it saves after dispatched steps, waits
  for its last write at `close` and stores the result at `finish`. The run carries the state as
  it would without a saver (`padded_eval.eval.run.start`: packed when small); the saver saves
  and restores it through that carrier (`restore`), the files always holding the tree's leaves.

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
    self._carrier: Any = TreeLayout()  # how the run carries its state (set by `restore`)
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
    if several_processes():
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
    if several_processes() or self.resume_at.spec is None:
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

  def restore(self, empty: Any, carrier: Any) -> Any:
    """This process's saved part of the carried state (checked by `verify`) in the form
    ``carrier`` carries it (a `padded_eval.eval.packing.StatePacking` packs it, a `TreeLayout`
    keeps ``empty``'s tree), as host arrays, or None when there is no checkpoint to resume from.

    The saves from now on read the state through ``carrier`` too: a file holds the state's
    tree leaves whichever carrier ran, so a packed run resumes a tree run's checkpoint and
    the other way round."""
    self._carrier = carrier
    if self._restored is None:
      return None
    saved = jax.tree.unflatten(jax.tree.structure(empty), self._restored.leaves)
    self._restored.leaves = None
    return carrier.pack_host(saved)

  def _host_leaves(self, state: Any) -> list[np.ndarray]:
    """This process's part of the carried ``state``, as the tree leaves a file holds (on the
    writer thread: the device-to-host copies happen there)."""
    local = jax.tree.map(self._runner.local_part, state)
    return jax.tree.leaves(self._carrier.unpack_host(local))

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
    if not several_processes() and self._dir.busy():
      return
    self._due = False
    header = {"steps": self._steps, "batches": batches_consumed, "fingerprint": self._found}
    self._dir.save_async(state, header, self._host_leaves, self._carrier.donated)

  def close(self, failed: bool = False) -> None:
    """Ends the saving: waits for the write in flight; after a failed step (``failed``) at
    most ``timeout`` seconds (see `CheckpointDir.close`)."""
    self._dir.close(self._timeout_s if failed else None)

  def finish(self, results: dict) -> dict:
    """Stores ``results`` as the finished evaluation's and returns them."""
    self._dir.finish(results, self._found)
    return results


def _agree(steps: list[int], done: bool, timeout: float | None) -> tuple[list[int], bool]:
  """Every process's saved steps -> the steps all share, and whether all stored a result."""
  payload = {"steps": steps, "done": done}
  everyone = exchange(payload, f"{next_call_number()}/resume", timeout or DEFAULT_TIMEOUT_S)
  common = set(steps).intersection(*(set(p["steps"]) for p in everyone))
  return sorted(common), all(p["done"] for p in everyone)

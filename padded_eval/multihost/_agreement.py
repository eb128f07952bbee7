"""`masked_eval`'s multi-host pre-flight: O(P) requests to the coordinator in total, whatever P.

Every process must agree on the batch structure, the call's settings and the number of steps before the first
collective. The first version had every process read every other process's full record: P*P blocking gets at one
coordinator (16.7 million at P = 4,096). Here (`agree`) each process makes a constant number of requests:

1. It publishes its full record (batch spec, settings, length, failure) under ``<name>/record/<p>``, then a
   fixed-size digest (hashes of the settings and of the batch spec, its length, has-data and failed flags) under
   ``<name>/digest/<p>``, and waits at a barrier (`padded_eval.multihost._coordination.arrive`). A process that does not
   arrive fails the barrier on every process after ``timeout``: `TimeoutError` naming it, no hang.
2. Process 0, the checker, reads all digests (one directory read: P small values), compares them and fetches the
   full records of only the processes it needs to name a difference (one get each: at most two on the error
   path, one on success, for the batch spec). It publishes one verdict: the agreed spec and step count, a
   failure, or the error message.
3. Every other process reads the verdict (one blocking get, deadline ``timeout``) and raises the same error, or
   returns the same agreement. A checker that dies before publishing is named in a `TimeoutError`.

Requests in total: 4P + 2 on success (two sets and one barrier per process, one verdict get per process but the
checker, plus the checker's directory read, record get and verdict set); tests/multihost/test_agreement.py counts them and
benchmarks/bench_multihost.py measures them.
"""

from __future__ import annotations

import hashlib
import json
import time
from typing import Any, NamedTuple

from padded_eval.data._batch_spec import BatchSpec
from padded_eval.multihost._coordination import (
  KEY_PREFIX,
  Peers,
  arrive,
  blocking_get,
  first_line,
  read_all,
)

__all__ = ["Agreement", "agree", "digest", "record"]

CHECKER = 0
"""The process that compares the digests and publishes the verdict."""


class Agreement(NamedTuple):
  """What the processes agreed on.

  Attributes:
    spec: the common `BatchSpec` (from the first process with data, or the resumed run's saved one).
    num_steps: steps every process runs (the largest length), or None when some length is unknown.
  """

  spec: BatchSpec
  num_steps: int | None


def record(
  first: Any, mask_key: str | None, length: int | None, settings: dict, failure: str | None
) -> dict:
  """This process's full pre-flight record (JSON-able).

  Args:
    first: its first batch, or None when it has none (or reading it failed).
    mask_key: the batch key of the mask.
    length: its number of batches if known.
    settings: JSON-able call settings that must be equal on every process.
    failure: ``"Type: message"`` of the error reading the first batch raised, else None.
  """
  return {
    "batch": None if first is None else BatchSpec.from_batch(first, mask_key).to_json(),
    "length": length,
    "settings": settings,
    "failure": failure,
  }


def digest(full: dict) -> dict:
  """The fixed-size digest of a `record`: what the checker compares (about 100 bytes).

  Returns:
    ``{"settings": hash, "batch": hash or None, "length": int or None, "failed": bool}``.
  """
  return {
    "settings": _hash(full["settings"]),
    "batch": None if full["batch"] is None else _hash(full["batch"]),
    "length": full["length"],
    "failed": full["failure"] is not None,
  }


def _hash(value: Any) -> str:
  text = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
  return hashlib.sha256(text.encode()).hexdigest()[:24]


def agree(
  mine: dict,
  name: str,
  timeout: float,
  mask_key: str | None,
  saved: dict | None = None,
  peers: Peers | None = None,
) -> Agreement | None:
  """Agrees with the other processes on batch structure and step count (the protocol above).

  Args:
    mine: this process's `record`.
    name: the pre-flight's key, unique per call and equal on every process (e.g. ``"3/preflight"``).
    timeout: seconds to wait for all processes to arrive, then for the checker's verdict.
    mask_key: the batch key of the mask.
    saved: a resumed run's saved `BatchSpec.to_json`, used when no process has a batch left.
    peers: the processes (`padded_eval.multihost._coordination.Peers`); default `Peers.current`.

  Returns:
    The `Agreement` (the same on every process). A process whose own first batch failed gets
    no agreement: its caller re-raises its own failure.

  Raises:
    ValueError: settings or batches differ, or no process has a batch (the same message on every process).
    RuntimeError: another process failed before its first step.
    TimeoutError: a process did not arrive, or the checker did not publish, within `timeout` seconds.
  """
  peers = Peers.current() if peers is None else peers
  peers.client.key_value_set(f"{KEY_PREFIX}/{name}/record/{peers.process}", json.dumps(mine))
  arrive(peers, f"{name}/digest", json.dumps(digest(mine)), timeout)
  verdict = None
  if peers.process == CHECKER:
    verdict = _verdict(peers, name, mask_key, saved, timeout)
    peers.client.key_value_set(f"{KEY_PREFIX}/{name}/verdict", json.dumps(verdict))
  if mine["failure"] is not None:
    return None  # the caller re-raises its own failure
  if verdict is None:  # not the checker: read the one it published
    verdict = _read_verdict(peers, name, timeout)
  return _outcome(verdict, peers)


def _read_verdict(peers: Peers, name: str, timeout: float) -> dict:
  try:
    return json.loads(blocking_get(peers, f"{name}/verdict", time.monotonic() + timeout))
  except Exception as err:  # DEADLINE_EXCEEDED, or the coordinator is gone
    raise TimeoutError(
      f"masked_eval on process {peers.process} of {peers.count}: process(es) [{CHECKER}] did not publish "
      f"the pre-flight verdict within {timeout:g} s (it died or hangs; coordination service: "
      f"{first_line(err)})"
    ) from None


def _outcome(verdict: dict, peers: Peers) -> Agreement:
  """The verdict as an `Agreement`, or its error raised."""
  if "failed" in verdict:
    process, message = verdict["failed"]
    raise RuntimeError(
      f"masked_eval on process {peers.process}: process {process} failed before the "
      f"first step ({message}); no step was run"
    )
  if "error" in verdict:
    raise ValueError(verdict["error"])
  return Agreement(BatchSpec.from_json(verdict["spec"]), verdict["num_steps"])


def _verdict(
  peers: Peers, name: str, mask_key: str | None, saved: dict | None, timeout: float
) -> dict:
  """The checker's verdict from everyone's digests, fetching full records only where needed."""
  digests = [json.loads(value) for value in read_all(peers, f"{name}/digest")]

  def fetch(process: int) -> dict:  # one get; the process published it before arriving
    key = f"{name}/record/{process}"
    return json.loads(blocking_get(peers, key, time.monotonic() + timeout))

  failed = [p for p, d in enumerate(digests) if d["failed"]]
  if failed:
    return {"failed": [failed[0], fetch(failed[0])["failure"]]}
  error = _settings_error(digests, fetch)
  if error:
    return {"error": error}
  with_data = [p for p, d in enumerate(digests) if d["batch"] is not None]
  if not with_data and saved is None:
    return {
      "error": f"batches yielded no batch on any of the {len(digests)} processes; masked_eval needs at "
      "least one (an all-padding batch is fine: pe.pad_batches(..., num_batches=1))"
    }
  spec = saved if not with_data else fetch(with_data[0])["batch"]
  assert spec is not None  # no process with a batch: the saved spec (checked above)
  error = _batch_error(digests, with_data, spec, fetch)
  if error is None and BatchSpec.from_json(spec).mask_key != mask_key:
    error = f"the batches have no mask key {mask_key!r}; pad them with pe.pad_batches"
  if error:
    return {"error": error}
  lengths = [d["length"] if d["batch"] is not None else 0 for d in digests]
  if saved is not None:  # a process out of data may still have consumed batches
    lengths = [d["length"] for d in digests]
  return {"spec": spec, "num_steps": None if None in lengths else max(lengths)}


def _settings_error(digests: list[dict], fetch) -> str | None:
  """The first process whose settings differ from process 0's, named with the setting."""
  differing = [p for p, d in enumerate(digests) if d["settings"] != digests[0]["settings"]]
  if not differing:
    return None
  process, settings = differing[0], fetch(0)["settings"]
  theirs = fetch(process)["settings"]
  for key in list(theirs) + [k for k in settings if k not in theirs]:
    value = theirs.get(key)
    if value != settings.get(key):
      return (
        f"masked_eval got {key}={value!r} on process {process} but {key}="
        f"{settings.get(key)!r} on process 0; every process must pass the same"
      )
  return None  # equal values, different JSON (e.g. 1 and 1.0): agreed


def _batch_error(digests: list[dict], with_data: list[int], spec: dict, fetch) -> str | None:
  """The first process with data whose batch spec differs from the first one's, named with the leaf."""
  if not with_data:
    return None
  reference_process = with_data[0]
  reference = BatchSpec.from_json(spec)
  for process in with_data[1:]:
    if digests[process]["batch"] == digests[reference_process]["batch"]:
      continue
    difference = BatchSpec.from_json(fetch(process)["batch"]).difference(reference)
    if difference is not None:
      return (
        f"masked_eval: the batches of process {process} differ from those of process "
        f"{reference_process}: {difference}. Every process must feed batches of the same "
        "structure, shapes and dtypes (the same batch_size and features in pe.pad_batches)"
      )
  return None

"""Deadline-bounded meetings of all processes over `jax.distributed`'s coordination service (its key-value store).

`padded_eval.multihost._agreement` runs `masked_eval`'s multi-host pre-flight over it, and `padded_eval.eval.checkpoint` agrees on
the steps to resume from with `exchange`. Every helper here makes O(1) requests to the coordinator per process, so
a meeting of P processes costs O(P) requests in total (the first version read every other process's key: P*P):

* `arrive`: every process publishes a value under ``<name>/<process>`` and waits at one barrier. The coordinator
  counts the arrivals (one request per process) and fails the barrier for everyone after ``timeout``; the
  processes that published nothing are then named in a `TimeoutError` on every process.
* `exchange`: `arrive`, then one directory read returns everyone's values (P requests in total, P*P bytes).

`service_client` is the one use of JAX's private API in the package: JAX has no public handle on the key-value
store (``jax.experimental.multihost_utils`` reaches it the same way). tests/multihost/test_agreement.py fails loudly when
JAX moves it.
"""

from __future__ import annotations

import json
import time
from typing import Any, NamedTuple

import jax

__all__ = [
  "KEY_PREFIX",
  "Peers",
  "arrive",
  "blocking_get",
  "exchange",
  "first_line",
  "missing",
  "read_all",
  "service_client",
]

KEY_PREFIX = "padded_eval/masked_eval"
"""Prefix of every key this package writes to the key-value store."""


def service_client() -> Any:
  """The coordination-service client: the one use of JAX's private API in this package.

  JAX (0.10) has no public handle on the key-value store that `jax.distributed.initialize` set
  up: `jax.distributed` exports only ``initialize``, ``is_initialized`` and ``shutdown``, and
  ``jax.experimental.multihost_utils`` and orbax reach the client through the same private
  ``global_state``. The methods used: ``key_value_set``, ``blocking_key_value_get``,
  ``key_value_dir_get`` and ``wait_at_barrier``. Why not multihost_utils' collectives instead:
  docs/architecture.md, "Well-kept libraries".

  Raises:
    RuntimeError: `jax.distributed` is not initialized.
  """
  client = None
  if jax.distributed.is_initialized():  # the public check; the client itself is private
    from jax._src import distributed as jax_distributed

    client = jax_distributed.global_state.client
  if client is None:
    raise RuntimeError(
      f"masked_eval runs on {jax.process_count()} processes but jax.distributed is not "
      "initialized; call jax.distributed.initialize() first"
    )
  return client


class Peers(NamedTuple):
  """Who meets: the coordination client, this process's index and the number of processes.

  Attributes:
    client: the key-value store (`service_client`, or a stand-in in tests and benchmarks).
    process: this process's index in ``[0, count)``.
    count: the number of processes.
  """

  client: Any
  process: int
  count: int

  @classmethod
  def current(cls) -> Peers:
    """This process in its `jax.distributed` session."""
    return cls(service_client(), jax.process_index(), jax.process_count())


def arrive(peers: Peers, name: str, value: str, timeout: float, what: str = "pre-flight check"):
  """Publishes ``value`` under ``<KEY_PREFIX>/<name>/<process>`` and waits until all processes did.

  Two requests per process: one set, one barrier wait (the coordinator counts arrivals).

  Args:
    peers: the meeting's processes.
    name: the meeting's key, unique per meeting and equal on every process (e.g. ``"3/preflight"``).
    value: this process's string.
    timeout: seconds the barrier waits, counted from the first process's arrival.
    what: the meeting, as error messages name it.

  Raises:
    TimeoutError: some process did not arrive within ``timeout`` (named in the message, on every process).
  """
  prefix = f"{KEY_PREFIX}/{name}"
  peers.client.key_value_set(f"{prefix}/{peers.process}", value)
  try:
    peers.client.wait_at_barrier(f"{prefix}/arrived", max(int(timeout * 1000), 1))
  except Exception as err:  # DEADLINE_EXCEEDED (or the coordinator is gone): name who is missing
    raise TimeoutError(
      f"masked_eval on process {peers.process} of {peers.count}: process(es) "
      f"{missing(peers, prefix)} did not reach the {what} within {timeout:g} s (they died, hang, or do not "
      f"call masked_eval; coordination service: {first_line(err)})"
    ) from None


def missing(peers: Peers, prefix: str) -> list[int]:
  """The processes without a key under ``prefix`` (one directory read); all of them if unreadable."""
  try:
    published = {key.rsplit("/", 1)[-1] for key, _ in peers.client.key_value_dir_get(f"{prefix}/")}
  except Exception:  # the coordinator is gone
    published = set()
  return [p for p in range(peers.count) if str(p) not in published]


def read_all(peers: Peers, name: str) -> list[str]:
  """Everyone's values of a finished `arrive` (one directory read): ``result[p]`` is process ``p``'s."""
  prefix = f"{KEY_PREFIX}/{name}"
  values = {}
  for key, value in peers.client.key_value_dir_get(f"{prefix}/"):
    last = key.rsplit("/", 1)[-1]
    if last.isdigit():
      values[int(last)] = value
  return [values[p] for p in range(peers.count)]


def exchange(payload: dict, name: str, timeout: float, peers: Peers | None = None) -> list[dict]:
  """All-gathers a small JSON payload over the key-value store: three requests per process.

  Args:
    payload: this process's JSON-able dict.
    name: the exchange's key, unique per exchange and equal on every process (e.g. ``"3/resume"``).
    timeout: seconds to wait for all processes together.
    peers: the processes; default `Peers.current`.

  Returns:
    Every process's payload: ``result[p]`` is process ``p``'s.

  Raises:
    TimeoutError: some process did not publish within `timeout` seconds (named in the message).
  """
  peers = Peers.current() if peers is None else peers
  arrive(peers, name, json.dumps(payload), timeout)
  return [json.loads(value) for value in read_all(peers, name)]


def blocking_get(peers: Peers, key: str, deadline: float) -> str:
  """The value of ``<KEY_PREFIX>/<key>``, waiting until the monotonic ``deadline`` (one request).

  Raises:
    Exception: the coordination service's error (DEADLINE_EXCEEDED, or the service is gone).
  """
  remaining_ms = max(int((deadline - time.monotonic()) * 1000), 1)
  return peers.client.blocking_key_value_get(f"{KEY_PREFIX}/{key}", remaining_ms)


def first_line(err: BaseException) -> str:
  """The first line of an error's message (at most 300 characters; its type's name if empty)."""
  return (str(err).strip().splitlines() or [type(err).__name__])[0][:300]

"""A stand-in for JAX's coordination client that counts requests, and P simulated processes on threads.

`CountingClient` keeps the key-value store and barriers in memory with the semantics padded_eval relies on
(blocking gets and barriers with deadlines that raise, directory reads of one level) and counts every request
by method, and the bytes the coordinator sends back. `simulate` runs one function per simulated process, each on
its own thread against one client, and returns what each returned or raised. Used by tests/multihost/test_agreement.py and
benchmarks/bench_multihost.py (before/after request counts up to P = 4,096).
"""

from __future__ import annotations

import collections
import threading
import time


class DeadlineExceeded(Exception):
  """What the stub raises where the coordination service answers DEADLINE_EXCEEDED."""


class CountingClient:
  """In-memory key-value store and barriers; ``counts[method]`` requests, ``bytes_out`` sent back.

  Directory reads return one level (``key_value_dir_get("a/")`` gives ``a/x``, not ``a/b/x``).

  Args:
    count: the number of processes (a barrier passes when all ``count`` arrived).
  """

  def __init__(self, count: int):
    self.count = count
    self._lock = threading.Lock()
    self._values: dict[str, str] = {}
    self._dirs: dict[str, dict[str, str]] = collections.defaultdict(dict)
    self._ready: dict[str, threading.Event] = collections.defaultdict(threading.Event)
    self._barriers: dict[str, set] = collections.defaultdict(set)
    self._deadlines: dict[str, float] = {}
    self._local = threading.local()
    self._per_thread: list[
      collections.Counter
    ] = []  # each thread counts its own: no lock per request

  @property
  def counts(self) -> collections.Counter:
    """Requests so far by method (and ``"bytes_out"``, not a request)."""
    total: collections.Counter = collections.Counter()
    for counts in list(self._per_thread):
      total.update(counts)
    total.pop("bytes_out", None)
    return total

  @property
  def requests(self) -> int:
    """All requests so far."""
    return sum(self.counts.values())

  @property
  def bytes_out(self) -> int:
    """Bytes of values (and keys, for directory reads) the coordinator sent back."""
    return sum(counts["bytes_out"] for counts in list(self._per_thread))

  def _count(self, method: str, sent: int = 0) -> None:
    counts = getattr(self._local, "counts", None)
    if counts is None:
      counts = self._local.counts = collections.Counter()
      with self._lock:
        self._per_thread.append(counts)
    counts[method] += 1
    counts["bytes_out"] += sent

  def key_value_set(self, key: str, value: str) -> None:
    self._count("key_value_set")
    directory, _ = key.rsplit("/", 1)
    with self._lock:
      self._dirs[directory + "/"][key] = value
      self._values[key] = value
      event = self._ready[key]
    event.set()

  def blocking_key_value_get(self, key: str, timeout_in_ms: int) -> str:
    value = self._values.get(key)
    if value is None:
      with self._lock:
        event = self._ready[key]
      if not event.wait(timeout_in_ms / 1000):
        self._count("blocking_key_value_get")
        raise DeadlineExceeded(f"DEADLINE_EXCEEDED: key {key} not found within {timeout_in_ms} ms")
      value = self._values[key]
    self._count("blocking_key_value_get", len(value))
    return value

  def key_value_try_get(self, key: str) -> str:
    value = self._values.get(key)
    self._count("key_value_try_get", len(value or ""))
    if value is None:
      raise KeyError(f"NOT_FOUND: {key}")
    return value

  def key_value_dir_get(self, prefix: str) -> list[tuple[str, str]]:
    with self._lock:
      items = list(self._dirs[prefix].items())
    self._count("key_value_dir_get", sum(len(k) + len(v) for k, v in items))
    return items

  def wait_at_barrier(self, barrier_id: str, timeout_in_ms: int, process_ids=None) -> None:
    """Passes when all processes arrived; fails for all at the first arrival's deadline."""
    del process_ids
    self._count("wait_at_barrier")
    with self._lock:
      self._barriers[barrier_id].add(threading.get_ident())
      deadline = self._deadlines.setdefault(barrier_id, time.monotonic() + timeout_in_ms / 1000)
      done = self._ready["barrier:" + barrier_id]
      if len(self._barriers[barrier_id]) == self.count:
        done.set()
    if not done.wait(max(deadline - time.monotonic(), 0)):
      raise DeadlineExceeded(f"DEADLINE_EXCEEDED: barrier {barrier_id} timed out")


def simulate(count: int, run, absent: tuple[int, ...] = ()) -> list:
  """Runs ``run(process)`` on one thread per process except ``absent``; result or raised error each.

  Returns:
    ``outcomes[p]``: what ``run(p)`` returned or raised (None for an absent process).
  """
  outcomes: list = [None] * count

  def one(process):
    try:
      outcomes[process] = run(process)
    except Exception as err:  # reported to the caller, which checks it
      outcomes[process] = err

  threads = [threading.Thread(target=one, args=(p,)) for p in range(count) if p not in absent]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join()
  return outcomes

"""A small all-gather of JSON payloads over `jax.distributed`'s coordination service (its key-value store).

`padded_eval.distributed` runs its multi-host pre-flight over it: every process publishes one payload and reads
everyone's, with a deadline, before any collective could hang. This module is the one use of JAX's private API in
the package (`service_client`).
"""

from __future__ import annotations

import json
import time
from typing import Any

import jax

__all__ = ["KEY_PREFIX", "exchange", "first_line", "service_client"]

KEY_PREFIX = "padded_eval/masked_eval"
"""Prefix of every key this package writes to the key-value store."""


def service_client() -> Any:
  """The coordination-service client: the one use of JAX's private API in this package.

  JAX has no public handle on the key-value store that `jax.distributed.initialize` set up.

  Raises:
    RuntimeError: `jax.distributed` is not initialized.
  """
  from jax._src import distributed as jax_distributed

  client = jax_distributed.global_state.client
  if client is None:
    raise RuntimeError(
      f"masked_eval runs on {jax.process_count()} processes but jax.distributed is not "
      "initialized; call jax.distributed.initialize() first"
    )
  return client


def exchange(payload: dict, name: str, timeout: float) -> list[dict]:
  """All-gathers a small JSON payload over the key-value store.

  Args:
    payload: this process's JSON-able dict.
    name: the exchange's key, unique per exchange and equal on every process (e.g. ``"3/preflight"``).
    timeout: seconds to wait for all processes together.

  Returns:
    Every process's payload: ``result[p]`` is process ``p``'s.

  Raises:
    TimeoutError: some process did not publish within `timeout` seconds (named in the message).
  """
  client, me, count = service_client(), jax.process_index(), jax.process_count()
  prefix = f"{KEY_PREFIX}/{name}"
  client.key_value_set(f"{prefix}/{me}", json.dumps(payload))
  deadline = time.monotonic() + timeout
  values: dict[int, str] = {}
  for process in range(count):
    remaining_ms = max(int((deadline - time.monotonic()) * 1000), 1)
    try:
      values[process] = client.blocking_key_value_get(f"{prefix}/{process}", remaining_ms)
    except Exception as err:  # DEADLINE_EXCEEDED (or the coordinator is gone): name who is missing
      missing = [
        p for p in range(count) if p not in values and not _published(client, f"{prefix}/{p}")
      ]
      raise TimeoutError(
        f"masked_eval on process {me} of {count}: process(es) {missing or [process]} did not reach the "
        f"pre-flight check within {timeout:g} s (they died, hang, or do not call masked_eval; "
        f"coordination service: {first_line(err)})"
      ) from None
  return [json.loads(values[p]) for p in range(count)]


def _published(client, key: str) -> bool:
  try:
    client.key_value_try_get(key)
    return True
  except Exception:  # NOT_FOUND, or the service is unreachable
    return False


def first_line(err: BaseException) -> str:
  """The first line of an error's message (at most 300 characters; its type's name if empty)."""
  return (str(err).strip().splitlines() or [type(err).__name__])[0][:300]

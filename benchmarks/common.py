"""Helpers shared by the benchmark tables: the naive loop, padded_eval's driver, timing, cells."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import padded_eval as pe

NOT_YET = "not yet in padded_eval"


def num_devices() -> int:
  return jax.local_device_count()


def split_rows(data: dict, batch_size: int) -> list[dict]:
  """The dataset cut into consecutive batches of ``batch_size`` rows (the last may be short)."""
  n = len(next(iter(data.values())))
  return [{k: v[i : i + batch_size] for k, v in data.items()} for i in range(0, n, batch_size)]


def shard_rows(batch: dict) -> dict:
  """``[B, ...] -> [devices, B // devices, ...]``; raises ValueError if B is not divisible."""
  d = num_devices()
  out = {}
  for key, value in batch.items():
    if value.shape[0] % d:
      raise ValueError(f"batch of {value.shape[0]} rows is not divisible by {d} devices")
    out[key] = value.reshape((d, value.shape[0] // d) + value.shape[1:])
  return out


def naive_pmean_loop(device_value: Callable[[dict], jax.Array], batches: Iterable[dict]) -> float:
  """The seed's eval loop: per-device batch value, ``pmean`` over devices, mean over steps.

  Args:
    device_value: one device's ``{key: [B/devices, ...]}`` shard -> a scalar.
    batches: host batches ``{key: [B, ...]}``.

  Returns:
    The mean over steps of the device-averaged batch values, as a float.
  """
  step = jax.pmap(lambda b: jax.lax.pmean(device_value(b), "batch"), axis_name="batch")
  per_step = two_in_flight(lambda b: step(shard_rows(b)), batches)
  return float(jnp.mean(jnp.stack([out[0] for out in per_step])))


def two_in_flight(step: Callable[[Any], Any], batches: Iterable) -> list:
  """``[step(b) for b in batches]``, waiting on step t-1 after dispatching step t (two in flight).

  At most two steps in flight (see DESIGN.md, platform notes); the last output is blocked on.
  """
  outputs = []
  for b in batches:
    outputs.append(step(b))
    if len(outputs) > 1:
      block(outputs[-2])
  if outputs:
    block(outputs[-1])
  return outputs


def has_masked_eval() -> bool:
  return hasattr(pe, "masked_eval")


def metric_class(name: str):
  """``pe.metrics.<name>`` or None while its family has not landed."""
  return getattr(pe.metrics, name, None)


def padded_eval_value(step_fn, params, batches, key: str, backend: str = "pmap") -> float | str:
  """``pe.masked_eval(...)[key]`` as a float, or a note while masked_eval has not landed."""
  if not has_masked_eval():
    return NOT_YET + " (masked_eval)"
  logs = pe.masked_eval(step_fn, params, batches, backend=backend)
  return float(logs[key])


def describe_failure(error: BaseException) -> str:
  """A one-line table cell for an approach that raised."""
  message = str(error).splitlines()[0] if str(error) else ""
  if len(message) > 60:
    message = message[:57] + "..."
  return f"fails: {type(error).__name__}" + (f" ({message})" if message else "")


@dataclasses.dataclass(frozen=True)
class Annotated:
  """A measured value with a note shown before its cell (e.g. how it had to be obtained)."""

  value: float
  note: str


def relative_error_cell(value: Any, reference: float) -> str:
  """A table cell: the relative error of ``value`` against ``reference`` (strings pass through)."""
  if isinstance(value, str):
    return value
  if isinstance(value, Annotated):
    return f"{value.note} {relative_error_cell(value.value, reference)}"
  value = float(value)
  if math.isnan(value):
    return "NaN"
  error = abs(value - reference) / abs(reference)
  if error == 0:
    text = "0"
  else:
    text = f"{error:.1e}"
  if error > 1e-3:
    text += f" (got {value:.4g}, want {reference:.4g})"
  return text


def block(tree):
  return jax.tree.map(
    lambda x: x.block_until_ready() if hasattr(x, "block_until_ready") else x, tree
  )


def time_call(fn: Callable[[], Any], repeats: int, warmup: int = 1) -> float:
  """Best (minimum) seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs.

  On a shared machine other jobs only ever add time, so the minimum is the least noisy estimate.
  """
  return min(interleaved({"fn": fn}, repeats, warmup)["fn"])


def interleaved(fns: dict[str, Callable[[], Any]], rounds: int, warmup: int = 1) -> dict[str, list]:
  """Seconds of each ``fn()`` (results blocked on) per round; each round runs all, order rotated.

  Interleaving spreads the load of other jobs over all contenders instead of one of them.
  """
  names = list(fns)
  for _ in range(warmup):
    for name in names:
      block(fns[name]())
  times = {name: [] for name in names}
  for r in range(rounds):
    for name in names[r % len(names) :] + names[: r % len(names)]:
      start = time.perf_counter()
      block(fns[name]())
      times[name].append(time.perf_counter() - start)
  return times


def host_metrics(logits, labels, dtype=np.float32) -> tuple[int, float]:
  """Correct count and cross-entropy sum of host logits ``[B, C]``, in numpy at ``dtype``.

  float32: what a host-metrics loop (Flax's ``pad_shard_unpad`` recipe) computes; float64: a
  reference.
  """
  logits = np.asarray(logits, dtype)
  shifted = logits - logits.max(-1, keepdims=True)
  log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
  loss = -np.take_along_axis(log_probs, np.asarray(labels)[:, None].astype(np.int64), -1)
  return int(np.sum(logits.argmax(-1) == labels)), float(loss.sum(dtype=np.float64))


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
  return "\n".join(lines)


def seeded(seed: int) -> np.random.Generator:
  return np.random.default_rng(seed)


def interleaved_seconds(fns: dict[str, Callable[[], Any]], rounds: int) -> list[dict[str, float]]:
  """Seconds of each of ``fns`` per round, after one warm-up call of each (compilation).

  Each round starts at the next function (rotating order), so drift in the machine's load
  falls on every function alike; compare within a round (ratios), not across rounds.
  """
  for fn in fns.values():
    fn()
  names, timings = list(fns), []
  for r in range(rounds):
    seconds = {}
    for name in names[r % len(names) :] + names[: r % len(names)]:
      start = time.perf_counter()
      fns[name]()
      seconds[name] = time.perf_counter() - start
    timings.append(seconds)
  return timings

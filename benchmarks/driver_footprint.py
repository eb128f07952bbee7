"""Driver footprint (issue #32): padded_eval modules entered per batch (a warm call, traced with
sys.setprofile between two pulls of the batch iterator) and in a cold call, and the device bytes a
masked_eval call with a 16 MiB params tree under pmap leaves alive (summed over device buffers).

Usage: ``python -m benchmarks.driver_footprint`` (8 virtual CPU devices).
"""

import gc
import os
import sys

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
import jax
import jax.numpy as jnp
import numpy as np

import padded_eval as pe


def step(params, batch):
  return pe.metrics.Accuracy().batch_updates(
    preds=batch["x"] @ params["w"], target=batch["y"], mask=batch["mask"]
  )


rng = np.random.default_rng(0)
data = {"x": rng.normal(size=(1003, 4)).astype(np.float32), "y": rng.integers(0, 3, 1003)}
small = {"w": jnp.ones((4, 3))}


class Marked:
  def __init__(self, padded):
    self.padded, self.marks = padded, []

  def __len__(self):
    return len(self.padded)

  def __iter__(self):
    for b in self.padded:
      self.marks.append(len(EVENTS))
      yield b


EVENTS = []


def prof(frame, event, arg):
  if event == "call":
    name = frame.f_globals.get("__name__", "")
    if name.startswith("padded_eval"):
      EVENTS.append(name)


def modules(backend, cold):
  EVENTS.clear()
  m = Marked(pe.pad_batches(data, 64))
  sys.setprofile(prof)
  pe.masked_eval(step, small, m, backend=backend)
  sys.setprofile(None)
  if cold:
    return len(set(EVENTS))
  k = len(m.marks) // 2
  return len(set(EVENTS[m.marks[k] : m.marks[k + 1]])), sorted(
    set(EVENTS[m.marks[k] : m.marks[k + 1]])
  )


print("cold modules (pmap first call):", modules("pmap", True))
for backend in ("pmap", "shard_map", "jit"):
  modules(backend, False)
  n, names = modules(backend, False)
  print(f"per-batch modules warm {backend}: {n} {names}")


def live_bytes():
  gc.collect()
  return sum(s.data.nbytes for x in jax.live_arrays() for s in x.addressable_shards)


big = {"w": jnp.ones((4, 3)), "big": jnp.ones((4096, 1024), jnp.float32)}  # 16 MiB on one device


def step_big(params, batch):
  return pe.metrics.Accuracy().batch_updates(
    preds=batch["x"] @ params["w"] + params["big"][0, 0], target=batch["y"], mask=batch["mask"]
  )


before = live_bytes()
pe.masked_eval(step_big, big, pe.pad_batches(data, 64), backend="pmap")
after = live_bytes()
print(
  f"pmap, params 16 MiB: live device bytes before {before / 2**20:.1f} MiB, after call {after / 2**20:.1f} MiB, left by the call {(after - before) / 2**20:.1f} MiB"
)
if hasattr(pe, "clear_caches"):
  pe.clear_caches()
  print(f"after pe.clear_caches(): {(live_bytes() - before) / 2**20:.1f} MiB")

"""Sharded models (issue #19): masked_eval(backend="jit") on FSDP params against a bare jit loop.

A transformer-shaped model (token embedding, ``layers`` pre-norm MLP blocks of width
``d_model`` and 4 x ``d_model``, tied logits) with every param sharded over ``"fsdp"`` on a
``(data=1, fsdp=8)`` mesh. Timed in one process, rounds interleaved, median of per-round ratios:

* bare jit loop: the same sharded params, each padded batch placed over the data axes and
  one jitted forward pass returning a token count (no metrics); the baseline, 1.00;
* masked_eval jit: the same params, perplexity and accuracy exactly (default data axes);
* old behaviour: replicated params and a split over the mesh's first axis only (``data``,
  size 1), what masked_eval did before;
* per-call partial: ``functools.partial(step, pad_id=0)`` built anew on every call.
"""

from __future__ import annotations

import os

if "device_count" not in os.environ.get("XLA_FLAGS", ""):  # run alone: 8 virtual devices
  os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
  ).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import functools  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

import padded_eval as pe  # noqa: E402
from benchmarks.common import interleaved_seconds, markdown_table  # noqa: E402


def init_params(rng, vocab: int, d_model: int, layers: int) -> dict:
  def dense(a, b):
    return (rng.normal(size=(a, b)) / np.sqrt(a)).astype(np.float32)

  blocks = [
    {"up": dense(d_model, 4 * d_model), "down": dense(4 * d_model, d_model)} for _ in range(layers)
  ]
  return {"embed": dense(vocab, d_model), "blocks": blocks}


def forward(params, tokens):  # [B, T] -> [B, T, vocab]
  x = params["embed"][tokens]
  for block in params["blocks"]:
    h = x / (jnp.sqrt(jnp.mean(x * x, -1, keepdims=True)) + 1e-6)
    x = x + jax.nn.gelu(h @ block["up"]) @ block["down"]
  return x @ params["embed"].T


METRICS = pe.Metrics({"perplexity": pe.metrics.Perplexity(), "accuracy": pe.metrics.Accuracy()})


def eval_step(params, batch, *, pad_id=0):
  logits = forward(params, batch["inputs"])
  tokens = batch["mask"][:, None] & (batch["inputs"] != pad_id)
  return METRICS.batch_updates(preds=logits, target=batch["inputs"], mask=tokens)


@jax.jit
def bare_step(params, inputs):
  return jnp.sum(jnp.argmax(forward(params, inputs), -1) == inputs)


def _median_ratios(fns: dict, baseline: str, rounds: int) -> dict:
  timings = interleaved_seconds(fns, rounds)
  ratios = {name: [t[name] / t[baseline] for t in timings] for name in fns}
  return {name: statistics.median(values) for name, values in ratios.items()}


def run(quick: bool, log=print) -> tuple[str, dict]:
  """Returns (Markdown, {"ratios": {variant: median ratio to the bare loop}})."""
  vocab, d_model, layers, length = (128, 256, 2, 16) if quick else (512, 256, 4, 32)
  rows, batch, rounds = (256, 64, 3) if quick else (2048, 128, 7)
  rng = np.random.default_rng(0)
  tokens = rng.integers(1, vocab, size=(rows + 5, length)).astype(np.int32)
  mesh = Mesh(np.array(jax.devices()).reshape(1, -1), ("data", "fsdp"))
  fsdp = NamedSharding(mesh, PartitionSpec(None, "fsdp"))
  host = init_params(rng, vocab, d_model, layers)
  sharded = jax.tree.map(lambda p: jax.device_put(p, fsdp), host)
  replicated = jax.tree.map(lambda p: jax.device_put(p, NamedSharding(mesh, PartitionSpec())), host)
  data = {"inputs": tokens}
  split = NamedSharding(mesh, PartitionSpec(("data", "fsdp")))

  def bare():
    counts = []
    for b in pe.pad_batches(data, batch):
      counts.append(bare_step(sharded, jax.device_put(b["inputs"], split)))
      if len(counts) > 1:
        counts[-2].block_until_ready()
    return int(sum(jax.device_get(counts)))

  def masked(params=sharded, data_axes=None, step=eval_step):
    return pe.masked_eval(
      step, params, pe.pad_batches(data, batch), backend="jit", mesh=mesh, data_axes=data_axes
    )

  fns = {
    "bare jit loop (sharded params, no metrics)": bare,
    "masked_eval jit (sharded params, data axes data x fsdp)": masked,
    "old behaviour: replicated params, split over 'data' (size 1)": lambda: masked(
      replicated, "data"
    ),
    "masked_eval jit, functools.partial built per call": lambda: masked(
      step=functools.partial(eval_step, pad_id=0)
    ),
  }
  log(f"bench_sharded: {len(fns)} variants x {rounds} rounds")
  ratios = _median_ratios(fns, next(iter(fns)), rounds)
  table = markdown_table(
    ["variant", "time / bare jit loop (median of rounds)"],
    [[name, f"{ratio:.2f}x"] for name, ratio in ratios.items()],
  )
  note = (
    f"\nModel: vocab {vocab}, d_model {d_model}, {layers} MLP blocks (4 x d_model), sequence "
    f"{length}; {rows + 5} rows in batches of {batch}; params sharded over 'fsdp' on a "
    f"(data=1, fsdp={mesh.shape['fsdp']}) mesh of virtual CPU devices; {rounds} interleaved "
    "rounds after a warm-up. The machine's 2 cores are shared with other jobs.\n"
  )
  return table + "\n" + note, {"ratios": ratios}


if __name__ == "__main__":  # python -m benchmarks sharded [--quick]
  print(run("--quick" in sys.argv)[0])

"""Speed table: every approach timed on the same eval work, as a ratio to a bare loop in the same run.

Three tables: whole-dataset evaluation (accuracy of an MLP) per approach; the per-step cost of a
metric update relative to the model's forward; and how many times each approach traces its step
for N in {1000, 1003, 1024}. Times are medians of repeated runs after a warm-up (compilation is
excluded, except in the trace-count table, which counts compilations instead of timing them).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

import padded_eval as pe
from benchmarks import anchors
from benchmarks.common import (
  block,
  describe_failure,
  interleaved,
  markdown_table,
  metric_class,
  seeded,
  shard_rows,
  split_rows,
)
from padded_eval.exact.accumulate import ExactSum


@dataclasses.dataclass(frozen=True)
class Sizes:
  rows: int = 16384
  batch: int = 512
  features: int = 256
  hidden: int = 512
  classes: int = 10
  repeats: int = 10
  update_repeats: int = 20
  seq_len: int = 128  # perplexity model: [4, seq_len] tokens -> [4, seq_len, 32000] logits


FULL = Sizes()
QUICK = Sizes(
  rows=2048, batch=256, features=64, hidden=128, repeats=2, update_repeats=3, seq_len=16
)


def mlp_init(seed: int, widths: tuple[int, ...]) -> list:
  rng = seeded(seed)
  return [
    (jnp.asarray(rng.normal(size=(a, b)).astype(np.float32) / np.sqrt(a)), jnp.zeros((b,)))
    for a, b in zip(widths[:-1], widths[1:])
  ]


def mlp(params, x):
  # the bias broadcast over the leading axes explicitly (rank promotion may be "raise")
  dense = lambda x, w, b: x @ w + b.reshape((1,) * (x.ndim - 1) + b.shape)
  for w, b in params[:-1]:
    x = jax.nn.relu(dense(x, w, b))
  w, b = params[-1]
  return dense(x, w, b)


def _data(sizes: Sizes, rows: int | None = None, seed: int = 0) -> dict:
  rng = seeded(seed)
  rows = sizes.rows if rows is None else rows
  return {
    "x": rng.normal(size=(rows, sizes.features)).astype(np.float32),
    "y": rng.integers(0, sizes.classes, rows).astype(np.int32),
  }


# --- whole-dataset evaluation, per approach ---------------------------------------------------


# The most steps the "many in flight" bare loop leaves un-waited. XLA's CPU client aborts
# (rendezvous timeout) once about 32 programs with collectives are in flight on few cores
# (HOWTO.md, "Driving metrics yourself on CPU"), and a full benchmark run hit it.
MANY_IN_FLIGHT = 16


def _bare_loop(params, sharded: list[dict], bounded: bool) -> float:
  """The bare pmap loop: per-device accuracy, pmean, mean over steps (the naive baseline).

  ``bounded``: wait on step t-1 after dispatching step t; else keep up to
  ``MANY_IN_FLIGHT`` steps in flight. The per-step values are fetched in one transfer.
  """
  outputs, lag = [], 1 if bounded else MANY_IN_FLIGHT
  for b in sharded:
    outputs.append(_bare_step(params, b))
    if len(outputs) > lag:
      outputs[-1 - lag].block_until_ready()
  return float(np.mean([np.asarray(o)[0] for o in jax.device_get(outputs)]))


def _bare_device_accuracy(params, b):
  return jax.lax.pmean(jnp.mean(jnp.argmax(mlp(params, b["x"]), -1) == b["y"]), "batch")


_bare_step = jax.pmap(_bare_device_accuracy, "batch", in_axes=(None, 0))


def _accuracy_step(params, b):
  return pe.metrics.Accuracy().batch_updates(
    preds=mlp(params, b["x"]), target=b["y"], mask=b["mask"]
  )


def _pad_shard_unpad_loop(forward, params, raw: list[dict]) -> float:
  correct = 0
  for b in raw:
    logits = forward(params, b["x"])
    correct += int(np.sum(np.argmax(logits, -1) == b["y"]))
  return correct / sum(len(b["y"]) for b in raw)


def _clu_collection(clu):
  return clu.Collection.create(accuracy=clu.Accuracy)


def _clu_loop(step, params, sharded: list[dict]) -> float:
  total, previous = None, None
  for b in sharded:
    out = step(params, b)
    if previous is not None:
      previous.accuracy.count.block_until_ready()
    previous = out
    one = out.unreplicate()
    total = one if total is None else total.merge(one)
  return float(total.compute()["accuracy"])


def _clu_step_for(clu, collection):
  def device_step(params, b):
    return collection.gather_from_model_output(
      logits=mlp(params, b["x"]), labels=b["y"], mask=b["mask"], axis_name="batch"
    )

  return jax.pmap(device_step, "batch", in_axes=(None, 0))


def eval_table(sizes: Sizes, log=print) -> tuple[str, dict]:
  """Times each approach over the whole dataset; returns (Markdown, {approach: seconds})."""
  params = mlp_init(0, (sizes.features, sizes.hidden, sizes.hidden, sizes.classes))
  data = _data(sizes)
  raw = split_rows(data, sizes.batch)
  padded = list(pe.pad_batches(data, sizes.batch))
  sharded = [shard_rows(b) for b in padded]
  approaches: dict[str, Callable[[], object] | str] = {
    "bare pmap loop, wait on step t-1": lambda: _bare_loop(params, sharded, True),
    "bare pmap loop, 16 steps in flight": lambda: _bare_loop(params, sharded, False),
  }
  for backend in ("pmap", "shard_map", "jit"):
    approaches[f"pe.masked_eval, backend={backend!r}"] = lambda backend=backend: pe.masked_eval(
      _accuracy_step, params, padded, backend=backend
    )
  approaches["pe.masked_eval pmap, pe.pad_batches inside the timing"] = lambda: pe.masked_eval(
    _accuracy_step, params, pe.pad_batches(data, sizes.batch)
  )
  psu, clu = anchors.pad_shard_unpad(), anchors.load("clu")
  name = "flax pad_shard_unpad(pmap(forward)) + numpy accuracy on host"
  if psu is None:
    approaches[name] = anchors.NOT_INSTALLED
  else:
    forward = psu(jax.pmap(mlp, in_axes=(None, 0)), static_argnums=(0,))
    approaches[name] = lambda: _pad_shard_unpad_loop(forward, params, raw)
  name = "clu Collection.gather_from_model_output in pmap, merge on host"
  if clu is None:
    approaches[name] = anchors.NOT_INSTALLED
  else:
    step = _clu_step_for(clu, _clu_collection(clu))
    approaches[name] = lambda: _clu_loop(step, params, sharded)
  seconds, ratios = _rounds(approaches, sizes.repeats, log)
  rows = [
    [k]
    + (
      [f"{seconds[k] * 1e3:.1f} ms", f"{ratios[k][0]:.2f}x", f"{ratios[k][1]:.2f}x"]
      if k in seconds
      else [v] * 3
    )
    for k, v in approaches.items()
  ]
  header = [
    "approach (same MLP, same data)",
    "best time for the dataset",
    "best time / best bare loop",
    "median over rounds of time / that round's bare loop",
  ]
  note = (
    f"\n{sizes.rows} rows, batch {sizes.batch}, MLP {sizes.features}-{sizes.hidden}-"
    f"{sizes.hidden}-{sizes.classes}, {sizes.repeats} rounds after a warm-up round; each round "
    "runs every approach once (order rotated); the baseline is the faster bare loop. "
    "Bare loops and clu get batches already padded and sharded on the host; masked_eval gets "
    "pe.pad_batches output (a list, except in the 'inside the timing' row).\n"
  )
  return markdown_table(header, rows) + "\n" + note, {"seconds": seconds, "ratios": ratios}


def _rounds(approaches: dict, rounds: int, log) -> tuple[dict, dict]:
  """Times every runnable approach in interleaved rounds.

  Returns:
    ``({approach: best seconds}, {approach: (best / best bare, median over rounds of the
    round's time / that round's faster bare loop)})``. Approaches that raise in the warm-up
    are replaced in ``approaches`` by the failure's description.
  """
  runnable = [k for k, v in approaches.items() if not isinstance(v, str)]
  for name in runnable:  # warm-up: compiles, and records approaches that raise
    log(f"speed: warm-up {name}")
    try:
      block(approaches[name]())
    except Exception as error:  # noqa: BLE001 - a failing anchor is a measured outcome
      approaches[name] = describe_failure(error)
  runnable = [k for k in runnable if not isinstance(approaches[k], str)]
  log(f"speed: {rounds} interleaved rounds")
  times = interleaved({k: approaches[k] for k in runnable}, rounds, warmup=0)
  bare = runnable[:2]
  best_bare = min(min(times[k]) for k in bare)
  per_round_bare = [min(times[k][r] for k in bare) for r in range(rounds)]
  ratios = {
    k: (min(v) / best_bare, statistics.median(t / b for t, b in zip(v, per_round_bare)))
    for k, v in times.items()
  }
  return {k: min(v) for k, v in times.items()}, ratios


# --- per-step metric update cost relative to the forward ----------------------------------------

VOCAB = 32000
UPDATE_COLUMNS = ("padded_eval", "flax nnx metrics", "clu.metrics", "metrax")


def _token_ce(logits, targets):
  return -jnp.take_along_axis(jax.nn.log_softmax(logits, -1), targets[..., None], -1)[..., 0]


def _nnx_state(metric_factory, **update):
  from flax import nnx as nnx_module

  metric = metric_factory()
  metric.update(**update)
  return nnx_module.state(metric)


def _update_cases(sizes: Sizes):
  """``{metric: (forward, params, batch, {column: update(outputs, batch) or note})}``."""
  nnx, clu, metrax = anchors.load("flax"), anchors.load("clu"), anchors.load("metrax")
  rng, b = seeded(7), sizes.batch
  x = jnp.asarray(rng.normal(size=(b, sizes.features)).astype(np.float32))
  mask = jnp.arange(b) < b - 3
  widths = (sizes.features, sizes.hidden, sizes.hidden)
  cls_batch = {"x": x, "y": jnp.asarray(rng.integers(0, sizes.classes, b), jnp.int32), "mask": mask}
  f1_batch = dict(cls_batch, y=jnp.asarray(rng.integers(0, 1000, b), jnp.int32))
  bin_batch = dict(cls_batch, y=jnp.asarray(rng.integers(0, 2, b), jnp.int32))
  tokens = jnp.asarray(rng.integers(0, VOCAB, (4, sizes.seq_len)), jnp.int32)
  lm_batch = {"x": tokens, "y": jnp.roll(tokens, -1, 1), "mask": jnp.ones((4,), bool)}
  embed = jnp.asarray(rng.normal(size=(VOCAB, 64)).astype(np.float32) * 0.1)
  lm_params = (embed, mlp_init(8, (64, 64, VOCAB)))

  def lm(params, tokens):
    return mlp(params[1], params[0][tokens])

  def na(text):
    return text if nnx is not None else anchors.NOT_INSTALLED

  cases = {}
  accuracy = {
    "padded_eval": lambda o, d: pe.metrics.Accuracy().batch_updates(
      preds=o, target=d["y"], mask=d["mask"]
    ),
    "flax nnx metrics": None
    if nnx is None
    else lambda o, d: _nnx_state(nnx.metrics.Accuracy, logits=o, labels=d["y"], mask=d["mask"]),
    "clu.metrics": None
    if clu is None
    else lambda o, d: clu.Accuracy.from_model_output(logits=o, labels=d["y"], mask=d["mask"]),
    "metrax": None
    if metrax is None
    else lambda o, d: metrax.Accuracy.from_model_output(
      jnp.argmax(o, -1), d["y"], sample_weights=d["mask"].astype(jnp.float32)
    ),
  }
  cases[f"Accuracy (C={sizes.classes})"] = (
    mlp,
    mlp_init(1, widths + (sizes.classes,)),
    cls_batch,
    accuracy,
  )
  # A mean of real values (the compensated in-batch sums of issue 26): the MLP's outputs.
  cases[f"Mean of the outputs (C={sizes.classes})"] = (
    mlp,
    mlp_init(1, widths + (sizes.classes,)),
    cls_batch,
    {
      "padded_eval": lambda o, d: pe.metrics.Mean().batch_updates(values=o, mask=d["mask"]),
      "flax nnx metrics": na("n/a: Average takes no mask"),
      "clu.metrics": na("not measured"),
      "metrax": na("not measured"),
    },
  )
  f1_class = metric_class("F1Score")
  cases["F1 macro (C=1000)"] = (
    mlp,
    mlp_init(2, widths + (1000,)),
    f1_batch,
    {
      "padded_eval": None
      if f1_class is None
      else lambda o, d: f1_class(
        task="multiclass", num_classes=1000, average="macro"
      ).batch_updates(preds=o, target=d["y"], mask=d["mask"]),
      "flax nnx metrics": na("n/a: no F1"),
      "clu.metrics": "n/a: no F1" if clu is not None else anchors.NOT_INSTALLED,
      "metrax": "n/a: FBetaScore is binary, no merge" if metrax else anchors.NOT_INSTALLED,
    },
  )
  auroc_class = metric_class("AUROC")
  cases["AUROC (binary)"] = (
    mlp,
    mlp_init(3, widths + (1,)),
    bin_batch,
    {
      "padded_eval": None
      if auroc_class is None
      else lambda o, d: auroc_class(from_logits=True).batch_updates(
        preds=o[:, 0], target=d["y"], mask=d["mask"]
      ),
      "flax nnx metrics": na("n/a: no AUROC"),
      "clu.metrics": "n/a: no AUROC" if clu is not None else anchors.NOT_INSTALLED,
      "metrax": None
      if metrax is None
      else lambda o, d: metrax.AUCROC.from_model_output(
        jax.nn.sigmoid(o[:, 0]), d["y"], sample_weights=d["mask"].astype(jnp.float32)
      ),
    },
  )
  perplexity_class = metric_class("Perplexity")
  tokens_real = lambda d: jnp.broadcast_to(d["mask"][:, None], d["y"].shape)  # noqa: E731
  cases[f"Perplexity (V=32k, 4x{sizes.seq_len} tokens)"] = (
    lm,
    lm_params,
    lm_batch,
    {
      "padded_eval": None
      if perplexity_class is None
      else lambda o, d: perplexity_class().batch_updates(
        preds=o, target=d["y"], mask=tokens_real(d)
      ),
      "flax nnx metrics": None
      if nnx is None
      else lambda o, d: _nnx_state(
        lambda: nnx.metrics.Average("ce"), ce=_token_ce(o, d["y"]), mask=tokens_real(d)
      ),
      "clu.metrics": None
      if clu is None
      else lambda o, d: clu.Average.from_model_output(_token_ce(o, d["y"]), mask=tokens_real(d)),
      "metrax": None
      if metrax is None
      else lambda o, d: metrax.Perplexity.from_model_output(
        o, d["y"], sample_weights=tokens_real(d).astype(jnp.float32), from_logits=True
      ),
    },
  )
  return cases


def update_cost_table(sizes: Sizes, log=print) -> tuple[str, dict]:
  """Per-step update cost of each metric, as a fraction of its model's jitted forward time."""
  rows, measured = [], {}
  for title, (forward, params, batch, updates) in _update_cases(sizes).items():
    log(f"speed: update cost {title}")
    fns = {"forward": lambda f=jax.jit(lambda p, d, f=forward: f(p, d["x"])): f(params, batch)}
    cells = {}
    for column in UPDATE_COLUMNS:
      update = updates[column]
      if update is None:
        cells[column] = (
          anchors.NOT_INSTALLED if column != "padded_eval" else "not yet in padded_eval"
        )
      elif isinstance(update, str):
        cells[column] = update
      else:
        both = jax.jit(lambda p, d, f=forward, u=update: u(f(p, d["x"]), d))
        try:
          block(both(params, batch))
          fns[column] = lambda both=both: both(params, batch)
        except Exception as error:  # noqa: BLE001
          cells[column] = describe_failure(error)
    best = {k: min(v) for k, v in interleaved(fns, sizes.update_repeats, warmup=2).items()}
    for column in fns:
      if column != "forward":
        measured[(title, column)] = cost = (best[column] - best["forward"]) / best["forward"]
        cells[column] = f"{cost * 100:+.0f}%"
    rows.append([title, f"{best['forward'] * 1e3:.2f} ms"] + [cells[c] for c in UPDATE_COLUMNS])
  header = ["metric (model)", "forward alone"] + [f"{c}: update cost" for c in UPDATE_COLUMNS]
  note = (
    "\nCell: (time of jit(forward + metric update) - time of jit(forward)) / time of "
    f"jit(forward), one device, batch {sizes.batch} (LM: 4 sequences); best of "
    f"{sizes.update_repeats} interleaved rounds. Noise on this shared machine is a few "
    "percent either way; small negative values mean 'not measurable'.\n"
  )
  return markdown_table(header, rows) + "\n" + note, measured


def compensated_sum_table(sizes: Sizes, log=print) -> tuple[str, dict]:
  """The step time of forward + Mean (compensated in-batch sums) against forward + the same
  masked mean with a plain float32 sum (what Mean did before issue 26), in one process."""
  log("speed: compensated in-batch sums")
  rng, b = seeded(7), sizes.batch
  x = jnp.asarray(rng.normal(size=(b, sizes.features)).astype(np.float32))
  mask = jnp.arange(b) < b - 3
  params = mlp_init(1, (sizes.features, sizes.hidden, sizes.hidden, sizes.classes))

  def plain(p, x, mask):
    o = mlp(p, x)
    real = jnp.broadcast_to(mask[:, None], o.shape).astype(jnp.float32)
    sums = jnp.sum(jnp.stack([jnp.where(real > 0, o, 0.0), real]), axis=(1, 2))
    return ExactSum.of(sums[0]), ExactSum.of(sums[1])

  steps = {
    "forward": jax.jit(lambda p, x, mask: mlp(p, x)),
    "plain": jax.jit(plain),
    "compensated": jax.jit(
      lambda p, x, mask: pe.metrics.Mean().batch_updates(values=mlp(p, x), mask=mask)
    ),
  }
  fns = {name: lambda step=step: step(params, x, mask) for name, step in steps.items()}
  times = interleaved(fns, 3 * sizes.update_repeats, warmup=2)
  per_round = [dict(zip(times, round_times)) for round_times in zip(*times.values())]
  cost = {
    name: statistics.median((t[name] - t["forward"]) / t["forward"] for t in per_round)
    for name in ("plain", "compensated")
  }
  ratio = statistics.median(t["compensated"] / t["plain"] for t in per_round)
  rows = [
    [
      f"Mean of the MLP's outputs ({b} x {sizes.classes})",
      f"{min(times['forward']) * 1e3:.2f} ms",
      f"{cost['plain'] * 100:+.0f}%",
      f"{cost['compensated'] * 100:+.0f}%",
      f"{ratio:.3f}",
    ]
  ]
  header = [
    "update",
    "forward alone",
    "plain float32 sums: cost",
    "compensated sums: cost",
    "step time, compensated / plain",
  ]
  note = (
    f"\nMedians over {3 * sizes.update_repeats} interleaved rounds of per-round ratios, one "
    "device, one process.\n"
  )
  return markdown_table(header, rows) + "\n" + note, {"compensated_over_plain": ratio, **cost}


# --- how many times each approach traces its step -----------------------------------------------


TRACE_ROWS = (1000, 1003, 1024)


def _counted(fn):
  def counted(*args):
    counted.traces += 1
    return fn(*args)

  counted.traces = 0
  return counted


def _trace_count(approach: Callable[[Callable, dict], None], rows: int, sizes: Sizes):
  data = _data(sizes, rows, seed=rows)
  try:
    return approach(data)
  except Exception as error:  # noqa: BLE001 - a crash is the measured outcome
    return describe_failure(error)


def trace_table(sizes: Sizes, log=print) -> tuple[str, dict]:
  """Number of traces of the step per approach and dataset size (batch 128)."""
  batch, clu, psu = 128, anchors.load("clu"), anchors.pad_shard_unpad()
  params = mlp_init(4, (sizes.features, 32, sizes.classes))

  def bare(data):
    step = _counted(_bare_device_accuracy)
    mapped = jax.pmap(step, "batch", in_axes=(None, 0))
    block([mapped(params, shard_rows(b)) for b in split_rows(data, batch)])
    return step.traces

  def pad_shard_unpad(min_device_batch):
    def run(data):
      forward = _counted(mlp)
      wrapped = psu(jax.pmap(forward, in_axes=(None, 0)), static_argnums=(0,))
      for b in split_rows(data, batch):
        wrapped(params, b["x"], min_device_batch=min_device_batch)
      return forward.traces

    return run

  def clu_gather(data):
    collection = _clu_collection(clu)
    counter = _counted(
      lambda p, b: collection.gather_from_model_output(
        logits=mlp(p, b["x"]), labels=b["y"], axis_name="batch"
      )
    )
    mapped = jax.pmap(counter, "batch", in_axes=(None, 0))
    block([mapped(params, shard_rows(b)) for b in split_rows(data, batch)])
    return counter.traces

  def masked_eval(backend):
    def run(data):
      step = _counted(lambda p, b: _accuracy_step(p, b))
      pe.masked_eval(step, params, pe.pad_batches(data, batch), backend=backend)
      return step.traces

    return run

  approaches = {"bare pmap loop (raw batches)": bare}
  approaches["flax pad_shard_unpad(pmap)"] = pad_shard_unpad(None) if psu else None
  approaches["flax pad_shard_unpad(pmap), min_device_batch=16"] = (
    pad_shard_unpad(16) if psu else None
  )
  approaches["clu gather_from_model_output (raw batches)"] = clu_gather if clu else None
  for backend in ("pmap", "shard_map", "jit"):
    approaches[f"pe.masked_eval, backend={backend!r}"] = masked_eval(backend)
  rows, counts = [], {}
  for name, approach in approaches.items():
    log(f"speed: traces {name}")
    row = [name]
    for n in TRACE_ROWS:
      count = anchors.NOT_INSTALLED if approach is None else _trace_count(approach, n, sizes)
      counts[(name, n)] = count
      row.append(str(count))
    rows.append(row)
  header = ["approach (batch 128, 8 devices)"] + [
    f"N={n} (last batch {n % batch or batch})" for n in TRACE_ROWS
  ]
  return markdown_table(header, rows) + "\n", counts


def run(quick: bool, log=print) -> tuple[str, dict]:
  sizes = QUICK if quick else FULL
  eval_md, seconds = eval_table(sizes, log)
  update_md, costs = update_cost_table(sizes, log)
  compensated_md, compensated = compensated_sum_table(sizes, log)
  trace_md, traces = trace_table(sizes, log)
  markdown = (
    "### Whole-dataset evaluation\n\n"
    + eval_md
    + "\n### Per-step metric update cost\n\n"
    + update_md
    + "\n### Compensated in-batch sums (issue 26)\n\n"
    + compensated_md
    + "\n### Traces (compilations) of the step\n\n"
    + trace_md
  )
  return markdown, {
    "seconds": seconds,
    "update_costs": costs,
    "compensated_sums": compensated,
    "traces": traces,
  }

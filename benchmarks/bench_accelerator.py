"""masked_eval against the loop an expert writes by hand, on whatever accelerator JAX finds (issue 64).

The accelerator run is one command, from the repository root, with nothing installed beyond jax, flax,
optax and tensorflow-cpu (besides padded_eval's own requirements)::

    python -m benchmarks accelerator --json accelerator.json

``--quick`` runs small models of the same shapes (CPU, tests); ``--models mlp logits`` picks cases.
JAX picks the platform (TPU or GPU if present, CPU otherwise; nothing here forces CPU). The hand loop
runs on the default device, the other loops on every local device: for the issue's one-chip figures on
a host of several chips, make one visible (e.g. ``TPU_VISIBLE_CHIPS=0`` or ``CUDA_VISIBLE_DEVICES=0``).
Four models, each timed side by side in this one process:

* ``mlp``: MLP 784-256-10, N = 1,003, batches of 128;
* ``cnn``: 6 conv layers (3x3, every second of stride 2), 32x32x3 -> 100 classes, N = 10,003, 1,024;
* ``transformer``: 4 pre-norm blocks of width 512, 8 heads, sequence 128 -> 10 classes, N = 10,003, 512;
* ``logits``: metrics only, the data is ``[N, 1000]`` float32 logits, N = 100,003, batches of 4,096.

Every loop computes the accuracy and the mean cross entropy over all N rows from host numpy data:

* ``hand loop`` (the baseline, 1.00): numpy slices of the host arrays, the last batch padded with zeros
  and a bool mask, one ``jax.jit`` step that takes the numpy arrays as they are and returns (correct
  count, loss sum, real count), summed on the device with ``jnp.add``, one ``device_get`` at the end;
  params placed once on the default device, outside the timing;
* ``hand loop, tf.data``: the same over the tf.data pipeline below (``as_numpy_iterator``, the
  last batch padded): the baseline of the tf.data loops (``same source`` columns), since what
  tf.data takes to make its batches is the pipeline's, whoever reads them;
* ``Flax issue's naive loop`` (Flax's issue "Correctly compute metrics over entire evalset/testset",
  the pattern of its examples then): a pmapped step returning per-batch means, ``pmean`` over
  devices, the means averaged over batches on the host. The last batch is fed as it comes (its own
  shape, compiled once more, weighted like a full batch) when its rows split evenly over the devices,
  as on one device; otherwise it is dropped (the pmap could not take it). Its numbers are wrong by
  design (the error columns show by how much); it is timed, not checked;
* ``Flax pad_shard_unpad``: ``flax.jax_utils.pad_shard_unpad`` around a pmapped forward pass
  (``min_device_batch`` so the last batch does not compile again), logits to the host, the metrics
  accumulated there with numpy;
* ``masked_eval`` with ``backend="pmap"`` and ``"jit"`` (params from ``pe.place_params``, once) over
  ``pe.pad_batches`` of the host numpy arrays, over a tf.data pipeline
  (``tf.data.Dataset.from_tensor_slices(data).batch(B)``, built once outside the timing; a new
  ``pad_batches`` per call), and over the padded batches already on the devices (placed once).

Warm: every loop once to compile, then ``--repeats`` rounds that each run every loop once (order
rotated); reported the median seconds and the median over rounds of the loop's time / the same
round's hand loop. First call: trace + compile + one run, measured in this process right after
``jax.clear_caches()`` and ``pe.clear_caches()`` (so every program is built again; the process's
imports and backend start are not included), the median of ``--first-repeats``, and its ratio to
the hand loop's first call. Checked: the accuracy and mean loss of every masked_eval loop equal the
hand loop's (the same count, loss within 1e-4 relative), and every loop's error against a float64
numpy reference on the same float32 logits is printed. Nothing is asserted about speed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

import padded_eval as pe  # noqa: E402
from benchmarks import _models, common  # noqa: E402

METRICS = pe.Metrics({"accuracy": pe.metrics.Accuracy(), "loss": pe.metrics.Mean("loss")})
HAND = "hand loop"
HAND_TF = "hand loop, tf.data"


def own_hand_loop(name: str) -> str:
  """The hand loop over the same source as loop ``name``: the tf.data one for tf.data loops."""
  return HAND_TF if "tf.data" in name else HAND


@dataclasses.dataclass(frozen=True)
class Case:
  """One model: its params, forward pass, host data and batch size."""

  name: str
  description: str
  params: object
  apply: Callable
  data: dict
  batch: int


def make_case(name: str, quick: bool) -> Case:
  rng = np.random.default_rng(0)
  if name == "mlp":
    n, batch = (203, 32) if quick else (1003, 128)
    params = _models.mlp_params((784, 256, 10))
    x = rng.normal(size=(n, 784)).astype(np.float32)
    return Case(name, "MLP 784-256-10", params, _models.mlp_apply, _labelled(x, 10, rng), batch)
  if name == "cnn":
    n, batch, channels = (203, 64, (8, 8, 16, 16, 16, 16)) if quick else (10003, 1024, None)
    channels = channels or (32, 32, 64, 64, 128, 128)
    x = rng.normal(size=(n, 32, 32, 3)).astype(np.float32)
    params = _models.cnn_params(channels, 100)
    text = f"CNN 6 conv {channels[0]}-{channels[-1]} ch, 32x32x3 -> 100"
    return Case(name, text, params, _models.cnn_apply, _labelled(x, 100, rng), batch)
  if name == "transformer":
    n, batch, width, layers, length = (203, 32, 64, 2, 16) if quick else (10003, 512, 512, 4, 128)
    tokens = rng.integers(0, 1000, (n, length)).astype(np.int32)
    params = _models.transformer_params(1000, width, layers, length, 10)
    text = f"transformer {layers}x{width}, seq {length} -> 10"
    return Case(name, text, params, _models.transformer_apply, _labelled(tokens, 10, rng), batch)
  if name == "logits":
    n, batch = (2003, 256) if quick else (100003, 4096)
    x = rng.normal(size=(n, 1000)).astype(np.float32)
    return Case(
      name, "metrics only, [N, 1000] logits", {}, lambda p, x: x, _labelled(x, 1000, rng), batch
    )
  raise ValueError(f"unknown model {name!r}; use one of {MODELS}")


MODELS = ("mlp", "cnn", "transformer", "logits")


def _labelled(x: np.ndarray, num_classes: int, rng: np.random.Generator) -> dict:
  return {"x": x, "label": rng.integers(0, num_classes, len(x)).astype(np.int32)}


def _counts(logits, labels, mask):
  """(correct count, loss sum, real count) of the masked rows, on the device."""
  loss = _models.cross_entropy(logits, labels)
  correct = jnp.sum(jnp.where(mask, jnp.argmax(logits, -1) == labels, False), dtype=jnp.int32)
  return correct, jnp.sum(jnp.where(mask, loss, 0.0)), jnp.sum(mask, dtype=jnp.int32)


def make_loops(case: Case) -> tuple[dict[str, Callable[[], tuple[float, float]]], tuple]:
  """``{name: loop() -> (accuracy, mean loss)}``; data and params placed here, outside the timing."""
  data, batch, apply = case.data, case.batch, case.apply
  n = len(data["label"])
  devices = jax.local_devices()
  num_devices = len(devices)
  mesh = Mesh(np.array(devices), ("batch",))

  # The hand loop: params on the default device once; numpy slices; one jit step; jnp.add.
  hand_params = jax.device_put(case.params)
  hand_step = jax.jit(lambda p, x, y, m: _counts(apply(p, x), y, m))
  all_real = np.ones(batch, bool)

  def hand_sum(pairs):
    """The hand loop over ``(x, label)`` numpy batches: the last padded with zeros and a mask."""
    total, start = None, 0
    for x, y in pairs:
      mask = all_real
      if len(y) < batch:
        pad = batch - len(y)
        x = np.concatenate([x, np.zeros((pad,) + x.shape[1:], x.dtype)])
        y = np.concatenate([y, np.zeros(pad, y.dtype)])
        mask = np.arange(batch) < n - start
      start += batch
      out = hand_step(hand_params, x, y, mask)
      total = out if total is None else jax.tree.map(jnp.add, total, out)
    correct, loss_sum, count = jax.device_get(total)
    return int(correct) / int(count), float(loss_sum) / int(count)

  def hand_loop():
    return hand_sum(
      (data["x"][start : start + batch], data["label"][start : start + batch])
      for start in range(0, n, batch)
    )

  replicated = jax.device_put(case.params, NamedSharding(mesh, PartitionSpec()))

  # The Flax issue's loop: per-batch means, pmean, averaged over batches on the host.
  def naive_device_means(p, x, y):
    logits = apply(p, x)
    means = {
      "accuracy": jnp.mean(jnp.argmax(logits, -1) == y),
      "loss": jnp.mean(_models.cross_entropy(logits, y)),
    }
    return jax.lax.pmean(means, "batch")

  naive_step = jax.pmap(naive_device_means, "batch", in_axes=(None, 0, 0))

  def naive_loop():
    per_batch = []
    for start in range(0, n, batch):
      x, y = data["x"][start : start + batch], data["label"][start : start + batch]
      if len(y) % num_devices:
        continue  # the pmap cannot split it: dropped
      shard = lambda a: a.reshape((num_devices, len(a) // num_devices) + a.shape[1:])
      per_batch.append(naive_step(replicated, shard(x), shard(y)))
    means = jax.device_get(per_batch)
    return tuple(float(np.mean([m[key][0] for m in means])) for key in ("accuracy", "loss"))

  # Flax's recipe: pad_shard_unpad around a pmapped forward pass, metrics on the host.
  from flax import jax_utils

  flax_forward = jax_utils.pad_shard_unpad(jax.pmap(apply, "batch", in_axes=(None, 0)))

  def flax_loop():
    correct, loss_sum = 0, 0.0
    for start in range(0, n, batch):
      x, y = data["x"][start : start + batch], data["label"][start : start + batch]
      logits = flax_forward(replicated, x, min_device_batch=-(-batch // num_devices))
      c, s = common.host_metrics(logits, y)  # float32, as the recipe's user would
      correct, loss_sum = correct + c, loss_sum + s
    return correct / n, loss_sum / n

  def step(p, b):
    logits = apply(p, b["x"])
    loss = _models.cross_entropy(logits, b["label"])
    return METRICS.batch_updates(preds=logits, target=b["label"], loss=loss, mask=b["mask"])

  pipeline = _tensorflow().data.Dataset.from_tensor_slices(data).batch(batch)

  # The hand loop over the tf.data pipeline: its numpy batches, the last padded, the same step.
  def hand_tf_loop():
    return hand_sum((b["x"], b["label"]) for b in pipeline.as_numpy_iterator())

  on_devices = [
    jax.device_put(b, NamedSharding(mesh, PartitionSpec("batch")))
    for b in pe.pad_batches(data, batch)
  ]
  for b in on_devices:
    common.block(b)

  def masked(backend: str, source: Callable):
    placed = pe.place_params(case.params, backend=backend)

    def loop():
      logs = pe.masked_eval(step, placed, source(), backend=backend)
      return float(logs["accuracy"]), float(logs["loss"])

    return loop

  loops = {HAND: hand_loop, HAND_TF: hand_tf_loop, "Flax issue's naive loop (pmap)": naive_loop}
  loops["Flax pad_shard_unpad + host metrics"] = flax_loop
  sources = {
    "numpy": lambda: pe.pad_batches(data, batch),
    "tf.data": lambda: pe.pad_batches(pipeline, batch),
    "on device": lambda: on_devices,
  }
  for source, make in sources.items():
    for backend in ("pmap", "jit"):
      loops[f"masked_eval {backend}, {source}"] = masked(backend, make)
  return loops, _reference(case)


def _tensorflow():
  """TensorFlow, kept off the accelerators (JAX's); only its tf.data is used."""
  import tensorflow as tf

  try:
    tf.config.set_visible_devices([], "GPU")
  except RuntimeError:  # already initialised (a second model): it was set then
    pass
  return tf


def _reference(case: Case) -> tuple[float, float]:
  """Accuracy and mean loss in float64 numpy of the float32 logits (the forward in batches)."""
  forward = jax.jit(case.apply)
  n, batch = len(case.data["label"]), case.batch
  correct, loss_sum = 0, 0.0
  for b in pe.pad_batches(case.data, batch):
    logits = np.asarray(forward(case.params, b["x"]))[b["mask"]]
    c, s = common.host_metrics(logits, b["label"][b["mask"]], np.float64)
    correct, loss_sum = correct + c, loss_sum + s
  return correct / n, loss_sum / n


def _cleared_first_call(loop: Callable) -> float:
  jax.clear_caches()
  pe.clear_caches()
  start = time.perf_counter()
  common.block(loop())
  return time.perf_counter() - start


def measure(case: Case, repeats: int, first_repeats: int, log) -> list[dict]:
  """One row per loop: warm and first-call seconds and ratios, the numbers and their errors."""
  loops, (ref_accuracy, ref_loss) = make_loops(case)
  log(f"{case.name}: first calls")
  first = {name: [] for name in loops}
  for _ in range(first_repeats):
    for name, loop in loops.items():
      first[name].append(_cleared_first_call(loop))
  results = {name: loop() for name, loop in loops.items()}
  n = len(case.data["label"])
  hand_accuracy, hand_loss = results[HAND]
  for name, (accuracy, loss) in results.items():
    if name.startswith("masked_eval") and (
      round(accuracy * n) != round(hand_accuracy * n) or abs(loss - hand_loss) > 1e-4 * hand_loss
    ):
      raise AssertionError(f"{case.name}, {name}: {(accuracy, loss)} != hand {results[HAND]}")
  log(f"{case.name}: {repeats} warm rounds")
  times = common.interleaved(loops, repeats, warmup=0)  # compiled above
  first_hand = statistics.median(first[HAND])
  rows = []
  for name in loops:
    accuracy, loss = results[name]
    rows.append(
      {
        "model": case.name,
        "description": case.description,
        "n": n,
        "batch": case.batch,
        "loop": name,
        "warm_s": statistics.median(times[name]),
        "warm_ratio": statistics.median(t / h for t, h in zip(times[name], times[HAND])),
        "warm_ratio_own": statistics.median(
          t / h for t, h in zip(times[name], times[own_hand_loop(name)])
        ),
        "first_s": statistics.median(first[name]),
        "first_ratio": statistics.median(first[name]) / first_hand,
        "first_ratio_own": statistics.median(first[name])
        / statistics.median(first[own_hand_loop(name)]),
        "accuracy": accuracy,
        "loss": loss,
        "accuracy_error": abs(accuracy - ref_accuracy) / ref_accuracy,
        "loss_error": abs(loss - ref_loss) / ref_loss,
      }
    )
  return rows


def probe(case: Case, repeats: int) -> list[dict]:
  """Where the host batches' time goes: placement paths side by side (``--probe``).

  Every loop runs the hand loop's step on the case's pre-padded host batches (``pad_batches``, read
  once outside the timing) and returns the summed counts, blocked on at the end:

  * ``jit(numpy)``: the numpy batch passed to ``jax.jit`` (the hand loop's transfer);
  * ``device_put(device)`` / ``device_put(split)``: ``jax.device_put`` to the default device, or with
    masked_eval's ``NamedSharding`` of the rows, then the step;
  * ``... wait t-1``: the same, waiting on step t-1 after step t is dispatched (two in flight);
  * ``device_put ahead``: batch t+1 placed right after step t is dispatched (masked_eval's order);
  * ``put only``: every batch placed, nothing run (the transfer alone);
  * ``pad_batches only``: iterating ``pe.pad_batches`` of the host arrays (no device);
  * ``masked_eval jit host list`` and ``... steps_in_flight=8``: the driver over the same batches.
  """
  hosts = list(pe.pad_batches(case.data, case.batch))
  apply = case.apply
  params = jax.device_put(case.params)
  step = jax.jit(lambda p, b: _counts(apply(p, b["x"]), b["label"], b["mask"]))
  mesh = Mesh(np.array(jax.local_devices()[:1]), ("batch",))
  split = NamedSharding(mesh, PartitionSpec("batch"))
  device = jax.local_devices()[0]

  def run(place, wait=False, ahead=False):
    def loop():
      total, previous = None, None
      placed = place(hosts[0]) if ahead else None
      for i, host in enumerate(hosts):
        b = placed if ahead else place(host)
        out = step(params, b)
        if ahead and i + 1 < len(hosts):
          placed = place(hosts[i + 1])
        if wait and previous is not None:
          jax.block_until_ready(previous)
        previous = out
        total = out if total is None else jax.tree.map(jnp.add, total, out)
      return jax.device_get(total)

    return loop

  def put_only(place):
    return lambda: jax.block_until_ready([place(h) for h in hosts])

  def step_fn(p, b):
    logits = apply(p, b["x"])
    loss = _models.cross_entropy(logits, b["label"])
    return METRICS.batch_updates(preds=logits, target=b["label"], loss=loss, mask=b["mask"])

  placed_params = pe.place_params(case.params, backend="jit")
  numpy_ = lambda b: b
  to_device = lambda b: jax.device_put(b, device)
  to_split = lambda b: jax.device_put(b, split)
  loops = {
    "jit(numpy)": run(numpy_),
    "jit(numpy) wait t-1": run(numpy_, wait=True),
    "device_put(device)": run(to_device),
    "device_put(split)": run(to_split),
    "device_put(split) wait t-1": run(to_split, wait=True),
    "device_put(split) ahead, wait t-1": run(to_split, wait=True, ahead=True),
    "device_put(split) ahead": run(to_split, ahead=True),
    "put only (device)": put_only(to_device),
    "put only (split)": put_only(to_split),
    "pad_batches only": lambda: sum(1 for _ in pe.pad_batches(case.data, case.batch)),
    "masked_eval jit host list": lambda: pe.masked_eval(
      step_fn, placed_params, hosts, backend="jit"
    ),
    "masked_eval jit host list, steps_in_flight=8": lambda: pe.masked_eval(
      step_fn, placed_params, hosts, backend="jit", steps_in_flight=8
    ),
    "masked_eval jit pad_batches": lambda: pe.masked_eval(
      step_fn, placed_params, pe.pad_batches(case.data, case.batch), backend="jit"
    ),
  }
  tf = _tensorflow()
  pipeline = tf.data.Dataset.from_tensor_slices(case.data).batch(case.batch)
  prefetched = pipeline.prefetch(2)
  loops["tf.data as_numpy_iterator only"] = lambda: sum(1 for _ in pipeline.as_numpy_iterator())
  loops["tf.data pad_batches only"] = lambda: sum(1 for _ in pe.pad_batches(pipeline, case.batch))
  loops["tf.data .prefetch(2) pad_batches only"] = lambda: sum(
    1 for _ in pe.pad_batches(prefetched, case.batch)
  )
  loops["masked_eval jit tf.data"] = lambda: pe.masked_eval(
    step_fn, placed_params, pe.pad_batches(pipeline, case.batch), backend="jit"
  )
  loops["masked_eval jit tf.data .prefetch(2)"] = lambda: pe.masked_eval(
    step_fn, placed_params, pe.pad_batches(prefetched, case.batch), backend="jit"
  )
  times = common.interleaved(loops, repeats, warmup=1)
  base = "jit(numpy)"
  return [
    {
      "model": case.name,
      "loop": name,
      "warm_s": statistics.median(times[name]),
      "ratio": statistics.median(t / h for t, h in zip(times[name], times[base])),
    }
    for name in loops
  ]


def table(rows: list[dict]) -> str:
  header = [
    "model",
    "N, batch",
    "loop",
    "warm s",
    "warm / hand",
    "warm / hand, same source",
    "first call s",
    "first / hand",
    "first / hand, same source",
    "accuracy rel. error",
    "loss rel. error",
  ]
  cells = [
    [
      r["description"],
      f"{r['n']:,}, {r['batch']:,}",
      r["loop"],
      f"{r['warm_s']:.4f}",
      f"{r['warm_ratio']:.2f}x",
      f"{r['warm_ratio_own']:.2f}x",
      f"{r['first_s']:.3f}",
      f"{r['first_ratio']:.2f}x",
      f"{r['first_ratio_own']:.2f}x",
      f"{r['accuracy_error']:.1e}",
      f"{r['loss_error']:.1e}",
    ]
    for r in rows
  ]
  return common.markdown_table(header, cells)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks accelerator", description=__doc__)
  parser.add_argument("--quick", action="store_true", help="small models of the same shapes")
  parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
  parser.add_argument("--repeats", type=int, default=None, help="warm rounds (default 9; quick 3)")
  parser.add_argument("--first-repeats", type=int, default=None, help="default 3; quick 1")
  parser.add_argument("--json", type=str, default=None, help="also write the rows here")
  parser.add_argument("--probe", action="store_true", help="time placement paths (see `probe`)")
  args = parser.parse_args(argv)
  repeats = args.repeats or (3 if args.quick else 9)
  first_repeats = args.first_repeats or (1 if args.quick else 3)
  start = time.perf_counter()

  def log(message):
    print(f"[{time.perf_counter() - start:6.1f}s] {message}", file=sys.stderr, flush=True)

  jax.block_until_ready(jax.jit(lambda x: x + 1)(1.0))  # the backend starts outside any timing
  device = jax.devices()[0]
  machine = (
    f"{jax.local_device_count()} x {device.platform} ({device.device_kind}), jax {jax.__version__}"
  )
  if args.probe:
    rows = [r for name in args.models for r in probe(make_case(name, args.quick), repeats)]
    print(f"{machine}; placement probe; median of {repeats} rounds\n")
    print(
      common.markdown_table(
        ["model", "loop", "warm s", "/ jit(numpy)"],
        [[r["model"], r["loop"], f"{r['warm_s']:.4f}", f"{r['ratio']:.2f}x"] for r in rows],
      )
    )
    if args.json:
      with open(args.json, "w") as out:
        json.dump({"machine": machine, "probe": True, "rows": rows}, out, indent=1)
    return 0
  rows = []
  for name in args.models:
    rows += measure(make_case(name, args.quick), repeats, first_repeats, log)
    if args.json:  # after every model, so that a run cut short keeps what it measured
      with open(args.json, "w") as out:
        json.dump(
          {"machine": machine, "quick": args.quick, "repeats": repeats, "rows": rows}, out, indent=1
        )
  mode = "quick sizes" if args.quick else "full sizes"
  print(f"{machine}; {mode}; warm: median of {repeats} rounds; first: median of {first_repeats}\n")
  print(table(rows))
  return 0


if __name__ == "__main__":
  sys.exit(main())

"""Flax's real sst2 eval against its HOWTO conversion: one fixed length, then length buckets (issue 66).

Run from the repository root: ``python -m benchmarks flax_sst2 [--flax DIR] [--repeats N] [--cold-repeats N]``.
``DIR`` is a google/flax checkout, or the git directory of a copy of one (the default: ``$FLAX_DIR``, else the
mirror ``/work/.mirror/google+flax/repo`` that the ``fetch`` route of this project's sessions leaves); without
one the benchmark says so and stops. The repository holds no Flax code: ``examples/sst2/{train, models,
input_pipeline, vocabulary}.py``, ``vocab.txt`` and ``configs/default.py`` are copied from ``DIR`` into a
temporary folder twice, once as they are and once with the HOWTO's patch (docs/howto/sequences.md) applied.

The data is offline and tiny: the sentences of `examples/from_flax/sst2.py` (1003 sentences of 1 to 41 words,
about 13 on average, with BOS and EOS), token ids drawn from Flax's ``vocab.txt``, in a ``TextDataset`` whose
``tfds.load`` is skipped (``tensorflow_text``, imported by the pipeline, is a stub: the sentences are already
token ids). The model is Flax's ``TextClassifier`` with its default config (embedding 300, LSTM 256).

Three loops, each ``train.evaluate_model`` of its copy over ``get_batches(batch_size=64)`` (each batch padded to
its own longest sentence):

* ``flax``: the original (``jax.jit(eval_step)``: one compilation per batch shape);
* ``fixed``: the conversion with ``EVAL_LENGTHS = [60]``: every batch padded to 60 (the HOWTO before buckets);
* ``buckets``: the conversion as the HOWTO writes it, ``EVAL_LENGTHS = [16, 24, 32, 40, 48, 60]``.

Each loop runs in fresh Python processes of its own (``--cold-repeats``, interleaved): ``cold`` is the first
call (tracing and compilation included; imports, model and data made before the clock starts), ``warm`` the
minimum over ``--repeats`` later calls in that process; compilations are counted with JAX's backend compile event
during the first call. Printed: the medians of cold, the minimum of warm, and each ratio to ``flax``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
FILES = (
  "train.py",
  "models.py",
  "input_pipeline.py",
  "vocabulary.py",
  "vocab.txt",
  "configs/default.py",
)
MIRROR = "/work/.mirror/google+flax/repo"
LOOPS = {"flax": None, "fixed": [60], "buckets": None}  # buckets: the HOWTO's EVAL_LENGTHS
BATCH_SIZE = 64


def _read(flax: pathlib.Path, path: str) -> bytes:
  """One file of Flax's ``examples/sst2``: from a checkout's work tree, else from its git objects."""
  worktree = flax / "examples" / "sst2" / path
  if worktree.is_file():
    return worktree.read_bytes()
  done = subprocess.run(
    ["git", f"--git-dir={flax}", "show", f"HEAD:examples/sst2/{path}"], capture_output=True
  )
  if done.returncode:
    raise FileNotFoundError(f"{flax} holds no examples/sst2/{path}: {done.stderr.decode().strip()}")
  return done.stdout


def materialize(flax: pathlib.Path, into: pathlib.Path) -> dict[str, pathlib.Path]:
  """``{"original": dir, "converted": dir}``: Flax's sst2 files, and the same with the HOWTO's patch."""
  sys.path.insert(0, str(ROOT / "scripts"))
  import check_flax_diffs

  patch = next(p for p in check_flax_diffs.flax_diffs().values() if "a/examples/sst2/" in p)
  dirs = {}
  for role in ("original", "converted"):
    base = into / role
    for path in FILES:
      target = base / "examples" / "sst2" / path
      target.parent.mkdir(parents=True, exist_ok=True)
      target.write_bytes(_read(flax, path))
    if role == "converted":
      subprocess.run(["git", "apply"], input=patch, text=True, cwd=base, check=True)
    dirs[role] = base / "examples" / "sst2"
  return dirs


def _child(loop: str, folder: str, repeats: int) -> dict:
  """One loop in this fresh process: cold, then ``repeats`` warm calls; returns the figures."""
  import types

  sys.modules["tensorflow_text"] = types.ModuleType(
    "tensorflow_text"
  )  # the sentences are ids already
  sys.path.insert(0, folder)
  sys.path.insert(0, str(ROOT))
  import jax
  import jax.monitoring
  import numpy as np
  import tensorflow as tf

  import input_pipeline  # Flax's, from `folder`
  import train
  from configs import default
  from examples.from_flax import sst2 as stand_in

  compiles = [0]

  def listener(event, duration, **kwargs):
    del duration, kwargs
    compiles[0] += event == "/jax/core/compile/backend_compile_duration"

  jax.monitoring.register_event_duration_secs_listener(listener)
  dataset = input_pipeline.TextDataset.__new__(input_pipeline.TextDataset)  # no tfds.load
  dataset.vocab = input_pipeline.vocabulary.Vocabulary(vocab_path=os.path.join(folder, "vocab.txt"))
  rng = np.random.default_rng(4)
  vocab_size = len(dataset.vocab)
  rows = []
  for index, example in enumerate(stand_in.make_inputs()[1]):
    words = rng.integers(4, vocab_size, size=int(example["length"]) - 2)
    ids = np.concatenate([[dataset.vocab.bos_idx], words, [dataset.vocab.eos_idx]]).astype(np.int64)
    rows.append(
      {
        "idx": np.int32(index),
        "token_ids": ids,
        "length": np.int32(len(ids)),
        "label": example["label"],
      }
    )
  signature = {
    "idx": tf.TensorSpec([], tf.int32),
    "token_ids": tf.TensorSpec([None], tf.int64),
    "length": tf.TensorSpec([], tf.int32),
    "label": tf.TensorSpec([], tf.int64),
  }
  dataset.examples = tf.data.Dataset.from_generator(
    lambda: iter(rows), output_signature=signature
  ).cache()
  for _ in dataset.examples:  # fill the cache: every loop reads the same warm pipeline
    pass
  config = default.get_config()
  config.vocab_size = vocab_size
  state = train.create_train_state(jax.random.key(0), config, train.model_from_config(config))
  if loop == "flax":
    step = jax.jit(train.eval_step)
  else:
    step = train.eval_step
    if LOOPS[loop] is not None:
      train.EVAL_LENGTHS = LOOPS[loop]
  batches = dataset.get_batches(batch_size=BATCH_SIZE)
  widths = sorted({int(b["token_ids"].shape[1]) for b in batches.as_numpy_iterator()})
  times = []
  compiles[0] = 0  # the first call's own compilations
  for call in range(1 + repeats):
    start = time.perf_counter()
    metrics = train.evaluate_model(step, state, batches, epoch=1)
    times.append(time.perf_counter() - start)
    if call == 0:
      first_compiles = compiles[0]
  loss = metrics.loss if hasattr(metrics, "loss") else metrics["loss"]
  lengths = getattr(train, "EVAL_LENGTHS", None)
  return {
    "loop": loop,
    "cold": times[0],
    "warm": min(times[1:]) if repeats else None,
    "compiles": first_compiles,
    "loss": float(loss),
    "batch_widths": widths,
    "eval_lengths": lengths,
  }


def _run_child(loop: str, folder: pathlib.Path, repeats: int) -> dict:
  command = [sys.executable, "-m", "benchmarks.bench_flax_sst2", "--child", loop, str(folder)]
  done = subprocess.run(
    command + ["--repeats", str(repeats)], cwd=ROOT, capture_output=True, text=True, check=False
  )
  if done.returncode:
    raise RuntimeError(f"{loop}: {done.stderr[-3000:]}")
  return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--flax", default=os.environ.get("FLAX_DIR", MIRROR))
  parser.add_argument("--repeats", type=int, default=10)
  parser.add_argument("--cold-repeats", type=int, default=3)
  parser.add_argument("--quick", action="store_true", help="one process per loop, 2 warm calls")
  parser.add_argument("--child", nargs=2, metavar=("LOOP", "FOLDER"), help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.child:
    print(json.dumps(_child(args.child[0], args.child[1], args.repeats)))
    return 0
  flax = pathlib.Path(args.flax)
  if not flax.exists():
    print(f"no Flax checkout at {flax}: pass --flax DIR (a google/flax checkout) or set FLAX_DIR")
    return 0
  if args.quick:
    args.repeats, args.cold_repeats = 2, 1
  with tempfile.TemporaryDirectory() as tmp:
    dirs = materialize(flax, pathlib.Path(tmp))
    runs: dict[str, list[dict]] = {loop: [] for loop in LOOPS}
    for _ in range(args.cold_repeats):
      for loop in LOOPS:
        folder = dirs["original" if loop == "flax" else "converted"]
        runs[loop].append(_run_child(loop, folder, args.repeats))
    shutil.rmtree(tmp, ignore_errors=True)
  cold = {loop: statistics.median(r["cold"] for r in rs) for loop, rs in runs.items()}
  warm = {loop: min(r["warm"] for r in rs) for loop, rs in runs.items()}
  print(f"batch widths of get_batches({BATCH_SIZE}): {runs['flax'][0]['batch_widths']}")
  print(
    "| loop | compilations (first call) | cold s (median) | cold / flax | warm s (min) | warm / flax | loss |"
  )
  print("|---|---|---|---|---|---|---|")
  for loop, rs in runs.items():
    lengths = rs[0]["eval_lengths"]
    name = loop if lengths is None else f"{loop} (EVAL_LENGTHS={lengths})"
    print(
      f"| {name} | {rs[0]['compiles']} | {cold[loop]:.3f} | {cold[loop] / cold['flax']:.2f} | "
      f"{warm[loop]:.4f} | {warm[loop] / warm['flax']:.2f} | {rs[0]['loss']:.6f} |"
    )
  return 0


if __name__ == "__main__":
  sys.exit(main())

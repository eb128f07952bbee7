"""Flax's real sst2 eval against its HOWTO conversion: one fixed length, then length buckets (issue 66).

Run from the repository root: ``python -m benchmarks flax_sst2 [--flax DIR] [--repeats N] [--cold-repeats N]``.
``DIR`` is a google/flax checkout, or the git directory of a copy of one (the default: ``$FLAX_DIR``, else the
mirror ``/work/.mirror/google+flax/repo`` that the ``fetch`` route of this project's sessions leaves); without
one the benchmark says so and stops. The repository holds no Flax code: ``examples/sst2/{train, models,
input_pipeline, vocabulary}.py``, ``vocab.txt`` and ``configs/default.py`` are copied from ``DIR`` into a
temporary folder twice, once as they are and once with the HOWTO's patch (docs/howto/sequences.md) applied.

The data is offline and tiny, token ids drawn from Flax's ``vocab.txt``, in a ``TextDataset`` whose
``tfds.load`` is skipped (``tensorflow_text``, imported by the pipeline, is a stub: the sentences are already
token ids). Two length distributions (``--lengths``, `sentence_lengths`):

* ``narrow`` (the default, the figures of RESULTS.md before 2026-12-08): the sentences of
  `examples/from_flax/sst2.py`, 1003 sentences of 1 + Binomial(40, 0.3) words (here 4 to 22, mean 13.2, sd
  2.9), with BOS and EOS. Batches of 64 have only five widths (19 to 24), so Flax's loop compiles 6 times:
  narrower than real SST-2, whose longest sentence in a batch of 64 varies far more;
* ``sst2``: 872 sentences (SST-2's validation size) of 2 to 55 words, mean 20, sd 9 (a gamma, rounded and
  clipped; the shape of SST-2's validation lengths, not its data: no download here). Batches of 64 have ten
  widths (42 to 57) in five of the HOWTO's buckets (44 to 60).

The model is Flax's ``TextClassifier`` with its default config (embedding 300, LSTM 256).

Three loops, each ``train.evaluate_model`` of its copy over ``get_batches(batch_size=64)`` (each batch padded to
its own longest sentence):

* ``flax``: the original (``jax.jit(eval_step)``: one compilation per batch shape);
* ``fixed``: the conversion with ``EVAL_LENGTHS = [60]``: every batch padded to 60 (the HOWTO before buckets);
* ``buckets``: the conversion as the HOWTO writes it, ``EVAL_LENGTHS = list(range(16, 61, 4))``;
* ``coarse`` (with ``--coarse``): the conversion with ``EVAL_LENGTHS = [16, 24, ..., 56, 60]`` (fewer
  programs, more padding).

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
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

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
COARSE = [
  16,
  24,
  32,
  40,
  48,
  56,
  60,
]  # --coarse: a fourth loop, fewer buckets (fewer programs, more padding)
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


def sentence_lengths(kind: str) -> np.ndarray:
  """Token counts (BOS and EOS included) of the offline sentences: ``"narrow"`` those of
  `examples/from_flax/sst2.py` (1003 sentences of 4 to 22 words, mean 13.2, sd 2.9), ``"sst2"`` lengths
  shaped like SST-2's validation set (872 sentences, 2 to 55 words, mean about 20: a gamma of mean 20
  and sd 9 words, rounded and clipped to 2..55; seed 4)."""
  if kind == "narrow":
    from examples.from_flax import sst2 as stand_in

    return np.array([int(e["length"]) for e in stand_in.make_inputs()[1]])
  if kind != "sst2":
    raise ValueError(f"lengths must be 'narrow' or 'sst2'; got {kind!r}")
  rng = np.random.default_rng(4)
  words = np.clip(np.rint(rng.gamma(shape=(20 / 9) ** 2, scale=81 / 20, size=872)), 2, 55)
  return words.astype(np.int64) + 2


def _setup(dirs: dict[str, str], lengths: str = "narrow") -> tuple[dict, object, object]:
  """Imports both copies of ``train.py`` (``{"original": module, "converted": module}``; their other files are
  the same), and builds the stand-in ``TextDataset`` (sentences of `sentence_lengths` ``lengths``) and a
  ``TrainState``."""
  import importlib.util
  import types

  sys.modules["tensorflow_text"] = types.ModuleType(
    "tensorflow_text"
  )  # the sentences are ids already
  sys.path.insert(0, dirs["original"])
  sys.path.insert(0, str(ROOT))
  import input_pipeline  # Flax's, from the copies
  import jax
  import numpy as np
  import tensorflow as tf
  from configs import default

  from examples.from_flax import sst2 as stand_in

  trains = {}
  for role, folder in dirs.items():
    spec = importlib.util.spec_from_file_location(f"train_{role}", os.path.join(folder, "train.py"))
    assert spec is not None and spec.loader is not None
    trains[role] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(trains[role])
  dataset = input_pipeline.TextDataset.__new__(input_pipeline.TextDataset)  # no tfds.load
  dataset.vocab = input_pipeline.vocabulary.Vocabulary(
    vocab_path=os.path.join(dirs["original"], "vocab.txt")
  )
  rng = np.random.default_rng(4)
  vocab_size = len(dataset.vocab)
  labels = [example["label"] for example in stand_in.make_inputs()[1]]
  rows = []
  for index, length in enumerate(sentence_lengths(lengths)):
    words = rng.integers(4, vocab_size, size=int(length) - 2)
    ids = np.concatenate([[dataset.vocab.bos_idx], words, [dataset.vocab.eos_idx]])
    label = np.int64(rng.integers(0, 2)) if lengths == "sst2" else labels[index]
    rows.append(
      {
        "idx": np.int32(index),
        "token_ids": ids.astype(np.int64),
        "length": np.int32(len(ids)),
        "label": label,
      }
    )
  signature = {
    "idx": tf.TensorSpec([], tf.int32),
    "token_ids": tf.TensorSpec([None], tf.int64),
    "length": tf.TensorSpec([], tf.int32),
    "label": tf.TensorSpec([], tf.int64),
  }
  examples = tf.data.Dataset.from_generator(lambda: iter(rows), output_signature=signature)
  dataset.examples = examples.cache()
  for _ in dataset.examples:  # fill the cache: every loop reads the same warm pipeline
    pass
  config = default.get_config()
  config.vocab_size = vocab_size
  train = trains["original"]
  state = train.create_train_state(jax.random.key(0), config, train.model_from_config(config))
  return trains, dataset, state


def _loop(trains: dict, loop: str):
  """``(train module, eval step)`` of one loop, with the conversion's ``EVAL_LENGTHS`` set for it."""
  import jax

  if loop == "flax":  # one jax.jit, as train_and_evaluate makes it
    original = trains["original"]
    if not hasattr(original, "JITTED_EVAL_STEP"):
      original.JITTED_EVAL_STEP = jax.jit(original.eval_step)
    return original, original.JITTED_EVAL_STEP
  train = trains["converted"]
  if not hasattr(train, "DEFAULT_LENGTHS"):
    train.DEFAULT_LENGTHS = train.EVAL_LENGTHS
  train.EVAL_LENGTHS = LOOPS[loop] or train.DEFAULT_LENGTHS
  return train, train.eval_step


def _child(mode: str, dirs: dict[str, str], repeats: int, lengths: str = "narrow") -> dict:
  """``cold LOOP``: the first call of one loop in this fresh process (seconds, compilations). ``warm``: every
  loop, one call each to warm it, then ``repeats`` rounds of one call per loop, interleaved (minimum seconds)."""
  import jax
  import jax.monitoring

  trains, dataset, state = _setup(dirs, lengths)
  batches = dataset.get_batches(batch_size=BATCH_SIZE)
  compiles = [0]

  def listener(event, duration, **kwargs):
    del duration, kwargs
    compiles[0] += event == "/jax/core/compile/backend_compile_duration"

  jax.monitoring.register_event_duration_secs_listener(listener)

  def timed(loop):
    train, step = _loop(trains, loop)
    start = time.perf_counter()
    metrics = train.evaluate_model(step, state, batches, epoch=1)
    seconds = time.perf_counter() - start
    loss = metrics.loss if hasattr(metrics, "loss") else metrics["loss"]
    return seconds, float(loss)

  if mode != "warm":
    seconds, loss = timed(mode)
    return {"cold": seconds, "compiles": compiles[0], "loss": loss}
  losses = {loop: timed(loop)[1] for loop in LOOPS}
  widths = sorted({int(b["token_ids"].shape[1]) for b in batches.as_numpy_iterator()})
  times: dict[str, list[float]] = {loop: [] for loop in LOOPS}
  for _ in range(repeats):
    for loop in LOOPS:
      times[loop].append(timed(loop)[0])
  lengths = {
    loop: LOOPS[loop] or trains["converted"].DEFAULT_LENGTHS for loop in LOOPS if loop != "flax"
  }
  return {"warm": times, "losses": losses, "batch_widths": widths, "eval_lengths": lengths}


def _run_child(mode: str, dirs: dict, repeats: int, lengths: str = "narrow") -> dict:
  command = [sys.executable, "-m", "benchmarks.bench_flax_sst2", "--child", mode]
  command += [
    json.dumps({role: str(path) for role, path in dirs.items()}),
    "--repeats",
    str(repeats),
    "--lengths",
    lengths,
  ]
  command += ["--coarse"] if "coarse" in LOOPS else []
  done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
  if done.returncode:
    raise RuntimeError(f"{mode}: {done.stderr[-3000:]}")
  return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--flax", default=os.environ.get("FLAX_DIR", MIRROR))
  parser.add_argument("--repeats", type=int, default=10)
  parser.add_argument("--cold-repeats", type=int, default=3)
  parser.add_argument(
    "--quick", action="store_true", help="one cold process per loop, 2 warm rounds"
  )
  parser.add_argument(
    "--lengths",
    choices=("narrow", "sst2"),
    default="narrow",
    help="the offline sentences' lengths (sentence_lengths): narrow (the default) or sst2-like",
  )
  parser.add_argument(
    "--coarse",
    action="store_true",
    help=f"a fourth loop: the conversion with EVAL_LENGTHS={COARSE}",
  )
  parser.add_argument("--child", nargs=2, metavar=("MODE", "DIRS"), help=argparse.SUPPRESS)
  args = parser.parse_args(argv)
  if args.coarse:
    LOOPS["coarse"] = COARSE
  if args.child:
    child = _child(args.child[0], json.loads(args.child[1]), args.repeats, args.lengths)
    print(json.dumps(child))
    return 0
  flax = pathlib.Path(args.flax)
  if not flax.exists():
    print(f"no Flax checkout at {flax}: pass --flax DIR (a google/flax checkout) or set FLAX_DIR")
    return 0
  if args.quick:
    args.repeats, args.cold_repeats = 2, 1
  with tempfile.TemporaryDirectory() as tmp:
    dirs = materialize(flax, pathlib.Path(tmp))
    colds: dict[str, list[dict]] = {loop: [] for loop in LOOPS}
    for _ in range(args.cold_repeats):  # interleaved fresh processes
      for loop in LOOPS:
        colds[loop].append(_run_child(loop, dirs, 0, args.lengths))
    warm = _run_child("warm", dirs, args.repeats, args.lengths)
  cold = {loop: statistics.median(r["cold"] for r in rs) for loop, rs in colds.items()}
  fastest = {loop: min(times) for loop, times in warm["warm"].items()}
  median = {loop: statistics.median(times) for loop, times in warm["warm"].items()}
  print(
    f"lengths {args.lengths}; batch widths of get_batches({BATCH_SIZE}): {warm['batch_widths']}"
  )
  print(
    "| loop | compilations (first call) | cold s (median) | cold / flax | warm s (min) | warm / flax "
    "| warm median / flax | loss |"
  )
  print("|---|---|---|---|---|---|---|---|")
  for loop in LOOPS:
    lengths = warm["eval_lengths"].get(loop)
    name = loop if lengths is None else f"{loop} (EVAL_LENGTHS={lengths})"
    compiles = sorted({r["compiles"] for r in colds[loop]})
    print(
      f"| {name} | {', '.join(map(str, compiles))} | {cold[loop]:.3f} | {cold[loop] / cold['flax']:.2f} | "
      f"{fastest[loop]:.4f} | {fastest[loop] / fastest['flax']:.2f} | "
      f"{median[loop] / median['flax']:.2f} | {warm['losses'][loop]:.6f} |"
    )
  return 0


if __name__ == "__main__":
  sys.exit(main())

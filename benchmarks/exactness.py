"""Exactness table: each approach's relative error against a float64 reference on the same inputs.

Every row is one way the common eval loop goes wrong; every column is one way to write it. All
approaches get the same float32 inputs; the reference is numpy float64 (or scikit-learn) on them.
Where a library cannot express a case the cell says why; where its code raises, the cell says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

import padded_eval as pe
from benchmarks import anchors
from benchmarks.common import (
  NOT_YET,
  Annotated,
  describe_failure,
  markdown_table,
  metric_class,
  naive_pmean_loop,
  padded_eval_value,
  relative_error_cell,
  seeded,
  split_rows,
)

COLUMNS = ("naive pmean loop", "flax nnx metrics", "clu.metrics", "metrax", "padded_eval")


@dataclasses.dataclass(frozen=True)
class Sizes:
  rows: int = 1000  # unequal final batch, NaN padding, macro F1 (batch 128 -> last 104)
  batch: int = 128
  classes: int = 10
  sequences: int = 256  # perplexity: sequences of length <= seq_len, vocab V
  seq_len: int = 64
  vocab: int = 1000
  chunk_log2: int = 24  # mean over 2**31 + 2**chunk_log2 values, built from one chunk
  std_rows: int = 100_000
  tail_updates: int = 1 << 20  # one-element updates after 2**24 elements
  real_loops_past_2_31: bool = True  # run the nnx / naive loops over all 2**31 values (~10 s)


FULL = Sizes()
QUICK = Sizes(
  sequences=64, vocab=200, std_rows=8_000, tail_updates=1 << 12, real_loops_past_2_31=False
)


def _cell(fn: Callable[[], object], module) -> object:
  """Runs one approach: ``not installed`` without its library, ``fails: ...`` if it raises."""
  if module is None:
    return anchors.NOT_INSTALLED
  try:
    return fn()
  except Exception as error:  # noqa: BLE001 - a library raising is a measured outcome
    return describe_failure(error)


def _merge_all(states):
  total = states[0]
  for s in states[1:]:
    total = total.merge(s)
  return total


def _nnx_run(metric, batches, **keys):
  for b in batches:
    metric.update(**{k: jnp.asarray(b[v]) for k, v in keys.items()})
  return metric.compute()


# --- 1. unequal final batch: accuracy over 1000 rows in batches of 128 -------------------------


def _classification_data(sizes: Sizes, seed: int):
  rng = seeded(seed)
  labels = rng.integers(0, sizes.classes, sizes.rows).astype(np.int32)
  logits = rng.normal(size=(sizes.rows, sizes.classes)).astype(np.float32)
  logits[np.arange(sizes.rows), labels] += rng.uniform(0, 2.5, sizes.rows).astype(np.float32)
  return {"logits": logits, "labels": labels}


def unequal_final_batch(sizes: Sizes) -> tuple[float, list]:
  data = _classification_data(sizes, 1)
  reference = float(np.mean(np.argmax(data["logits"], -1) == data["labels"]))
  raw = split_rows(data, sizes.batch)
  nnx, clu, metrax = anchors.load("flax"), anchors.load("clu"), anchors.load("metrax")
  cells = [
    naive_pmean_loop(lambda b: jnp.mean(jnp.argmax(b["logits"], -1) == b["labels"]), raw),
    _cell(lambda: _nnx_run(nnx.metrics.Accuracy(), raw, logits="logits", labels="labels"), nnx),
    _cell(
      lambda: _merge_all(
        [
          clu.Accuracy.from_model_output(
            logits=jnp.asarray(b["logits"]), labels=jnp.asarray(b["labels"])
          )
          for b in raw
        ]
      ).compute(),
      clu,
    ),
    _cell(
      lambda: _merge_all(
        [
          metrax.Accuracy.from_model_output(
            predictions=jnp.argmax(b["logits"], -1), labels=jnp.asarray(b["labels"])
          )
          for b in raw
        ]
      ).compute(),
      metrax,
    ),
    padded_eval_value(
      lambda _, b: pe.metrics.Accuracy().batch_updates(
        preds=b["logits"], target=b["labels"], mask=b["mask"]
      ),
      None,
      pe.pad_batches(data, sizes.batch),
      "accuracy",
    ),
  ]
  return reference, cells


# --- 2. NaN in padded rows: mean loss, padded rows hold NaN, mask given -------------------------


def nan_in_padded_rows(sizes: Sizes) -> tuple[float, list]:
  values = seeded(2).exponential(size=sizes.rows).astype(np.float32)
  reference = float(np.mean(values.astype(np.float64)))
  padded = list(pe.pad_batches({"loss": values}, sizes.batch, pad_value=np.nan))
  nnx, clu, metrax = anchors.load("flax"), anchors.load("clu"), anchors.load("metrax")

  def masked_mean(b):  # the usual masked mean: multiply by the mask
    m = b["mask"].astype(jnp.float32)
    return jnp.sum(b["loss"] * m) / jnp.sum(m)

  cells = [
    naive_pmean_loop(masked_mean, padded),
    _cell(lambda: _nnx_run(nnx.metrics.Average("loss"), padded, loss="loss", mask="mask"), nnx),
    _cell(
      lambda: _merge_all(
        [
          clu.Average.from_model_output(jnp.asarray(b["loss"]), mask=jnp.asarray(b["mask"]))
          for b in padded
        ]
      ).compute(),
      clu,
    ),
    _cell(
      lambda: _merge_all(
        [
          metrax.Average.from_model_output(
            jnp.asarray(b["loss"]), sample_weights=jnp.asarray(b["mask"], jnp.float32)
          )
          for b in padded
        ]
      ).compute(),
      metrax,
    ),
    padded_eval_value(
      lambda _, b: pe.metrics.Mean("loss").batch_updates(loss=b["loss"], mask=b["mask"]),
      None,
      padded,
      "mean",
    ),
  ]
  return reference, cells


# --- 3. macro F1 over batches -------------------------------------------------------------------


def _macro_f1_jnp(preds, labels, mask, classes):
  real = mask.astype(jnp.float32)[:, None]
  p, t = jax.nn.one_hot(preds, classes) * real, jax.nn.one_hot(labels, classes) * real
  tp, fp, fn = jnp.sum(p * t, 0), jnp.sum(p * (1 - t), 0), jnp.sum((1 - p) * t, 0)
  denominator = 2 * tp + fp + fn
  return jnp.mean(jnp.where(denominator > 0, 2 * tp / jnp.maximum(denominator, 1), 0.0))


def macro_f1(sizes: Sizes) -> tuple[float, list]:
  from sklearn.metrics import f1_score

  data = _classification_data(sizes, 3)
  preds = np.argmax(data["logits"], -1).astype(np.int32)
  reference = float(f1_score(data["labels"], preds, average="macro", zero_division=0))
  padded = list(pe.pad_batches({"preds": preds, "labels": data["labels"]}, sizes.batch))
  metrax = anchors.load("metrax")
  c = sizes.classes

  def metrax_f1():  # one-vs-rest columns give per-class F1; macro = their mean
    states = [
      metrax.FBetaScore.from_model_output(
        jax.nn.one_hot(b["preds"], c), jax.nn.one_hot(b["labels"], c), beta=1.0
      )
      for b in padded
    ]
    return jnp.mean(_merge_all(states).compute())

  f1_class = metric_class("F1Score")
  cells = [
    naive_pmean_loop(lambda b: _macro_f1_jnp(b["preds"], b["labels"], b["mask"], c), padded),
    "n/a: no F1 in nnx.metrics" if anchors.load("flax") else anchors.NOT_INSTALLED,
    (
      "n/a: no F1 (only CollectingMetric: all N rows to host)"
      if anchors.load("clu")
      else anchors.NOT_INSTALLED
    ),
    _cell(metrax_f1, metrax),
    NOT_YET + " (F1Score)"
    if f1_class is None
    else padded_eval_value(
      lambda _, b: f1_class(task="multiclass", num_classes=c, average="macro").batch_updates(
        preds=b["preds"], target=b["labels"], mask=b["mask"]
      ),
      None,
      padded,
      "f1score",
    ),
  ]
  return reference, cells


# --- 4. token-weighted perplexity, sequences of varying length ----------------------------------


def perplexity(sizes: Sizes) -> tuple[float, list]:
  rng = seeded(4)
  n, t, v = sizes.sequences, sizes.seq_len, sizes.vocab
  logits = (rng.normal(size=(n, t, v)) * 2).astype(np.float32)
  targets = rng.integers(0, v, (n, t)).astype(np.int32)
  lengths = rng.integers(1, t + 1, n)
  tokens = np.arange(t)[None, :] < lengths[:, None]
  logits64 = logits.astype(np.float64)
  shifted = logits64 - logits64.max(-1, keepdims=True)
  ce64 = (
    np.log(np.exp(shifted).sum(-1)) - np.take_along_axis(shifted, targets[..., None], -1)[..., 0]
  )
  reference = float(np.exp(ce64[tokens].mean()))
  batch = sizes.batch // 4
  padded = list(pe.pad_batches({"logits": logits, "targets": targets, "tokens": tokens}, batch))
  nnx, clu, metrax = anchors.load("flax"), anchors.load("clu"), anchors.load("metrax")

  def token_ce(b):
    lp = jax.nn.log_softmax(jnp.asarray(b["logits"]), -1)
    return -jnp.take_along_axis(lp, jnp.asarray(b["targets"])[..., None], -1)[..., 0]

  def real_tokens(b):
    return jnp.asarray(b["tokens"]) & jnp.asarray(b["mask"])[:, None]

  def naive_device(b):
    m = real_tokens(b).astype(jnp.float32)
    return jnp.sum(token_ce(b) * m) / jnp.sum(m)

  def nnx_run():
    metric = nnx.metrics.Average("ce")
    for b in padded:
      metric.update(ce=token_ce(b), mask=real_tokens(b))
    return jnp.exp(metric.compute())

  perplexity_class = metric_class("Perplexity")
  cells = [
    float(np.exp(naive_pmean_loop(naive_device, padded))),
    _cell(nnx_run, nnx),
    _cell(
      lambda: jnp.exp(
        _merge_all(
          [clu.Average.from_model_output(token_ce(b), mask=real_tokens(b)) for b in padded]
        ).compute()
      ),
      clu,
    ),
    _cell(
      lambda: _merge_all(
        [
          metrax.Perplexity.from_model_output(
            jnp.asarray(b["logits"]),
            jnp.asarray(b["targets"]),
            sample_weights=real_tokens(b).astype(jnp.float32),
            from_logits=True,
          )
          for b in padded
        ]
      ).compute(),
      metrax,
    ),
    NOT_YET + " (Perplexity)"
    if perplexity_class is None
    else padded_eval_value(
      lambda _, b: perplexity_class().batch_updates(
        preds=b["logits"], target=b["targets"], mask=b["tokens"] & b["mask"][:, None]
      ),
      None,
      padded,
      "perplexity",
    ),
  ]
  return reference, cells


# --- 5. a mean over 2**31 + 2**k values (one real chunk, its states merged) ---------------------


def _doubled(state, doublings: int):
  """``state`` merged with itself ``doublings`` times: the library's own merge, 2**doublings copies."""
  for _ in range(doublings):
    state = state.merge(state)
  return state


def mean_past_2_31(sizes: Sizes) -> tuple[float, list]:
  k = sizes.chunk_log2
  chunk = seeded(5).uniform(0, 6, 1 << k).astype(np.float32)
  reference = float(np.mean(chunk.astype(np.float64)))
  copies = (1 << (31 - k)) + 1  # 2**31 + 2**k values in all
  doublings = 31 - k
  device_chunk = jnp.asarray(chunk)
  nnx, clu, metrax = anchors.load("flax"), anchors.load("clu"), anchors.load("metrax")

  def nnx_run():  # nnx metrics have no merge: real updates, 2**k values each
    metric = nnx.metrics.Average()
    for _ in range(copies):
      metric.update(values=device_chunk)
    return metric.compute()

  def by_merging(first):
    return _doubled(first, doublings).merge(first).compute()

  skipped = "skipped in --quick (2**31 real updates)"
  cells = [
    naive_pmean_loop(lambda b: jnp.mean(b["x"]), ({"x": chunk} for _ in range(copies)))
    if sizes.real_loops_past_2_31
    else skipped,
    _cell(nnx_run if sizes.real_loops_past_2_31 else lambda: skipped, nnx),
    _cell(lambda: by_merging(clu.Average.from_model_output(device_chunk)), clu),
    _cell(lambda: by_merging(metrax.Average.from_model_output(device_chunk)), metrax),
    float(by_merging(pe.metrics.Mean().batch_updates(values=device_chunk))),
  ]
  return reference, cells


# --- 6. Std of data with mean 1e4 and std 1 -----------------------------------------------------


def _clu_std(clu, batches):
  """clu's Std; if its compute() raises on this jax, its own formula on its own merged state."""
  state = _merge_all([clu.Std.from_model_output(jnp.asarray(b["x"])) for b in batches])
  try:
    return state.compute()
  except Exception as error:  # noqa: BLE001 - clu 0.0.12 calls jnp.clip(a_min=...), gone in jax 0.10
    mean = state.total / state.count
    variance = jnp.maximum(state.sum_of_squares / state.count - mean**2, 0.0)
    return Annotated(
      float(variance**0.5), f"{describe_failure(error)}; its formula on its state gives"
    )


def std_large_mean(sizes: Sizes) -> tuple[float, list]:
  values = (1e4 + seeded(6).normal(size=sizes.std_rows)).astype(np.float32)
  reference = float(np.std(values.astype(np.float64)))
  batches = split_rows({"x": values}, 1000)
  nnx, clu = anchors.load("flax"), anchors.load("clu")

  def nnx_run():
    metric = nnx.metrics.Welford()
    for b in batches:
      metric.update(values=jnp.asarray(b["x"]))
    return metric.compute().standard_deviation

  std_class = metric_class("Std")
  padded = list(pe.pad_batches({"x": values}, 1000))
  cells = [
    naive_pmean_loop(lambda b: jnp.std(b["x"]), batches),
    _cell(nnx_run, nnx),
    _cell(lambda: _clu_std(clu, batches), clu),
    "n/a: no Std in metrax" if anchors.load("metrax") else anchors.NOT_INSTALLED,
    NOT_YET + " (Std)"
    if std_class is None
    else padded_eval_value(
      lambda _, b: std_class().batch_updates(values=b["x"], preds=b["x"], mask=b["mask"]),
      None,
      padded,
      "std",
    ),
  ]
  return reference, cells


# --- 7. one-element updates past 2**24 ----------------------------------------------------------


def _scan_updates(state, update: Callable, count: int):
  """``count`` one-element updates of 1.0 applied with ``update(state, x[1])`` in a jitted scan."""

  @jax.jit
  def run(state, xs):
    return jax.lax.scan(lambda s, x: (update(s, x), None), state, xs)[0]

  return run(state, jnp.ones((count, 1), jnp.float32))


def one_element_updates(sizes: Sizes) -> tuple[float, list]:
  base, tail = 1 << 24, sizes.tail_updates
  reference = tail / (base + tail)
  zeros = jnp.zeros((base,), jnp.float32)
  nnx, clu, metrax = anchors.load("flax"), anchors.load("clu"), anchors.load("metrax")

  def nnx_run():
    from flax import nnx as nnx_module

    metric = nnx.metrics.Average()
    metric.update(values=zeros)
    graphdef, state = nnx_module.split(metric)

    def update(state, x):
      m = nnx_module.merge(graphdef, state)
      m.update(values=x)
      return nnx_module.split(m)[1]

    return nnx_module.merge(graphdef, _scan_updates(state, update, tail)).compute()

  def merged(cls, **kw):
    return _scan_updates(
      cls.from_model_output(zeros, **kw), lambda s, x: s.merge(cls.from_model_output(x, **kw)), tail
    ).compute()

  cells = [
    f"n/a: a 1-row batch cannot split over {jax.local_device_count()} devices",
    _cell(nnx_run, nnx),
    _cell(lambda: merged(clu.Average), clu),
    _cell(lambda: merged(metrax.Average), metrax),
    float(
      _scan_updates(
        pe.metrics.Mean().batch_updates(values=zeros), lambda m, x: m.update(values=x), tail
      ).compute()
    ),
  ]
  return reference, cells


CASES = (
  ("unequal final batch (accuracy, 1000 rows, batch 128)", unequal_final_batch),
  ("NaN in padded rows (mean loss, mask given)", nan_in_padded_rows),
  ("macro F1 over batches (10 classes)", macro_f1),
  ("token-weighted perplexity, varying lengths", perplexity),
  ("mean over 2**31 + 2**24 values", mean_past_2_31),
  ("Std, mean 1e4, std 1", std_large_mean),
  ("one-element updates past 2**24 (mean)", one_element_updates),
)


HOW_COLUMNS_RUN = """How each column runs (the same float32 inputs everywhere):
- naive pmean loop: `pmap` of the per-device batch value (a mask, when the case has one, is
  multiplied in), `lax.pmean` over devices, mean over steps: the loop from the seed issue.
- flax nnx / clu.metrics / metrax: the library's own metric classes, updated or merged once per
  batch (unpadded batches where padding is not the point of the case; padded batches with the
  mask passed as `mask=` / `sample_weights=` where it is); perplexity for nnx and clu is `exp`
  of their token-masked `Average` of the cross entropy, as their users write it.
- padded_eval: `pe.masked_eval(step_fn, params, pe.pad_batches(...), backend="pmap")` over 8
  devices; in the three count cases, the metric's own `batch_updates` / `merge` / `update`.
- Cases past 2**31 and 2**24 feed every library through its real code path, cheaply: one real
  chunk of 2**24 values whose state is merged with itself (the library's `merge`; nnx has none,
  so it runs 129 real updates of 2**24 values, as does the naive loop), and the 2**24 + M
  one-element updates run as M real one-element updates in a jitted `lax.scan` after a state
  holding 2**24 zeros.
"""


def run(quick: bool, log=print) -> tuple[str, dict]:
  """Runs every case; returns (the exactness table as Markdown, {(case, column): cell value})."""
  sizes = QUICK if quick else FULL
  rows, values = [], {}
  for title, case in CASES:
    log(f"exactness: {title}")
    reference, cells = case(sizes)
    for column, cell in zip(COLUMNS, cells):
      values[(title, column)] = (cell, reference)
    rows.append([title, f"{reference:.6g}"] + [relative_error_cell(c, reference) for c in cells])
  notes = (
    f"\nSizes: {dataclasses.asdict(sizes)}. Cells: relative error |x - ref| / |ref| "
    "(value shown when above 1e-3).\n\n" + HOW_COLUMNS_RUN
  )
  return markdown_table(["case", "float64 reference"] + list(COLUMNS), rows) + "\n" + notes, values

"""Rows of the metric table for the text metrics (BLEU, ROUGE, WER, exact match).

Imported at the end of ``tests/metric_cases.py``; appends :data:`TEXT_CASES` to its ``CASES``. The references are the packages themselves on the same ids written as
words (pad ids removed): sacrebleu (``tokenize="none"``, ``score / 100``; an all-padding
reference is ``None``, absent), Google's rouge-score (a whitespace tokenizer;
``score_multi`` for several references) and jiwer; exact match is string equality.
"""

from __future__ import annotations

import jiwer
import numpy as np
import sacrebleu
from metric_cases import CASES, MetricCase, padded_batches, real
from rouge_score import rouge_scorer

import padded_eval as pe


def words(ids, pad_id: int = 0) -> str:
  """The sentence of a row of ids, pad ids removed: ``[5, 0, 6] -> "5 6"``."""
  return " ".join(str(int(t)) for t in np.asarray(ids).reshape(-1) if t != pad_id)


def reference_streams(target: np.ndarray, pad_id: int = 0) -> list[list[str | None]]:
  """sacrebleu's reference streams of a ``[N, S]`` or ``[N, R, S]`` target: an all-padding
  reference is None (absent), unless every reference of the row is (then one ``""``)."""
  target = target[:, None, :] if target.ndim == 2 else target
  streams = [[words(row[r], pad_id) or None for row in target] for r in range(target.shape[1])]
  for i in range(len(target)):
    if all(stream[i] is None for stream in streams):
      streams[0][i] = ""
  return streams


def sentences(rng, shape, length, vocab=5, pad_id=0, gaps=True):
  """int32 ``shape + [length]``: ids in ``1..vocab - 1`` (shifted past ``pad_id``), a random
  real length per sentence (0 included), padding after it and, with ``gaps``, a few pad
  ids inside it."""
  ids = rng.integers(1, vocab, size=shape + (length,))
  ids = np.where(ids == pad_id, vocab, ids)
  lengths = rng.integers(0, length + 1, size=shape)
  inside = np.arange(length) < lengths[..., None]
  if gaps:
    inside &= rng.random(ids.shape) > 0.1
  return np.where(inside, ids, pad_id).astype(np.int32)


def text_fields(refs=3, hyp_len=10, ref_len=9, vocab=5, pad_id=0, copies=0.3):
  """``data`` for :func:`padded_batches`: ``preds [B, hyp_len]``, ``target [B, refs, ref_len]``
  (``[B, ref_len]`` for ``refs=None``); about ``copies`` of the hypotheses copy a reference."""

  def fields(rng, b):
    shape = (b,) if refs is None else (b, refs)
    target = sentences(rng, shape, ref_len, vocab, pad_id)
    preds = sentences(rng, (b,), hyp_len, vocab, pad_id)
    first = target if refs is None else target[:, 0]
    width = min(hyp_len, ref_len)
    copied = np.full_like(preds, pad_id)
    copied[:, :width] = first[:, :width]
    copy = rng.random(b) < copies
    return {"preds": np.where(copy[:, None], copied, preds), "target": target}

  return fields


def _bleu(batches, pad_id=0, max_order=4, smooth=False):
  hyps = [words(row, pad_id) for row in real(batches, "preds")]
  refs = reference_streams(real(batches, "target"), pad_id)
  method = {"smooth_method": "add-k", "smooth_value": 1} if smooth else {"smooth_method": "none"}
  bleu = sacrebleu.metrics.BLEU(tokenize="none", max_ngram_order=max_order, **method)
  return bleu.corpus_score(hyps, refs).score / 100


class _Whitespace:
  def tokenize(self, text):
    return text.split()


def _rouge(batches, key):
  scorer = rouge_scorer.RougeScorer([key], tokenizer=_Whitespace())
  target = real(batches, "target")
  target = target[:, None, :] if target.ndim == 2 else target
  scores = [
    scorer.score_multi([words(r) for r in refs], words(hyp))[key].fmeasure
    for hyp, refs in zip(real(batches, "preds"), target)
  ]
  return np.mean(scores)


def _wer(batches):
  refs = [words(row) for row in real(batches, "target")]
  hyps = [words(row) for row in real(batches, "preds")]
  return jiwer.wer(refs, hyps)


def _exact_match(batches):
  streams = reference_streams(real(batches, "target"))
  hyps = [words(row) for row in real(batches, "preds")]
  return np.mean([any(hyp == s[i] for s in streams) for i, hyp in enumerate(hyps)])


def _nonempty_refs(fields):
  """``fields`` with every empty reference given one id (jiwer refuses empty references)."""

  def fixed(rng, b):
    out = fields(rng, b)
    target = out["target"]
    out["target"] = np.where(np.any(target != 0, -1, keepdims=True), target, 3).astype(np.int32)
    return out

  return fixed


BLEU_RTOL = ROUGE_RTOL = 1e-5
COUNT_RTOL = 1e-6

TEXT_CASES = [
  MetricCase(
    "bleu_three_refs",
    lambda: pe.metrics.BLEU(),
    lambda rng: padded_batches(rng, text_fields(vocab=4)),
    _bleu,
    rtol=BLEU_RTOL,
    atol=0.0,
  ),
  MetricCase(
    "bleu_smooth_one_ref_pad_7",
    lambda: pe.metrics.BLEU(smooth=True, pad_id=7),
    lambda rng: padded_batches(rng, text_fields(refs=None, hyp_len=11, vocab=6, pad_id=7)),
    lambda bs: _bleu(bs, pad_id=7, smooth=True),
    rtol=BLEU_RTOL,
    atol=0.0,
  ),
  MetricCase(
    "bleu_order2",
    lambda: pe.metrics.BLEU(max_order=2),
    lambda rng: padded_batches(rng, text_fields(refs=2, vocab=8)),
    lambda bs: _bleu(bs, max_order=2),
    rtol=BLEU_RTOL,
    atol=0.0,
  ),
  MetricCase(
    "rouge1_three_refs",
    lambda: pe.metrics.RougeN(1),
    lambda rng: padded_batches(rng, text_fields(vocab=8)),
    lambda bs: _rouge(bs, "rouge1"),
    rtol=ROUGE_RTOL,
    atol=0.0,
  ),
  MetricCase(
    "rouge2_one_ref",
    lambda: pe.metrics.RougeN(2),
    lambda rng: padded_batches(rng, text_fields(refs=None, vocab=4)),
    lambda bs: _rouge(bs, "rouge2"),
    rtol=ROUGE_RTOL,
    atol=0.0,
  ),
  MetricCase(
    "rougeL_two_refs",
    lambda: pe.metrics.RougeL(),
    lambda rng: padded_batches(rng, text_fields(refs=2, hyp_len=12, vocab=6)),
    lambda bs: _rouge(bs, "rougeL"),
    rtol=ROUGE_RTOL,
    atol=0.0,
  ),
  MetricCase(
    "wer",
    lambda: pe.metrics.WordErrorRate(),
    lambda rng: padded_batches(rng, _nonempty_refs(text_fields(refs=None, hyp_len=12, vocab=6))),
    _wer,
    rtol=COUNT_RTOL,
    atol=0.0,
  ),
  MetricCase(
    "exact_match_two_refs",
    lambda: pe.metrics.ExactMatch(),
    lambda rng: padded_batches(rng, text_fields(refs=2, hyp_len=9, copies=0.5)),
    _exact_match,
    rtol=COUNT_RTOL,
    atol=0.0,
  ),
]

CASES.extend(TEXT_CASES)

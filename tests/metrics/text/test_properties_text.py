"""Property suite, text metrics: BLEU, RougeN, RougeL, WordErrorRate, ExactMatch.

Random sentences (lengths from 0, pad ids inside sentences, 1 to 3 references, some all
padding) go through a random padded batching, merge tree and device count
(``metric_checks.evaluate_randomly``; padded rows hold random ids, negative and huge
included) and are compared with the reference packages on the same ids written as words.

Tolerances: BLEU's and WER's statistics are exact integer counts, so only ``compute()``'s
float32 arithmetic rounds (a few ``EPS = 2**-24`` relative: divisions, logs, one exp):
``rtol = 1e-5`` for BLEU (logs of precisions near 1 amplify), 1e-6 for WER and exact
match. ROUGE averages float32 per-row F-measures (one rounding each) summed in float32
within a batch of at most 16 rows and exactly across batches: ``rtol = 1e-5``.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from metric_cases_text import _bleu, _exact_match, _rouge, _wer, sentences
from metric_checks import assert_close, evaluate_randomly

import padded_eval as pe

SEEDS = st.integers(0, 2**32 - 1)
ROWS = st.integers(1, 40)
REFS = st.sampled_from([None, 1, 2, 3])


def _data(rng, n, refs, vocab, copies=0.3, hyp_len=9, ref_len=8):
  preds = sentences(rng, (n,), hyp_len, vocab)
  target = sentences(rng, (n,) if refs is None else (n, refs), ref_len, vocab)
  first = target if refs is None else target[:, 0]
  copy = rng.random(n) < copies
  preds[copy, :ref_len] = first[copy]
  preds[copy, ref_len:] = 0
  return {"preds": preds, "target": target}


def _as_batch(fields):
  return [{**fields, "mask": np.ones(len(fields["preds"]), bool)}]


@given(
  seed=SEEDS,
  n=ROWS,
  refs=REFS,
  vocab=st.integers(2, 6),
  max_order=st.integers(1, 4),
  smooth=st.booleans(),
)
def test_bleu_equals_sacrebleu(seed, n, refs, vocab, max_order, smooth):
  rng = np.random.default_rng(seed)
  fields = _data(rng, n, refs, vocab)
  metric = pe.metrics.BLEU(max_order=max_order, smooth=smooth)
  got = evaluate_randomly(metric, fields, rng)
  expected = _bleu(_as_batch(fields), max_order=max_order, smooth=smooth)
  assert_close(got, expected, rtol=1e-5, atol=1e-7, what=f"BLEU {metric}")


@given(seed=SEEDS, n=ROWS, refs=REFS, vocab=st.integers(2, 8), order=st.sampled_from([1, 2, 3, 0]))
def test_rouge_equals_rouge_score(seed, n, refs, vocab, order):
  rng = np.random.default_rng(seed)
  fields = _data(rng, n, refs, vocab)
  metric = pe.metrics.RougeL() if order == 0 else pe.metrics.RougeN(order)
  got = evaluate_randomly(metric, fields, rng)
  expected = _rouge(_as_batch(fields), "rougeL" if order == 0 else f"rouge{order}")
  assert_close(got, expected, rtol=1e-5, atol=1e-7, what=f"{metric}")


@given(seed=SEEDS, n=ROWS, vocab=st.integers(2, 8), hyp_len=st.integers(1, 12))
def test_word_error_rate_equals_jiwer(seed, n, vocab, hyp_len):
  rng = np.random.default_rng(seed)
  fields = _data(rng, n, None, vocab, hyp_len=max(hyp_len, 8))
  target = fields["target"]  # jiwer refuses empty references
  fields["target"] = np.where(np.any(target != 0, -1, keepdims=True), target, 1).astype(np.int32)
  got = evaluate_randomly(pe.metrics.WordErrorRate(), fields, rng)
  assert_close(got, _wer(_as_batch(fields)), rtol=1e-6, atol=0.0, what="WER")


@given(seed=SEEDS, n=ROWS, refs=REFS, vocab=st.integers(2, 4))
def test_exact_match_equals_string_equality(seed, n, refs, vocab):
  rng = np.random.default_rng(seed)
  fields = _data(rng, n, refs, vocab, copies=0.5)
  got = evaluate_randomly(pe.metrics.ExactMatch(), fields, rng)
  assert_close(got, _exact_match(_as_batch(fields)), rtol=1e-6, atol=0.0, what="ExactMatch")

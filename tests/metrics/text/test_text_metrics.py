"""Text metrics on token ids (BLEU, RougeN, RougeL, WordErrorRate, ExactMatch) end to end.

The generic protocol grid runs them through ``tests/metric_cases_text.py``; here:
``masked_eval`` on every backend (one trace) against sacrebleu, rouge-score and jiwer on a
dataset whose size divides neither the batch nor the device count, ids of any size, the
invalid counts, and the input errors.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
import sacrebleu
from metric_cases_text import _bleu, _exact_match, _rouge, _wer, sentences, words

import padded_eval as pe

BACKENDS = ("pmap", "shard_map", "jit")
NUM_ROWS, BATCH = 203, 24  # 203 = 8 * 24 + 11: divides neither the batch nor 8 devices
# Ids as a tokenizer might give them: large, sparse, 0 the pad id.
ID_TABLE = np.array([0, 2**31 - 1, 123_456_789, 7, 65_536, 31_999], np.int32)


def _dataset(rng):
  preds = ID_TABLE[sentences(rng, (NUM_ROWS,), 20, vocab=6)]
  refs = ID_TABLE[sentences(rng, (NUM_ROWS, 3), 18, vocab=6)]
  copy = rng.random(NUM_ROWS) < 0.3
  preds[copy, :18] = refs[copy, 0]
  preds[copy, 18:] = 0
  refs[:, 0] = np.where(np.any(refs[:, 0] != 0, -1, keepdims=True), refs[:, 0], 7)
  return {"preds": preds, "target": refs, "reference": refs[:, 0].copy()}


def _garbage_batches(data, rng):
  batches = []
  for start in range(0, NUM_ROWS, BATCH):
    real = min(BATCH, NUM_ROWS - start)
    batch = {"mask": np.arange(BATCH) < real}
    for key, value in data.items():
      garbage = rng.integers(-(2**31), 2**31 - 1, (BATCH - real,) + value.shape[1:])
      batch[key] = np.concatenate([value[start : start + real], garbage.astype(np.int32)])
    batches.append(batch)
  return batches


def _collection():
  return pe.Metrics(
    {
      "bleu": pe.metrics.BLEU(),
      "bleu_smooth": pe.metrics.BLEU(smooth=True),
      "rouge1": pe.metrics.RougeN(1),
      "rouge2": pe.metrics.RougeN(2),
      "rougeL": pe.metrics.RougeL(),
      "exact_match": pe.metrics.ExactMatch(),
      "wer": pe.metrics.WordErrorRate().map_arg(target="reference"),
    }
  )


def _references(data):
  whole = [{**data, "mask": np.ones(NUM_ROWS, bool)}]
  one_ref = [{"preds": data["preds"], "target": data["reference"], "mask": whole[0]["mask"]}]
  return {
    "bleu": _bleu(whole),
    "bleu_smooth": _bleu(whole, smooth=True),
    "rouge1": _rouge(whole, "rouge1"),
    "rouge2": _rouge(whole, "rouge2"),
    "rougeL": _rouge(whole, "rougeL"),
    "exact_match": _exact_match(whole),
    "wer": _wer(one_ref),
  }


@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_eval_equals_the_reference_packages_in_one_trace(backend):
  rng = np.random.default_rng(29)
  data = _dataset(rng)
  traces = []

  def step_fn(params, batch):
    traces.append(batch["preds"].shape)
    preds = batch["preds"] + params["offset"]  # stands for the decoding
    return _collection().batch_updates(
      preds=preds, target=batch["target"], reference=batch["reference"], mask=batch["mask"]
    )

  result = pe.masked_eval(
    step_fn, {"offset": np.int32(0)}, _garbage_batches(data, rng), backend=backend
  )
  assert len(traces) == 1, traces
  assert result["num_examples"] == NUM_ROWS
  expected = _references(data)
  assert 0.05 < expected["bleu"] < 0.95 and 0.0 < expected["exact_match"] < 1.0  # not trivial
  for key, want in expected.items():
    rtol = 1e-6 if key in ("wer", "exact_match") else 1e-5
    np.testing.assert_allclose(result[key], want, rtol=rtol, err_msg=f"{backend} {key}")
  assert result.metric.invalid_report() == []


def test_out_of_range_ids_and_rows_without_reference_are_counted():
  rng = np.random.default_rng(3)
  preds = sentences(rng, (16,), 8, vocab=9)
  target = sentences(rng, (16, 2), 8, vocab=9)
  preds[1, 2], preds[4, 0], target[5, 1, 3] = -4, 10, 2**31 - 1  # out of range for vocab 10
  target[6] = 0  # a row with no reference at all
  mask = np.arange(16) < 12
  preds[12:], target[12:] = -7, 99  # padded rows: garbage, not counted
  bad = lambda x: int(np.sum(((x < 0) | (x >= 10))[mask]))
  expected_bad = bad(preds) + bad(target)
  assert expected_bad == 3
  update = jax.jit(lambda m, b: m.update(**b))
  batch = {"preds": preds, "target": target, "mask": mask}
  for metric in (pe.metrics.BLEU(vocab_size=10), pe.metrics.RougeN(2, vocab_size=10)):
    counts = update(metric, batch).invalid_counts()
    assert counts["token id out of range"] == expected_bad, metric
  no_reference = int(np.sum(np.all(target == 0, axis=(1, 2))[mask]))
  assert no_reference >= 1  # row 6
  bleu = update(pe.metrics.BLEU(vocab_size=10), batch)
  assert bleu.invalid_counts()["row without a reference"] == no_reference
  without_vocab = update(pe.metrics.ExactMatch(), batch).invalid_counts()
  assert without_vocab == {"token id out of range": 1}  # only the negative id
  one_ref = {**batch, "target": target[:, 0]}
  assert update(pe.metrics.WordErrorRate(vocab_size=10), one_ref).invalid_counts() == {
    "token id out of range": bad(preds) + bad(target[:, 0])
  }


def test_row_without_reference_scores_like_sacrebleu_with_an_empty_one():
  rng = np.random.default_rng(5)
  preds, target = sentences(rng, (9,), 10, vocab=4), sentences(rng, (9, 2), 10, vocab=4)
  target[2] = 0
  batch = {"preds": preds, "target": target, "mask": np.ones(9, bool)}
  got = float(pe.metrics.BLEU(max_order=2).update(**batch).compute())
  np.testing.assert_allclose(got, _bleu([batch], max_order=2), rtol=1e-5)


def test_an_all_padding_reference_is_sacrebleus_none_not_an_empty_string():
  # the hypothesis "5" against "5 6 7" and an all-padding reference: sacrebleu keeps an empty
  # string "" as a reference of length 0 (the closest length: no brevity penalty), and drops
  # None; the docstring's rule is None's
  preds = np.array([[5, 0, 0]], np.int32)
  target = np.array([[[5, 6, 7], [0, 0, 0]]], np.int32)
  got = float(pe.metrics.BLEU(max_order=1).update(preds=preds, target=target).compute())
  bleu = sacrebleu.metrics.BLEU(tokenize="none", max_ngram_order=1, smooth_method="none")
  absent = bleu.corpus_score(["5"], [["5 6 7"], [None]]).score / 100
  empty = bleu.corpus_score(["5"], [["5 6 7"], [""]]).score / 100
  np.testing.assert_allclose(got, absent, rtol=1e-6)
  assert abs(got - empty) > 0.5


def test_pad_inside_a_sentence_is_removed_like_a_detokenizer_would():
  preds = np.array([[5, 0, 6, 7, 0, 8]], np.int32)
  target = np.array([[5, 6, 7, 8]], np.int32)
  assert words(preds) == words(target)
  batch = {"preds": preds, "target": target}
  assert float(pe.metrics.BLEU().update(**batch).compute()) == 1.0
  assert float(pe.metrics.WordErrorRate().update(**batch).compute()) == 0.0
  assert float(pe.metrics.ExactMatch().update(**batch).compute()) == 1.0


def test_nothing_seen_is_nan():
  batch = {"preds": np.ones((8, 4), np.int32), "target": np.ones((8, 4), np.int32)}
  batch["mask"] = np.zeros(8, bool)
  for metric in (
    pe.metrics.BLEU(),
    pe.metrics.RougeN(1),
    pe.metrics.RougeL(),
    pe.metrics.WordErrorRate(),
    pe.metrics.ExactMatch(),
  ):
    assert np.isnan(float(metric.update(**batch).compute())), metric


@pytest.mark.parametrize(
  "metric, kwargs, match",
  [
    (pe.metrics.BLEU(), {"preds": np.zeros((4, 5), np.float32)}, "preds must hold int"),
    (pe.metrics.BLEU(), {"preds": np.zeros((4, 5, 2), np.int32)}, r"preds has shape \(4, 5, 2\)"),
    (pe.metrics.RougeN(1), {"target": np.zeros((4, 2, 3, 5), np.int32)}, "target has shape"),
    (pe.metrics.RougeL(), {"target": np.zeros((3, 5), np.int32)}, "with B = 4"),
    (pe.metrics.WordErrorRate(), {"target": np.zeros((4, 2, 5), np.int32)}, "one reference"),
    (pe.metrics.ExactMatch(), {"mask": np.ones((4, 5), bool)}, r"mask has shape \(4, 5\)"),
    (pe.metrics.ExactMatch(), {"mask": np.ones(4, np.int32)}, "mask must be a bool"),
  ],
)
def test_bad_inputs_raise_naming_the_argument(metric, kwargs, match):
  batch = {"preds": np.zeros((4, 5), np.int32), "target": np.zeros((4, 5), np.int32), **kwargs}
  with pytest.raises(ValueError, match=match):
    metric.update(**batch)
  with pytest.raises(ValueError, match=match):
    jax.jit(lambda m, b: m.update(**b))(metric, batch)


@pytest.mark.parametrize(
  "make, match",
  [
    (lambda: pe.metrics.BLEU(max_order=0), "max_order must be a positive int"),
    (lambda: pe.metrics.BLEU(smooth=1), "smooth must be True or False"),
    (lambda: pe.metrics.BLEU(pad_id="0"), "pad_id must be an int"),
    (lambda: pe.metrics.RougeN(0), "n must be a positive int"),
    (lambda: pe.metrics.RougeL(vocab_size=0), "vocab_size must be a positive int or None"),
    (lambda: pe.metrics.WordErrorRate(pad_id=True), "pad_id must be an int"),
    (
      lambda: pe.metrics.BLEU(pad_id=2**40),
      r"pad_id must be an int token id in int32.*1099511627776",
    ),
    (lambda: pe.metrics.RougeL(pad_id=-(2**31) - 1), r"pad_id must be an int token id in int32"),
  ],
)
def test_bad_configuration_raises(make, match):
  with pytest.raises(ValueError, match=match):
    make()


def test_higher_is_better():
  assert pe.metrics.BLEU.higher_is_better and pe.metrics.RougeN(1).higher_is_better
  assert pe.metrics.RougeL.higher_is_better and pe.metrics.ExactMatch.higher_is_better
  assert pe.metrics.WordErrorRate.higher_is_better is False


@pytest.mark.parametrize(
  "module", [pe.metrics.text.ngrams, pe.metrics.text.edit_distance, pe.metrics.text.token_sequences]
)
def test_docstring_examples(module):
  import doctest

  result = doctest.testmod(module)
  assert result.failed == 0 and (module is pe.metrics.text.token_sequences or result.attempted > 0)


def test_weights_are_refused_so_a_bootstrap_resamples_rows_through_the_mask():
  rng = np.random.default_rng(11)
  preds, target = sentences(rng, (24,), 8, vocab=4), sentences(rng, (24,), 8, vocab=4)
  preds[:8] = target[:8]  # some exact matches
  batch = {"preds": preds, "target": target, "mask": np.arange(24) < 21}
  for make in (
    lambda: pe.metrics.BLEU(max_order=1),
    lambda: pe.metrics.RougeN(1),
    pe.metrics.RougeL,
    pe.metrics.WordErrorRate,
    pe.metrics.ExactMatch,
  ):
    with pytest.raises(ValueError, match="does not take sample weights"):
      make().update(**batch, weights=np.ones(24, np.float32))
    boot = pe.metrics.Bootstrap(make(), num_replicas=64)
    boot = boot.update(**batch, index=np.arange(24))
    low, high = (float(x) for x in boot.compute_interval())
    assert low < high, make  # replicas differ: rows were resampled, not ignored


def test_vocab_size_beyond_int32_leaves_every_nonnegative_id_in_range():
  """No int32 id reaches 2**31 or 2**40: only negative ids are out of range, as without a
  vocabulary size, and the scores are sacrebleu's / jiwer's (was an OverflowError)."""
  rng = np.random.default_rng(13)
  preds, target = sentences(rng, (12,), 8, vocab=5), sentences(rng, (12,), 8, vocab=5)
  target[:, 0] = np.where(target[:, 0] == 0, 3, target[:, 0])  # jiwer refuses empty references
  preds[0, 0], target[1, 1] = 2**31 - 1, -3
  batch = {"preds": preds, "target": target, "mask": np.ones(12, bool)}
  for vocab_size in (2**31 - 1, 2**31, 2**40):
    update = lambda m: jax.jit(lambda m, b: m.update(**b))(m, batch)  # noqa: E731
    bleu = update(pe.metrics.BLEU(max_order=2, vocab_size=vocab_size))
    np.testing.assert_allclose(float(bleu.compute()), _bleu([batch], max_order=2), rtol=1e-5)
    wer = update(pe.metrics.WordErrorRate(vocab_size=vocab_size))
    np.testing.assert_allclose(float(wer.compute()), _wer([batch]), rtol=1e-6)
    expected = 1 + (vocab_size == 2**31 - 1)  # the -3, and 2**31 - 1 for a vocabulary of 2**31 - 1
    assert bleu.invalid_counts()["token id out of range"] == expected, vocab_size
    assert wer.invalid_counts() == {"token id out of range": expected}, vocab_size


def test_target_with_no_reference_axis_scores_rows_without_a_reference():
  """``target [B, 0, S]``: every row lacks a reference, as an all-padding one (each row has one
  empty reference, counted as "row without a reference"); was an IndexError."""
  rng = np.random.default_rng(17)
  preds = sentences(rng, (10,), 6, vocab=4)
  preds[0] = 0  # an empty hypothesis: it matches the empty reference
  empty = {"preds": preds, "target": np.zeros((10, 0, 5), np.int32), "mask": np.ones(10, bool)}
  as_padding = {**empty, "target": np.zeros((10, 1, 5), np.int32)}  # the references' view
  update = jax.jit(lambda m, b: m.update(**b))
  bleu = update(pe.metrics.BLEU(max_order=2, smooth=True), empty)
  want = _bleu([as_padding], max_order=2, smooth=True)
  np.testing.assert_allclose(float(bleu.compute()), want, rtol=1e-5, atol=1e-7)
  assert bleu.invalid_counts()["row without a reference"] == 10
  for metric, key in ((pe.metrics.RougeN(1), "rouge1"), (pe.metrics.RougeL(), "rougeL")):
    got = float(metric.update(**empty).compute())
    np.testing.assert_allclose(got, _rouge([as_padding], key), atol=1e-7)
  got = float(pe.metrics.ExactMatch().update(**empty).compute())
  np.testing.assert_allclose(got, _exact_match([as_padding]), rtol=1e-6)

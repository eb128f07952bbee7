"""``higher_is_better`` on every public metric, checked by scoring good and bad predictions.

A metric declaring True must score predictions that match the target better (higher) than
predictions that do not; False, lower. Every public metric class is walked: a class must
declare the attribute itself or inherit it from a metric below the base (the base's None is
for metrics defined elsewhere), and every class with a direction has a row in DIRECTIONS.
"""

import inspect

import jax
import numpy as np
import pytest

import padded_eval as pe
from padded_eval.collections import LossAverage

NUM = 61  # rows: not a multiple of anything the metrics care about
rng = np.random.default_rng(7)
LABELS = rng.integers(0, 3, NUM).astype(np.int32)
POSITIVE = (LABELS == 0).astype(np.int32)
GOOD_LOGITS = (5.0 * np.eye(3)[LABELS] + 0.1 * rng.standard_normal((NUM, 3))).astype(np.float32)
BAD_LOGITS = (5.0 * np.eye(3)[(LABELS + 1) % 3]).astype(np.float32)
GOOD_PROBS = np.where(POSITIVE == 1, 0.95, 0.05).astype(np.float32)
BAD_PROBS = (1.0 - GOOD_PROBS).astype(np.float32)
TARGET = rng.standard_normal(NUM).astype(np.float32)
GOOD_VALUES = (TARGET + 0.01 * rng.standard_normal(NUM)).astype(np.float32)
BAD_VALUES = (-TARGET + rng.standard_normal(NUM)).astype(np.float32)
MASK = rng.random(NUM) < 0.8

POSITIVE_TARGET = rng.uniform(0.5, 2.0, NUM).astype(np.float32)
RELEVANCE = rng.integers(0, 3, (NUM, 6)).astype(np.float32)
IMAGES = rng.uniform(0.0, 1.0, (5, 16, 16, 1)).astype(np.float32)

TOKENS = rng.integers(1, 9, (NUM, 7)).astype(np.int32)  # ids 1..8; 0 is the pad id
OTHER_TOKENS = ((TOKENS + 3) % 8 + 1).astype(np.int32)  # never the same id at a position

classes = {"preds": (GOOD_LOGITS, BAD_LOGITS), "target": LABELS}
tokens = {"preds": (TOKENS, OTHER_TOKENS), "target": TOKENS}
positive = {
  "preds": ((POSITIVE_TARGET * 1.01).astype(np.float32), (POSITIVE_TARGET * 3.0 + 1.0)),
  "target": POSITIVE_TARGET,
}
ranked = {
  "preds": ((RELEVANCE + 0.1 * rng.random((NUM, 6))).astype(np.float32), -RELEVANCE),
  "target": RELEVANCE,
}
images = {
  "preds": ((IMAGES + 0.01 * rng.random(IMAGES.shape)).astype(np.float32), 1.0 - IMAGES),
  "target": IMAGES,
}
binary = {"preds": (GOOD_PROBS, BAD_PROBS), "target": POSITIVE}
regression = {"preds": (GOOD_VALUES, BAD_VALUES), "target": TARGET}

# {class name: (an instance, inputs {key: (good, bad) or shared})}
DIRECTIONS = {
  "Accuracy": (pe.metrics.Accuracy(), classes),
  "MSE": (pe.metrics.MSE(), regression),
  "MAE": (pe.metrics.MAE(), regression),
  "RMSE": (pe.metrics.RMSE(), regression),
  "CalibrationError": (pe.metrics.CalibrationError(), binary),
  "CohenKappa": (pe.metrics.CohenKappa(num_classes=3), classes),
  "F1Score": (pe.metrics.F1Score(num_classes=3), classes),
  "FBetaScore": (pe.metrics.FBetaScore(num_classes=3, beta=2.0), classes),
  "JaccardIndex": (pe.metrics.JaccardIndex(num_classes=3), classes),
  "MatthewsCorrCoef": (pe.metrics.MatthewsCorrCoef(num_classes=3), classes),
  "Precision": (pe.metrics.Precision(num_classes=3), classes),
  "Recall": (pe.metrics.Recall(num_classes=3), classes),
  "Specificity": (pe.metrics.Specificity(num_classes=3), classes),
  "AUPRC": (pe.metrics.AUPRC(), binary),
  "AUROC": (pe.metrics.AUROC(), binary),
  "PearsonCorrelation": (pe.metrics.PearsonCorrelation(), regression),
  "R2Score": (pe.metrics.R2Score(), regression),
  "Perplexity": (pe.metrics.Perplexity(), classes),
  "LossAverage": (LossAverage(loss=pe.losses.MeanSquaredError()), regression),
  "Dice": (pe.metrics.Dice(num_classes=3), classes),
  "ExplainedVariance": (pe.metrics.ExplainedVariance(), regression),
  "MAPE": (pe.metrics.MAPE(), positive),
  "MSLE": (pe.metrics.MSLE(), positive),
  "RecallAtK": (pe.metrics.RecallAtK(3), ranked),
  "PrecisionAtK": (pe.metrics.PrecisionAtK(3), ranked),
  "MRR": (pe.metrics.MRR(), ranked),
  "MAPAtK": (pe.metrics.MAPAtK(3), ranked),
  "NDCGAtK": (pe.metrics.NDCGAtK(3), ranked),
  "PSNR": (pe.metrics.PSNR(data_range=1.0), images),
  "SSIM": (pe.metrics.SSIM(data_range=1.0), images),
  "BLEU": (pe.metrics.BLEU(max_order=2), tokens),
  "RougeN": (pe.metrics.RougeN(1), tokens),
  "RougeL": (pe.metrics.RougeL(), tokens),
  "ExactMatch": (pe.metrics.ExactMatch(), tokens),
  "WordErrorRate": (pe.metrics.WordErrorRate(), tokens),
  "NegativePredictiveValue": (pe.metrics.NegativePredictiveValue(task="binary"), binary),
  "BalancedAccuracy": (pe.metrics.BalancedAccuracy(num_classes=3), classes),
  "HammingLoss": (pe.metrics.HammingLoss(num_classes=3), classes),
  "ZeroOneLoss": (pe.metrics.ZeroOneLoss(num_classes=3), classes),
  "RecallAtFixedPrecision": (pe.metrics.RecallAtFixedPrecision(min_precision=0.5), binary),
  "PrecisionAtFixedRecall": (pe.metrics.PrecisionAtFixedRecall(min_recall=0.5), binary),
  "SensitivityAtSpecificity": (pe.metrics.SensitivityAtSpecificity(min_specificity=0.5), binary),
  "SpecificityAtSensitivity": (pe.metrics.SpecificityAtSensitivity(min_sensitivity=0.5), binary),
  "EER": (pe.metrics.EER(), binary),
  "BrierScore": (pe.metrics.BrierScore(num_classes=3), classes),
  "HingeLoss": (pe.metrics.HingeLoss(task="multiclass", num_classes=3), classes),
  "LogAUC": (pe.metrics.LogAUC(fpr_range=(0.01, 1.0)), binary),
}
# issue 31, regression half
DIRECTIONS.update(
  {
    "SpearmanCorrelation": (pe.metrics.SpearmanCorrelation(capacity=NUM), regression),
    "KendallTau": (pe.metrics.KendallTau(capacity=NUM), regression),
    "CosineSimilarity": (
      pe.metrics.CosineSimilarity(),
      {"preds": (GOOD_LOGITS, BAD_LOGITS), "target": np.eye(3, dtype=np.float32)[LABELS]},
    ),
    "KLDivergence": (
      pe.metrics.KLDivergence(),
      {"preds": (np.exp(GOOD_LOGITS), np.exp(BAD_LOGITS)), "target": np.exp(GOOD_LOGITS)},
    ),
    "TweedieDevianceScore": (pe.metrics.TweedieDevianceScore(power=1.5), positive),
    "D2TweedieScore": (pe.metrics.D2TweedieScore(power=1.5), positive),
  }
)
# No direction: a mean or spread of any values, a matrix of counts, a report dict, a collection (its members
# have theirs), a bootstrap (its wrapped metric's).
NO_DIRECTION = {
  "Mean",
  "Std",
  "LastValue",
  "ConfusionMatrix",
  "ClassificationReport",
  "StatScores",
  "Metrics",
  "Losses",
  "LossesAndMetrics",
}


def public_metric_classes():
  found = {
    cls
    for module in (pe.metrics, pe.collections)
    for _, cls in inspect.getmembers(module, inspect.isclass)
    if issubclass(cls, pe.Metric) and cls is not pe.Metric and not cls.__name__.startswith("_")
  }
  return sorted(found, key=lambda cls: cls.__name__)


_update_compute = jax.jit(lambda metric, batch: metric.update(**batch).compute())
"""One program per metric for its good and its bad predictions (of the same shapes and dtypes)."""


def score(metric, inputs, which):
  batch = {k: (v[which] if isinstance(v, tuple) else v) for k, v in inputs.items()}
  mask = np.resize(MASK, len(batch["target"]))
  return float(_update_compute(metric, {**batch, "mask": mask}))


@pytest.mark.parametrize("cls", public_metric_classes(), ids=lambda cls: cls.__name__)
def test_every_public_metric_declares_its_direction(cls):
  below_base = cls.__mro__[: cls.__mro__.index(pe.Metric)]
  declared = [k for k in below_base if "higher_is_better" in vars(k)]
  assert declared, (
    f"{cls.__name__} does not declare higher_is_better (True, False, or None when its value "
    "has no direction): add `higher_is_better: ClassVar[bool | None] = ...` to the class"
  )
  if cls in (pe.metrics.Bootstrap, pe.metrics.Sliced, pe.metrics.FromFun):
    return  # a property: the wrapped metric's (test below)
  value = cls.higher_is_better
  assert value in (True, False, None) and (value is None) == (cls.__name__ in NO_DIRECTION)
  if value is not None:
    assert cls.__name__ in DIRECTIONS, f"add a row for {cls.__name__} to DIRECTIONS"


@pytest.mark.parametrize("name", sorted(DIRECTIONS))
def test_the_declared_direction_ranks_good_predictions_first(name):
  metric, inputs = DIRECTIONS[name]
  assert type(metric).__name__ == name
  good, bad = score(metric, inputs, 0), score(metric, inputs, 1)
  assert np.isfinite(good) and np.isfinite(bad) and good != bad, (good, bad)
  assert (good > bad) == metric.higher_is_better, (name, good, bad, metric.higher_is_better)


def test_a_bootstrap_has_its_wrapped_metrics_direction():
  assert pe.metrics.Bootstrap(pe.metrics.Accuracy(), 4).higher_is_better is True
  assert pe.metrics.Bootstrap(pe.metrics.MSE(), 4).higher_is_better is False
  assert pe.metrics.Bootstrap(pe.metrics.Mean(), 4).higher_is_better is None


def test_a_sliced_metric_has_its_wrapped_metrics_direction():
  assert pe.metrics.Sliced(pe.metrics.Accuracy(), 3).higher_is_better is True
  assert pe.metrics.Sliced(pe.metrics.MSE(), 3).higher_is_better is False
  assert pe.metrics.Sliced(pe.metrics.Mean(), 3).higher_is_better is None


def test_no_direction_means_an_array_or_a_value_of_any_sign():
  matrix = pe.metrics.ConfusionMatrix(num_classes=3).update(preds=GOOD_LOGITS, target=LABELS)
  assert np.asarray(matrix.compute()).shape == (3, 3)
  assert pe.metrics.Mean().higher_is_better is None and pe.metrics.Std().higher_is_better is None

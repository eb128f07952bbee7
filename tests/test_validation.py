"""Eager input checks (issue 12): every bad input names its keyword; float64 is range-checked."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import padded_eval as pe
from padded_eval import validation

METRICS = [
  pe.metrics.Accuracy(),
  pe.metrics.F1Score(task="multiclass", num_classes=3, average="macro"),
  pe.metrics.MSE(),
  pe.metrics.R2Score(),
  pe.metrics.AUROC(),
  pe.metrics.Perplexity(),
]
GOOD = {
  "Accuracy": dict(preds=np.eye(3, dtype=np.float32)[[0, 1, 2, 1]], target=np.array([0, 1, 2, 2])),
  "F1Score": dict(preds=np.eye(3, dtype=np.float32)[[0, 1, 2, 1]], target=np.array([0, 1, 2, 2])),
  "MSE": dict(preds=np.array([1.0, 2.0], np.float32), target=np.array([1.5, 2.0], np.float32)),
  "R2Score": dict(preds=np.array([1.0, 2.0], np.float32), target=np.array([1.5, 2.0], np.float32)),
  "AUROC": dict(preds=np.array([0.2, 0.7], np.float32), target=np.array([0, 1])),
  "Perplexity": dict(preds=np.zeros((2, 3, 5), np.float32), target=np.zeros((2, 3), np.int32)),
}


def _good(metric):
  return dict(GOOD[type(metric).__name__])


@pytest.mark.parametrize("metric", METRICS, ids=lambda m: type(m).__name__)
def test_missing_keyword_is_a_value_error_naming_it(metric):
  kwargs = _good(metric)
  del kwargs["target"]
  with pytest.raises(ValueError, match=r"'target'"):
    metric.update(**kwargs)


@pytest.mark.parametrize("metric", METRICS, ids=lambda m: type(m).__name__)
@pytest.mark.parametrize(
  "bad, pattern",
  [
    (None, r"preds is None"),
    ("0.5", r"preds is a str"),
    (np.array(["a", "b"]), r"preds holds strings"),
    ([[1.0, 2.0], [3.0]], r"preds could not be made an array.*ragged"),
    (np.array([1 + 2j, 3j]), r"preds is complex"),
    (np.array([1.0, None], dtype=object), r"preds is an object array"),
  ],
  ids=["none", "str", "string-array", "ragged", "complex", "object"],
)
def test_bad_preds_are_refused_with_the_key(metric, bad, pattern):
  kwargs = _good(metric)
  kwargs["preds"] = bad
  with pytest.raises(ValueError, match=pattern):
    metric.update(**kwargs)


@pytest.mark.parametrize("values", [[1e-300, 3e-300], [1e39, 1.0], [1e-40, 2.0]])
def test_float64_outside_float32_range_is_refused(values):
  with pytest.raises(ValueError, match=r"values is float64 with magnitudes.*float32"):
    pe.metrics.Mean().update(values=np.array(values, np.float64))


def test_float64_inside_float32_range_is_converted_like_jax_does():
  values = np.random.default_rng(0).normal(1e3, 7.0, size=257)  # float64
  got = float(pe.metrics.Mean().update(values=values).compute())
  expected = float(np.mean(values.astype(np.float32).astype(np.float64)))
  assert got == pytest.approx(expected, rel=1e-6)
  # Zeros, inf and NaN are not range problems: they survive the conversion unchanged.
  assert np.isnan(float(pe.metrics.Mean().update(values=np.array([0.0, np.nan])).compute()))


def test_traced_inputs_are_checked_by_dtype_only():
  @jax.jit
  def step(values):
    return pe.metrics.Mean().update(values=values).compute()

  assert float(step(jnp.array([1.0, 3.0]))) == 2.0
  with pytest.raises(ValueError, match=r"values is complex"):
    step(jnp.array([1.0 + 1j]))


@pytest.mark.parametrize(
  "check, value",
  [
    (validation.check_positive_int, True),
    (validation.check_positive_int, 0),
    (validation.check_positive_int, 2.0),
    (validation.check_nonnegative_int, -1),
    (validation.check_positive_number, float("nan")),
    (validation.check_positive_number, 0),
    (validation.check_probability, 1.5),
  ],
)
def test_config_checks_name_the_argument(check, value):
  with pytest.raises(ValueError, match=r"^top_k must be .*got"):
    check("top_k", value)


def test_top_k_true_is_refused_everywhere():
  for make in (
    pe.metrics.Accuracy,
    lambda **k: pe.metrics.Precision(task="multiclass", num_classes=3, **k),
  ):
    with pytest.raises(ValueError, match="top_k"):
      make(top_k=True)

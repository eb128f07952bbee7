"""Issue 31, regression half: rank correlations, similarities, deviances, ExplainedVariance
options, LastValue and from_fun against scipy / scikit-learn / CLU (float64 or the peer's own
code), through ``masked_eval`` on every backend (8 devices, 203 rows in batches of 32), at
scale, and the refusals. The grid rows are in ``tests/_regression_cases.py``.
"""

from __future__ import annotations

import re
import warnings

import jax
import jax.numpy as jnp
import metric_cases  # noqa: F401  (the table the rank rows' module extends)
import numpy as np
import pytest
import scipy.stats
import sklearn.metrics as skm
from _metrics_shared import CHECKS
from _regression_cases import RANK_CASES

import padded_eval as pe

M = pe.metrics
N = 203  # divides neither the batch (32) nor the devices (8)
_batch_updates = jax.jit(lambda m, b: m.batch_updates(**b))  # one program per metric and shape


def _data(seed=0):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal(N)
  target = rng.gamma(2.0, 1.0, N)
  return {
    "x": (np.round(4 * x) / 4).astype(np.float32),  # ties
    "y": (np.round(4 * (0.5 * x + rng.standard_normal(N))) / 4).astype(np.float32),
    "vec_p": rng.standard_normal((N, 5)).astype(np.float32),
    "vec_t": rng.standard_normal((N, 5)).astype(np.float32),
    "dist_p": rng.uniform(0.05, 1.0, (N, 4)).astype(np.float32),
    "dist_t": rng.uniform(0.0, 1.0, (N, 4)).astype(np.float32),
    "mu": (target * rng.uniform(0.7, 1.4, N) + 0.1).astype(np.float32),
    "target": target.astype(np.float32),
    "w": rng.uniform(0.1, 2.0, N).astype(np.float32),
  }


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__.removeprefix("check_"))
@pytest.mark.parametrize("case", RANK_CASES, ids=lambda case: case.name)
def test_rank_correlation_protocol(case, check):
  """Every generic check of tests/metric_checks.py on every rank-correlation row."""
  check(case)


TRACES = []
PAIR = {"preds": "x", "target": "y"}
TWEEDIE = {"preds": "mu", "weights": "w"}
COLLECTION = pe.Metrics(
  {
    "spearman": M.SpearmanCorrelation(capacity=256).map_arg(**PAIR),
    "kendall": M.KendallTau(capacity=256).map_arg(**PAIR),
    "cosine": M.CosineSimilarity().map_arg(preds="vec_p", target="vec_t"),
    "kl": M.KLDivergence(reduction="sum").map_arg(preds="dist_p", target="dist_t"),
    "tweedie": M.TweedieDevianceScore(power=1.5).map_arg(**TWEEDIE),
    "d2": M.D2TweedieScore(power=1.5).map_arg(**TWEEDIE),
    "ev": M.ExplainedVariance(force_finite=False).map_arg(**PAIR, weights="w"),
    "last": M.LastValue("target"),  # positive: a mean far from 0
    "abs_error": M.from_fun(lambda x, y, **_: jnp.abs(x - y)),
  }
)


def _step(params, batch):
  del params
  TRACES.append(1)
  return COLLECTION.batch_updates(**batch)


def test_through_masked_eval_on_every_backend(backend):
  d = _data()
  batches = pe.pad_batches(d, 32)
  TRACES.clear()
  results = pe.masked_eval(_step, None, batches, backend=backend)
  assert len(TRACES) == 1 and results["num_examples"] == N
  f = {k: v.astype(np.float64) for k, v in d.items()}
  cos = np.sum(f["vec_p"] * f["vec_t"], -1)
  cos /= np.linalg.norm(f["vec_p"], axis=-1) * np.linalg.norm(f["vec_t"], axis=-1)
  last_batch = f["target"][(N // 32) * 32 :]  # the last batch's 11 real rows
  expected = {
    "spearman": scipy.stats.spearmanr(f["x"], f["y"]).statistic,
    "kendall": scipy.stats.kendalltau(f["x"], f["y"]).statistic,
    "cosine": np.mean(cos),
    "kl": np.sum(scipy.stats.entropy(f["dist_t"], f["dist_p"], axis=-1)),
    "tweedie": skm.mean_tweedie_deviance(f["target"], f["mu"], sample_weight=f["w"], power=1.5),
    "d2": skm.d2_tweedie_score(f["target"], f["mu"], sample_weight=f["w"], power=1.5),
    "ev": skm.explained_variance_score(f["y"], f["x"], sample_weight=f["w"], force_finite=False),
    "last": np.mean(last_batch),
    "abs_error": np.mean(np.abs(f["x"] - f["y"])),
  }
  for name, value in expected.items():
    np.testing.assert_allclose(results[name], value, rtol=2e-6, atol=2e-6, err_msg=name)


@pytest.mark.parametrize("n", [2, 3, 5_000])
def test_rank_correlations_match_scipy_with_heavy_ties(n):
  rng = np.random.default_rng(n)
  x = rng.integers(0, 7, n).astype(np.float32)
  y = (x + rng.integers(0, 4, n) + (rng.random(n) < 0.3) * rng.standard_normal(n)).astype(
    np.float32
  )
  y[: n // 10] = np.nan  # NaN rows are masked out below
  mask = ~np.isnan(y)
  for cls, ref in (
    (M.SpearmanCorrelation, scipy.stats.spearmanr),
    (M.KendallTau, scipy.stats.kendalltau),
  ):
    metric = jax.jit(lambda m, b: m.update(**b))(
      cls(capacity=n), {"preds": x, "target": y, "mask": mask}
    )
    expected = ref(x[mask].astype(np.float64), y[mask].astype(np.float64)).statistic
    assert abs(float(metric.compute()) - expected) < 1e-6, (cls.__name__, n)


@pytest.mark.parametrize("capacity", [np.int64(6), np.int32(6)])
def test_rank_correlations_take_a_numpy_int_capacity(capacity):
  # capacity is an int like the other int settings (k, num_outputs): numpy's ints count too
  x = np.array([1.0, 2.0, 2.0, 5.0, 0.5], np.float32)
  y = np.array([1.0, 3.0, 2.0, 0.0, 0.2], np.float32)
  for cls, ref in (
    (M.SpearmanCorrelation, scipy.stats.spearmanr),
    (M.KendallTau, scipy.stats.kendalltau),
  ):
    got = jax.jit(lambda m, b: m.update(**b))(cls(capacity=capacity), {"preds": x, "target": y})
    expected = ref(x.astype(np.float64), y.astype(np.float64)).statistic
    np.testing.assert_allclose(float(got.compute()), expected, rtol=1e-6)


def test_rank_correlations_nan_capacity_and_constants():
  x, y = np.array([1.0, 2.0, 3.0, 4.0], np.float32), np.array([1.0, 3.0, 2.0, 4.0], np.float32)
  for cls in (M.SpearmanCorrelation, M.KendallTau):
    full = cls(capacity=3).update(preds=x, target=y)  # 4 pairs, room for 3
    assert np.isnan(float(full.compute()))
    assert full.invalid_report() == [
      (full.name, "pair beyond capacity=3 (value NaN; pass a larger capacity)", 1)
    ]
    nan = cls(capacity=8).update(preds=x, target=np.array([1.0, np.nan, 2.0, 4.0], np.float32))
    assert np.isnan(float(nan.compute())) and nan.invalid_counts()["nan value"] == 1
    assert sum(nan.invalid_counts().values()) == 1
    constant = cls(capacity=8).update(preds=x, target=np.ones(4, np.float32))
    assert np.isnan(float(constant.compute()))  # scipy: nan (with a warning)
    assert np.isnan(float(cls(capacity=8).compute()))


def test_rank_correlations_count_integers_float32_rounds():
  """float32 rounds int32 values beyond 2**24 (2**24 + 3 reads 2**24 + 4), which makes ties the
  data does not have (Spearman 0.894 where scipy gives 1.0): such elements are counted as
  invalid and the value is NaN (masked_eval refuses it); integers float32 holds rank as scipy."""
  x = (2**24 + np.array([0, 3, 6, 9])).astype(np.int32)
  y = (2**24 + np.array([0, 1, 7, 8])).astype(np.int32)
  kind = "integer that float32 rounds (beyond 2**24; subtract an offset, e.g. the minimum)"
  for cls, ref in (
    (M.SpearmanCorrelation, scipy.stats.spearmanr),
    (M.KendallTau, scipy.stats.kendalltau),
  ):
    metric = cls(capacity=8).update(preds=x, target=y)
    assert np.isnan(float(metric.compute()))
    assert metric.invalid_report() == [(metric.name, kind, 3)]  # 2**24 + 3, + 9 and + 1
    step = lambda params, batch, cls=cls: cls(capacity=16).batch_updates(
      preds=batch["x"], target=batch["y"], mask=batch["mask"]
    )
    with pytest.raises(ValueError, match="float32 rounds"):
      pe.masked_eval(step, None, pe.pad_batches({"x": x, "y": y}, 8), backend="jit")
    held = cls(capacity=8).update(preds=x - 2**24, target=y - 2**24)  # the advised offset
    expected = ref(x.astype(np.float64), y.astype(np.float64)).statistic
    np.testing.assert_allclose(float(held.compute()), expected, rtol=1e-6)
    even = (2**25 + 4 * np.array([0, 3, 6, 9])).astype(np.int32)  # float32 holds these
    np.testing.assert_allclose(
      float(cls(capacity=8).update(preds=even, target=y - 2**24).compute()), expected, rtol=1e-6
    )


@pytest.mark.parametrize("power", [1, 1.5, 2, 3])
def test_tweedie_keeps_precision_near_the_target(power):
  rng = np.random.default_rng(11)
  target = rng.uniform(0.5, 3.0, 1000).astype(np.float32)
  preds = (target * (1 + 1e-4 * rng.standard_normal(1000))).astype(np.float32)
  got = float(M.TweedieDevianceScore(power=power).update(preds=preds, target=target).compute())
  expected = skm.mean_tweedie_deviance(
    target.astype(np.float64), preds.astype(np.float64), power=power
  )
  assert abs(got / expected - 1) < 1e-5  # the textbook float32 formula: no digit right


def test_tweedie_power_0_is_the_squared_error_at_any_scale():
  # power 0 is the squared error: as MSE, no overflow of a batch's squares (1e19 errors)
  rng = np.random.default_rng(12)
  target = (5e18 * rng.standard_normal(16)).astype(np.float32)
  preds = (target + 1e19 * rng.standard_normal(16)).astype(np.float32)
  got = float(M.TweedieDevianceScore(power=0).update(preds=preds, target=target).compute())
  expected = skm.mean_tweedie_deviance(target.astype(np.float64), preds.astype(np.float64), power=0)
  np.testing.assert_allclose(got, expected, rtol=1e-5)


@pytest.mark.parametrize("scale", [1e-25, 5e18])
def test_d2_tweedie_power_0_at_any_scale(scale):
  # power 0 is R2Score: the ratio of two sums of squares neither under- nor overflows
  rng = np.random.default_rng(13)
  target = (scale * rng.standard_normal(16)).astype(np.float32)
  preds = (target + 0.5 * scale * rng.standard_normal(16)).astype(np.float32)
  got = float(M.D2TweedieScore(power=0).update(preds=preds, target=target).compute())
  expected = skm.d2_tweedie_score(target.astype(np.float64), preds.astype(np.float64), power=0)
  np.testing.assert_allclose(got, expected, rtol=1e-5)


@pytest.mark.parametrize("scale", [1e-25, 5e18])
@pytest.mark.parametrize("power", [-2.0, -1.0, -0.5, 1.5, 3.0])
def test_d2_tweedie_at_any_scale(power, scale):
  # the deviance is homogeneous of degree 2 - p: each batch forms it scaled by a power of two
  # (p = -1 at 5e18: deviances near 1e56, beyond float32; at 1e-25 they underflowed to 0)
  rng = np.random.default_rng(16)
  target = (scale * rng.uniform(0.2, 2.0, 24)).astype(np.float32)
  target[:12] *= np.float32(0.125)  # the two batches at different scales
  preds = (target * rng.uniform(0.6, 1.6, 24)).astype(np.float32)
  weights = rng.uniform(0.5, 2.0, 24).astype(np.float32)
  parts = [
    _batch_updates(M.D2TweedieScore(power=power), {"preds": p, "target": t, "weights": w})
    for p, t, w in zip(np.split(preds, 2), np.split(target, 2), np.split(weights, 2))
  ]
  got = float(parts[0].merge(parts[1]).compute())
  t, p, w = (x.astype(np.float64) for x in (target, preds, weights))
  expected = skm.d2_tweedie_score(t, p, sample_weight=w, power=power)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=2e-6)


def _stable_deviance(y, mu, power):
  """float64 unit deviances ``d(y, mu)`` (y, mu > 0) in the form that does not cancel near
  ``mu = y`` (``2 y**(2-p) (expm1(a L) / a - expm1(b L) / b)``, ``L = log(mu / y)``), as the
  reference for targets far from 0: scikit-learn's textbook float64 form cancels there (about
  1e-3 of relative error for targets near 1e6 spread by 1)."""
  a, b = 2.0 - power, 1.0 - power
  log_ratio = np.log1p((mu - y) / y)
  part = lambda c: log_ratio if c == 0 else np.expm1(c * log_ratio) / c  # noqa: E731
  return 2.0 * y**a * (part(a) - part(b))


@pytest.mark.parametrize("offset", [1e3, 1e6])
@pytest.mark.parametrize("power", [-1.5, 1.0, 1.5, 2.0, 3.0])
def test_d2_tweedie_of_nearly_constant_targets_keeps_its_precision(power, offset):
  # The null deviance sum w d(y, c) of targets 1e6 + N(0, 1): its Jensen-gap form
  # 2 (sum w A(y) - W A(c)) cancelled to noise (D2 0.64 where scikit-learn says -0.57 at 1e3,
  # NaN at 1e6). Each part keeps its deviance around its own mean and merges by Chan's formula
  # D = sum D_i + sum W_i d(c_i, c): batches at other means, merged pairwise and aggregated.
  rng = np.random.default_rng(17)
  n = 90
  target = (offset + rng.standard_normal(n) + np.repeat([0.0, 3.0, -2.0], n // 3)).astype(
    np.float32
  )
  preds = (target + 0.7 * rng.standard_normal(n)).astype(np.float32)
  weights = rng.uniform(0.1, 2.0, n).astype(np.float32)
  parts = [
    _batch_updates(M.D2TweedieScore(power=power), {"preds": p, "target": t, "weights": w})
    for p, t, w in zip(*(np.array_split(x, 6) for x in (preds, target, weights)))
  ]
  pairwise = parts[5]
  for i in (2, 0, 4, 1, 3):
    pairwise = parts[i].merge(pairwise)
  stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *parts).aggregate()
  t, p, w = (x.astype(np.float64) for x in (target, preds, weights))
  mean = np.sum(w * t) / np.sum(w)
  null = np.sum(w * _stable_deviance(t, np.full(n, mean), power))
  expected = 1.0 - np.sum(w * _stable_deviance(t, p, power)) / null
  for how, metric in (("merged", pairwise), ("aggregated", stacked)):
    np.testing.assert_allclose(float(metric.compute()), expected, rtol=2e-5, err_msg=how)


@pytest.mark.parametrize("scale", [1.0, 1e20, 1e-20])
@pytest.mark.parametrize("power", [-1.0, -1.5, -2.0, -3.0])
def test_d2_tweedie_of_a_negative_mean_target_is_scikit_learns(power, scale):
  # p < 0 takes targets <= 0; a mean target c <= 0 is outside the deviance's domain, and
  # scikit-learn's textbook null deviance there is a number for integer p (NaN for p = -1.5)
  target = (scale * np.array([-3.0, -1.0, 1.5, -2.0, 0.5, -0.25])).astype(np.float32)
  preds = (scale * np.array([1.0, 2.0, 0.5, 1.0, 0.75, 3.0])).astype(np.float32)
  weights = np.array([1.0, 2.0, 0.5, 1.5, 1.0, 0.25], np.float32)
  parts = [
    _batch_updates(M.D2TweedieScore(power=power), {"preds": p, "target": t, "weights": w})
    for p, t, w in zip(*(np.split(x, 2) for x in (preds, target, weights)))
  ]
  got = float(parts[0].merge(parts[1]).compute())
  t, p, w = (x.astype(np.float64) for x in (target, preds, weights))
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", RuntimeWarning)  # scikit-learn's NaN for p = -1.5
    expected = skm.d2_tweedie_score(t, p, sample_weight=w, power=power)
  np.testing.assert_allclose(got, expected, rtol=2e-6, equal_nan=True)


@pytest.mark.parametrize("power", [-1.0, 1.0, 1.5, 2.0, 3.0])
def test_d2_tweedie_of_a_constant_target_is_nan(power):
  # a constant target is its own mean: its null deviance is exactly 0, so D2 is undefined
  # (NaN, as documented); the sums of the Jensen-gap form round to noise under weights
  rng = np.random.default_rng(14)
  target = np.full(6, 3.5, np.float32)
  weights = rng.uniform(0.1, 2.0, 6).astype(np.float32)
  for preds in (target, (target * rng.uniform(0.5, 1.5, 6)).astype(np.float32)):
    metric = M.D2TweedieScore(power=power).update(preds=preds, target=target, weights=weights)
    assert np.isnan(float(metric.compute()))


def test_deviance_counts_elements_outside_the_domain():
  preds = np.array([1.0, -1.0, 2.0, 1.0], np.float32)
  target = np.array([1.0, 1.0, -1.0, 0.0], np.float32)
  metric = M.TweedieDevianceScore(power=2).update(preds=preds, target=target)
  assert metric.invalid_counts() == {"outside the domain of power": 3}
  assert float(metric.compute()) == 0.0  # the one element left: preds == target
  d2 = M.D2TweedieScore(power=1).update(preds=preds, target=target)
  assert d2.invalid_counts() == {"outside the domain of power": 2}


def test_cosine_and_kl_count_rows_without_a_value():
  zero = np.array([[0.0, 0.0], [1.0, 2.0]], np.float32)
  cosine = M.CosineSimilarity().update(preds=zero, target=np.ones((2, 2), np.float32))
  assert cosine.invalid_counts() == {"zero vector or nan": 1} and np.isnan(float(cosine.compute()))
  kl = M.KLDivergence().update(
    preds=np.ones((2, 2), np.float32), target=np.array([[1.0, -1.0], [1.0, 1.0]], np.float32)
  )
  assert kl.invalid_counts() == {"not a distribution": 1} and np.isnan(float(kl.compute()))
  infinite = M.KLDivergence().update(preds=np.array([[1.0, 0.0]]), target=np.array([[0.5, 0.5]]))
  assert float(infinite.compute()) == np.inf  # scipy.stats.entropy: inf


def test_cosine_of_huge_vectors():
  # vectors near float32's largest values (3e38) are scaled, not divided into 0 or inf
  preds = np.array([[3e38, 1e38, 0.0], [1e37, 2e37, 5e36]], np.float32)
  target = np.array([[1.0, 2.0, 3.0], [2e38, 1.0, 3e38]], np.float32)
  got = M.CosineSimilarity().update(preds=preds, target=target).compute()
  want = np.mean(np.diag(skm.pairwise.cosine_similarity(preds.astype(float), target.astype(float))))
  np.testing.assert_allclose(float(got), want, rtol=1e-5)


def test_moment_metrics_take_huge_weights():
  # weights of 1e30 (w * x**2 fits float32): the batch co-moment's correction
  # first**2 / n overflowed (R2 0.0, Pearson NaN; Std 0.0, ExplainedVariance 1.0)
  rng = np.random.default_rng(0)
  target = rng.standard_normal(32).astype(np.float32)
  preds = (target + 0.5 * rng.standard_normal(32)).astype(np.float32)
  weights = np.full(32, 1e30, np.float32)
  t, p, w = target.astype(float), preds.astype(float), weights.astype(float)
  cases = [
    (M.R2Score(), skm.r2_score(t, p, sample_weight=w)),
    (M.PearsonCorrelation(), scipy.stats.pearsonr(p, t)[0]),
  ]
  for metric, want in cases:
    got = metric.update(preds=preds, target=target, weights=weights).compute()
    np.testing.assert_allclose(float(got), want, rtol=1e-5, err_msg=type(metric).__name__)


def test_kl_normalises_rows_of_any_scale():
  # rows whose sum overflows float32 (3e38 entries) are still distributions
  target = np.array([[3e38, 3e38, 1e38], [1.0, 2.0, 3.0]], np.float32)
  preds = np.array([[1.0, 2.0, 3.0], [3e38, 1e38, 2e38]], np.float32)
  got = M.KLDivergence().update(preds=preds, target=target).compute()
  want = np.mean(
    [scipy.stats.entropy(t, p) for t, p in zip(target.astype(float), preds.astype(float))]
  )
  np.testing.assert_allclose(float(got), want, rtol=1e-5)


def test_last_value_matches_clu_sequence_and_keeps_through_padding():
  clu_metrics = pytest.importorskip("clu.metrics")
  rng = np.random.default_rng(5)
  values = [rng.standard_normal(8).astype(np.float32) for _ in range(4)]
  masks = [rng.random(8) < 0.6 for _ in range(4)]
  masks[1][0] = True
  ours, theirs = M.LastValue(), None
  for v, m in zip(values, masks):
    ours = ours.update(values=v, mask=m)
    part = clu_metrics.LastValue.from_model_output(jnp.asarray(v), mask=jnp.asarray(m))
    theirs = part if theirs is None else theirs.merge(part)
  np.testing.assert_allclose(float(ours.compute()), float(theirs.compute()), rtol=1e-6)
  padding = ours.update(values=np.full(8, np.nan, np.float32), mask=np.zeros(8, bool))
  assert float(padding.compute()) == float(ours.compute())  # CLU: 0 / 0
  assert np.isnan(float(M.LastValue().compute()))


def test_last_value_reduces_the_latest_step_over_devices():
  devices = jax.local_device_count()
  values = np.arange(devices * 2 * 3, dtype=np.float32).reshape(2, devices, 3)
  masks = np.ones((2, devices, 3), bool)
  masks[1, devices // 2 :] = False  # step 2: half the devices hold only padding
  masks[1, 0, 1] = False

  def run(v, m):
    metric = M.LastValue()
    for step in range(2):
      metric = metric.update(values=v[step], mask=m[step])
    return metric.reduce("d").compute()

  got = jax.pmap(run, axis_name="d")(values.transpose(1, 0, 2), masks.transpose(1, 0, 2))
  expected = np.mean(values[1][masks[1]])
  np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-6)


def test_last_value_of_an_infinite_value_is_inf_as_mean():
  # numpy's mean of [1, inf] is inf; the compensated sum's error term (NaN next to an inf) was
  # added to it, a NaN value with nothing counted
  for values, want in (([1.0, np.inf, 2.0], np.inf), ([-np.inf, 3.0], -np.inf)):
    metric = M.LastValue().update(values=np.array(values, np.float32))
    assert float(metric.compute()) == want == float(M.Mean().update(values=values).compute())
    assert metric.invalid_counts() == {"nan value": 0}
  both = M.LastValue().update(values=np.array([np.inf, -np.inf], np.float32))
  assert np.isnan(float(both.compute()))  # inf - inf, as numpy


def test_from_fun_follows_clu_mask_rules():
  clu_metrics = pytest.importorskip("clu.metrics")
  x = np.array([1.0, 2.0, 4.0, 100.0], np.float32)
  mask = np.array([True, True, True, False])
  head_mask = np.array([True, False, True, True])

  def per_example(x, **_):
    return x

  def per_batch(x, **_):
    return jnp.sum(x[:2])  # one value per batch: the mask does not apply

  def with_mask(x, head, **_):
    return {"values": x, "mask": head}

  clu_with_mask = lambda x, head, **_: {"values": x, "mask": head}
  for fun, clu_fun in (
    (per_example, per_example),
    (per_batch, per_batch),
    (with_mask, clu_with_mask),
  ):
    ours = M.from_fun(fun).update(x=x, head=head_mask, mask=mask)
    theirs = clu_metrics.Average.from_fun(clu_fun).from_model_output(
      x=jnp.asarray(x), head=jnp.asarray(head_mask), mask=jnp.asarray(mask)
    )
    np.testing.assert_allclose(float(ours.compute()), float(theirs.compute()), rtol=1e-6)
  wrapped = M.from_fun(lambda x, **_: {"preds": x, "target": 2 * x}, M.MSE())
  assert wrapped.higher_is_better is False and wrapped.name == "mse"
  value = wrapped.update(x=x, mask=mask).compute()
  np.testing.assert_allclose(float(value), np.mean(x[mask] ** 2), rtol=1e-6)


BAD = [
  (lambda: M.SpearmanCorrelation(), "capacity must be an int"),
  (lambda: M.KendallTau(capacity=0), "capacity must be an int"),
  (lambda: M.KendallTau(capacity=True), "capacity must be an int"),
  (lambda: M.SpearmanCorrelation(capacity=4, num_outputs=0), "num_outputs"),
  (lambda: M.CosineSimilarity(reduction="none"), "reduction"),
  (lambda: M.KLDivergence(log_prob="yes"), "log_prob"),
  (lambda: M.TweedieDevianceScore(power=0.5), "power <= 0 or >= 1"),
  (lambda: M.D2TweedieScore(power=float("nan")), "power must be a finite number"),
  (lambda: M.ExplainedVariance(force_finite=None), "force_finite"),
  (lambda: M.ExplainedVariance(num_outputs=2, multioutput=(1.0,)), "shape (2,)"),
  (lambda: M.from_fun(3), "from_fun wraps a function"),
  (lambda: M.from_fun(abs, metric="mean"), "from_fun feeds a Metric"),
  (lambda: M.Std(ddof=float("nan")), "ddof must be a non-negative finite number"),
  (lambda: M.Std(ddof=float("inf")), "ddof must be a non-negative finite number"),
]


@pytest.mark.parametrize("make, words", BAD)
def test_bad_configurations_are_refused(make, words):
  with pytest.raises(ValueError, match=re.escape(words)):
    make()


def test_bad_inputs_are_refused():
  x = np.zeros((4, 3), np.float32)
  with pytest.raises(ValueError, match="takes no sample weights"):
    M.KendallTau(capacity=8).update(preds=x[:, 0], target=x[:, 0], weights=np.ones(4))
  with pytest.raises(ValueError, match=re.escape("[batch, ..., 2]")):
    M.SpearmanCorrelation(capacity=8, num_outputs=2).update(preds=x, target=x)
  with pytest.raises(ValueError, match="vector per row"):
    M.CosineSimilarity().update(preds=x[:, 0], target=x[:, 0])
  with pytest.raises(ValueError, match="return a dict"):
    M.from_fun(lambda x, **_: x, M.MSE()).update(x=x)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    M.LastValue().update(values=x)  # no warning for a [B, 3] value


def test_last_value_and_from_fun_in_a_clu_collection_under_pmap():
  clu_metrics = pytest.importorskip("clu.metrics")
  devices = jax.local_device_count()
  ours = clu_metrics.Collection.create(
    last=pe.clu.metric(M.LastValue("loss")),
    mean=pe.clu.metric(M.from_fun(lambda loss, **_: 2 * loss)),
  )
  theirs = clu_metrics.Collection.create(
    last=clu_metrics.LastValue.from_output("loss"),
    mean=clu_metrics.Average.from_fun(lambda loss, **_: 2 * loss),
  )
  rng = np.random.default_rng(2)
  steps = [
    (rng.standard_normal((devices, 4)).astype(np.float32), rng.random((devices, 4)) < 0.7)
    for _ in range(3)
  ]
  results = []
  for collection in (ours, theirs):
    gather = jax.pmap(
      lambda loss, mask, c=collection: c.gather_from_model_output(loss=loss, mask=mask),
      axis_name="batch",
    )
    total = collection.empty()
    for loss, mask in steps:
      total = total.merge(gather(loss, mask).unreplicate())
    results.append(total.compute())
  for key in ("last", "mean"):
    np.testing.assert_allclose(float(results[0][key]), float(results[1][key]), rtol=1e-6)


# --- NaN in a real element of nonzero weight is counted ("nan value"), the result stays NaN ------


def _weighted_std(x, w, ddof):
  mean = np.sum(w * x) / np.sum(w)
  return np.sqrt(np.sum(w * (x - mean) ** 2) / (np.sum(w) - ddof))


def _weighted_pearson(p, t, w):
  dp, dt = p - np.sum(w * p) / np.sum(w), t - np.sum(w * t) / np.sum(w)
  return np.sum(w * dp * dt) / np.sqrt(np.sum(w * dp**2) * np.sum(w * dt**2))


def _per_output(ref, p, t, w):
  """``ref(p, t, w)`` per column of ``[n, D]`` inputs (or once for ``[n]``); NaN for a column
  holding a NaN (numpy's formulas give NaN there; scikit-learn refuses it)."""
  column = lambda p, t: np.nan if np.isnan(p).any() or np.isnan(t).any() else ref(p, t, w)
  if p.ndim == 1:
    return np.float64(column(p, t))
  return np.array([column(p[:, j], t[:, j]) for j in range(p.shape[1])])


# name: (metric factory, element shape, float64 reference(preds, target, weights) per output)
_NAN_MOMENTS = {
  "std": (lambda: M.Std(), (), lambda p, t, w: _weighted_std(p, w, 0)),
  "std_ddof1": (lambda: M.Std(ddof=1), (), lambda p, t, w: _weighted_std(p, w, 1)),
  "r2": (lambda: M.R2Score(), (), lambda p, t, w: skm.r2_score(t, p, sample_weight=w)),
  "r2_two_outputs": (
    lambda: M.R2Score(num_outputs=2, multioutput="raw_values"),
    (2,),
    lambda p, t, w: skm.r2_score(t, p, sample_weight=w),
  ),
  "pearson": (lambda: M.PearsonCorrelation(), (), _weighted_pearson),
  "pearson_two_outputs": (lambda: M.PearsonCorrelation(num_outputs=2), (2,), _weighted_pearson),
  "explained_variance": (
    lambda: M.ExplainedVariance(),
    (),
    lambda p, t, w: skm.explained_variance_score(t, p, sample_weight=w),
  ),
}


def _nan_batches(name, n=21, pad=5, nan_rows=True):
  """Two jitted ``batch_updates`` of ``name``'s metric merged, and the float64 references.

  Real rows: NaN in some elements of ``preds`` and ``target`` (only in output 0 of two),
  weights with zeros (a NaN there is not seen); ``pad`` padded rows full of NaN and inf.
  ``nan_rows=False`` masks the real rows holding a NaN out too (then nothing is invalid).
  """
  make, shape, ref = _NAN_MOMENTS[name]
  rng = np.random.default_rng(17)
  preds = rng.normal(size=(n, *shape)).astype(np.float32)
  target = (0.6 * preds + rng.normal(size=(n, *shape))).astype(np.float32)
  weights = rng.uniform(0.5, 2.0, n).astype(np.float32)
  weights[[1, 6, 9, 12]] = 0.0  # the NaN rows 1, 9 and 12 are not seen
  column = (slice(None), 0) if shape else (slice(None),)
  preds[column][[1, 4, 9, 15]] = np.nan
  target[column][[4, 12, 19]] = np.nan
  if name.startswith("std"):  # Std takes one keyword: the NaN of both
    target = preds
  nan = np.isnan(preds) | np.isnan(target)
  row_nan = nan.reshape(n, -1).any(1)
  real = np.ones(n, bool) if nan_rows else ~row_nan
  seen = np.broadcast_to(((weights != 0) & real).reshape(-1, *([1] * len(shape))), nan.shape)
  garbage = np.full((pad, *shape), np.nan, np.float32)
  args = {
    "preds": np.concatenate([preds, garbage]),
    "target": np.concatenate([target, np.full_like(garbage, np.inf)]),
    "weights": np.r_[weights, np.ones(pad, np.float32)],
    "mask": np.r_[real, np.zeros(pad, bool)],
  }
  if name.startswith("std"):
    args = {"values": args["preds"], "weights": args["weights"], "mask": args["mask"]}
  first = {k: v[:13] for k, v in args.items()}
  second = {k: v[13:] for k, v in args.items()}
  parts = [_batch_updates(make(), b) for b in (first, second)]  # both 13 rows
  used = (weights != 0) & real
  p64, t64 = preds[used].astype(np.float64), target[used].astype(np.float64)
  want = _per_output(ref, p64, t64, weights[used].astype(np.float64))
  return parts[0].merge(parts[1]), int(np.count_nonzero(nan & seen)), want


@pytest.mark.parametrize("name", _NAN_MOMENTS)
def test_moment_metrics_count_nan_in_real_elements(name):
  merged, count, want = _nan_batches(name)
  assert count > 0
  assert merged.invalid_counts() == {"nan value": count}
  got, want = np.atleast_1d(np.asarray(merged.compute(), np.float64)), np.atleast_1d(want)
  assert np.array_equal(np.isnan(got), np.isnan(want)) and np.isnan(want[0])
  np.testing.assert_allclose(got[~np.isnan(want)], want[~np.isnan(want)], rtol=2e-6)
  clean, count, want = _nan_batches(name, nan_rows=False)  # the NaN rows masked out
  assert count == 0 and clean.invalid_counts() == {"nan value": 0}
  assert not np.any(np.isnan(want))
  np.testing.assert_allclose(np.asarray(clean.compute(), np.float64), want, rtol=2e-6)


@pytest.mark.parametrize(
  "metric, keywords",
  [
    (M.Std(), ("values",)),
    (M.R2Score(), ("preds", "target")),
    (M.PearsonCorrelation(), ("target",)),
  ],
  ids=["std", "r2", "pearson"],
)
def test_nan_in_moment_metrics_is_reported_by_masked_eval(metric, keywords):
  x = np.arange(10, dtype=np.float32)
  y = (x % 3).astype(np.float32)
  data = {"values": x.copy(), "preds": x.copy(), "target": y}
  for keyword in keywords:
    data[keyword][[3, 7]] = np.nan
  batches = pe.pad_batches(data, 8, pad_value=np.nan)

  def step(params, batch):
    del params
    keys = metric.required_inputs()
    return metric.batch_updates(**{k: batch[k] for k in keys}, mask=batch["mask"])

  with pytest.raises(ValueError, match=rf"'{metric.name}': 2 x 'nan value'"):
    pe.masked_eval(step, None, batches, backend="jit")
  ignored = pe.masked_eval(step, None, batches, backend="jit", on_invalid="ignore")
  assert np.isnan(ignored[metric.name]) and ignored["num_examples"] == 10


def test_last_value_counts_nan_in_real_elements():
  # every update's NaN of nonzero weight is counted (not only the last one's); the value stays
  # the last update's mean (NaN when that update saw a NaN); padding and weight 0 never count
  rng = np.random.default_rng(19)
  values = rng.normal(size=(3, 8)).astype(np.float32)
  weights = rng.uniform(0.5, 2.0, (3, 8)).astype(np.float32)
  mask = np.ones((3, 8), bool)
  mask[:, 6:] = False
  values[:, 6:] = np.nan  # padding
  values[0, [1, 4]] = np.nan  # seen
  values[1, 2], weights[1, 2] = np.nan, 0.0  # not seen
  values[2, 5] = np.nan
  parts = [
    _batch_updates(M.LastValue(), {"values": v, "weights": w, "mask": m})
    for v, w, m in zip(values, weights, mask)
  ]
  seen = mask & (weights != 0)
  want = int(np.count_nonzero(np.isnan(values) & seen))
  assert want == 3
  merged = parts[0].merge(parts[1]).merge(parts[2])
  assert merged.invalid_counts() == {"nan value": want}
  assert np.isnan(float(merged.compute()))
  middle = parts[0].merge(parts[1])  # the last update: its weight-0 NaN unseen
  assert middle.invalid_counts() == {"nan value": 2}
  v, w = values[1][seen[1]].astype(np.float64), weights[1][seen[1]].astype(np.float64)
  np.testing.assert_allclose(float(middle.compute()), np.sum(w * v) / np.sum(w), rtol=1e-6)

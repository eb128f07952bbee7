"""metrics.Bootstrap: Poisson bootstrap replicas against an independent numpy/sklearn bootstrap.

The reference re-implements the documented counter-based hash in numpy (uint64 arithmetic masked to 32 bits)
and the Poisson(1) inverse CDF from scipy, draws the same counts, and computes each replica's metric in float64
(or with scikit-learn's ``sample_weight``). Padded rows hold NaN/garbage and id -1.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import accuracy_score, cohen_kappa_score, f1_score, matthews_corrcoef

import padded_eval as pe
from padded_eval.metrics.resampling._poisson_counts import poisson_counts

M32 = 0xFFFFFFFF
R = 24  # replicas in most tests


# --- the independent reference ---------------------------------------------------------------


def np_mix(x):
  x = np.asarray(x, np.uint64) & M32
  x ^= x >> np.uint64(16)
  x = (x * np.uint64(0x7FEB352D)) & M32
  x ^= x >> np.uint64(15)
  x = (x * np.uint64(0x846CA68B)) & M32
  return x ^ (x >> np.uint64(16))


def np_counts(seed, num_replicas, index):
  """The documented counts: [R, B] int64."""
  seed_key = np_mix(np.uint64(seed) ^ np.uint64(0x9E3779B9))
  keys = np_mix(seed_key ^ np.arange(num_replicas, dtype=np.uint64))[:, None]
  ids = np.asarray(index, np.int64).astype(np.uint64) & M32
  u = np_mix((np_mix(ids[None, :] ^ keys) + keys) & M32)
  scaled = stats.poisson(1.0).cdf(np.arange(40)) * 2.0**32
  thresholds = np.floor(scaled)[np.floor(scaled) < 2.0**32 - 1]
  return (u[..., None].astype(np.float64) >= thresholds).sum(-1)


def with_padding(data, pad, rng):
  """Appends `pad` garbage rows (NaN floats, wild ints, id -1) and the mask."""
  out = {}
  for key, x in data.items():
    junk = np.full((pad,) + x.shape[1:], np.nan, x.dtype) if x.dtype.kind == "f" else None
    if junk is None:
      junk = rng.integers(-(10**6), 10**6, (pad,) + x.shape[1:]).astype(x.dtype)
    out[key] = np.concatenate([x, junk])
  out["index"][len(data["index"]) :] = -1
  out["mask"] = np.arange(len(out["index"])) < len(data["index"])
  return out


def classification_data(n=120, c=4, seed=0):
  rng = np.random.default_rng(seed)
  target = rng.integers(0, c, n)
  logits = rng.normal(size=(n, c)).astype(np.float32)
  logits[np.arange(n), target] += 1.0  # better than chance
  return {"preds": logits, "target": target, "index": np.arange(n, dtype=np.int32) + 1000}


def boot(metric, **kw):
  return pe.metrics.Bootstrap(metric, num_replicas=kw.pop("num_replicas", R), **kw)


# --- the sampler -------------------------------------------------------------------------------


def test_counts_equal_the_documented_hash_in_numpy():
  rng = np.random.default_rng(1)
  index = np.concatenate([rng.integers(0, 2**31 - 1, 500), [0, -1, 2**31 - 1]]).astype(np.int32)
  for seed in (0, 1, 12345, 2**32 - 1):
    ours = np.asarray(poisson_counts(seed, 37, jnp.asarray(index)))
    np.testing.assert_array_equal(ours, np_counts(seed, 37, index))


def test_counts_are_poisson_one():
  counts = np.asarray(poisson_counts(7, 1000, jnp.arange(1000, dtype=jnp.int32))).ravel()
  n = counts.size  # 10**6
  assert abs(counts.mean() - 1.0) < 5 * math.sqrt(1 / n)
  assert abs(counts.var() - 1.0) < 5 * math.sqrt(3 / n)  # Var(s^2) = (mu4 - 1) / n = 3 / n
  for k in range(5):
    p = stats.poisson(1.0).pmf(k)
    assert abs(np.mean(counts == k) - p) < 5 * math.sqrt(p * (1 - p) / n), k
  # Different replicas, seeds and neighbouring ids are uncorrelated.
  grid = counts.reshape(1000, 1000)
  assert abs(np.corrcoef(grid[0], grid[1])[0, 1]) < 0.15
  assert abs(np.corrcoef(grid[:, :-1].ravel(), grid[:, 1:].ravel())[0, 1]) < 5 / 1000
  other = np.asarray(poisson_counts(8, 1000, jnp.arange(1000, dtype=jnp.int32))).ravel()
  assert abs(np.corrcoef(counts, other)[0, 1]) < 5 / 1000


# --- replicas against the numpy / sklearn bootstrap -----------------------------------------


def reference_replicas(fn, data, seed=0, num_replicas=R):
  counts = np_counts(seed, num_replicas, data["index"])
  return np.array([fn(k) for k in counts])


def run(metric, data, **kw):
  empty = boot(metric, **kw)
  return jax.jit(lambda batch: empty.update(**batch))(data)


def test_accuracy_and_macro_f1_match_sklearn():
  data = classification_data()
  padded = with_padding(data, 9, np.random.default_rng(2))
  pred_ids = data["preds"].argmax(-1)
  for metric, fn in [
    (pe.metrics.Accuracy(), lambda k: accuracy_score(data["target"], pred_ids, sample_weight=k)),
    (
      pe.metrics.F1Score(num_classes=4),
      lambda k: f1_score(data["target"], pred_ids, average="macro", sample_weight=k),
    ),
  ]:
    b = run(metric, padded)  # accuracy: counts as weights; F1: as repeat masks
    assert float(b.compute()) == float(metric.update(**padded).compute())
    np.testing.assert_allclose(b.replicas(), reference_replicas(fn, data), rtol=2e-6)
    low, high = b.compute_interval(0.9)
    ref = reference_replicas(fn, data)
    np.testing.assert_allclose([low, high], np.quantile(ref, [0.05, 0.95]), rtol=2e-6)


def test_matthews_and_quadratic_kappa_match_sklearn():
  data = classification_data(n=100, c=4, seed=10)
  padded = with_padding(data, 4, np.random.default_rng(11))
  pred_ids = data["preds"].argmax(-1)
  cases = [
    (pe.metrics.MatthewsCorrCoef(num_classes=4), matthews_corrcoef, {}),
    (
      pe.metrics.CohenKappa(num_classes=4, weights="quadratic"),
      cohen_kappa_score,
      {"weights": "quadratic"},
    ),
  ]
  for metric, fn, options in cases:
    b = run(metric, padded, num_replicas=12)
    assert float(b.compute()) == float(metric.update(**padded).compute())
    ref = lambda k: fn(data["target"], pred_ids, sample_weight=k, **options)  # noqa: E731
    np.testing.assert_allclose(
      b.replicas(), reference_replicas(ref, data, num_replicas=12), rtol=1e-5
    )


def test_confusion_matrix_counts_are_exact_integers():
  data = classification_data(n=90, c=3)
  padded = with_padding(data, 6, np.random.default_rng(3))
  b = run(pe.metrics.ConfusionMatrix(num_classes=3), padded)

  def reference(k):
    matrix = np.zeros((3, 3), np.int64)
    np.add.at(matrix, (data["target"], data["preds"].argmax(-1)), k)
    return matrix

  np.testing.assert_array_equal(b.replicas(), reference_replicas(reference, data))


def test_mean_std_and_perplexity_match_float64():
  rng = np.random.default_rng(4)
  n, t, v = 50, 6, 7
  data = {
    "values": rng.normal(3.0, 2.0, n).astype(np.float32),
    "preds": rng.normal(size=(n, t, v)).astype(np.float32),
    "target": rng.integers(0, v, (n, t)),
    "index": np.arange(n, dtype=np.int32),
  }
  token_mask = rng.random((n, t)) < 0.7
  padded = with_padding(data, 5, rng)
  padded["mask"] = np.concatenate([token_mask, np.zeros((5, t), bool)])  # token-level mask
  values = data["values"].astype(np.float64)
  logits = data["preds"].astype(np.float64)
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  nll = -np.take_along_axis(log_probs, data["target"][..., None], -1)[..., 0]

  def std(k):
    mean = np.sum(k * values) / k.sum()
    return np.sqrt(np.sum(k * (values - mean) ** 2) / k.sum())

  def perplexity(k):  # whole rows resampled: row k broadcast over its tokens
    w = k[:, None] * token_mask
    return np.exp(np.sum(w * nll) / w.sum())

  cases = [
    (pe.metrics.Mean(), lambda k: np.sum(k * values) / k.sum()),
    (pe.metrics.Std(), std),
    (pe.metrics.Perplexity(), perplexity),
  ]
  row_mask = dict(padded, mask=padded["mask"].any(-1) | (np.arange(n + 5) < n))
  for metric, fn in cases:
    inputs = padded if isinstance(metric, pe.metrics.Perplexity) else row_mask
    b = run(metric, inputs, seed=3)
    np.testing.assert_array_equal(b.compute(), metric.update(**inputs).compute())
    np.testing.assert_allclose(b.replicas(), reference_replicas(fn, data, seed=3), rtol=3e-6)


def test_collection_with_a_loss_and_counting_metrics():
  data = classification_data(n=80, c=3)
  padded = with_padding(data, 4, np.random.default_rng(5))
  collection = pe.Metrics(
    {
      "acc": pe.metrics.Accuracy(),
      "f1": pe.metrics.F1Score(num_classes=3, average="micro"),
      "xent": pe.losses.Crossentropy(),
    }
  )
  b = run(collection, padded)  # F1 refuses weights: every member resampled by repeat masks
  replicas = b.replicas()
  pred_ids = data["preds"].argmax(-1)
  ref = reference_replicas(
    lambda k: accuracy_score(data["target"], pred_ids, sample_weight=k), data
  )
  np.testing.assert_allclose(replicas["acc"], ref, rtol=2e-6)
  np.testing.assert_allclose(replicas["f1"], ref, rtol=2e-6)  # micro F1 = accuracy
  logits = data["preds"].astype(np.float64)
  log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  nll = -log_probs[np.arange(len(pred_ids)), data["target"]]
  xent = reference_replicas(lambda k: np.sum(k * nll) / k.sum(), data)
  np.testing.assert_allclose(replicas["xent"], xent, rtol=3e-6)
  logs = b.compute_logs()
  assert set(logs) == {f"{k}{s}" for k in ("acc", "f1", "xent") for s in ("", "_low", "_high")}


def test_weights_and_repeat_modes_agree():
  data = classification_data(n=64)
  a = run(pe.metrics.Accuracy(), data, resample="weights").replicas()
  b = run(pe.metrics.Accuracy(), data, resample="repeat").replicas()
  np.testing.assert_allclose(a, b, rtol=1e-6)


def test_routed_keywords_reach_the_wrapped_metric():
  data = classification_data(n=48)
  plain = run(pe.metrics.Accuracy(), data).replicas()
  renamed = {"logits": data["preds"], "target": data["target"], "index": data["index"]}
  inner = run(pe.metrics.Accuracy().map_arg(preds="logits"), renamed).replicas()
  np.testing.assert_array_equal(inner, plain)
  outer = boot(pe.metrics.Accuracy()).map_arg(index="row_id")
  ids = {"preds": data["preds"], "target": data["target"], "row_id": data["index"]}
  np.testing.assert_array_equal(jax.jit(lambda b: outer.update(**b))(ids).replicas(), plain)


# --- invariance: batch size, order, padding, devices --------------------------------------


def batched_state(metric, data, batch_size, order, rng):
  """Bootstrap batch states of `data` cut into padded batches, stacked [S, ...] in `order`."""
  n = len(data["index"])
  cuts = [{k: v[s : s + batch_size] for k, v in data.items()} for s in range(0, n, batch_size)]
  states, update = [], jax.jit(lambda batch: metric.batch_updates(**batch))
  for part in (cuts[i] for i in order(len(cuts))):
    states.append(update(with_padding(part, batch_size - len(part["index"]) + 2, rng)))
  return jax.tree.map(lambda *xs: jnp.stack(xs), *states).aggregate()


@pytest.mark.parametrize(
  "metric",
  [
    pe.metrics.Mean(argname="values"),
    pe.metrics.F1Score(num_classes=4),
    pe.metrics.AUROC(num_thresholds=64),
  ],
  ids=["mean", "f1", "auroc"],
)
def test_replicas_do_not_depend_on_batching(metric):
  rng = np.random.default_rng(6)
  data = classification_data(n=100)
  data["values"] = rng.normal(size=100).astype(np.float32)
  if isinstance(metric, pe.metrics.AUROC):
    data = {"preds": data["values"], "target": data["target"] % 2, "index": data["index"]}
  b = boot(metric)
  whole = jax.jit(lambda batch: b.update(**batch))(data).replicas()
  forward = batched_state(b, data, 16, range, rng).replicas()
  backward = batched_state(b, data, 16, lambda s: reversed(range(s)), rng).replicas()
  exact = not isinstance(metric, pe.metrics.Mean)
  for other in (forward, backward):
    if exact:  # integer counts
      np.testing.assert_array_equal(other, whole)
    else:  # float rounding of a mean of values of scale 1
      np.testing.assert_allclose(other, whole, rtol=1e-6, atol=1e-7)


def test_through_masked_eval_on_every_backend():
  rng = np.random.default_rng(7)
  n, c = 150, 5
  data = {"x": rng.normal(size=(n, c)).astype(np.float32), "y": rng.integers(0, c, n)}
  metric = pe.Metrics({"acc": boot(pe.metrics.Accuracy()), "mean": boot(pe.metrics.Mean())})

  def step(params, batch):
    return metric.batch_updates(
      preds=batch["x"] * params,
      target=batch["y"],
      values=batch["x"][:, 0],
      mask=batch["mask"],
      index=batch["index"],
    )

  host = metric.update(
    preds=data["x"], target=data["y"], values=data["x"][:, 0], index=np.arange(n, dtype=np.int32)
  ).children
  results = {}
  for backend, batch_size in [("pmap", 16), ("jit", 24)]:
    batches = pe.pad_batches(
      data, batch_size, num_devices=8, pad_value={"x": np.nan, "y": -7}, index_key="index"
    )
    logs = pe.masked_eval(step, np.float32(1.0), batches, backend=backend)
    results[backend, batch_size] = logs
  for logs in results.values():
    assert logs["num_examples"] == n
    for key in ("acc", "mean"):
      np.testing.assert_allclose(logs[key], host[key].compute(), rtol=1e-6)
      low, high = host[key].compute_interval()
      np.testing.assert_allclose([logs[f"{key}_low"], logs[f"{key}_high"]], [low, high], rtol=1e-6)
      assert low < logs[key] < high


def test_replicas_through_masked_eval_equal_the_host_bootstrap():
  rng = np.random.default_rng(8)
  n = 100
  data = {"x": rng.normal(size=(n, 3)).astype(np.float32), "y": rng.integers(0, 3, n)}
  metric = boot(pe.metrics.ConfusionMatrix(num_classes=3))

  def step(params, batch):
    return metric.batch_updates(
      preds=batch["x"], target=batch["y"], mask=batch["mask"], index=batch["index"]
    )

  whole = {"preds": data["x"], "target": data["y"], "index": np.arange(n, dtype=np.int32)}
  host = jax.jit(lambda batch: metric.update(**batch))(whole)
  reference = np.asarray(host.replicas())
  for backend, batch_size in [("pmap", 16), ("shard_map", 24), ("jit", 8)]:
    batches = pe.pad_batches(
      data, batch_size, num_devices=8, pad_value={"x": np.nan, "y": -7}, index_key="index"
    )
    logs = pe.masked_eval(step, None, batches, backend=backend)
    low, high = np.quantile(reference, [0.025, 0.975], axis=0)  # of exact integer replicas
    np.testing.assert_allclose(logs["confusionmatrix_low"], low, rtol=1e-6)
    np.testing.assert_allclose(logs["confusionmatrix_high"], high, rtol=1e-6)


# --- errors ---------------------------------------------------------------------------------


def test_missing_index_says_how_to_get_ids():
  with pytest.raises(ValueError, match=r"index_key=\"index\""):
    boot(pe.metrics.Mean()).update(values=np.ones(3, np.float32))


def test_absurd_size_is_explained():
  with pytest.raises(ValueError, match=r"max_state_bytes.*fewer replicas"):
    pe.metrics.Bootstrap(pe.metrics.ConfusionMatrix(num_classes=1000), num_replicas=10_000)


@pytest.mark.parametrize(
  "kwargs, word",
  [
    ({"num_replicas": 0}, "num_replicas"),
    ({"seed": -1}, "seed"),
    ({"seed": 2**32}, "seed"),
    ({"confidence": 1.0}, "confidence"),
    ({"resample": "x"}, "resample"),
  ],
)
def test_bad_configuration(kwargs, word):
  with pytest.raises(ValueError, match=word):
    pe.metrics.Bootstrap(pe.metrics.Mean(), **kwargs)


def test_bad_index():
  with pytest.raises(ValueError, match="index"):
    boot(pe.metrics.Mean()).update(values=np.ones(3, np.float32), index=np.ones((3, 2), np.int32))


@pytest.mark.parametrize("rows", [7, 9])
@pytest.mark.parametrize(
  "metric, inputs",
  [
    (pe.metrics.Mean(), {"values": np.ones(8, np.float32)}),
    (pe.metrics.Mean(), {"values": np.ones(8, np.float32), "mask": np.ones(8, bool)}),
    (
      pe.metrics.Accuracy(task="binary"),
      {"preds": np.ones(8, np.int32), "target": np.ones(8, np.int32)},
    ),
  ],
)
def test_index_of_the_wrong_length_is_named(
  rows, metric, inputs
):  # issue 26: it was blamed on the mask
  named = "mask" if "mask" in inputs else next(iter(inputs))
  with pytest.raises(
    ValueError,
    match=rf"^index has shape \({rows},\); expected \[8\], one row id per row of the batch \('{named}' has "
    r"shape \(8,\)\)",
  ):
    boot(metric).update(index=np.arange(rows, dtype=np.int32), **inputs)


# --- calibration on synthetic data ------------------------------------------------------------


def test_coverage_for_accuracy_and_a_mean():
  """n=400, p=0.7: the 95% interval covers p in 90-98% of 200 test sets; sd within 15%."""
  n, sims, p = 400, 200, 0.7
  rng = np.random.default_rng(9)
  hits = rng.random((sims, n)) < p
  target = rng.integers(0, 2, (sims, n))
  preds = np.where(hits, target, 1 - target)
  values = rng.normal(2.0, 1.0, (sims, n)).astype(np.float32)
  index = (np.arange(sims)[:, None] * n + np.arange(n)).astype(np.int32)  # new rows, new counts
  acc = boot(pe.metrics.Accuracy(task="binary"), num_replicas=400)
  mean = boot(pe.metrics.Mean(), num_replicas=400)

  @jax.jit
  @jax.vmap
  def replicas(preds, target, values, index):
    a = acc.update(preds=preds.astype(jnp.float32), target=target, index=index)
    m = mean.update(values=values, index=index)
    return a.replicas(), m.replicas()

  acc_replicas, mean_replicas = map(np.asarray, replicas(preds, target, values, index))
  for reps, truth, sd in [
    (acc_replicas, p, math.sqrt(p * (1 - p) / n)),
    (mean_replicas, 2.0, 0.05),
  ]:
    low, high = np.quantile(reps, [0.025, 0.975], axis=1)
    coverage = np.mean((low <= truth) & (truth <= high))
    print(f"coverage {coverage:.3f}, sd ratio {np.mean(reps.std(axis=1)) / sd:.3f}")
    assert 0.90 <= coverage <= 0.98, coverage
    assert abs(np.mean(reps.std(axis=1)) / sd - 1) < 0.15


def test_invalid_values_are_reported_as_the_wrapped_metric_reports_them():
  data = classification_data(n=32)
  data["target"][[3, 9]] = 7  # out of range for 4 classes, on real rows
  wrapped = pe.metrics.Accuracy().update(**data)
  b = run(pe.metrics.Accuracy(), data)
  assert b.invalid_report() == wrapped.invalid_report() != []
  collection = pe.Metrics({"top1": boot(pe.metrics.Accuracy())}).update(**data)
  assert [name for name, _, _ in collection.invalid_report()] == ["top1"]


def test_replicas_beyond_a_capacity_are_reported():
  """A replica holds each row as many times as it is drawn: an exact AUROC whose point estimate
  fits its capacity can overflow in some replicas (their values NaN, so the interval's). Those
  replicas are reported, counted as the documented counts say, and masked_eval refuses them."""
  n = 40
  rng = np.random.default_rng(0)
  data = {"preds": rng.random(n).astype(np.float32), "target": rng.integers(0, 2, n)}
  index = np.arange(n, dtype=np.int32)
  drawn = np_counts(0, 50, index).sum(axis=1)  # elements each replica holds
  over = drawn > n
  assert 0 < over.sum() < 50
  metric = boot(pe.metrics.AUROC(exact=True, capacity=n), num_replicas=50)
  b = metric.update(**data, index=index)
  assert np.isnan(np.asarray(b.replicas())).sum() == over.sum()
  (name, kind, count), *rest = b.invalid_report()
  assert not rest and name == "auroc"
  assert f"in {over.sum()} of 50 bootstrap replicas" in kind and "capacity=40" in kind
  assert count == (drawn - n)[over].sum()
  step = lambda params, batch: metric.batch_updates(
    preds=batch["preds"], target=batch["target"], mask=batch["mask"], index=batch["index"]
  )
  batches = pe.pad_batches({**data, "index": index}, 16)
  with pytest.raises(ValueError, match="bootstrap replicas"):
    pe.masked_eval(step, None, batches, backend="jit")
  roomy = boot(
    pe.metrics.AUROC(exact=True, capacity=n + 5 * math.ceil(math.sqrt(n))), num_replicas=50
  )
  b = roomy.update(**data, index=index)
  assert b.invalid_report() == [] and np.isfinite(np.asarray(b.compute_interval())).all()


def test_repeated_ids_in_a_batch_are_reported_by_masked_eval():
  """Issue 65: labels passed as ``index`` (every row of a class drawn together) silently widened
  the interval; now the repeated ids are counted (``invalid_report``) and masked_eval raises. With
  the row ids of pad_batches the interval is the numpy bootstrap's over the same counts."""
  data = classification_data(n=203, c=4, seed=65)
  del data["index"]
  metric = boot(pe.metrics.Accuracy(), num_replicas=200)

  def step(params, batch, ids):
    return metric.batch_updates(
      preds=batch["preds"], target=batch["target"], mask=batch["mask"], index=batch[ids]
    )

  batches = lambda: pe.pad_batches(
    data, 32, pad_value={"preds": np.nan, "target": -7}, index_key="index"
  )
  with pytest.raises(ValueError, match=r"'accuracy': \d+ x 'repeated row id") as info:
    pe.masked_eval(functools.partial(step, ids="target"), None, batches(), backend="jit")
  # 203 rows in 7 batches of 4 classes: every real row but the first of its class in its batch
  blocks = [data["target"][i : i + 32] for i in range(0, 203, 32)]
  repeated = sum(len(b) - len(np.unique(b)) for b in blocks)
  assert f"'accuracy': {repeated} x 'repeated row id" in str(info.value)
  logs = pe.masked_eval(functools.partial(step, ids="index"), None, batches(), backend="jit")
  hits = (data["preds"].argmax(-1) == data["target"]).astype(np.float64)
  counts = np_counts(0, 200, np.arange(203))
  replicas = (counts * hits).sum(1) / counts.sum(1)
  np.testing.assert_allclose(logs["accuracy"], hits.mean(), rtol=1e-6)
  low, high = np.quantile(replicas, [0.025, 0.975])
  np.testing.assert_allclose([logs["accuracy_low"], logs["accuracy_high"]], [low, high], rtol=1e-5)

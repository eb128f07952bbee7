"""pe.Metrics, pe.Losses, pe.LossesAndMetrics: names, exact weighting, the Metric protocol."""

import jax
import numpy as np
import pytest
from _loss_reference import categorical_xent, with_garbage

import padded_eval as pe

C = 4


def _dataset(n=37, seed=0):
  rng = np.random.default_rng(seed)
  return dict(
    preds=rng.normal(size=(n, C)).astype(np.float32),
    target=rng.integers(0, C, size=n),
    values=rng.normal(3.0, 2.0, size=n).astype(np.float32),
  )


def _padded_batches(data, batch_size, seed=1):
  """Fixed-size batches, the last one padded with NaN / garbage rows, plus ``mask``."""
  rng = np.random.default_rng(seed)
  n = len(data["target"])
  for start in range(0, n, batch_size):
    real = min(batch_size, n - start)
    mask = np.arange(batch_size) < real
    batch = {}
    for key, value in data.items():
      chunk = np.zeros((batch_size,) + value.shape[1:], value.dtype)
      chunk[:real] = value[start : start + real]
      batch[key] = with_garbage(chunk, mask, rng)
    yield dict(batch, mask=mask)


def _reference(data):
  preds, target = data["preds"].astype(np.float64), data["target"]
  top2 = np.argsort(-preds, axis=-1, kind="stable")[:, :2]
  return {
    "acc": np.mean(preds.argmax(-1) == target),
    "top2": np.mean((top2 == target[:, None]).any(-1)),
    "mean_values": np.mean(data["values"].astype(np.float64)),
    "crossentropy": np.mean(categorical_xent(preds, target)),
  }


def _metrics():
  return pe.Metrics(
    {
      "acc": pe.metrics.Accuracy(),
      "top2": pe.metrics.Accuracy(top_k=2),
      "mean_values": pe.metrics.Mean(),
    }
  )


def _assert_logs(got, expected, rtol=2e-6):
  assert set(got) == set(expected), (sorted(got), sorted(expected))
  for key, value in expected.items():
    np.testing.assert_allclose(float(got[key]), value, rtol=rtol, err_msg=key)


# --- names ---------------------------------------------------------------------------------


def test_list_names_get_numeric_suffixes_like_jax_metrics():
  acc = pe.metrics.Accuracy
  metrics = pe.Metrics([acc(), acc(top_k=2), acc(top_k=3), acc(name="top5"), acc(name="top5")])
  assert metrics.names == ("accuracy", "accuracy2", "accuracy3", "top5", "top5_2")
  batch = dict(preds=np.eye(C, dtype=np.float32)[[1, 2]], target=np.array([1, 0]))
  assert list(metrics.update(**batch).compute()) == list(metrics.names)


def test_dict_keys_and_nested_groups_join_with_slash():
  acc = pe.metrics.Accuracy
  metrics = pe.Metrics(
    {"train": [acc(), acc()], "val": {"acc": acc(), "deep": [acc()]}, "plain": acc()}
  )
  assert metrics.names == (
    "train/accuracy",
    "train/accuracy2",
    "val/acc",
    "val/deep/accuracy",
    "plain",
  )
  inner = pe.Metrics([acc(), pe.metrics.Mean()])
  outer = pe.Metrics([inner, {"g": inner}])
  batch = dict(preds=np.eye(C, dtype=np.float32)[[1]], target=np.array([1]), values=np.array([2.0]))
  assert list(outer.update(**batch).compute()) == [
    "metrics/accuracy",
    "metrics/mean",
    "g/accuracy",
    "g/mean",
  ]


def test_losses_and_metrics_keep_colliding_names_unique():
  lam = pe.LossesAndMetrics(
    metrics=[pe.metrics.Mean(name="loss"), pe.metrics.Mean(name="crossentropy")],
    losses=[pe.losses.Crossentropy()],
  )
  data = _dataset(9)
  got = lam.update(**data).compute()
  assert list(got) == ["loss", "crossentropy", "loss2", "crossentropy2"]
  ref = _reference(data)
  _assert_logs(
    got,
    {
      "loss": ref["crossentropy"],
      "crossentropy": ref["crossentropy"],
      "loss2": ref["mean_values"],
      "crossentropy2": ref["mean_values"],
    },
  )


# --- exact weighting ----------------------------------------------------------------------------


@pytest.mark.parametrize("batch_size", [4, 8, 37, 64])
def test_metrics_over_padded_batches_equal_the_whole_dataset(batch_size):
  data = _dataset()
  metrics = _metrics()
  for batch in _padded_batches(data, batch_size):
    metrics = metrics.update(**batch)
  ref = _reference(data)
  _assert_logs(metrics.compute(), {k: ref[k] for k in ("acc", "top2", "mean_values")})
  assert metrics.compute_logs().keys() == metrics.compute().keys()


def test_losses_weight_batches_by_real_examples_not_equally():
  data = _dataset(n=10)
  params = {"w": np.array([0.5, -2.0], np.float32)}
  l2 = 1e-2 * (0.25 + 4.0)
  losses = pe.Losses([pe.losses.Crossentropy(), pe.regularizers.L2(1e-2)])
  batch_means = []
  for batch in _padded_batches(data, 9):  # 9 real rows, then 1 real + 8 NaN rows
    loss, losses = losses.loss_and_update(**batch, parameters=params)
    real = batch["mask"]
    batch_xent = np.mean(categorical_xent(batch["preds"][real], batch["target"][real]))
    np.testing.assert_allclose(float(loss), batch_xent + l2, rtol=2e-6)
    batch_means.append(batch_xent)
  ref = _reference(data)["crossentropy"]
  _assert_logs(losses.compute(), {"crossentropy": ref, "l2": l2})
  np.testing.assert_allclose(float(losses.total_loss()), ref + l2, rtol=2e-6)
  # the seed (jax_metrics) would report the unweighted mean of the two batch means
  assert abs(np.mean(batch_means) - ref) > 1e-3


def test_all_padding_batch_adds_nothing_and_has_zero_batch_loss():
  data = _dataset(n=6)
  params = {"w": np.ones(3, np.float32)}
  lam = pe.LossesAndMetrics(
    metrics=[pe.metrics.Accuracy()], losses=[pe.losses.Crossentropy(), pe.regularizers.L1(0.1)]
  )
  lam = lam.update(**data, parameters=params)
  empty_batch = {
    k: np.full_like(v[:4], np.nan if v.dtype.kind == "f" else 99) for k, v in data.items()
  }
  loss, after = lam.loss_and_update(**empty_batch, mask=np.zeros(4, bool), parameters=params)
  assert float(loss) == 0.0
  _assert_logs(after.compute(), {k: float(v) for k, v in lam.compute().items()}, rtol=0)
  assert np.isnan(float(lam.reset().total_loss()))  # nothing seen: NaN, like every metric


# --- the Metric protocol ------------------------------------------------------------------------


def _collections():
  return [
    _metrics(),
    pe.Losses({"xent": pe.losses.Crossentropy(), "l_two": pe.regularizers.L2(1e-3)}),
    pe.LossesAndMetrics(metrics=_metrics(), losses=[pe.losses.Crossentropy()]),
  ]


@pytest.mark.parametrize("index", range(3), ids=["metrics", "losses", "losses_and_metrics"])
def test_empty_has_the_updated_structure_and_scan_jit_agree(index):
  collection = _collections()[index]
  data = _dataset(n=24)
  params = {"w": np.ones(2, np.float32)}
  batches = list(_padded_batches(data, 8))
  updated = collection.update(**batches[0], parameters=params)
  spec = lambda tree: [(x.shape, x.dtype) for x in jax.tree.leaves(tree)]
  assert jax.tree.structure(updated) == jax.tree.structure(collection.reset())
  assert spec(updated) == spec(collection.empty()) == spec(updated.reset())
  fresh = _collections()[index]  # a new collection holds the empty state; reset gives it back
  for got, empty in zip(jax.tree.leaves(updated.reset()), jax.tree.leaves(fresh)):
    np.testing.assert_array_equal(got, empty)
  _assert_logs(  # the empty state is the identity of merge
    fresh.merge(updated).compute(), {k: float(v) for k, v in updated.compute().items()}, rtol=1e-7
  )

  eager = collection
  for batch in batches:
    eager = eager.update(**batch, parameters=params)
  stacked = {k: np.stack([b[k] for b in batches]) for k in batches[0]}
  scanned, _ = jax.lax.scan(
    lambda m, b: (m.update(**b, parameters=params), None), collection, stacked
  )
  jitted = jax.jit(lambda m, b: m.update(**b, parameters=params))
  for batch in batches:
    collection = jitted(collection, batch)
  for other in (scanned, collection):
    _assert_logs(other.compute(), {k: float(v) for k, v in eager.compute().items()}, rtol=1e-6)


def test_equal_collections_share_one_compilation():
  traces = []

  @jax.jit
  def step(metrics, batch):
    traces.append(1)
    return metrics.update(**batch)

  batch = next(_padded_batches(_dataset(), 8))
  for _ in range(3):
    step(pe.LossesAndMetrics(metrics=_metrics(), losses=[pe.losses.Crossentropy()]), batch)
  assert len(traces) == 1


def test_pmap_reduce_and_all_gather_aggregate_equal_the_whole_dataset():
  data = _dataset(n=45)
  lam = pe.LossesAndMetrics(metrics=_metrics(), losses=[pe.losses.Crossentropy()])
  devices = jax.local_device_count()

  def step(lam, batch):
    batch_updates = lam.batch_updates(**batch)
    gathered = jax.lax.all_gather(batch_updates, "device").aggregate()
    return lam.merge(gathered), lam.merge(batch_updates.reduce("device"))

  pstep = jax.pmap(step, axis_name="device", in_axes=(None, 0))
  by_gather = by_reduce = lam
  for batch in _padded_batches(data, 2 * devices):
    sharded = {k: v.reshape((devices, 2) + v.shape[1:]) for k, v in batch.items()}
    out = jax.block_until_ready(pstep(by_gather, sharded))
    by_gather, by_reduce = (jax.tree.map(lambda x: x[0], o) for o in out)
  ref = _reference(data)
  expected = dict(ref, loss=ref["crossentropy"])
  _assert_logs(by_gather.compute(), expected, rtol=1e-5)
  _assert_logs(by_reduce.compute(), expected, rtol=1e-5)


# --- keyword routing -----------------------------------------------------------------------------


def test_each_child_reads_its_own_keywords():
  data = _dataset(n=20)
  metrics = pe.Metrics(
    [
      pe.metrics.Accuracy().map_arg(preds="logits"),
      pe.metrics.Mean("loss"),
      pe.metrics.Accuracy(name="nested").index_into(preds=("out", "scores")),
    ]
  )
  batches = list(_padded_batches(data, 8))
  for batch in batches:
    metrics = metrics.update(
      logits=batch["preds"],
      loss=batch["values"],
      preds={"out": {"scores": batch["preds"]}},
      target=batch["target"],
      mask=batch["mask"],
    )
  ref = _reference(data)
  _assert_logs(
    metrics.compute(), {"accuracy": ref["acc"], "mean": ref["mean_values"], "nested": ref["acc"]}
  )
  # routing on the collection itself, composed with the children's
  routed = pe.Metrics([pe.metrics.Accuracy()]).map_arg(preds="y_pred", target="y_true")
  for batch in batches:
    routed = routed.update(y_pred=batch["preds"], y_true=batch["target"], mask=batch["mask"])
  _assert_logs(routed.compute(), {"accuracy": ref["acc"]})
  assert hash(jax.tree.structure(routed)) == hash(jax.tree.structure(routed.reset()))


def test_a_loss_in_metrics_reports_its_mean():
  data = _dataset(n=11)
  metrics = pe.Metrics([pe.losses.Crossentropy(), pe.metrics.Accuracy()])
  for batch in _padded_batches(data, 4):
    metrics = metrics.update(**batch)
  ref = _reference(data)
  _assert_logs(metrics.compute(), {"crossentropy": ref["crossentropy"], "accuracy": ref["acc"]})


@pytest.mark.parametrize(
  "make, match",
  [
    (lambda: pe.Metrics([pe.metrics.Accuracy(), 3]), "Metrics takes Metric instances"),
    (lambda: pe.Metrics({1: pe.metrics.Accuracy()}), "dict keys"),
    (lambda: pe.Metrics([]), "at least one"),
    (lambda: pe.Losses([pe.metrics.Accuracy()]), "Losses takes"),
    (lambda: pe.LossesAndMetrics(), "got neither"),
    (
      lambda: pe.Metrics([pe.metrics.Mean()]).merge(pe.Losses([pe.losses.Crossentropy()])),
      "cannot merge",
    ),
    (lambda: pe.Metrics([pe.metrics.Mean("loss")]).update(values=np.ones(2)), "'loss'"),
  ],
)
def test_bad_input_raises_value_error(make, match):
  with pytest.raises(ValueError, match=match):
    make()


def test_a_sliced_or_bootstrapped_member_logs_its_names_under_its_key():
  """Before, ``Metrics({"m": Sliced(Mean, slice_names=...)})`` logged ``{"m": array}`` (scalars
  ``m/0``, ``m/1``: the names lost), and a ``Sliced(Bootstrap)`` member mixed that array with named
  intervals. Each member's logs are its own under its key; values against numpy per slice."""
  rng = np.random.default_rng(5)
  x = rng.normal(size=23).astype(np.float32)
  lang = rng.integers(0, 2, 23).astype(np.int32)  # slice "fr" stays empty
  names = ("en", "de", "fr")
  data = {"x": x, "lang": lang}
  members = {
    "m": pe.metrics.Sliced(pe.metrics.Mean("x"), 3, key="lang", slice_names=names),
    "b": pe.metrics.Sliced(
      pe.metrics.Bootstrap(pe.metrics.Mean("x"), num_replicas=16), 3, key="lang", slice_names=names
    ),
    "inner": pe.Metrics({"boot": pe.metrics.Bootstrap(pe.metrics.Mean("x"), num_replicas=16)}),
  }
  collection = pe.Metrics(members)
  batches = pe.pad_batches(data, 8, index_key="index")
  results = pe.masked_eval(
    lambda _, b: collection.batch_updates(
      x=b["x"], lang=b["lang"], index=b["index"], mask=b["mask"]
    ),
    None,
    batches,
    backend="jit",
  )
  want = {name: np.mean(x[lang == s].astype(np.float64)) for s, name in enumerate(names[:2])}
  for name, value in want.items():
    np.testing.assert_allclose(results[f"m/{name}"], value, rtol=1e-6)
    np.testing.assert_allclose(results[f"b/{name}"], value, rtol=1e-6)
    assert results[f"b_low/{name}"] <= value <= results[f"b_high/{name}"]
  assert np.isnan(results["m/fr"]) and np.isnan(results["b/fr"])
  np.testing.assert_allclose(results["inner/boot"], np.mean(x.astype(np.float64)), rtol=1e-6)
  assert {"inner/boot_low", "inner/boot_high"} <= set(results)
  assert "m" not in results and "b" not in results
  assert set(results.scalars()) >= {"m/en", "m/de", "b_low/en"}


def test_members_are_read_by_name_from_a_masked_eval_result():
  # Issue 65: results.metric["accuracy"] was a TypeError (only the undocumented .children worked).
  rng = np.random.default_rng(3)
  logits = rng.normal(size=(13, 3)).astype(np.float32)
  labels = rng.integers(0, 3, 13)
  data = {"logits": logits, "label": labels}
  metrics = pe.Metrics({"accuracy": pe.metrics.Accuracy(), "train": [pe.metrics.Accuracy(top_k=2)]})
  both = pe.LossesAndMetrics(metrics=metrics, losses=[pe.losses.Crossentropy()])

  def step(params, batch):
    return both.batch_updates(preds=batch["logits"], target=batch["label"], mask=batch["mask"])

  results = pe.masked_eval(step, None, pe.pad_batches(data, 8), backend="jit")
  top1 = float(np.mean(logits.argmax(-1) == labels))
  top2 = float(np.mean(np.any(np.argsort(-logits, -1)[:, :2] == labels[:, None], -1)))
  assert float(results.metric["accuracy"].compute()) == pytest.approx(top1)
  assert float(results.metric["train/accuracy"].compute()) == pytest.approx(top2)
  assert float(results.metric["crossentropy"].compute()) == pytest.approx(results["crossentropy"])
  assert "accuracy" in results.metric and "auroc" not in results.metric
  assert float(results.metric.metrics["accuracy"].compute()) == pytest.approx(top1)
  with pytest.raises(
    KeyError,
    match=r"no member 'auroc'; its members: \['accuracy', 'train/accuracy', 'crossentropy'\]",
  ):
    results.metric["auroc"]

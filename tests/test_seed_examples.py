"""Every code block of the jax_metrics README (seeds/002) and the nnx MultiMetric exercise
(seeds/004), rewritten with padded_eval names, checked against float64 numpy references.

Where the seeds are wrong for padded or unequal batches, the tests assert our corrected
value and say what the seed would give.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _loss_reference import categorical_xent, log_softmax, with_garbage
from sklearn.metrics import f1_score

import padded_eval as pe

N, D, C = 29, 3, 4
LR = 0.5


@pytest.fixture(scope="module")
def data():
  rng = np.random.default_rng(0)
  x = rng.normal(size=(N, D)).astype(np.float32)
  y = rng.integers(0, C, size=N)
  params = {
    "w": rng.normal(size=(D, C)).astype(np.float32) * 0.5,
    "b": rng.normal(size=C).astype(np.float32) * 0.1,
  }
  return x, y, params


def _batches(x, y, batch_size, seed=1):
  """Padded batches: padded x rows hold large finite garbage, y rows garbage ids."""
  rng = np.random.default_rng(seed)
  for start in range(0, len(y), batch_size):
    real = min(batch_size, len(y) - start)
    mask = np.arange(batch_size) < real
    xb = np.zeros((batch_size, D), np.float32)
    yb = np.zeros(batch_size, np.int64)
    xb[:real], yb[:real] = x[start : start + real], y[start : start + real]
    yield with_garbage(xb, mask, rng, value=1e3), with_garbage(yb, mask, rng), mask


def _logits(params, x):
  return np.asarray(x, np.float64) @ params["w"] + params["b"]


def _l2(params, factor):
  return factor * sum(float((np.asarray(p, np.float64) ** 2).sum()) for p in params.values())


def _f1(logits, y):
  return f1_score(y, logits.argmax(-1), average="macro", labels=range(C), zero_division=0)


# --- "Metric": reset, update, compute, compute_logs ------------------------------------------


def test_metric_getting_started(data):
  x, y, params = data
  logits = _logits(params, x).astype(np.float32)
  metric = pe.metrics.Accuracy()
  metric = metric.reset()
  metric = metric.update(target=y, preds=logits)
  acc = metric.compute()
  logs = metric.compute_logs()
  expected = np.mean(logits.argmax(-1) == y)
  np.testing.assert_allclose(float(acc), expected, rtol=1e-7)
  assert list(logs) == ["accuracy"]
  np.testing.assert_allclose(float(logs["accuracy"]), expected, rtol=1e-7)


# --- "Typical Training Setup": jit, grad(has_aux=True) -----------------------------------------


def _numpy_train(params, batches, factor=0.0):
  """SGD on the masked mean cross entropy (+ L2), and the accuracy of every batch's logits."""
  params = {k: np.asarray(v, np.float64) for k, v in params.items()}
  hits = seen = 0
  for xb, yb, mask in batches:
    xr, yr = np.asarray(xb, np.float64)[mask], yb[mask]
    logits = _logits(params, xr)
    hits, seen = hits + np.sum(logits.argmax(-1) == yr), seen + len(yr)
    dlogits = (np.exp(log_softmax(logits)) - np.eye(C)[yr]) / len(yr)
    grads = {
      "w": xr.T @ dlogits + 2 * factor * params["w"],
      "b": dlogits.sum(0) + 2 * factor * params["b"],
    }
    params = {k: params[k] - LR * grads[k] for k in params}
  return params, hits / seen


def _sgd(params, grads):
  return jax.tree.map(lambda p, g: p - LR * g, params, grads)


def test_training_setup_jit_and_grad_has_aux(data):
  x, y, params = data
  metric = pe.metrics.Accuracy()
  xent = pe.losses.Crossentropy()

  @jax.jit
  def init_step(metric):
    return metric.reset()

  def loss_fn(params, metric, x, y, mask):
    logits = x @ params["w"] + params["b"]
    metric = metric.update(target=y, preds=logits, mask=mask)
    return xent(target=y, preds=logits, mask=mask), metric

  @jax.jit
  def train_step(params, metric, x, y, mask):
    grads, metric = jax.grad(loss_fn, has_aux=True)(params, metric, x, y, mask)
    return _sgd(params, grads), metric

  batches = list(_batches(x, y, 8))
  metric = init_step(metric)
  trained = params
  for xb, yb, mask in batches:
    trained, metric = train_step(trained, metric, xb, yb, mask)
  expected_params, expected_acc = _numpy_train(params, batches)
  np.testing.assert_allclose(float(metric.compute()), expected_acc, rtol=1e-7)
  for key in params:
    np.testing.assert_allclose(np.asarray(trained[key]), expected_params[key], rtol=2e-5, atol=1e-6)


# --- "Distributed Training": batch_updates, all_gather(...).aggregate(), merge ----------------


def test_distributed_metric_all_gather_aggregate(data):
  x, y, params = data
  devices = jax.local_device_count()

  def loss_fn(params, metric, x, y, mask):
    logits = x @ params["w"] + params["b"]
    batch_updates = metric.batch_updates(target=y, preds=logits, mask=mask)
    batch_updates = jax.lax.all_gather(batch_updates, "device").aggregate()
    metric = metric.merge(batch_updates)
    return metric

  step = jax.pmap(loss_fn, axis_name="device", in_axes=(None, None, 0, 0, 0))
  metric = pe.Metrics([pe.metrics.Accuracy(), pe.metrics.F1Score(num_classes=C, name="f1")])
  for xb, yb, mask in _batches(x, y, 2 * devices):
    shard = lambda a: a.reshape((devices, 2) + a.shape[1:])
    out = jax.block_until_ready(step(params, metric, shard(xb), shard(yb), shard(mask)))
    metric = jax.tree.map(lambda a: a[0], out)
  logits = _logits(params, x)
  got = metric.compute()
  np.testing.assert_allclose(float(got["accuracy"]), np.mean(logits.argmax(-1) == y), rtol=1e-7)
  np.testing.assert_allclose(float(got["f1"]), _f1(logits, y), rtol=1e-6)


# --- "Loss" ------------------------------------------------------------------------------------


def test_loss_call_and_static_loss(data):
  x, y, params = data
  logits = _logits(params, x).astype(np.float32)
  crossentropy = pe.losses.Crossentropy()
  loss = crossentropy(target=y, preds=logits)
  expected = np.mean(categorical_xent(logits, y))
  np.testing.assert_allclose(float(loss), expected, rtol=2e-6)
  # losses are hashable configuration, so they can be static arguments
  static = jax.jit(lambda fn, t, p: fn(target=t, preds=p), static_argnums=0)
  np.testing.assert_allclose(float(static(crossentropy, y, logits)), expected, rtol=2e-6)


# --- "Combinators": Metrics (list, dict), Losses (list, dict), LossesAndMetrics ---------------


def _update_all(collection, x, y, params, batch_size=8):
  for xb, yb, mask in _batches(x, y, batch_size):
    logits = xb @ params["w"] + params["b"]
    collection = collection.update(target=yb, preds=logits, parameters=params, mask=mask)
  return collection


def _expected(x, y, params):
  logits = _logits(params, x)
  return {
    "accuracy": np.mean(logits.argmax(-1) == y),
    "f1": _f1(logits, y),
    "crossentropy": np.mean(categorical_xent(logits, y)),
    "l2": _l2(params, 1e-4),
  }


def _check(got, expected, rtol=2e-6):
  assert list(got) == list(expected)
  for key, value in expected.items():
    np.testing.assert_allclose(float(got[key]), value, rtol=rtol, err_msg=key)


@pytest.mark.parametrize("as_dict", [False, True], ids=["list", "dict"])
def test_metrics_combinator(data, as_dict):
  x, y, params = data
  children = [pe.metrics.Accuracy(), pe.metrics.F1Score(num_classes=C, name="f1")]
  metrics = pe.Metrics(dict(zip(["acc", "f_one"], children)) if as_dict else children)
  metrics = metrics.reset()
  metrics = _update_all(metrics, x, y, params)
  ref = _expected(x, y, params)
  keys = ["acc", "f_one"] if as_dict else ["accuracy", "f1"]
  expected = dict(zip(keys, [ref["accuracy"], ref["f1"]]))
  _check(metrics.compute(), expected)
  _check(metrics.compute_logs(), expected)


@pytest.mark.parametrize("as_dict", [False, True], ids=["list", "dict"])
def test_losses_combinator(data, as_dict):
  x, y, params = data
  children = [pe.losses.Crossentropy(), pe.regularizers.L2(1e-4)]
  losses = pe.Losses(dict(zip(["xent", "l_two"], children)) if as_dict else children)
  losses = losses.reset()
  losses = _update_all(losses, x, y, params)
  ref = _expected(x, y, params)
  keys = ["xent", "l_two"] if as_dict else ["crossentropy", "l2"]
  expected = dict(zip(keys, [ref["crossentropy"], ref["l2"]]))
  _check(losses.compute(), expected)
  _check(losses.compute_logs(), expected)
  np.testing.assert_allclose(float(losses.total_loss()), ref["crossentropy"] + ref["l2"], rtol=2e-6)


def _losses_and_metrics():
  return pe.LossesAndMetrics(
    metrics=[pe.metrics.Accuracy(), pe.metrics.F1Score(num_classes=C, name="f1")],
    losses=[pe.losses.Crossentropy(), pe.regularizers.L2(1e-4)],
  )


def test_losses_and_metrics_combinator(data):
  x, y, params = data
  lam = _losses_and_metrics().reset()
  lam = _update_all(lam, x, y, params)
  ref = _expected(x, y, params)
  expected = {
    "loss": ref["crossentropy"] + ref["l2"],
    "crossentropy": ref["crossentropy"],
    "l2": ref["l2"],
    "accuracy": ref["accuracy"],
    "f1": ref["f1"],
  }
  _check(lam.compute(), expected)
  _check(lam.compute_logs(), expected)
  np.testing.assert_allclose(float(lam.total_loss()), expected["loss"], rtol=2e-6)


# --- loss functions: batch_updates + total_loss + merge, and loss_and_update -------------------


def _loss_fn_batch_updates(params, collection, x, y, mask):
  logits = x @ params["w"] + params["b"]
  batch_updates = collection.batch_updates(target=y, preds=logits, parameters=params, mask=mask)
  loss = batch_updates.total_loss()
  collection = collection.merge(batch_updates)
  return loss, collection


def _loss_fn_loss_and_update(params, collection, x, y, mask):
  logits = x @ params["w"] + params["b"]
  return collection.loss_and_update(target=y, preds=logits, parameters=params, mask=mask)


@pytest.mark.parametrize(
  "loss_fn",
  [_loss_fn_batch_updates, _loss_fn_loss_and_update],
  ids=["batch_updates", "loss_and_update"],
)
@pytest.mark.parametrize(
  "make",
  [lambda: pe.Losses([pe.losses.Crossentropy(), pe.regularizers.L2(1e-4)]), _losses_and_metrics],
  ids=["losses", "losses_and_metrics"],
)
def test_loss_fn_patterns_train_under_jit_grad(data, loss_fn, make):
  x, y, params = data

  @jax.jit
  def train_step(params, collection, x, y, mask):
    grads, collection = jax.grad(loss_fn, has_aux=True)(params, collection, x, y, mask)
    return _sgd(params, grads), collection

  collection = make()
  trained = params
  batches = list(_batches(x, y, 8))  # 29 rows: the last batch holds 5 real rows and 3 padded
  for xb, yb, mask in batches:
    trained, collection = train_step(trained, collection, xb, yb, mask)
  expected_params, expected_acc = _numpy_train(params, batches, factor=1e-4)
  for key in params:
    np.testing.assert_allclose(np.asarray(trained[key]), expected_params[key], rtol=2e-5, atol=1e-6)
  if isinstance(collection, pe.LossesAndMetrics):
    np.testing.assert_allclose(float(collection.compute()["accuracy"]), expected_acc, rtol=1e-7)


def test_distributed_losses_and_metrics_exact_gradient(data):
  """The README's pmap loss_fn; the gradient uses our exact per-device share.

  Shards hold unequal numbers of real rows (the last batch is padded), so the seed's
  device-local mean loss with pmean'd gradients would weight devices equally; the share
  ``batch_loss(axis_name)`` with psum'd gradients is the exact global-batch gradient.
  """
  x, y, params = data
  devices = jax.local_device_count()

  def loss_fn(params, lam, x, y, mask):
    logits = x @ params["w"] + params["b"]
    batch_updates = lam.batch_updates(target=y, preds=logits, parameters=params, mask=mask)
    loss = batch_updates.batch_loss(axis_name="device")
    batch_updates = jax.lax.all_gather(batch_updates, "device").aggregate()
    lam = lam.merge(batch_updates)
    return loss, lam

  def train_step(params, lam, x, y, mask):
    grads, lam = jax.grad(loss_fn, has_aux=True)(params, lam, x, y, mask)
    return _sgd(params, jax.lax.psum(grads, "device")), lam

  step = jax.pmap(train_step, axis_name="device", in_axes=(None, None, 0, 0, 0))
  lam = _losses_and_metrics()
  trained = params
  batches = list(_batches(x, y, 2 * devices))  # 29 rows: 16, then 13 real + 3 padded
  for xb, yb, mask in batches:
    shard = lambda a: a.reshape((devices, 2) + a.shape[1:])
    out = jax.block_until_ready(step(trained, lam, shard(xb), shard(yb), shard(mask)))
    trained, lam = jax.tree.map(lambda a: a[0], out)
  expected_params, expected_acc = _numpy_train(params, batches, factor=1e-4)
  for key in params:
    np.testing.assert_allclose(np.asarray(trained[key]), expected_params[key], rtol=2e-5, atol=1e-6)
  np.testing.assert_allclose(float(lam.compute()["accuracy"]), expected_acc, rtol=1e-7)


# --- nnx MultiMetric exercise (seeds/004) --------------------------------------------------


def test_nnx_multimetric_block():
  metrics = pe.Metrics({"mse": pe.metrics.Mean("mse"), "mae": pe.metrics.Mean("mae")})
  metrics = metrics.update(mse=jnp.array(2.0), mae=jnp.array(1.0))
  metrics = metrics.update(mse=jnp.array(4.0), mae=jnp.array(2.0))
  result = metrics.compute()
  np.testing.assert_allclose(float(result["mse"]), np.mean([2.0, 4.0]))
  np.testing.assert_allclose(float(result["mae"]), np.mean([1.0, 2.0]))
  assert float(metrics.compute()["mse"]) == float(result["mse"])  # compute does not reset
  metrics = metrics.reset()
  metrics = metrics.update(mse=jnp.array(8.0), mae=jnp.array(3.0))
  np.testing.assert_allclose(float(metrics.compute()["mse"]), 8.0)


def test_nnx_unequal_batches_weighted_by_examples():
  """One example with error 10 and nine with error 0: 1.0 per example, 5.0 per batch."""
  errors = [np.array([10.0]), np.zeros(9)]
  expected = np.mean(np.concatenate(errors))
  per_batch = pe.metrics.Mean("mae")
  per_example = pe.metrics.Mean("mae")
  losses = pe.Losses([pe.losses.MeanAbsoluteError()])
  for err in errors:  # both batches padded to 9 rows; padded rows hold NaN
    mask = np.arange(9) < len(err)
    padded = np.concatenate([err, np.full(9 - len(err), np.nan)])
    per_batch = per_batch.update(mae=jnp.asarray(err.mean()))
    per_example = per_example.update(mae=padded, mask=mask)
    losses = losses.update(preds=padded, target=np.zeros(9), mask=mask)
  np.testing.assert_allclose(float(per_example.compute()), expected)
  np.testing.assert_allclose(float(losses.compute()["meanabsoluteerror"]), expected)
  assert float(per_batch.compute()) == 5.0  # what scalar batch means (and the seeds) give


def test_nnx_multimetric_exercise():
  """multimetric_aggregate: two SGD steps of an nnx.Linear, then batch-mean MSE/MAE."""
  optax = pytest.importorskip("optax")
  nnx = pytest.importorskip("flax.nnx")
  rng = np.random.default_rng(5)
  n, d_in, d_out, batch_size, lr, seed = 12, 3, 2, 4, 0.05, 7
  x = rng.normal(size=(n, d_in)).astype(np.float32)
  y = rng.normal(size=(n, d_out)).astype(np.float32)

  model = nnx.Linear(d_in, d_out, rngs=nnx.Rngs(seed))
  w0, b0 = np.asarray(model.kernel[...], np.float64), np.asarray(model.bias[...], np.float64)
  optimizer = nnx.Optimizer(model, optax.sgd(lr), wrt=nnx.Param)
  for _ in range(2):
    grads = nnx.grad(lambda m: jnp.mean((m(x) - y) ** 2))(model)
    optimizer.update(model, grads)
  metrics = pe.Metrics({"mse": pe.metrics.Mean("mse"), "mae": pe.metrics.Mean("mae")})
  exact = pe.Metrics([pe.metrics.MSE(), pe.metrics.MAE()])
  for start in range(0, n, batch_size):
    out, target = model(x[start : start + batch_size]), y[start : start + batch_size]
    metrics = metrics.update(mse=jnp.mean((out - target) ** 2), mae=jnp.mean(jnp.abs(out - target)))
    exact = exact.update(preds=out, target=target)
  result = metrics.compute()
  got = jnp.stack([result["mse"], result["mae"]])

  w, b = w0, b0  # numpy float64 reference of the two full-batch SGD steps
  for _ in range(2):
    err = np.asarray(x, np.float64) @ w + b - y
    w, b = w - lr * 2 * x.T @ err / err.size, b - lr * 2 * err.sum(0) / err.size
  err = (np.asarray(x, np.float64) @ w + b - y).reshape(n // batch_size, batch_size, d_out)
  expected = [np.mean((err**2).mean(axis=(1, 2))), np.mean(np.abs(err).mean(axis=(1, 2)))]
  assert got.shape == (2,)
  np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5)
  # equal batches: the per-element metrics agree with the batch means
  np.testing.assert_allclose([float(v) for v in exact.compute().values()], expected, rtol=1e-5)

"""pe.losses and pe.regularizers against float64 numpy references, padded rows full of NaN."""

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from _loss_reference import binary_xent, categorical_xent, log_softmax, masked_mean, with_garbage

import padded_eval as pe

B, T, C = 12, 3, 5


def _rows(rng, shape=(B,), frac=0.6):
  mask = rng.random(shape) < frac
  mask.flat[0] = True
  return mask


# Each case: (loss, make inputs(rng) -> (kwargs without mask, per-element reference fn)).
def _sparse(rng):
  preds = rng.normal(size=(B, C)).astype(np.float32) * 3
  target = rng.integers(0, C, size=(B,))
  return dict(preds=preds, target=target)


def _dense(rng):
  preds = rng.normal(size=(B, C)).astype(np.float32)
  target = rng.dirichlet(np.ones(C), size=B).astype(np.float32)
  return dict(preds=preds, target=target)


def _probs(rng):
  preds = rng.dirichlet(np.ones(C), size=B).astype(np.float32)
  preds[0, 0] = 0.0  # clipped to 1e-7 before the log
  return dict(preds=preds, target=rng.integers(0, C, size=(B,)))


def _tokens(rng):
  preds = rng.normal(size=(B, T, C)).astype(np.float32)
  return dict(preds=preds, target=rng.integers(0, C, size=(B, T)))


def _binary(rng):
  return dict(
    preds=rng.normal(size=(B, T)).astype(np.float32) * 4,
    target=(rng.random((B, T)) < 0.5).astype(np.float32),
  )


def _binary_probs(rng):
  return dict(
    preds=rng.random((B, T)).astype(np.float32), target=(rng.random((B, T)) < 0.5).astype(np.int32)
  )


def _regression(rng):
  return dict(
    preds=rng.normal(size=(B, T)).astype(np.float32),
    target=rng.normal(size=(B, T)).astype(np.float32),
  )


CASES = {
  "xent_sparse": (
    pe.losses.Crossentropy(),
    _sparse,
    lambda kw: categorical_xent(kw["preds"], kw["target"]),
  ),
  "xent_sparse_smooth": (
    pe.losses.Crossentropy(label_smoothing=0.2),
    _sparse,
    lambda kw: categorical_xent(kw["preds"], kw["target"], smoothing=0.2),
  ),
  "xent_dense": (
    pe.losses.Crossentropy(),
    _dense,
    lambda kw: categorical_xent(kw["preds"], kw["target"], dense=True),
  ),
  "xent_dense_smooth": (
    pe.losses.Crossentropy(label_smoothing=0.1),
    _dense,
    lambda kw: categorical_xent(kw["preds"], kw["target"], dense=True, smoothing=0.1),
  ),
  "xent_probs": (
    pe.losses.Crossentropy(from_logits=False),
    _probs,
    lambda kw: categorical_xent(kw["preds"], kw["target"], from_logits=False),
  ),
  "xent_tokens": (
    pe.losses.Crossentropy(),
    _tokens,
    lambda kw: categorical_xent(kw["preds"], kw["target"]),
  ),
  "bce_logits": (
    pe.losses.Crossentropy(binary=True),
    _binary,
    lambda kw: binary_xent(kw["preds"], kw["target"]),
  ),
  "bce_logits_smooth": (
    pe.losses.Crossentropy(binary=True, label_smoothing=0.3),
    _binary,
    lambda kw: binary_xent(kw["preds"], kw["target"], smoothing=0.3),
  ),
  "bce_probs": (
    pe.losses.Crossentropy(binary=True, from_logits=False),
    _binary_probs,
    lambda kw: binary_xent(kw["preds"], kw["target"], from_logits=False),
  ),
  "mse": (
    pe.losses.MeanSquaredError(),
    _regression,
    lambda kw: (kw["preds"].astype(np.float64) - kw["target"]) ** 2,
  ),
  "mae": (
    pe.losses.MeanAbsoluteError(),
    _regression,
    lambda kw: np.abs(kw["preds"].astype(np.float64) - kw["target"]),
  ),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("with_weights", [False, True])
def test_loss_matches_reference_with_nan_padding(case, with_weights):
  loss, make, reference = CASES[case]
  rng = np.random.default_rng(zlib.crc32(case.encode()))
  kw = make(rng)
  mask = _rows(rng)
  weights = rng.random(B).astype(np.float32) if with_weights else None
  expected = masked_mean(reference(kw), mask, weights)
  padded = {k: with_garbage(v, mask, rng) for k, v in kw.items()}
  if weights is not None:
    weights = with_garbage(weights, mask, rng)
  got = loss(**padded, mask=mask, weights=weights)
  assert got.shape == () and got.dtype == jnp.float32
  np.testing.assert_allclose(float(got), expected, rtol=2e-6, atol=1e-7)
  # batch terms: their ratio is the mean, the weight is the real (weighted) count
  total, weight = loss.batch_terms(**padded, mask=mask, weights=weights)
  np.testing.assert_allclose(float(total) / float(weight), expected, rtol=2e-6)


def test_token_mask_selects_tokens():
  rng = np.random.default_rng(1)
  kw = _tokens(rng)
  token_mask = _rows(rng, (B, T))
  expected = masked_mean(categorical_xent(kw["preds"], kw["target"]), token_mask)
  padded = {k: with_garbage(v, token_mask, rng) for k, v in kw.items()}
  got = pe.losses.Crossentropy()(**padded, mask=token_mask)
  np.testing.assert_allclose(float(got), expected, rtol=2e-6)


def test_gradient_is_clean_and_ignores_padding():
  rng = np.random.default_rng(2)
  kw = _sparse(rng)
  mask = _rows(rng)
  logits = with_garbage(kw["preds"], mask, rng)
  target = with_garbage(kw["target"], mask, rng)
  grad = jax.grad(lambda p: pe.losses.Crossentropy()(preds=p, target=target, mask=mask))(
    jnp.asarray(logits)
  )
  probs = np.exp(log_softmax(kw["preds"]))
  expected = (probs - np.eye(C)[kw["target"]]) / mask.sum()
  expected[~mask] = 0.0
  np.testing.assert_allclose(np.asarray(grad), expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize(
  "loss",
  [pe.losses.Crossentropy(), pe.losses.MeanSquaredError(), pe.regularizers.L2(0.1)],
  ids=lambda l: l.name,
)
def test_all_padding_batch_gives_zero_loss_and_zero_gradient(loss):
  preds = jnp.full((4, C), jnp.nan)
  target = jnp.zeros((4, C)) if loss.name != "crossentropy" else jnp.zeros(4, jnp.int32)
  mask = jnp.zeros(4, bool)
  params = {"w": jnp.ones(3)}
  value, grad = jax.value_and_grad(
    lambda p, w: loss(preds=p, target=target, mask=mask, parameters=w), argnums=(0, 1)
  )(preds, params)
  assert float(value) == 0.0
  assert all(np.all(np.asarray(g) == 0) for g in jax.tree.leaves(grad))


def test_regularizers_over_pytrees():
  rng = np.random.default_rng(3)
  params = {
    "dense": {
      "w": rng.normal(size=(3, 4)).astype(np.float32),
      "b": rng.normal(size=4).astype(np.float16),
    },
    "scale": [np.float32(-2.5)],
  }
  leaves = [np.asarray(x, np.float64) for x in jax.tree.leaves(params)]
  l1 = 0.3 * sum(np.abs(x).sum() for x in leaves)
  l2 = 1e-2 * sum((x**2).sum() for x in leaves)
  np.testing.assert_allclose(float(pe.regularizers.L1(0.3)(parameters=params)), l1, rtol=1e-6)
  np.testing.assert_allclose(float(pe.regularizers.L2(1e-2)(parameters=params)), l2, rtol=1e-6)
  # weighted by the batch's real examples: a masked batch still gives the regularizer
  mask = np.array([True, False, True])
  total, weight = pe.regularizers.L2(1e-2).batch_terms(parameters=params, mask=mask)
  assert float(weight) == 2.0
  np.testing.assert_allclose(float(total), 2 * l2, rtol=1e-6)
  _, weight = pe.regularizers.L2(1e-2).batch_terms(parameters=params, target=np.zeros(7))
  assert float(weight) == 7.0
  token_mask = np.array([[True, False], [False, False], [False, True]])
  _, weight = pe.regularizers.L1(1.0).batch_terms(parameters=params, mask=token_mask)
  assert float(weight) == 2.0


def test_names_hashing_and_static_config():
  assert pe.losses.Crossentropy().name == "crossentropy"
  assert pe.regularizers.L2(1e-4).name == "l2"
  assert pe.losses.MeanSquaredError(name="mse").name == "mse"
  assert hash(pe.losses.Crossentropy()) == hash(pe.losses.Crossentropy())
  assert pe.regularizers.L2(1e-4) == pe.regularizers.L2(1e-4)
  assert pe.regularizers.L2(1e-4) != pe.regularizers.L2(1e-3)
  xent = pe.losses.Crossentropy()
  f = jax.jit(lambda preds, target: xent(preds=preds, target=target))
  got = f(jnp.zeros((2, C)), jnp.array([0, 1]))
  np.testing.assert_allclose(float(got), np.log(C), rtol=1e-6)


def test_map_arg_and_index_into():
  rng = np.random.default_rng(4)
  kw = _sparse(rng)
  expected = masked_mean(categorical_xent(kw["preds"], kw["target"]))
  renamed = pe.losses.Crossentropy().map_arg(preds="logits", target="labels")
  np.testing.assert_allclose(
    float(renamed(logits=kw["preds"], labels=kw["target"])), expected, rtol=2e-6
  )
  indexed = pe.losses.Crossentropy().index_into(preds=("out", "logits"), target=["y", 1])
  got = indexed(preds={"out": {"logits": kw["preds"]}}, target={"y": (None, kw["target"])})
  np.testing.assert_allclose(float(got), expected, rtol=2e-6)
  # chained: the latest call sees the caller's keywords first
  chained = pe.losses.Crossentropy().map_arg(preds="out").index_into(out="logits")
  np.testing.assert_allclose(
    float(chained(out={"logits": kw["preds"]}, target=kw["target"])), expected, rtol=2e-6
  )
  with pytest.raises(ValueError, match="'preds' is read from the keyword 'logits'"):
    renamed(preds=kw["preds"], labels=kw["target"])
  with pytest.raises(ValueError, match="has no key 'logit'"):
    pe.losses.Crossentropy().index_into(preds=("out", "logit"))(
      preds={"out": {"logits": 1}}, target=kw["target"]
    )


@pytest.mark.parametrize(
  "make, kwargs, match",
  [
    (
      lambda: pe.losses.Crossentropy(),
      dict(preds=np.zeros((4, C)), target=np.zeros(4)),
      "must be integers",
    ),
    (
      lambda: pe.losses.Crossentropy(),
      dict(preds=np.zeros((4, C)), target=np.zeros((4, 2))),
      "expected preds",
    ),
    (
      lambda: pe.losses.Crossentropy(binary=True),
      dict(preds=np.zeros(4), target=np.zeros(3)),
      "expected equal shapes",
    ),
    (
      lambda: pe.losses.MeanSquaredError(),
      dict(preds=np.zeros(4), target=np.zeros(4), mask=np.ones(3, bool)),
      "mask has shape",
    ),
    (lambda: pe.losses.Crossentropy(label_smoothing=1.0), None, "label_smoothing"),
    (lambda: pe.regularizers.L2(jnp.ones(2)), None, "l must be a Python float"),
    (lambda: pe.regularizers.L2(0.1), dict(parameters={}), "no array leaves"),
    (lambda: pe.losses.Crossentropy().map_arg(preds=3), None, "map_arg"),
  ],
)
def test_bad_input_raises_value_error(make, kwargs, match):
  with pytest.raises(ValueError, match=match):
    loss = make()
    loss(**kwargs)

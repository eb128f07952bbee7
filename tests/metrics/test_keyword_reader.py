"""Metrics and losses share one keyword reader; the mask rule and collections' paths.

References are numpy float64 on data whose padded rows hold NaN.
"""

import jax
import numpy as np
import pytest
from _loss_reference import categorical_xent, masked_mean, with_garbage

import padded_eval as pe
from padded_eval import masking, routing
from padded_eval.metrics.base import Metric, invalid_state, state

C = 4


def _batch(rng, n=9, real=6):
  mask = np.arange(n) < real
  preds = with_garbage(rng.normal(size=(n, C)).astype(np.float32), mask, rng)
  target = with_garbage(rng.integers(0, C, size=n), mask, rng)
  return {"preds": preds, "target": target, "mask": mask}


# --- one base for metrics and losses ------------------------------------------------------


@pytest.mark.parametrize("method", ["map_arg", "index_into", "routed", "required_inputs"])
def test_metric_and_loss_share_one_implementation(method):
  shared = getattr(routing.KeywordReader, method)
  assert getattr(pe.Metric, method) is shared
  assert getattr(pe.losses.Loss, method) is shared
  assert getattr(pe.metrics.Accuracy, method) is shared
  assert getattr(pe.regularizers.L2, method) is shared


@pytest.mark.parametrize(
  "make",
  [pe.metrics.Accuracy, pe.losses.Crossentropy, pe.regularizers.L1],
  ids=lambda m: m.__name__,
)
def test_name_defaults_to_the_class_name_and_must_be_a_non_empty_str(make):
  assert make().name == make.__name__.lower()
  assert make(name="mine").name == "mine"
  for bad in ("", 3):
    with pytest.raises(ValueError, match="name must be a non-empty str"):
      make(name=bad)


@pytest.mark.parametrize(
  "call",
  [
    lambda: pe.losses.Crossentropy()(preds=np.zeros((2, C))),
    lambda: pe.losses.MeanSquaredError().batch_terms(preds=np.zeros(2)),
    lambda: pe.regularizers.L2(0.1)(preds=np.zeros(2)),
    lambda: pe.Losses([pe.losses.Crossentropy()]).update(preds=np.zeros((2, C))),
    lambda: pe.Metrics([pe.losses.Crossentropy()]).update(target=np.zeros(2, int)),
  ],
)
def test_a_missing_loss_keyword_is_a_value_error_naming_it(call):
  # Regression: a missing keyword used to surface as a TypeError from _batch_terms.
  with pytest.raises(ValueError, match=r"needs the keyword\(s\) '(target|preds|parameters)'"):
    call()


def test_routed_metric_and_loss_read_the_same_keywords():
  rng = np.random.default_rng(0)
  batch = _batch(rng)
  nested = {"out": {"logits": batch["preds"]}, "labels": batch["target"], "mask": batch["mask"]}
  # The latest route sees the caller's keywords first: out -> out["logits"] -> preds.
  loss = pe.losses.Crossentropy().map_arg(preds="out", target="labels").index_into(out="logits")
  metric = pe.metrics.Accuracy().map_arg(preds="out", target="labels").index_into(out="logits")
  real = batch["mask"]
  expected_loss = masked_mean(categorical_xent(batch["preds"][real], batch["target"][real]))
  expected_acc = np.mean(np.argmax(batch["preds"][real], -1) == batch["target"][real])
  np.testing.assert_allclose(float(loss(**nested)), expected_loss, rtol=2e-6)
  np.testing.assert_allclose(float(metric.update(**nested).compute()), expected_acc, rtol=1e-6)
  both = pe.LossesAndMetrics(losses=[loss], metrics=[metric]).update(**nested).compute()
  np.testing.assert_allclose(float(both["loss"]), expected_loss, rtol=2e-6)
  np.testing.assert_allclose(float(both["accuracy"]), expected_acc, rtol=1e-6)


def test_routing_keeps_losses_hashable_and_metric_state_empty():
  loss = pe.losses.Crossentropy().map_arg(preds="logits")
  assert loss == pe.losses.Crossentropy().map_arg(preds="logits")
  assert hash(loss) == hash(pe.losses.Crossentropy().map_arg(preds="logits"))
  assert loss != pe.losses.Crossentropy()
  metric = pe.metrics.Mean().map_arg(values="x")
  assert metric.arg_routes == ((("values", "x", ()),),)
  assert jax.tree.structure(metric) == jax.tree.structure(pe.metrics.Mean().map_arg(values="x"))


# --- invalid counts of collections are named by key --------------------------------------


class CountNaN(Metric):
  """Counts NaN among the real ``values`` (a test metric with one invalid kind)."""

  invalid_kinds = ("nan in values",)
  invalid: object = state(invalid_state)

  def _batch_state(self, *, values, mask=None, **_):
    real = masking.broadcast_mask(mask, values.shape, "values")
    return {"invalid": self.count_invalid(**{"nan in values": real & np.isnan(values)})}

  def compute(self):
    return self.invalid.total()


def test_invalid_report_of_a_collection_names_members_by_key():
  rng = np.random.default_rng(1)
  mask = np.arange(12) < 8
  values = rng.normal(size=12).astype(np.float32)
  values[[1, 5]] = np.nan  # real NaN: counted
  values[~mask] = np.nan  # padded NaN: not counted
  expected = int(np.isnan(values[mask]).sum())
  collection = pe.Metrics({"train": CountNaN(), "eval": [CountNaN(), pe.metrics.Mean()]})
  updated = collection.update(values=values, mask=mask)
  report = sorted(updated.invalid_report())
  assert report == [  # Mean counts a NaN in a real element too, under its own kind
    ("eval/countnan", "nan in values", expected),
    ("eval/mean", "nan value", expected),
    ("train", "nan in values", expected),
  ]
  outer = pe.LossesAndMetrics(metrics=collection).update(values=values, mask=mask)
  assert sorted(outer.invalid_report()) == report


# --- the mask rule -----------------------------------------------------------------------


def test_element_weights_follow_the_prefix_rule_and_ignore_padded_nan():
  rng = np.random.default_rng(2)
  mask = rng.random((5, 3)) < 0.6
  weights = rng.random(5).astype(np.float32)
  weights[0] = np.nan
  mask[0] = False  # the NaN weight sits on padding
  real, w = masking.element_weights(mask, weights, (5, 3, 2))
  expected_real = np.broadcast_to(mask[..., None], (5, 3, 2))
  expected_w = np.where(expected_real, np.broadcast_to(weights[:, None, None], (5, 3, 2)), 0.0)
  np.testing.assert_array_equal(np.asarray(real), expected_real)
  np.testing.assert_allclose(np.asarray(w, np.float64), expected_w, rtol=0)
  assert w.dtype == np.float32
  with pytest.raises(ValueError, match=r"weights has shape \(3,\).*expected \(5,\) or \(5, 3\)"):
    masking.element_weights(None, np.ones(3), (5, 3))
  with pytest.raises(ValueError, match="mask must be a bool array"):
    masking.broadcast_mask(np.ones(5), (5,))

"""padded_eval.masking: the one mask rule's messages (issue 65)."""

import jax.numpy as jnp
import numpy as np
import pytest

import padded_eval as pe


def test_a_scalar_loss_with_a_mask_is_told_to_pass_one_value_per_row():
  # Before: "mask has shape (8,), which does not fit loss of shape (); expected ()".
  data = {"x": np.arange(13, dtype=np.float32)}

  def step(params, batch):
    loss = jnp.mean(batch["x"])  # the batch's mean: padded rows included
    return pe.metrics.Mean("loss").batch_updates(loss=loss, mask=batch["mask"])

  with pytest.raises(
    ValueError, match=r"loss is a scalar .* pass one value per row \(loss of shape \(8,\)"
  ):
    pe.masked_eval(step, None, pe.pad_batches(data, 8), backend="jit")

  def per_row(params, batch):  # what the message says
    return pe.metrics.Mean("loss").batch_updates(loss=batch["x"], mask=batch["mask"])

  got = pe.masked_eval(per_row, None, pe.pad_batches(data, 8), backend="jit")["mean"]
  assert got == pytest.approx(np.mean(np.arange(13, dtype=np.float64)))

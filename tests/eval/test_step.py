"""padded_eval.eval.step: a step_fn that cannot be called or reads a missing key (issue 65)."""

import numpy as np
import pytest

import padded_eval as pe

DATA = {"image": np.ones((13, 3), np.float32), "label": np.arange(13) % 3}


def test_a_step_fn_of_the_wrong_signature_is_named():
  # Before: a bare "<lambda>() takes 1 positional argument but 2 were given".
  def step(batch):
    return pe.metrics.Mean("image").batch_updates(image=batch["image"], mask=batch["mask"])

  with pytest.raises(
    TypeError, match=r"step_fn\(params, batch\), but step_fn .*step\(batch\)"
  ) as e:
    pe.masked_eval(step, None, pe.pad_batches(DATA, 8), backend="jit")
  assert "['image', 'label', 'mask']" in str(e.value)


def test_a_missing_batch_key_lists_the_batch_keys():
  # Before: a bare KeyError: 'labels'.
  def step(params, batch):
    return pe.metrics.Mean("label").batch_updates(label=batch["labels"], mask=batch["mask"])

  with pytest.raises(
    KeyError, match=r"step_fn .* read the batch key 'labels', which the batch lacks"
  ) as e:
    pe.masked_eval(step, None, pe.pad_batches(DATA, 8), backend="jit")
  assert "the batch's keys: ['image', 'label', 'mask']" in str(e.value)

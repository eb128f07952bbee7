"""A small real tfds dataset built offline: scikit-learn's bundled 8x8 handwritten digits.

`DigitsBuilder` is a `tfds.core.GeneratorBasedBuilder`; `load_digits_tfds(data_dir, split)` builds it into `data_dir`
once (no network) and returns the split as a `tf.data.Dataset`. TensorFlow and tfds are imported on first use, so
importing `padded_eval` does not import them; the builder class is created on first access and cached.

Splits are deterministic and keep scikit-learn's order: ``test`` holds rows ``0, 5, 10, ...`` (360 examples),
``train`` the other 1437. Features: ``image`` uint8 ``[8, 8]`` (values 0..16), ``label`` int64 in 0..9, ``index``
int64, the row in ``sklearn.datasets.load_digits()``.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

__all__ = ["DigitsBuilder", "digits_split_indices", "load_digits_tfds"]

TEST_EVERY = 5


def digits_split_indices(split: str) -> np.ndarray:
  """Rows of ``sklearn.datasets.load_digits()`` in `split` (``"train"`` or ``"test"``), in order.

  Args:
    split: ``"train"`` or ``"test"``.

  Returns:
    int64 ``[num_examples]`` row indices, increasing.

  Raises:
    ValueError: an unknown split.
  """
  rows = np.arange(1797)
  if split == "test":
    return rows[rows % TEST_EVERY == 0]
  if split == "train":
    return rows[rows % TEST_EVERY != 0]
  raise ValueError(f"split must be 'train' or 'test'; got {split!r}")


@functools.cache
def _digits_builder_class() -> type:
  import tensorflow_datasets as tfds

  class DigitsBuilder(tfds.core.GeneratorBasedBuilder):
    """scikit-learn's 8x8 digits as a tfds dataset, generated offline in scikit-learn's row order."""

    name = "padded_eval_digits"
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "Initial release."}
    # No checksums file to look for. (tfds 4.9.10 finds a builder's code path with `importlib_resources`,
    # which it does not install on Python >= 3.9.)
    code_path = None

    def _info(self) -> Any:
      return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict(
          {
            "image": tfds.features.Tensor(shape=(8, 8), dtype=np.uint8),
            "label": tfds.features.ClassLabel(num_classes=10),
            "index": tfds.features.Scalar(dtype=np.int64),
          }
        ),
        supervised_keys=("image", "label"),
        disable_shuffling=True,
      )

    def _split_generators(self, dl_manager: Any) -> dict:
      del dl_manager  # everything is bundled with scikit-learn
      return {split: self._generate_examples(split) for split in ("train", "test")}

    def _generate_examples(self, split: str):
      from sklearn.datasets import load_digits

      digits: Any = load_digits()  # a Bunch (the stubs also allow the (X, y) tuple)
      images = digits.images.astype(np.uint8)
      for row in digits_split_indices(split):
        yield int(row), {"image": images[row], "label": int(digits.target[row]), "index": int(row)}

  return DigitsBuilder


def __getattr__(name: str) -> Any:
  if name == "DigitsBuilder":
    return _digits_builder_class()
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_digits_tfds(data_dir: str, split: str, **as_dataset_kwargs: Any) -> Any:
  """Builds the digits dataset into `data_dir` if needed and returns `split` as a `tf.data.Dataset`.

  Args:
    data_dir: directory for the prepared tfds files (built once, offline).
    split: a tfds split string, e.g. ``"test"``, ``"train"``, ``"train[:10%]"``.
    **as_dataset_kwargs: passed to ``builder.as_dataset`` (e.g. ``batch_size=32``).

  Returns:
    A `tf.data.Dataset` of dicts ``{"image": uint8 [8, 8], "label": int64 [], "index": int64 []}`` (with a
    leading batch axis if `batch_size` was given), in scikit-learn's row order.
  """
  builder = _digits_builder_class()(data_dir=data_dir)
  builder.download_and_prepare()
  return builder.as_dataset(split=split, **as_dataset_kwargs)

"""Image quality metrics: PSNR and SSIM, means over images of a per-image value.

``preds`` and ``target`` are ``[B, H, W, C]`` images (``[B, H, W]``: one channel) of
any float or int dtype, computed in float32. Each image's value is formed inside the
batch; the state is the exact sum of the values of real images and their (weighted)
count (:class:`~padded_eval.exact.accumulate.ExactSum`), so the result over padded batches and
devices is the mean over the dataset's images. ``mask`` and ``weights`` are ``[B]``
(whole images); padded images may hold NaN or garbage. A NaN pixel of a real image is
counted in ``invalid`` (``"nan pixel"``, reported by ``masked_eval``) and makes the result
NaN: it is never dropped silently.
"""

from __future__ import annotations

import abc
import math
from typing import ClassVar, cast

import jax
import jax.numpy as jnp
import numpy as np

from padded_eval import validation
from padded_eval.exact._floats import scaled_to_unit
from padded_eval.exact.accumulate import ExactCount, ExactSum, upcast
from padded_eval.masking import broadcast_mask, broadcast_prefix
from padded_eval.metrics.base import Metric, empty_count, empty_sum, invalid_state, state
from padded_eval.metrics.totals import Totals


def image_pair(preds, target, *, min_ndim: int = 2, owner: str) -> tuple[jax.Array, jax.Array]:
  """``(preds, target)`` as float32 of equal shape ``[B, ...]``.

  Raises:
    ValueError: shapes that differ or have fewer than ``min_ndim`` axes.
  """
  preds, target = jnp.asarray(preds), jnp.asarray(target)
  if preds.shape != target.shape or preds.ndim < min_ndim:
    raise ValueError(
      f"{owner} takes preds and target images of one shape [B, H, W, C] (or [B, H, W]); "
      f"got preds {preds.shape}, target {target.shape}"
    )
  return upcast(preds), upcast(target)


def image_weights(mask, weights, num_images: int, ref: str = "preds") -> jax.Array:
  """float32 ``[B]``: each image's weight, 0 for padded images.

  Raises:
    ValueError: a ``mask`` or ``weights`` that is not ``[B]``.
  """
  real = broadcast_mask(mask, (num_images,), ref)
  if weights is None:
    return real.astype(jnp.float32)
  weights = broadcast_prefix(upcast(jnp.asarray(weights)), (num_images,), "weights", ref)
  return jnp.where(real, weights, 0.0)


class ImageMean(Metric):
  """Base of the per-image means: ``total = sum(w * value)``, ``weight = sum(w)`` over images.

  Subclasses define ``_image_values(preds, target) -> float32 [B]`` (inputs already
  zeroed on padded images).
  """

  higher_is_better: ClassVar[bool | None] = True

  data_range: float = 1.0
  total: ExactSum = state(empty_sum)
  weight: ExactSum = state(empty_sum)
  example_rows: ExactCount = state(empty_count)
  invalid: ExactCount = state(invalid_state)

  invalid_kinds: ClassVar[tuple[str, ...]] = ("nan pixel",)
  _min_ndim = 2

  def _check_config(self):
    validation.check_positive_number("data_range", self.data_range)

  @abc.abstractmethod
  def _image_values(self, preds, target) -> jax.Array:
    """float32 ``[B]``: each image's value."""

  def _batch_state(self, *, preds, target, mask=None, weights=None, **_):
    owner = type(self).__name__
    preds, target = image_pair(preds, target, min_ndim=self._min_ndim, owner=owner)
    w = image_weights(mask, weights, preds.shape[0])
    real = (w != 0).reshape((-1,) + (1,) * (preds.ndim - 1))
    values = self._image_values(jnp.where(real, preds, 0.0), jnp.where(real, target, 0.0))
    nan = real & (jnp.isnan(preds) | jnp.isnan(target))  # counted; the image's value is NaN
    invalid = self.count_invalid(**{"nan pixel": nan})
    sums = [jnp.where(w != 0, w * values, 0.0), w]  # one reduction with the real rows
    return Totals(sums, [], lambda s, _: {"total": s[0], "weight": s[1], "invalid": invalid})

  def compute(self) -> jax.Array:
    """The mean over images (float32 scalar); NaN when no image was seen."""
    return self.total.ratio(self.weight)


_DB_PER_BIT = 20.0 * math.log10(2.0)  # 10 log10(4): the dB of a factor 2 in the error


class PSNR(ImageMean):
  """Peak signal-to-noise ratio in dB, the mean over images of each image's PSNR.

  ``10 * log10(data_range**2 / MSE)`` with the MSE over the image's pixels and channels
  (torchmetrics ``PeakSignalNoiseRatio(data_range, reduction="elementwise_mean",
  dim=(1, 2, 3))``). An image equal to its target has PSNR ``inf``, so the mean is too.

  Args:
    data_range: ``max - min`` of the pixel values (1.0 for [0, 1] images, 255 for uint8).

  Update keywords: ``preds``, ``target`` ``[B, ...]`` images of one shape; ``mask``,
  ``weights`` ``[B]``.

  Example:
    >>> import jax.numpy as jnp
    >>> m = PSNR(1.0).update(preds=jnp.full((1, 4, 4, 1), 0.1), target=jnp.zeros((1, 4, 4, 1)))
    >>> round(float(m.compute()), 4)  # 10 log10(1 / 0.01)
    20.0
  """

  def _image_values(self, preds, target):
    axes = tuple(range(1, preds.ndim))
    # each image's errors scaled by a power of two 2**e before squaring: no over- or underflow
    scaled, e = scaled_to_unit(preds - target, axes)
    mse = jnp.mean(jnp.square(scaled), axis=axes)  # the MSE / 4**e
    e = jnp.squeeze(e, axes).astype(jnp.float32)
    return 20.0 * math.log10(float(self.data_range)) - 10.0 * jnp.log10(mse) - _DB_PER_BIT * e


def gaussian_kernel(size: int, sigma: float) -> np.ndarray:
  """float64 ``[size]``: the normalized 1-D Gaussian window (torchmetrics' and
  scikit-image's)."""
  offsets = np.arange(size, dtype=np.float64) - (size - 1) / 2.0
  kernel = np.exp(-0.5 * (offsets / sigma) ** 2)
  return kernel / kernel.sum()


def valid_filter(x: jax.Array, kernel: np.ndarray) -> jax.Array:
  """``x`` ``[..., B, H, W, C]`` filtered by the separable window ``kernel`` over H and W,
  where the window fits inside the image (``[..., B, H - K + 1, W - K + 1, C]``)."""
  size = len(kernel)
  height, width = x.shape[-3] - size + 1, x.shape[-2] - size + 1
  # sum() starts at 0: 0 + an array is an array (the kernel is never empty)
  rows = cast(jax.Array, sum(float(g) * x[..., i : i + height, :, :] for i, g in enumerate(kernel)))
  return cast(
    jax.Array, sum(float(g) * rows[..., :, i : i + width, :] for i, g in enumerate(kernel))
  )


PADDINGS = ("reflect", "valid")


class SSIM(ImageMean):
  """Structural similarity index, the mean over images of each image's mean SSIM.

  Gaussian window (``kernel_size`` 11, ``sigma`` 1.5), ``C1 = (k1 * data_range)**2``,
  ``C2 = (k2 * data_range)**2``, population (co)variances (clipped at 0, as torchmetrics
  does), the SSIM map averaged over pixels and channels. ``padding`` says where the map
  is formed:

  * ``"reflect"`` (default): at every pixel, the image extended by reflection (no edge
    repeat) under the window; equals torchmetrics
    ``StructuralSimilarityIndexMeasure(data_range=...)`` with its defaults (1.9).
  * ``"valid"``: only where the window fits inside the image (the original paper's code);
    equals scikit-image ``structural_similarity(gaussian_weights=True, sigma=1.5,
    use_sample_covariance=False, data_range=..., channel_axis=-1)``. scikit-image's Gaussian
    window is ``2 * int(3.5 * sigma + 0.5) + 1`` pixels wide whatever its ``win_size`` (11 at
    ``sigma=1.5``): at another ``sigma``, pass that ``kernel_size`` to get its value.

  Variances are formed around each image's mean, so nothing cancels for images far from 0.

  Args:
    data_range: ``max - min`` of the pixel values.
    kernel_size: the window's side, an odd int (default 11).
    sigma: the Gaussian's standard deviation in pixels (default 1.5).
    k1, k2: the stabilizing constants (defaults 0.01, 0.03).
    padding: ``"reflect"`` or ``"valid"`` (see above).

  Update keywords: ``preds``, ``target`` ``[B, H, W, C]`` or ``[B, H, W]`` images of
  one shape (``H``, ``W`` at least ``kernel_size`` with ``"valid"``, above
  ``kernel_size // 2`` with ``"reflect"``); ``mask``, ``weights`` ``[B]``.

  Example:
    >>> import jax.numpy as jnp
    >>> image = jnp.linspace(0.0, 1.0, 16 * 16).reshape(1, 16, 16, 1)
    >>> float(SSIM(1.0).update(preds=image, target=image).compute())
    1.0
  """

  kernel_size: int = 11
  sigma: float = 1.5
  k1: float = 0.01
  k2: float = 0.03
  padding: str = "reflect"

  _min_ndim = 3

  def _check_config(self):
    super()._check_config()
    validation.check_positive_int("kernel_size", self.kernel_size)
    if self.kernel_size % 2 == 0:
      raise ValueError(f"kernel_size must be odd; got {self.kernel_size!r}")
    validation.check_positive_number("sigma", self.sigma)
    validation.check_positive_number("k1", self.k1)
    validation.check_positive_number("k2", self.k2)
    validation.check_choice("padding", self.padding, PADDINGS)

  def _image_values(self, preds, target):
    if preds.ndim == 3:
      preds, target = preds[..., None], target[..., None]
    radius = self.kernel_size // 2
    smallest = self.kernel_size if self.padding == "valid" else radius + 1
    if preds.ndim != 4 or min(preds.shape[1:3]) < smallest:
      raise ValueError(
        f"SSIM(padding={self.padding!r}) takes images [B, H, W, C] (or [B, H, W]) with H and "
        f"W at least {smallest} (kernel_size={self.kernel_size}); got preds of shape "
        f"{preds.shape}"
      )
    # SSIM is scale-free once C1 and C2 scale with data_range: divide the pixels and
    # data_range by a power of two near data_range (exact), so that the squares and
    # products below neither underflow (data_range 1e-25) nor overflow (1e18) in float32
    exponent = -math.frexp(float(self.data_range))[1]
    preds, target = jnp.ldexp(preds, exponent), jnp.ldexp(target, exponent)
    data_range = math.ldexp(float(self.data_range), exponent)
    # deviations from each image's (and channel's) mean: the window's variances are then
    # small differences of small numbers, not of large ones
    center_x = jnp.mean(preds, axis=(1, 2), keepdims=True)
    center_y = jnp.mean(target, axis=(1, 2), keepdims=True)
    x, y = preds - center_x, target - center_y
    if self.padding == "reflect":
      pad = ((0, 0), (radius, radius), (radius, radius), (0, 0))
      x, y = jnp.pad(x, pad, mode="reflect"), jnp.pad(y, pad, mode="reflect")
    kernel = gaussian_kernel(self.kernel_size, float(self.sigma))
    filtered = valid_filter(jnp.stack([x, y, x * x, y * y, x * y]), kernel)
    mean_x, mean_y, xx, yy, xy = filtered
    var_x = jnp.maximum(xx - mean_x**2, 0.0)
    var_y = jnp.maximum(yy - mean_y**2, 0.0)
    cov = xy - mean_x * mean_y
    mu_x, mu_y = mean_x + center_x, mean_y + center_y
    c1 = (float(self.k1) * data_range) ** 2
    c2 = (float(self.k2) * data_range) ** 2
    ssim = ((2.0 * mu_x * mu_y + c1) * (2.0 * cov + c2)) / (
      (mu_x**2 + mu_y**2 + c1) * (var_x + var_y + c2)
    )
    return jnp.mean(ssim, axis=(1, 2, 3))

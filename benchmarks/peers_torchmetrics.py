"""padded_eval's ranking and image metrics against torchmetrics, on the same data (issue 29).

torchmetrics needs torch, which the ``test`` extra does not install, so this runs in two
interpreters:

  python -m benchmarks peers dump OUT.npz                     # with padded_eval (jax)
  TORCH_PYTHON benchmarks/peers_torchmetrics.py check OUT.npz  # with torch + torchmetrics

``dump`` builds padded batches (a ``[B, L]`` candidate mask, NaN/garbage in padding),
evaluates padded_eval's metrics through ``masked_eval`` (jit backend) and stores the real
data and the values; ``check`` feeds the real data to torchmetrics (retrieval metrics with
``indexes``: one index per query) and prints the relative differences. Scores are in
(0, 1]: torchmetrics 1.9 counts a candidate with score <= 0 as not relevant in recall,
precision, MRR and MAP. Ties only in the NDCG data: torchmetrics breaks ties of the other
metrics by its sort, padded_eval by list position.
"""

from __future__ import annotations

import sys

import numpy as np

QUERIES, LIST, BATCH, K = 203, 9, 32, 3
IMAGES, SIDE = 21, 24

RANKING = ("RecallAtK", "PrecisionAtK", "MRR", "MAPAtK", "NDCGAtK")


def _data(seed=0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, LIST + 1, QUERIES)
  target = rng.random((IMAGES, SIDE, SIDE + 3, 3)).astype(np.float32)
  return {
    "scores": rng.uniform(0.01, 1.0, (QUERIES, LIST)).astype(np.float32),
    "tied": np.round(rng.uniform(0.05, 1.0, (QUERIES, LIST)), 1).astype(np.float32),
    "binary": (rng.random((QUERIES, LIST)) < 0.3).astype(np.int32),
    "graded": rng.integers(0, 4, (QUERIES, LIST)).astype(np.int32),
    "candidates": np.arange(LIST)[None, :] < lengths[:, None],
    "image": target,
    "noisy": np.clip(target + 0.1 * rng.standard_normal(target.shape), 0, 1).astype(np.float32),
  }


def dump(path):
  import padded_eval as pe

  data = _data()
  lists = {"target": "binary", "preds": "scores", "mask": "list_mask"}
  metrics = {
    "RecallAtK": pe.metrics.RecallAtK(K).map_arg(**lists),
    "PrecisionAtK": pe.metrics.PrecisionAtK(K).map_arg(**lists),
    "MRR": pe.metrics.MRR().map_arg(**lists),
    "MAPAtK": pe.metrics.MAPAtK(K).map_arg(**lists),
    "NDCGAtK": pe.metrics.NDCGAtK(K).map_arg(preds="tied", target="graded", mask="list_mask"),
  }
  ranking = pe.Metrics(metrics)

  def ranking_step(params, batch):
    del params
    return ranking.batch_updates(**batch, list_mask=batch["mask"][:, None] & batch["candidates"])

  keys = ("scores", "tied", "binary", "graded", "candidates")
  results = dict(
    pe.masked_eval(
      ranking_step, None, pe.pad_batches({k: data[k] for k in keys}, BATCH), backend="jit"
    )
  )
  images = pe.Metrics({"PSNR": pe.metrics.PSNR(1.0), "SSIM": pe.metrics.SSIM(1.0)})

  def image_step(params, batch):
    del params
    return images.batch_updates(preds=batch["noisy"], target=batch["image"], mask=batch["mask"])

  source = {"noisy": data["noisy"], "image": data["image"]}
  results.update(pe.masked_eval(image_step, None, pe.pad_batches(source, 8), backend="jit"))
  np.savez(path, **data, **{f"value_{k}": results[k] for k in (*RANKING, "PSNR", "SSIM")})
  print({k: results[k] for k in (*RANKING, "PSNR", "SSIM")})


def check(path):
  import torch
  import torchmetrics
  import torchmetrics.retrieval as tr

  saved = np.load(path)
  mask = saved["candidates"]
  indexes = torch.from_numpy(np.nonzero(mask)[0])
  flat = lambda key: torch.from_numpy(saved[key][mask].astype(np.float64))  # noqa: E731
  peers = {
    "RecallAtK": tr.RetrievalRecall(top_k=K)(flat("scores"), flat("binary").bool(), indexes),
    "PrecisionAtK": tr.RetrievalPrecision(top_k=K)(flat("scores"), flat("binary").bool(), indexes),
    "MRR": tr.RetrievalMRR()(flat("scores"), flat("binary").bool(), indexes),
    "MAPAtK": tr.RetrievalMAP(top_k=K)(flat("scores"), flat("binary").bool(), indexes),
    "NDCGAtK": tr.RetrievalNormalizedDCG(top_k=K)(flat("tied"), flat("graded"), indexes),
  }
  nchw = lambda key: torch.from_numpy(saved[key].astype(np.float64)).permute(0, 3, 1, 2)  # noqa: E731
  image = torchmetrics.image
  peers["PSNR"] = image.PeakSignalNoiseRatio(
    data_range=1.0, reduction="elementwise_mean", dim=(1, 2, 3)
  )(nchw("noisy"), nchw("image"))
  peers["SSIM"] = image.StructuralSimilarityIndexMeasure(data_range=1.0)(
    nchw("noisy"), nchw("image")
  )
  print(f"torchmetrics {torchmetrics.__version__}, torch {torch.__version__}")
  for name, peer in peers.items():
    ours, theirs = float(saved[f"value_{name}"]), float(peer)
    print(
      f"{name:13s} padded_eval {ours:.9f}  torchmetrics {theirs:.9f}  rel diff {abs(ours - theirs) / abs(theirs):.2e}"
    )


if __name__ == "__main__":
  if sys.argv[1:] == ["--quick"]:  # the smoke test: padded_eval's side only (no torch in tests)
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
      dump(os.path.join(directory, "peers.npz"))
  else:
    {"dump": dump, "check": check}[sys.argv[1]](sys.argv[2])

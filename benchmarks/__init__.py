"""Benchmarks of padded_eval against its anchors: `python -m benchmarks [--quick]`, or one by name.

`python -m benchmarks NAME [ARGS]` runs one of `BENCHMARKS` (see `benchmarks/__main__.py`).
"""

# name: (module, what it measures, its arguments in the quick mode that the tests run)
BENCHMARKS = {
  "accelerator": (
    "bench_accelerator",
    "masked_eval vs the hand loop, Flax's loops; numpy, tf.data, on device (issue 64)",
    ("--quick", "--repeats", "1"),
  ),
  "eval": (
    "bench_eval",
    "warm masked_eval vs the bare pmap loop, MLP, 8 devices; checkpoint cost",
    ("--quick",),
  ),
  "from_flax": (
    "bench_from_flax",
    "converted Flax examples vs their own loops, cold and warm",
    ("--only", "mnist_nnx", "ogbg", "--repeats", "1", "--cold", "in-process"),
  ),
  "flax_sst2": (
    "bench_flax_sst2",
    "Flax's real sst2 eval vs its conversion: one fixed length, length buckets (issue 66)",
    ("--quick",),
  ),
  "sources": ("bench_sources", "pad_batches per source kind; tf.data throughput", ("--quick",)),
  "overhead": ("bench_overhead", "fixed cost per call, small N, every backend", ("--quick",)),
  "sharded": ("bench_sharded", "FSDP-sharded params under jit vs a bare jit loop", ("--quick",)),
  "outputs": ("per_row_outputs", "masked_eval(outputs=True) vs a device_get loop", ("--quick",)),
  "ogb": ("bench_ogb", "exact OGB mean AP (molpcba shapes) vs a bare loop", ("--quick",)),
  "text": ("bench_text", "BLEU, ROUGE, WER, exact match on the devices vs the host", ("--quick",)),
  "bootstrap": (
    "bench_bootstrap",
    "step cost of Bootstrap and Sliced vs the bare metric",
    ("--quick",),
  ),
  "families": ("bench_families", "metric update cost as a share of a forward pass", ("--quick",)),
  "multihost": ("bench_multihost", "multi-host agreement as the process count grows", ("--quick",)),
  "peers": ("peers_torchmetrics", "ranking and image metrics vs torchmetrics", ("--quick",)),
  "lm": (
    "bench_lm",
    "pe.lm.HarnessLM vs a loop compiling per request length (issue 66)",
    ("--quick",),
  ),
}

# What `python -m benchmarks --quick` (the full run's tables) already runs in its quick mode.
IN_FULL_RUN = ("overhead", "sharded", "outputs")

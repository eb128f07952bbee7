"""One process of the 2-process pe.lm.HarnessLM test, over jax.distributed.

Usage: ``python tests/multihost/_lm_worker.py PORT NUM_PROCESSES PROCESS_ID``. Each process holds 2 CPU devices
(gloo collectives) and is given EVERY request (lm-eval sees one rank); for each backend it prints one JSON line:
``{"backend", "process", "loglikelihood", "one", "rolling", "generated"}``, each process's full result lists.
"""

import pathlib
import sys

import _launch

TESTS = pathlib.Path(__file__).resolve().parents[1]
sys.path[:0] = [
  str(TESTS / "lm"),
  str(TESTS),
]  # tests/lm/test_harness.py and the helpers it imports


def lines(process):
  """Its JSON lines, one per backend, in a process of a joined session."""
  import _tiny
  import jax
  import test_harness as cases
  from lm_eval.api.instance import Instance

  import padded_eval as pe

  generate = jax.jit(_tiny.make_generate_fn(_tiny.apply_fn), static_argnums=3)
  for backend in ("jit", "pmap"):
    lm = pe.lm.HarnessLM(
      _tiny.apply_fn,
      cases.PARAMS,
      cases.TOKENIZER,
      max_length=cases.MAX_LENGTH,
      batch_size=4,
      backend=backend,
      generate_fn=generate,
    )
    pairs = [Instance("loglikelihood", {}, p, i) for i, p in enumerate(cases.PAIRS)]
    texts = [Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate(cases.TEXTS)]
    prompts = [
      Instance("generate_until", {}, (c, {"until": ["o"], "max_gen_toks": 5}), i)
      for i, c in enumerate(["the quick", "x", "over lazy d"])
    ]
    line = {
      "backend": backend,
      "process": process,
      "loglikelihood": lm.loglikelihood(pairs),
      "one": lm.loglikelihood(pairs[:1]),  # one request: process 1 scores none of it
      "rolling": lm.loglikelihood_rolling(texts),
      "generated": lm.generate_until(prompts),
    }
    yield line


if __name__ == "__main__":
  _launch.serve(lines)

"""pe.lm.HarnessLM across 2 jax.distributed processes: each scores its share of every bucket, and every process
returns every request's result, equal to the float64 reference (tests/lm/_tiny.py) on jit and pmap."""

import pathlib
import sys

import _lm_worker as worker
import numpy as np
import pytest
from test_bootstrap_multihost import run_workers

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "lm"))
import _tiny  # noqa: E402
import test_harness as cases  # noqa: E402
from lm_eval.api.instance import Instance  # noqa: E402

pytestmark = pytest.mark.multihost


def test_every_process_returns_every_result():
  reference = _tiny.reference_lm(cases.PARAMS, cases.MAX_LENGTH)
  expected = reference.loglikelihood([Instance("loglikelihood", {}, p, 0) for p in cases.PAIRS])
  rolling = reference.loglikelihood_rolling(
    [Instance("loglikelihood_rolling", {}, (t,), 0) for t in cases.TEXTS]
  )
  generated = []
  for context in ["the quick", "x", "over lazy d"]:
    new = _tiny.greedy_tokens64(cases.PARAMS, cases.TOKENIZER.encode(context), 5)
    new = new[: new.index(_tiny.EOT)] if _tiny.EOT in new else new
    generated.append(cases.TOKENIZER.decode(new).split("o")[0])
  lines = run_workers(worker_path=worker.__file__)
  assert sorted((line["backend"], line["process"]) for line in lines) == [
    ("jit", 0),
    ("jit", 1),
    ("pmap", 0),
    ("pmap", 1),
  ]
  for line in lines:
    got = line["loglikelihood"]
    np.testing.assert_allclose([v for v, _ in got], [v for v, _ in expected], rtol=1e-5)
    assert [g for _, g in got] == [g for _, g in expected]
    assert line["one"] == [got[0]]
    np.testing.assert_allclose(line["rolling"], rolling, rtol=1e-5)
    assert line["generated"] == generated

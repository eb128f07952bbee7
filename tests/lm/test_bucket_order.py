"""pe.lm.HarnessLM's buckets: requests grouped by length (each bucket's rows longest first, every request once),
the results back in request order whatever order the requests come in (against the float64 reference of
tests/lm/_tiny.py), and exactly one step program per new bucket width (pmap and shard_map: and its final reduce).
"""

import _tiny
import jax
import numpy as np
import pytest
from lm_eval.api.instance import Instance

import padded_eval as pe
from padded_eval.lm import requests as requests_lib
from padded_eval.lm import scoring

MAX_LENGTH = 40  # buckets 16, 32, 40
PARAMS = _tiny.make_params()
TOKENIZER = _tiny.MergingBytes()


def pairs(count, seed):
  """``count`` (context, continuation) pairs of lengths that fill the three buckets."""
  rng = np.random.default_rng(seed)
  letters = np.array(list("abcdefghij "))
  out = []
  for _ in range(count):
    context = "".join(rng.choice(letters, int(rng.integers(1, 45)))).strip() or "a"
    out.append((context, "".join(rng.choice(letters[:-1], int(rng.integers(1, 5))))))
  return out


def reference(pairs_):
  return _tiny.reference_lm(PARAMS, MAX_LENGTH).loglikelihood(
    [Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs_)], disable_tqdm=True
  )


def test_each_bucket_holds_its_requests_longest_first_every_request_once():
  runner = scoring.BucketRunner(PARAMS, batch_size=8, backend="jit", mesh=None, max_length=40)
  lengths = np.random.default_rng(3).integers(1, 41, size=101)
  buckets = runner.buckets(lengths, runner.widths)
  assert list(buckets) == sorted(buckets) and set(buckets) <= {16, 32, 40}
  every = np.concatenate(list(buckets.values()))
  assert sorted(every.tolist()) == list(range(len(lengths)))  # each request exactly once
  low = 0
  for width, indices in buckets.items():
    sizes = lengths[indices]
    assert np.all((low < sizes) & (sizes <= width))  # the narrowest bucket that holds the row
    assert np.all(np.diff(sizes) <= 0)  # longest first
    ties = indices[:-1][np.diff(sizes) == 0], indices[1:][np.diff(sizes) == 0]
    assert np.all(
      ties[0] < ties[1]
    )  # equal lengths keep request order: the layout is deterministic
    low = width


def test_results_come_back_in_request_order(backend):
  """The same requests in two orders give each request its own reference number (1e-5 relative)."""
  base = pairs(29, seed=11)
  rows = [requests_lib.token_request(requests_lib.Tokenizer(TOKENIZER), *p) for p in base]
  widths = scoring.bucket_widths(MAX_LENGTH)
  used = {widths[np.searchsorted(widths, len(r.row(MAX_LENGTH)))] for r in rows}
  assert used == {16, 32, 40}  # every bucket, so the grouping moves requests
  lm = pe.lm.HarnessLM(
    _tiny.apply_fn, PARAMS, TOKENIZER, max_length=MAX_LENGTH, batch_size=8, backend=backend
  )
  for order in (np.arange(len(base)), np.random.default_rng(5).permutation(len(base))):
    shuffled = [base[i] for i in order]
    got = lm.loglikelihood([Instance("loglikelihood", {}, p, i) for i, p in enumerate(shuffled)])
    expected = reference(shuffled)
    np.testing.assert_allclose([v for v, _ in got], [v for v, _ in expected], rtol=1e-5)
    assert [g for _, g in got] == [g for _, g in expected]


@pytest.fixture
def compile_events():
  """The XLA compilations while the test runs (JAX's compile event), as a one-item list."""
  seen = [0]

  def listener(event, duration, **kwargs):
    del duration, kwargs
    seen[0] += event == "/jax/core/compile/backend_compile_duration"

  jax.monitoring.register_event_duration_secs_listener(listener)
  yield seen
  unregister = getattr(jax.monitoring, "unregister_event_duration_listener", None)
  if unregister is None:
    from jax._src import monitoring

    unregister = monitoring._unregister_event_duration_listener_by_callback  # noqa: SLF001
  unregister(listener)


def test_each_new_bucket_compiles_its_step_once(backend, compile_events):
  """A bucket width met for the first time compiles exactly its step (pmap, shard_map: and the final reduce);
  a width met before compiles nothing, whatever the number of its requests."""
  per_bucket = 1 if backend == "jit" else 2

  def apply_fn(params, tokens):  # a step of its own: nothing compiled for it by other tests
    return _tiny.apply_fn(params, tokens)

  lm = pe.lm.HarnessLM(
    apply_fn, PARAMS, TOKENIZER, max_length=MAX_LENGTH, batch_size=8, backend=backend
  )
  lm.loglikelihood(
    [Instance("loglikelihood", {}, ("a", "b"), 0)]
  )  # bucket 16, and first-call programs
  by_width = {
    16: ("ab", "c"),
    32: ("abcdefghij" * 2 + "ab", "c"),
    40: ("abcdefghij" * 3 + "abc", "d"),
  }
  for width, pair in by_width.items():
    row = requests_lib.token_request(requests_lib.Tokenizer(TOKENIZER), *pair).row(MAX_LENGTH)
    assert scoring.bucket_widths(MAX_LENGTH)[np.searchsorted([16, 32, 40], len(row))] == width
    before = compile_events[0]
    lm.loglikelihood([Instance("loglikelihood", {}, pair, 0)])
    assert compile_events[0] - before == (0 if width == 16 else per_bucket), width
    before = compile_events[0]
    lm.loglikelihood([Instance("loglikelihood", {}, pair, i) for i in range(19)])  # 3 batches
    assert compile_events[0] == before, width

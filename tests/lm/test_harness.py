"""pe.lm.HarnessLM against lm-eval's own request handling over a float64 numpy model (tests/lm/_tiny.py).

Every request's log-probability is within 1e-5 relative of the float64 reference and ``is_greedy`` is identical,
on every backend with 8 devices and request counts no batch divides; rolling windows; generation with stop
sequences; params sharded over a mesh; one trace of the model per bucket width and no compilation on a second
call; the ValueErrors the contract names.
"""

import _compiles
import _tiny
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from lm_eval.api.instance import Instance

import padded_eval as pe
from padded_eval.lm import requests as requests_lib
from padded_eval.lm import scoring

compiles = _compiles.compiles  # the fixture (tests/_compiles.py)

MAX_LENGTH = 40  # buckets 16, 32, 40
PARAMS = _tiny.make_params()
TOKENIZER = _tiny.MergingBytes()
WORDS = "the quick brown fox jumps over lazy dog and then rests under a tree".split()


def instance(kind, args, number=0):
  return Instance(kind, {}, args, number)


def greedy_pairs():
  """(context, continuation) pairs whose continuation is the float64 model's greedy one (is_greedy True), kept
  where the text gives back the same tokens."""
  pairs = []
  for number, context in enumerate(
    ["the quick", "over lazy d", "x", "a tree and ", "brown fox jumps"]
  ):
    count = 1 + number % 3
    context_tokens = TOKENIZER.encode(context.rstrip())
    new = _tiny.greedy_tokens64(PARAMS, context_tokens, count)
    continuation = context[len(context.rstrip()) :] + TOKENIZER.decode(new)
    whole = TOKENIZER.encode(context.rstrip() + continuation)
    if whole[len(context_tokens) :] == new:
      pairs.append((context.rstrip(), TOKENIZER.decode(new)))
  return pairs


def random_pairs(count, seed):
  rng = np.random.default_rng(seed)
  pairs = []
  for _ in range(count):
    context = " ".join(rng.choice(WORDS, rng.integers(0, 12)))
    if context:  # (a context of spaces alone encodes to no tokens: lm-eval's HF backend refuses it)
      context += " " * int(rng.integers(0, 3))  # trailing spaces move to the continuation
    continuation = " ".join(rng.choice(WORDS, rng.integers(1, 4)))
    pairs.append((context, continuation))
  return pairs


HAND_PAIRS = [
  ("hello ", "world"),  # the space moves: the continuation is [" w", o, r, l, d]
  ("The cat sat  ", "on the mat"),
  ("", "abc"),  # empty context: the end-of-text id
  ("", " xyz"),
  ("lorem ipsum " * 8, "dolor sit"),  # longer than max_length: the row keeps its last 40 tokens
  ("q", "z" * MAX_LENGTH),  # a continuation of exactly max_length tokens
]
PAIRS = HAND_PAIRS + greedy_pairs() + random_pairs(31, seed=1)
TEXTS = ["", "a", "the quick brown fox", " ".join(WORDS) * 3, "x" * 80, "lorem ipsum dolor " * 7]


def harness(backend="jit", batch_size=8, **kwargs):
  return pe.lm.HarnessLM(
    _tiny.apply_fn,
    PARAMS,
    TOKENIZER,
    max_length=MAX_LENGTH,
    batch_size=batch_size,
    backend=backend,
    **kwargs,
  )


def check_loglikelihoods(got, pairs):
  expected = _tiny.reference_lm(PARAMS, MAX_LENGTH).loglikelihood(
    [instance("loglikelihood", p) for p in pairs], disable_tqdm=True
  )
  assert len(got) == len(expected)
  values = np.array([v for v, _ in got])
  reference = np.array([v for v, _ in expected])
  np.testing.assert_allclose(values, reference, rtol=1e-5)
  assert [g for _, g in got] == [g for _, g in expected]
  return np.max(np.abs(values - reference) / np.abs(reference))


def test_the_table_holds_the_cases_it_means_to():
  """The hand cases split as lm-eval's rules say, and the table holds greedy and non-greedy requests."""
  rows = [requests_lib.token_request(requests_lib.Tokenizer(TOKENIZER), *p) for p in HAND_PAIRS]
  assert rows[0].continuation == (256 + ord("w") - 97, ord("o"), ord("r"), ord("l"), ord("d"))
  assert rows[2].context == (_tiny.EOT,) and rows[2].continuation == (97, 98, 99)
  assert (
    len(rows[4].row(MAX_LENGTH)) == MAX_LENGTH < len(rows[4].context) + len(rows[4].continuation)
  )
  expected = _tiny.reference_lm(PARAMS, MAX_LENGTH).loglikelihood(
    [instance("loglikelihood", p) for p in PAIRS], disable_tqdm=True
  )
  flags = [g for _, g in expected]
  assert sum(flags) >= 3 and not all(flags)
  widths = {
    scoring.bucket_widths(MAX_LENGTH)[np.searchsorted([16, 32, 40], len(r.row(MAX_LENGTH)))]
    for r in (requests_lib.token_request(requests_lib.Tokenizer(TOKENIZER), *p) for p in PAIRS)
  }
  assert widths == {16, 32, 40}


@pytest.mark.parametrize("batch_size", [8, 16])
def test_loglikelihood_equals_the_float64_reference(backend, batch_size):
  lm = harness(backend, batch_size)
  got = lm.loglikelihood([instance("loglikelihood", p, i) for i, p in enumerate(PAIRS)])
  assert check_loglikelihoods(got, PAIRS) < 1e-5


def test_loglikelihood_rolling_equals_the_float64_reference(backend):
  lm = harness(backend)
  requests = [instance("loglikelihood_rolling", (t,), i) for i, t in enumerate(TEXTS)]
  got = lm.loglikelihood_rolling(requests)
  expected = _tiny.reference_lm(PARAMS, MAX_LENGTH).loglikelihood_rolling(requests)
  assert got[0] == 0.0 == expected[0]  # no tokens, no windows
  np.testing.assert_allclose(got, expected, rtol=1e-5)
  assert len(requests_lib.rolling_windows(TOKENIZER.encode(TEXTS[3]), _tiny.EOT, MAX_LENGTH)) >= 3


def test_rolling_windows_are_lm_evals():
  from lm_eval import utils

  for length in (1, 5, 39, 40, 41, 79, 80, 81, 200):
    tokens = list(range(1, length + 1))
    for max_length in (1, 2, 7, 40):
      ours = [
        (list(w.context), list(w.continuation))
        for w in requests_lib.rolling_windows(tokens, 0, max_length)
      ]
      theirs = [
        tuple(map(list, utils.make_disjoint_window(w)))
        for w in utils.get_rolling_token_windows(tokens, 0, max_length, 1)
      ]
      assert ours == [tuple(t) for t in theirs], (length, max_length)


def test_one_trace_per_bucket_width_and_no_compilation_on_a_second_call(backend, compiles):
  traced = []

  def counted(params, tokens):
    traced.append(tokens.shape)
    return _tiny.apply_fn(params, tokens)

  lm = pe.lm.HarnessLM(
    counted, PARAMS, TOKENIZER, max_length=MAX_LENGTH, batch_size=8, backend=backend
  )
  rows = 8 if backend == "jit" else 8 // jax.device_count()  # the rows the step sees
  lm.loglikelihood(
    [instance("loglikelihood", ("a", "b"))]
  )  # bucket 16, and what a first call compiles once
  assert traced == [(rows, 16)]
  before = compiles[0]
  lm.loglikelihood([instance("loglikelihood", p) for p in PAIRS])
  # the two new widths: each its step (and, on pmap / shard_map, its final reduce)
  assert sorted(traced) == [(rows, 16), (rows, 32), (rows, 40)]
  assert 2 <= compiles[0] - before <= (2 if backend == "jit" else 4)
  before = compiles[0]
  lm.loglikelihood([instance("loglikelihood", p) for p in random_pairs(23, seed=7)])
  lm.loglikelihood_rolling([instance("loglikelihood_rolling", (t,)) for t in TEXTS])
  assert compiles[0] == before and len(traced) == 3


def test_params_sharded_over_a_mesh_under_jit():
  mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
  sharding = {
    "embed": jax.sharding.PartitionSpec(None, "model"),
    "conv": jax.sharding.PartitionSpec(None, None, "model"),
    "mean": jax.sharding.PartitionSpec(None, "model"),
    "out": jax.sharding.PartitionSpec(None, "model"),
    "bias": jax.sharding.PartitionSpec("model"),
  }
  params = {
    k: jax.device_put(v, jax.sharding.NamedSharding(mesh, sharding[k])) for k, v in PARAMS.items()
  }
  assert params["bias"].addressable_shards[0].data.shape == (_tiny.VOCAB // 4,)  # really split
  lm = pe.lm.HarnessLM(
    _tiny.apply_fn, params, TOKENIZER, max_length=MAX_LENGTH, batch_size=6, backend="jit", mesh=mesh
  )
  got = lm.loglikelihood([instance("loglikelihood", p) for p in PAIRS])
  check_loglikelihoods(got, PAIRS)


def test_generate_until_cuts_at_the_stop_sequences(backend):
  widths = []

  def generate(params, tokens, mask, max_new_tokens):
    widths.append(tokens.shape[1])
    return _tiny.make_generate_fn(_tiny.apply_fn)(params, tokens, mask, max_new_tokens)

  lm = harness(backend, generate_fn=generate)
  contexts = ["the quick", "over lazy d", "x", "a tree and then some more words " * 2, "b"]
  new = {
    c: _tiny.greedy_tokens64(PARAMS, TOKENIZER.encode(c)[-(MAX_LENGTH - 6) :], 6) for c in contexts
  }
  texts = {
    c: TOKENIZER.decode(t[: t.index(_tiny.EOT)] if _tiny.EOT in t else t) for c, t in new.items()
  }
  stops = {c: [texts[c][2:4]] if len(texts[c]) > 4 else ["\x00never"] for c in contexts}
  requests = [
    instance("generate_until", (c, {"until": stops[c], "max_gen_toks": 6}), i)
    for i, c in enumerate(contexts)
  ]
  got = lm.generate_until(requests)
  expected = [texts[c].split(stops[c][0])[0] for c in contexts]
  assert got == expected
  assert any(len(e) < len(texts[c]) for e, c in zip(expected, contexts))  # some stop sequence cut
  assert sorted(widths) == [16, 34]  # prompt buckets end at max_length - max_gen_toks: 40 - 6


def test_errors_name_the_problem():
  class NoEnd:
    def encode(self, text):
      return list(text.encode())

    def decode(self, ids):
      return bytes(ids).decode()

  with pytest.raises(ValueError, match="end-of-text id"):
    pe.lm.HarnessLM(_tiny.apply_fn, PARAMS, NoEnd(), max_length=8, batch_size=8)
  with pytest.raises(ValueError, match="longer than max_length=40"):
    harness().loglikelihood([instance("loglikelihood", ("a", "b" * 41))])

  def flat(params, tokens):
    return _tiny.apply_fn(params, tokens)[:, -1]

  lm = pe.lm.HarnessLM(flat, PARAMS, TOKENIZER, max_length=MAX_LENGTH, batch_size=8)
  with pytest.raises(ValueError, match=r"logits \[B, T, V\]"):
    lm.loglikelihood([instance("loglikelihood", ("a", "b"))])
  with pytest.raises(ValueError, match="generate_fn"):
    harness().generate_until([instance("generate_until", ("a", {"until": ["\n"]}))])
  with pytest.raises(ValueError, match="not divisible"):
    harness(batch_size=6)
  with pytest.raises(ValueError, match="must be in"):
    harness(generate_fn=lambda *a: None).generate_until(
      [instance("generate_until", ("a", {"max_gen_toks": MAX_LENGTH}))]
    )


def test_logits_wider_than_float32_are_not_rounded():
  """bf16 logits are read in float32: the result equals float32 logits rounded to bf16, in float64."""

  def bf16(params, tokens):
    return _tiny.apply_fn(params, tokens).astype(jnp.bfloat16)

  lm = pe.lm.HarnessLM(bf16, PARAMS, TOKENIZER, max_length=MAX_LENGTH, batch_size=8)
  ((value, _),) = lm.loglikelihood([instance("loglikelihood", ("the quick", " brown"))])
  tokens = TOKENIZER.encode("the quick brown")
  logits = np.asarray(
    _tiny.apply_fn(PARAMS, jnp.asarray([tokens[:-1]])).astype(jnp.bfloat16), np.float64
  )[0]
  log_probs = _tiny.log_softmax64(logits)
  n = len(TOKENIZER.encode(" brown"))
  expected = log_probs[np.arange(len(tokens) - 1 - n, len(tokens) - 1), tokens[-n:]].sum()
  np.testing.assert_allclose(value, expected, rtol=1e-5)


def test_importing_padded_eval_imports_no_lm_eval():
  import subprocess
  import sys

  script = (
    "import sys, padded_eval as pe\n"
    "assert 'lm_eval' not in sys.modules, 'imported'\n"
    "pe.lm.HarnessLM\n"
    "assert 'lm_eval' in sys.modules\n"
    "print('ok')\n"
  )
  done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
  assert done.returncode == 0 and "ok" in done.stdout, done.stderr[-2000:]
  missing = "import sys; sys.modules['lm_eval'] = None; import padded_eval as pe; pe.lm"
  done = subprocess.run(
    [sys.executable, "-c", missing], capture_output=True, text=True, timeout=120
  )
  assert done.returncode == 1 and "pip install 'padded_eval[lm]'" in done.stderr, done.stderr[
    -2000:
  ]

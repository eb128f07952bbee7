"""pe.lm.HarnessLM against lm-eval's own Hugging Face backend (``HFLM``) on the same tiny GPT-2.

A randomly initialised ``transformers`` GPT-2 (torch, float32) and a character tokenizer built offline
(``tokenizers``, wrapped as a ``PreTrainedTokenizerFast``) go to ``HFLM``; the same weights in a JAX port of
GPT-2's forward pass, with the same tokenizer object as it is, go to ``HarnessLM``. Every loglikelihood (and
rolling loglikelihood) agrees within 1e-5 relative and ``is_greedy`` is identical, so the request rules are
lm-eval's HF backend's own code, not a rewrite of it.

Collected only where torch, transformers and accelerate are installed (CI installs no torch: its PyPI wheel
pulls GBs of CUDA libraries), as tests/data/test_sources_torch.py does; nothing is skipped.
"""

import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np

import padded_eval as pe

HAS_TORCH = all(
  importlib.util.find_spec(m) is not None for m in ("torch", "transformers", "accelerate")
)
CHARS = [chr(c) for c in range(32, 127)] + ["\n"]
MAX_LENGTH = 40


def hf_tokenizer():
  from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
  from transformers import PreTrainedTokenizerFast

  vocab = {c: i for i, c in enumerate(CHARS)}
  vocab["<eos>"] = len(vocab)
  vocab["[UNK]"] = len(vocab)
  tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
  tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
  tokenizer.decoder = decoders.Fuse()
  return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<eos>", unk_token="[UNK]")


def gpt2_model(vocab_size):
  import torch
  from transformers import GPT2Config, GPT2LMHeadModel

  torch.manual_seed(0)
  config = GPT2Config(vocab_size=vocab_size, n_positions=64, n_embd=32, n_layer=2, n_head=4)
  model = GPT2LMHeadModel(config).eval()
  with torch.no_grad():  # larger weights than the default init, so the logits are far from uniform
    for parameter in model.parameters():
      if parameter.ndim > 1:
        parameter.mul_(4.0)
  return model


def jax_gpt2(model):
  """``(apply_fn, params)``: GPT-2's forward pass in JAX over the torch model's weights."""
  # vectors as [1, 1, E]: the suite raises on rank promotion
  params = {
    k: jnp.asarray(v.detach().numpy())[None, None]
    if v.ndim == 1
    else jnp.asarray(v.detach().numpy())
    for k, v in model.state_dict().items()
  }
  layers = model.config.n_layer
  heads = model.config.n_head

  def layer_norm(x, prefix, p):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + 1e-5) * p[prefix + ".weight"] + p[prefix + ".bias"]

  def apply_fn(p, tokens):
    b, t = tokens.shape
    x = p["transformer.wte.weight"][tokens] + p["transformer.wpe.weight"][None, :t]
    causal = jnp.tril(jnp.ones((t, t), bool))
    for i in range(layers):
      prefix = f"transformer.h.{i}"
      h = layer_norm(x, prefix + ".ln_1", p)
      qkv = h @ p[prefix + ".attn.c_attn.weight"] + p[prefix + ".attn.c_attn.bias"]
      q, k, v = (
        a.reshape(b, t, heads, -1).transpose(0, 2, 1, 3) for a in jnp.split(qkv, 3, axis=-1)
      )
      scores = q @ k.transpose(0, 1, 3, 2) / jnp.sqrt(q.shape[-1]).astype(q.dtype)
      scores = jnp.where(causal[None, None], scores, jnp.finfo(scores.dtype).min)
      attended = (jax.nn.softmax(scores, axis=-1) @ v).transpose(0, 2, 1, 3).reshape(b, t, -1)
      x = x + attended @ p[prefix + ".attn.c_proj.weight"] + p[prefix + ".attn.c_proj.bias"]
      h = layer_norm(x, prefix + ".ln_2", p)
      h = jax.nn.gelu(
        h @ p[prefix + ".mlp.c_fc.weight"] + p[prefix + ".mlp.c_fc.bias"], approximate=True
      )
      x = x + h @ p[prefix + ".mlp.c_proj.weight"] + p[prefix + ".mlp.c_proj.bias"]
    x = layer_norm(x, "transformer.ln_f", p)
    return x @ p["transformer.wte.weight"].T

  return apply_fn, params


if HAS_TORCH:

  def test_harness_lm_equals_lm_evals_hf_backend(monkeypatch):
    for key in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
      monkeypatch.setenv(key, "1")
    import test_harness as cases
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    tokenizer = hf_tokenizer()
    model = gpt2_model(len(tokenizer))
    reference = HFLM(
      pretrained=model, tokenizer=tokenizer, max_length=MAX_LENGTH, batch_size=8, device="cpu"
    )
    apply_fn, params = jax_gpt2(model)
    ours = pe.lm.HarnessLM(apply_fn, params, tokenizer, max_length=MAX_LENGTH, batch_size=8)

    pairs = cases.HAND_PAIRS + cases.random_pairs(29, seed=5)
    requests = [Instance("loglikelihood", {}, p, i) for i, p in enumerate(pairs)]
    expected = reference.loglikelihood(requests, disable_tqdm=True)
    got = ours.loglikelihood(requests)
    np.testing.assert_allclose([v for v, _ in got], [v for v, _ in expected], rtol=1e-5)
    assert [g for _, g in got] == [g for _, g in expected]

    # greedy continuations of the torch model: is_greedy True for both
    import torch

    greedy = []
    for context in ("the quick", "over lazy", "x y"):
      ids = tokenizer.encode(context)
      with torch.no_grad():
        new = model.generate(
          torch.tensor([ids]),
          attention_mask=torch.ones((1, len(ids)), dtype=torch.long),
          max_new_tokens=3,
          do_sample=False,
          pad_token_id=tokenizer.eos_token_id,
        )
      greedy.append((context, tokenizer.decode(new[0, len(ids) :].tolist())))
    greedy = [p for p in greedy if "<eos>" not in p[1] and "[UNK]" not in p[1]]
    requests = [Instance("loglikelihood", {}, p, i) for i, p in enumerate(greedy)]
    expected = reference.loglikelihood(requests, disable_tqdm=True)
    got = ours.loglikelihood(requests)
    assert (
      greedy and all(g for _, g in expected) and [g for _, g in got] == [g for _, g in expected]
    )
    np.testing.assert_allclose([v for v, _ in got], [v for v, _ in expected], rtol=1e-5)

    texts = [Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate(cases.TEXTS[1:])]
    np.testing.assert_allclose(
      ours.loglikelihood_rolling(texts),
      reference.loglikelihood_rolling(texts, disable_tqdm=True),
      rtol=1e-5,
    )
    assert os.environ["HF_HUB_OFFLINE"] == "1"

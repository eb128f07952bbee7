"""`HarnessLM`: any JAX language model as an ``lm_eval.api.model.LM`` (lm-eval >= 0.4.3, the ``lm`` extra).

``lm_eval.simple_evaluate(model=pe.lm.HarnessLM(apply_fn, params, tokenizer, max_length=..., batch_size=...),
tasks=[...])`` evaluates a JAX model on harness tasks. Requests become token rows by the rules of lm-eval's
Hugging Face backend (`padded_eval.lm.requests`) and are scored in a few padded length buckets through
``masked_eval`` (`padded_eval.lm.scoring`): one compilation per bucket width, results in request order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

try:
  import lm_eval.api.model
except ImportError as error:  # pragma: no cover - the message is tested in a subprocess
  raise ImportError(
    "pe.lm needs lm-eval (>= 0.4.3): pip install 'padded_eval[lm]' (or pip install 'lm-eval>=0.4.3')"
  ) from error

from padded_eval.lm import requests as requests_lib
from padded_eval.lm import scoring
from padded_eval.validation import check_choice, check_int

__all__ = ["DEFAULT_MAX_GEN_TOKS", "HarnessLM"]

DEFAULT_MAX_GEN_TOKS = 256
"""New tokens per ``generate_until`` request when its ``gen_kwargs`` name none (lm-eval's default)."""

_MAX_GEN_KEYS = ("max_gen_toks", "max_new_tokens", "max_tokens", "max_completion_tokens")


class HarnessLM(lm_eval.api.model.LM):
  """A JAX causal language model as an lm-eval ``LM``: loglikelihood, rolling loglikelihood, generation.

  Args:
    apply_fn: ``apply_fn(params, tokens) -> logits``: ``tokens`` int32 ``[B, T]``, logits ``[B, T, V]``, causal
      (position ``t`` predicts token ``t + 1`` from tokens ``<= t``). Traced once per bucket width.
    params: the model's params, any pytree; under ``backend="jit"`` leaves sharded over ``mesh`` keep their
      shardings (see ``pe.masked_eval``).
    tokenizer: ``encode(str) -> list[int]``, ``decode(list[int]) -> str`` and an end-of-text id
      (``eot_token_id``, else ``eos_token_id``); a Hugging Face tokenizer works as it is.
    max_length: the most tokens the model reads in one row (>= 1): longer rows keep their last
      ``max_length`` tokens, and rolling windows predict up to ``max_length`` tokens each.
    batch_size: rows per batch on this process, divisible by its devices (pmap) or data shards (a mesh).
    backend: ``"jit"``, ``"pmap"`` or ``"shard_map"``, as in ``pe.masked_eval``.
    mesh: ``"jit"`` / ``"shard_map"``: the device mesh (rows split over its data axes), or None.
    generate_fn: for ``generate_until``: ``generate_fn(params, tokens, mask, max_new_tokens) -> new_tokens``,
      ``tokens`` int32 ``[B, T]`` prompts padded on the LEFT, ``mask`` bool ``[B, T]`` True on prompt tokens,
      ``max_new_tokens`` a Python int; returns int ``[B, max_new_tokens]``, the greedy continuation. Prompts
      keep their last ``max_length - max_new_tokens`` tokens, and ``T + max_new_tokens <= max_length``.

  Several processes (``jax.distributed``): every process is given every request (lm-eval sees one rank),
  scores an even share of each bucket, and returns every request's result.

  Raises:
    ValueError: a tokenizer without an end-of-text id, ``encode`` or ``decode``; ``max_length`` or
      ``batch_size`` not an int >= 1; an unknown backend; a ``batch_size`` the data shards do not divide.
      Later, from the request methods: a continuation longer than ``max_length`` (or empty); logits of the
      wrong shape; ``generate_until`` without ``generate_fn``, or asking for ``max_length`` new tokens or more.

  Examples:
    A model that gives every byte the same logit scores each continuation byte ``-log(256)``:

    >>> import jax.numpy as jnp, padded_eval as pe
    >>> from lm_eval.api.instance import Instance
    >>> class Bytes:
    ...   eos_token_id = 0
    ...   def encode(self, text): return list(text.encode())
    ...   def decode(self, ids): return bytes(ids).decode()
    >>> uniform = lambda params, tokens: jnp.zeros(tokens.shape + (256,))
    >>> lm = pe.lm.HarnessLM(uniform, None, Bytes(), max_length=32, batch_size=8)
    >>> [(round(v, 4), g) for v, g in lm.loglikelihood([Instance("loglikelihood", {}, ("Hi", " there"), 0)])]
    [(-33.2711, False)]
  """

  def __init__(
    self,
    apply_fn: Callable[[Any, Any], Any],
    params: Any,
    tokenizer: Any,
    *,
    max_length: int,
    batch_size: int,
    backend: str = "jit",
    mesh: Any = None,
    generate_fn: Callable[..., Any] | None = None,
  ):
    super().__init__()
    if not callable(apply_fn):
      raise ValueError(
        f"HarnessLM: apply_fn must be callable (params, tokens) -> logits; got {apply_fn!r}"
      )
    self.tokenizer = requests_lib.Tokenizer(tokenizer)
    self.max_length = check_int("max_length", max_length, minimum=1)
    self.batch_size = check_int("batch_size", batch_size, minimum=1)
    check_choice("backend", backend, ("jit", "pmap", "shard_map"))
    self.generate_fn = generate_fn
    self._runner = scoring.BucketRunner(
      params, batch_size=self.batch_size, backend=backend, mesh=mesh, max_length=self.max_length
    )
    self._score_step = scoring.bound(scoring.score_step, apply_fn)
    self._generate_steps: dict[
      int, Callable
    ] = {}  # one step per max_new_tokens, kept for its programs

  @property
  def eot_token_id(self) -> int:
    return self.tokenizer.eot_token_id

  def loglikelihood(self, requests: list, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
    """``[(logprob_sum, is_greedy)]`` of each ``(context, continuation)`` request, in request order."""
    rows = [requests_lib.token_request(self.tokenizer, *request.args) for request in requests]
    return self.loglikelihood_tokens(rows)

  def loglikelihood_tokens(self, rows: list) -> list[tuple[float, bool]]:
    """`loglikelihood` of requests already in token form (`padded_eval.lm.requests.TokenRequest`)."""
    requests_lib.check_continuations(rows, self.max_length)
    if not rows:
      return []
    logprob, greedy = scoring.loglikelihoods(
      self._runner, self._score_step, rows, self.max_length, self.eot_token_id
    )
    return [(float(value), bool(flag)) for value, flag in zip(logprob, greedy, strict=True)]

  def loglikelihood_rolling(self, requests: list, disable_tqdm: bool = False) -> list[float]:
    """The log-probability of each ``(text,)`` request's tokens, summed over lm-eval's disjoint rolling windows."""
    windows, owners = [], []
    for number, request in enumerate(requests):
      tokens = self.tokenizer.encode(request.args[0])
      found = requests_lib.rolling_windows(tokens, self.eot_token_id, self.max_length)
      windows += found
      owners += [number] * len(found)
    totals = [0.0] * len(requests)
    for owner, (logprob, _) in zip(owners, self.loglikelihood_tokens(windows), strict=True):
      totals[owner] += logprob
    return totals

  def generate_until(self, requests: list, disable_tqdm: bool = False) -> list[str]:
    """Greedy continuations of ``(context, gen_kwargs)`` requests, cut at the first stop sequence (``until``)."""
    if not requests:
      return []
    if self.generate_fn is None:
      raise ValueError(
        "HarnessLM.generate_until needs generate_fn: pass HarnessLM(..., generate_fn=fn) with "
        "fn(params, tokens, mask, max_new_tokens) -> new tokens [B, max_new_tokens] (tokens left-padded, "
        "mask True on prompt tokens)"
      )
    eot_text = self.tokenizer.decode([self.eot_token_id])
    groups: dict[int, list[int]] = {}
    stops = []
    for number, request in enumerate(requests):
      context, gen_kwargs = request.args
      max_new, until = self._generation_settings(gen_kwargs, eot_text)
      groups.setdefault(max_new, []).append(number)
      stops.append(until)
    texts = [""] * len(requests)
    for max_new, numbers in groups.items():
      prompts = [
        self.tokenizer.encode(requests[n].args[0])[-(self.max_length - max_new) :] for n in numbers
      ]
      new = scoring.generations(
        self._runner, self._generate_step(max_new), prompts, max_new, self.eot_token_id
      )
      for n, tokens in zip(numbers, new, strict=True):
        texts[n] = self._cut(tokens.tolist(), stops[n])
    return texts

  def _generation_settings(self, gen_kwargs: Any, eot_text: str) -> tuple[int, list[str]]:
    """``(max_new_tokens, stop strings)`` of one request's ``gen_kwargs`` (the end-of-text text always stops)."""
    gen_kwargs = dict(gen_kwargs or {})
    max_new = next((gen_kwargs[k] for k in _MAX_GEN_KEYS if gen_kwargs.get(k) is not None), None)
    max_new = DEFAULT_MAX_GEN_TOKS if max_new is None else int(max_new)
    if not 1 <= max_new < self.max_length:
      raise ValueError(
        f"HarnessLM.generate_until: a request asks for {max_new} new tokens; it must be in [1, max_length) "
        f"= [1, {self.max_length}) so that the prompt keeps at least one token (set gen_kwargs "
        f"max_gen_toks, or raise max_length)"
      )
    until = gen_kwargs.get("until")
    until = [until] if isinstance(until, str) else list(until or [])
    if eot_text and eot_text not in until:
      until.append(eot_text)
    return max_new, until

  def _cut(self, tokens: list[int], until: list[str]) -> str:
    """The text of ``tokens`` up to the end-of-text id and the first of the stop strings."""
    if self.eot_token_id in tokens:
      tokens = tokens[: tokens.index(self.eot_token_id)]
    text = self.tokenizer.decode(tokens)
    for stop in until:
      if stop:
        text = text.split(stop)[0]
    return text

  def _generate_step(self, max_new_tokens: int) -> Callable:
    if max_new_tokens not in self._generate_steps:
      self._generate_steps[max_new_tokens] = scoring.bound(
        scoring.generate_step, self.generate_fn, max_new_tokens
      )
    return self._generate_steps[max_new_tokens]

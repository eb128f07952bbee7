"""Harness requests as token rows: the rules of lm-eval's Hugging Face backend, in plain Python.

`padded_eval.lm.harness.HarnessLM` turns each lm-eval request into token lists here, then
scores them in padded buckets (`padded_eval.lm.scoring`). Nothing here imports lm-eval or JAX.

The rules (lm-eval >= 0.4, ``lm_eval/api/model.py`` ``TemplateLM`` and
``lm_eval/models/huggingface.py``):

* a loglikelihood request ``(context, continuation)``: trailing whitespace of the context moves
  to the front of the continuation; the continuation's tokens are the whole string's tokens
  after the context's (``encode(context + continuation)[len(encode(context)):]``). An empty
  context is the end-of-text id (unless the continuation already starts with it: then its
  first token is the context);
* the scored row is the last ``max_length + 1`` tokens of ``context + continuation`` less the
  final one; the continuation's tokens are scored at the row's last positions;
* a rolling request ``(text,)``: the text's tokens, predicted once each, in disjoint windows of
  at most ``max_length`` predictions; the first window's context is the end-of-text id, each
  later window takes ``max_length`` tokens of context before its last prediction.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

__all__ = ["TokenRequest", "Tokenizer", "rolling_windows", "token_request"]


@dataclasses.dataclass(frozen=True)
class TokenRequest:
  """One scored row: ``context`` (>= 1 token) and the ``continuation`` tokens whose log-probabilities sum.

  ``row`` is what the model reads (``(context + continuation)[-(max_length + 1):][:-1]``), and
  the continuation is predicted at its last ``len(continuation)`` positions.
  """

  context: tuple[int, ...]
  continuation: tuple[int, ...]

  def row(self, max_length: int) -> tuple[int, ...]:
    return (self.context + self.continuation)[-(max_length + 1) :][:-1]


class Tokenizer:
  """The user's tokenizer as the harness needs it: ``encode``, ``decode`` and the end-of-text id.

  Args:
    tokenizer: any object with ``encode(str) -> list[int]``, ``decode(list[int]) -> str`` and an
      int ``eot_token_id`` (else ``eos_token_id``); a Hugging Face tokenizer works as it is.

  Raises:
    ValueError: no ``encode`` / ``decode``, or neither end-of-text attribute holds an int.
  """

  def __init__(self, tokenizer: Any):
    for method in ("encode", "decode"):
      if not callable(getattr(tokenizer, method, None)):
        raise ValueError(
          f"HarnessLM: the tokenizer needs a {method}() method (encode(str) -> list[int], "
          f"decode(list[int]) -> str); got {type(tokenizer).__name__}"
        )
    eot = getattr(tokenizer, "eot_token_id", None)
    if eot is None:
      eot = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eot, bool) or not isinstance(eot, int):
      raise ValueError(
        f"HarnessLM: the tokenizer has no end-of-text id: neither tokenizer.eot_token_id nor "
        f"tokenizer.eos_token_id is an int (got {eot!r}); set one, e.g. tokenizer.eos_token_id = <id>, "
        "since an empty context and the first rolling window are conditioned on it"
      )
    self.wrapped = tokenizer
    self.eot_token_id: int = eot

  def encode(self, text: str) -> list[int]:
    return [int(t) for t in self.wrapped.encode(text)]

  def decode(self, tokens: Sequence[int]) -> str:
    return self.wrapped.decode(list(tokens))


def token_request(tokenizer: Tokenizer, context: str, continuation: str) -> TokenRequest:
  """The token form of a loglikelihood request ``(context, continuation)`` (the module's rules)."""
  if context == "":
    continuation_tokens = tokenizer.encode(continuation)
    if continuation_tokens and continuation_tokens[0] == tokenizer.eot_token_id:
      return TokenRequest(tuple(continuation_tokens[:1]), tuple(continuation_tokens[1:]))
    return TokenRequest((tokenizer.eot_token_id,), tuple(continuation_tokens))
  spaces = len(context) - len(context.rstrip())
  if spaces:
    context, continuation = context[:-spaces], context[-spaces:] + continuation
  whole = tokenizer.encode(context + continuation)
  context_tokens = tokenizer.encode(context)
  return TokenRequest(tuple(context_tokens), tuple(whole[len(context_tokens) :]))


def rolling_windows(tokens: Sequence[int], prefix: int, max_length: int) -> list[TokenRequest]:
  """Disjoint windows that predict every token of ``tokens`` once (the module's rolling rule).

  Window ``k`` predicts ``tokens[start:end]`` (the first window up to ``max_length`` tokens from
  the start, each later one up to ``max_length`` more); its context is the ``max_length + 1 -
  (end - start)`` tokens before ``start`` (the first window: ``prefix``), so that the model reads
  ``max_length`` tokens whenever the text has that many. Empty ``tokens``: no window.

  Examples:
    >>> [(w.context, w.continuation) for w in rolling_windows([1, 2, 3, 4, 5, 6], 0, 4)]
    [((0,), (1, 2, 3, 4)), ((2, 3, 4), (5, 6))]
  """
  tokens = tuple(tokens)
  windows = []
  start = 0
  while start < len(tokens):
    end = min(len(tokens), start + max_length)
    if start == 0:
      context = (prefix,)
    else:
      context = tokens[max(0, end - max_length - 1) : start]
    windows.append(TokenRequest(context, tokens[start:end]))
    start = end
  return windows


def check_continuations(requests: Sequence[TokenRequest], max_length: int) -> None:
  """Raises ValueError for an empty context or continuation, or a continuation longer than ``max_length``."""
  for number, request in enumerate(requests):
    if not request.context:
      raise ValueError(
        f"HarnessLM: request {number}'s context encodes to no tokens (a context of whitespace alone, whose "
        "spaces move to the continuation); lm-eval's Hugging Face backend refuses it too: pass context='' "
        "(the end-of-text id) or a non-blank context"
      )
    if not request.continuation:
      raise ValueError(
        f"HarnessLM: request {number} has a continuation of no tokens (context {len(request.context)} "
        "tokens); a loglikelihood continuation must hold at least one token"
      )
    if len(request.continuation) > max_length:
      raise ValueError(
        f"HarnessLM: request {number}'s continuation is {len(request.continuation)} tokens, longer than "
        f"max_length={max_length}; the model cannot score it in one row: raise max_length or shorten the "
        "continuation"
      )

"""lm_eval.simple_evaluate over local harness tasks (YAML + JSON files in a tmp dir, offline): a multiple-choice
task (``acc``, ``acc_norm``) and a rolling perplexity task give the numbers of lm-eval's own request handling
over the float64 reference model (tests/lm/_tiny.py), and those of the choices scored by hand."""

import json
import math
import os
import re

import _tiny
import numpy as np
import pytest

import padded_eval as pe

MAX_LENGTH = 40
PARAMS = _tiny.make_params(seed=3)
WORDS = "the quick brown fox jumps over lazy dog and then rests under a tree".split()

MC_YAML = """task: tiny_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: multiple_choice
test_split: test
doc_to_text: "Q: {{{{question}}}}\\nA:"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{label}}}}"
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
  - metric: acc_norm
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""

ROLLING_YAML = """task: tiny_ppl
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
output_type: loglikelihood_rolling
test_split: test
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
metadata:
  version: 1.0
"""


def mc_docs(count=13, seed=0):
  rng = np.random.default_rng(seed)
  docs = []
  for _ in range(count):
    choices = [
      " ".join(rng.choice(WORDS, rng.integers(1, 4))) for _ in range(int(rng.integers(2, 5)))
    ]
    question = " ".join(rng.choice(WORDS, rng.integers(2, 9)))
    docs.append(
      {"question": question, "choices": choices, "label": int(rng.integers(0, len(choices)))}
    )
  return docs


def rolling_docs():
  return [{"text": "the quick brown fox jumps over the lazy dog " * k} for k in (1, 2, 5)] + [
    {"text": "a tree rests under a dog"}
  ]


@pytest.fixture
def tasks(tmp_path, monkeypatch):
  for key in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
    monkeypatch.setenv(key, "1")
  monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf_cache"))
  for name, yaml, docs in (
    ("tiny_mc", MC_YAML, mc_docs()),
    ("tiny_ppl", ROLLING_YAML, rolling_docs()),
  ):
    data = tmp_path / f"{name}.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in docs))
    (tmp_path / f"{name}.yaml").write_text(yaml.format(data=data))
  from lm_eval.tasks import TaskManager

  return TaskManager(
    include_path=str(tmp_path), include_defaults=False
  )  # our tasks only (indexing all: 20 s)


def evaluate(model, task_manager):
  import lm_eval

  out = lm_eval.simple_evaluate(
    model=model,
    tasks=["tiny_mc", "tiny_ppl"],
    task_manager=task_manager,
    bootstrap_iters=0,
    log_samples=False,
    random_seed=0,
    numpy_random_seed=0,
    torch_random_seed=None,
    fewshot_random_seed=0,
  )
  return out["results"]


def test_simple_evaluate_gives_the_reference_numbers(tasks):
  model = pe.lm.HarnessLM(
    _tiny.apply_fn,
    PARAMS,
    _tiny.MergingBytes(),
    max_length=MAX_LENGTH,
    batch_size=8,
    backend="pmap",
  )
  got = evaluate(model, tasks)
  expected = evaluate(_tiny.reference_lm(PARAMS, MAX_LENGTH), tasks)
  assert got["tiny_mc"]["acc,none"] == expected["tiny_mc"]["acc,none"]
  assert got["tiny_mc"]["acc_norm,none"] == expected["tiny_mc"]["acc_norm,none"]
  for metric in ("word_perplexity,none", "byte_perplexity,none", "bits_per_byte,none"):
    np.testing.assert_allclose(got["tiny_ppl"][metric], expected["tiny_ppl"][metric], rtol=1e-5)

  # The same numbers scored by hand: acc picks the likeliest choice, acc_norm per character.
  reference = _tiny.reference_lm(PARAMS, MAX_LENGTH)
  hits, hits_norm = [], []
  for doc in mc_docs():
    context = f"Q: {doc['question']}\nA:"
    scores = [
      reference._loglikelihood_tokens([(None, *reference._encode_pair(context, " " + c))])[0][0]
      for c in doc["choices"]
    ]
    norm = [s / len(c) for s, c in zip(scores, doc["choices"])]  # characters of the choice alone
    hits.append(int(np.argmax(scores)) == doc["label"])
    hits_norm.append(int(np.argmax(norm)) == doc["label"])
  assert got["tiny_mc"]["acc,none"] == pytest.approx(np.mean(hits))
  assert got["tiny_mc"]["acc_norm,none"] == pytest.approx(np.mean(hits_norm))
  assert 0 < np.mean(hits) < 1 or 0 < np.mean(hits_norm) < 1  # the accuracies can tell models apart
  texts = [d["text"] for d in rolling_docs()]
  total = sum(reference.loglikelihood_rolling([_Instance(t) for t in texts]))
  words = sum(len(re.split(r"\s+", t)) for t in texts)
  np.testing.assert_allclose(
    got["tiny_ppl"]["word_perplexity,none"], math.exp(-total / words), rtol=1e-5
  )
  assert os.environ["HF_DATASETS_OFFLINE"] == "1"


class _Instance:
  def __init__(self, text):
    self.args = (text,)

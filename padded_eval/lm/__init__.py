"""Language-model evaluation: ``pe.lm.HarnessLM``, a JAX model as an lm-eval ``LM`` (the ``lm`` extra).

* `padded_eval.lm.requests`: harness requests as token rows (lm-eval's Hugging Face backend rules);
* `padded_eval.lm.scoring`: token rows scored in padded length buckets through ``masked_eval``;
* `padded_eval.lm.harness`: `HarnessLM`, the ``lm_eval.api.model.LM``.

lm-eval is imported by `padded_eval.lm.harness` only, and the facade imports this folder when ``pe.lm`` is first
read, so ``import padded_eval`` never loads it. docs/architecture.md, "Language models".
"""

from padded_eval.lm.harness import HarnessLM as HarnessLM

"""Text: `perplexity` on logits, and metrics on token ids with ``pad_id``.

`token_sequences` checks the ids and removes the padding once; `ngrams` (`BLEU`, `RougeN`)
and `edit_distance` (`RougeL`, `WordErrorRate`, `ExactMatch`) read its sequences. The public
names are re-exported by `padded_eval.metrics`.
"""

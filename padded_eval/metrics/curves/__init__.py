"""Curves: AUROC, AUPRC and the operating points read from the same score histograms.

`histogram` holds the state (`ScoreHistogram`: exact per-bin counts of positives and negatives)
and `auc` the areas and their curves; the modes each have a module: `exact_scores` (every score
kept, ``exact=True``), `segments` (explicit ``thresholds=``, partial AUC), `samples`
(multilabel ``average="samples"``), `one_vs_one` (``multi_class="ovo"``) and `weighted`
(``weighted=True``). `operating_points` picks points of the same curves (`EER`, `LogAUC`,
`RecallAtFixedPrecision`, ...). The public names are re-exported by `padded_eval.metrics`.
"""

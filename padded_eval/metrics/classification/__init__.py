"""Classification: accuracy, the confusion-matrix family, calibration and margin losses.

`_formatting` reads every task's inputs once (binary, multiclass, multilabel) and `_inputs`
holds `ClassificationMetric`, the configuration checks and the batch counts the family shares;
`confusion` is the one exact confusion state that `scores`, `stat_scores` and `report` read.
The public names are re-exported by `padded_eval.metrics`.
"""

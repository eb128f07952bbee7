"""Regression beside the weighted means of `padded_eval.metrics.averages` (MSE, MAE, RMSE).

`moments` (exactly merged second moments: `Std`, `R2Score`, `PearsonCorrelation`), `errors`
(`MAPE`, `MSLE`, `ExplainedVariance`), `deviance` (Tweedie deviances), `rank_correlation`
(Spearman and Kendall over the kept pairs of `pair_buffer`), `similarity` (cosine, KL) and
`_multioutput` (scikit-learn's ``multioutput=``). The public names are re-exported by
`padded_eval.metrics`.
"""

"""Resampling and slices around any metric: `bootstrap` (`Bootstrap`, Poisson counts of
`_poisson_counts` from each row's id), `sliced` (`Sliced`: one state per slice) and
`comparison` (`compare`: a paired bootstrap of two runs). The public names are re-exported by
`padded_eval.metrics`.
"""

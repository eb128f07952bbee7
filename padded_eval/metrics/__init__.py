"""Metrics: immutable pytrees of masked sufficient statistics."""

from padded_eval.metrics.base import Metric as Metric
from padded_eval.metrics.averages import Mean as Mean
from padded_eval.metrics.averages import MSE as MSE
from padded_eval.metrics.averages import MAE as MAE
from padded_eval.metrics.averages import RMSE as RMSE
from padded_eval.metrics.accuracy import Accuracy as Accuracy
from padded_eval.metrics.moments import Std as Std
from padded_eval.metrics.moments import R2Score as R2Score
from padded_eval.metrics.moments import PearsonCorrelation as PearsonCorrelation
from padded_eval.metrics.text import Perplexity as Perplexity

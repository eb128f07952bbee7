"""Metrics: immutable pytrees of masked sufficient statistics."""

from padded_eval.metrics.accuracy import Accuracy as Accuracy
from padded_eval.metrics.averages import MAE as MAE
from padded_eval.metrics.averages import MSE as MSE
from padded_eval.metrics.averages import RMSE as RMSE
from padded_eval.metrics.averages import Mean as Mean
from padded_eval.metrics.base import Metric as Metric
from padded_eval.metrics.bootstrap import Bootstrap as Bootstrap
from padded_eval.metrics.calibration import CalibrationError as CalibrationError
from padded_eval.metrics.confusion import CohenKappa as CohenKappa
from padded_eval.metrics.confusion import ConfusionMatrix as ConfusionMatrix
from padded_eval.metrics.confusion import F1Score as F1Score
from padded_eval.metrics.confusion import FBetaScore as FBetaScore
from padded_eval.metrics.confusion import JaccardIndex as JaccardIndex
from padded_eval.metrics.confusion import MatthewsCorrCoef as MatthewsCorrCoef
from padded_eval.metrics.confusion import Precision as Precision
from padded_eval.metrics.confusion import Recall as Recall
from padded_eval.metrics.confusion import Specificity as Specificity
from padded_eval.metrics.curves import AUPRC as AUPRC
from padded_eval.metrics.curves import AUROC as AUROC
from padded_eval.metrics.moments import PearsonCorrelation as PearsonCorrelation
from padded_eval.metrics.moments import R2Score as R2Score
from padded_eval.metrics.moments import Std as Std
from padded_eval.metrics.text import Perplexity as Perplexity

# isort: split
# curve-family metrics (issue 31)
from padded_eval.metrics.calibration import BrierScore as BrierScore
from padded_eval.metrics.operating_points import EER as EER
from padded_eval.metrics.operating_points import PrecisionAtFixedRecall as PrecisionAtFixedRecall
from padded_eval.metrics.operating_points import RecallAtFixedPrecision as RecallAtFixedPrecision
from padded_eval.metrics.operating_points import (
  SensitivityAtSpecificity as SensitivityAtSpecificity,
)
from padded_eval.metrics.operating_points import (
  SpecificityAtSensitivity as SpecificityAtSensitivity,
)

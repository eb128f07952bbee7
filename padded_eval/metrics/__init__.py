"""Metrics: immutable pytrees of masked sufficient statistics."""

from padded_eval.metrics.averages import MAE as MAE
from padded_eval.metrics.averages import MSE as MSE
from padded_eval.metrics.averages import RMSE as RMSE
from padded_eval.metrics.averages import Mean as Mean
from padded_eval.metrics.base import Metric as Metric
from padded_eval.metrics.classification.accuracy import Accuracy as Accuracy
from padded_eval.metrics.classification.calibration import CalibrationError as CalibrationError
from padded_eval.metrics.classification.confusion import CohenKappa as CohenKappa
from padded_eval.metrics.classification.confusion import ConfusionMatrix as ConfusionMatrix
from padded_eval.metrics.classification.confusion import MatthewsCorrCoef as MatthewsCorrCoef
from padded_eval.metrics.classification.report import ClassificationReport as ClassificationReport
from padded_eval.metrics.classification.scores import F1Score as F1Score
from padded_eval.metrics.classification.scores import FBetaScore as FBetaScore
from padded_eval.metrics.classification.scores import JaccardIndex as JaccardIndex
from padded_eval.metrics.classification.scores import Precision as Precision
from padded_eval.metrics.classification.scores import Recall as Recall
from padded_eval.metrics.classification.scores import Specificity as Specificity
from padded_eval.metrics.classification.segmentation import Dice as Dice
from padded_eval.metrics.classification.stat_scores import NPV as NPV
from padded_eval.metrics.classification.stat_scores import BalancedAccuracy as BalancedAccuracy
from padded_eval.metrics.classification.stat_scores import HammingLoss as HammingLoss
from padded_eval.metrics.classification.stat_scores import (
  NegativePredictiveValue as NegativePredictiveValue,
)
from padded_eval.metrics.classification.stat_scores import StatScores as StatScores
from padded_eval.metrics.classification.stat_scores import ZeroOneLoss as ZeroOneLoss
from padded_eval.metrics.curves.auc import AUPRC as AUPRC
from padded_eval.metrics.curves.auc import AUROC as AUROC
from padded_eval.metrics.images import PSNR as PSNR
from padded_eval.metrics.images import SSIM as SSIM
from padded_eval.metrics.ranking import MRR as MRR
from padded_eval.metrics.ranking import MAPAtK as MAPAtK
from padded_eval.metrics.ranking import NDCGAtK as NDCGAtK
from padded_eval.metrics.ranking import PrecisionAtK as PrecisionAtK
from padded_eval.metrics.ranking import RecallAtK as RecallAtK
from padded_eval.metrics.regression.errors import MAPE as MAPE
from padded_eval.metrics.regression.errors import MSLE as MSLE
from padded_eval.metrics.regression.errors import ExplainedVariance as ExplainedVariance
from padded_eval.metrics.regression.moments import PearsonCorrelation as PearsonCorrelation
from padded_eval.metrics.regression.moments import R2Score as R2Score
from padded_eval.metrics.regression.moments import Std as Std
from padded_eval.metrics.resampling.bootstrap import Bootstrap as Bootstrap
from padded_eval.metrics.text.edit_distance import ExactMatch as ExactMatch
from padded_eval.metrics.text.edit_distance import RougeL as RougeL
from padded_eval.metrics.text.edit_distance import WordErrorRate as WordErrorRate
from padded_eval.metrics.text.ngrams import BLEU as BLEU
from padded_eval.metrics.text.ngrams import RougeN as RougeN
from padded_eval.metrics.text.perplexity import Perplexity as Perplexity

# isort: split
# Slices and comparisons (issue 30)
# curve-family metrics (issue 31)
from padded_eval.metrics.classification.calibration import BrierScore as BrierScore
from padded_eval.metrics.curves.operating_points import EER as EER
from padded_eval.metrics.curves.operating_points import (
  PrecisionAtFixedRecall as PrecisionAtFixedRecall,
)
from padded_eval.metrics.curves.operating_points import (
  RecallAtFixedPrecision as RecallAtFixedPrecision,
)
from padded_eval.metrics.curves.operating_points import (
  SensitivityAtSpecificity as SensitivityAtSpecificity,
)
from padded_eval.metrics.curves.operating_points import (
  SpecificityAtSensitivity as SpecificityAtSensitivity,
)
from padded_eval.metrics.resampling.comparison import compare as compare
from padded_eval.metrics.resampling.sliced import Sliced as Sliced

# isort: split
# issue 31, classification half: margin losses
# regression and other metrics (issue 31, second half)
from padded_eval.metrics.classification.margins import HingeLoss as HingeLoss
from padded_eval.metrics.curves.operating_points import LogAUC as LogAUC
from padded_eval.metrics.regression.deviance import D2TweedieScore as D2TweedieScore
from padded_eval.metrics.regression.deviance import TweedieDevianceScore as TweedieDevianceScore
from padded_eval.metrics.regression.rank_correlation import KendallTau as KendallTau
from padded_eval.metrics.regression.rank_correlation import (
  SpearmanCorrelation as SpearmanCorrelation,
)
from padded_eval.metrics.regression.similarity import CosineSimilarity as CosineSimilarity
from padded_eval.metrics.regression.similarity import KLDivergence as KLDivergence
from padded_eval.metrics.values import FromFun as FromFun
from padded_eval.metrics.values import LastValue as LastValue
from padded_eval.metrics.values import from_fun as from_fun

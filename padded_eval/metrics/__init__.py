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
from padded_eval.metrics.confusion import MatthewsCorrCoef as MatthewsCorrCoef
from padded_eval.metrics.curves import AUPRC as AUPRC
from padded_eval.metrics.curves import AUROC as AUROC
from padded_eval.metrics.edit_distance import ExactMatch as ExactMatch
from padded_eval.metrics.edit_distance import RougeL as RougeL
from padded_eval.metrics.edit_distance import WordErrorRate as WordErrorRate
from padded_eval.metrics.images import PSNR as PSNR
from padded_eval.metrics.images import SSIM as SSIM
from padded_eval.metrics.moments import PearsonCorrelation as PearsonCorrelation
from padded_eval.metrics.moments import R2Score as R2Score
from padded_eval.metrics.moments import Std as Std
from padded_eval.metrics.ngrams import BLEU as BLEU
from padded_eval.metrics.ngrams import RougeN as RougeN
from padded_eval.metrics.ranking import MRR as MRR
from padded_eval.metrics.ranking import MAPAtK as MAPAtK
from padded_eval.metrics.ranking import NDCGAtK as NDCGAtK
from padded_eval.metrics.ranking import PrecisionAtK as PrecisionAtK
from padded_eval.metrics.ranking import RecallAtK as RecallAtK
from padded_eval.metrics.regression import MAPE as MAPE
from padded_eval.metrics.regression import MSLE as MSLE
from padded_eval.metrics.regression import ExplainedVariance as ExplainedVariance
from padded_eval.metrics.report import ClassificationReport as ClassificationReport
from padded_eval.metrics.scores import F1Score as F1Score
from padded_eval.metrics.scores import FBetaScore as FBetaScore
from padded_eval.metrics.scores import JaccardIndex as JaccardIndex
from padded_eval.metrics.scores import Precision as Precision
from padded_eval.metrics.scores import Recall as Recall
from padded_eval.metrics.scores import Specificity as Specificity
from padded_eval.metrics.segmentation import Dice as Dice
from padded_eval.metrics.stat_scores import NPV as NPV
from padded_eval.metrics.stat_scores import BalancedAccuracy as BalancedAccuracy
from padded_eval.metrics.stat_scores import HammingLoss as HammingLoss
from padded_eval.metrics.stat_scores import NegativePredictiveValue as NegativePredictiveValue
from padded_eval.metrics.stat_scores import StatScores as StatScores
from padded_eval.metrics.stat_scores import ZeroOneLoss as ZeroOneLoss
from padded_eval.metrics.text import Perplexity as Perplexity

# isort: split
# Slices and comparisons (issue 30)
# curve-family metrics (issue 31)
from padded_eval.metrics.calibration import BrierScore as BrierScore
from padded_eval.metrics.comparison import compare as compare
from padded_eval.metrics.operating_points import EER as EER
from padded_eval.metrics.operating_points import PrecisionAtFixedRecall as PrecisionAtFixedRecall
from padded_eval.metrics.operating_points import RecallAtFixedPrecision as RecallAtFixedPrecision
from padded_eval.metrics.operating_points import (
  SensitivityAtSpecificity as SensitivityAtSpecificity,
)
from padded_eval.metrics.operating_points import (
  SpecificityAtSensitivity as SpecificityAtSensitivity,
)
from padded_eval.metrics.sliced import Sliced as Sliced

# isort: split
# issue 31, classification half: margin losses
# regression and other metrics (issue 31, second half)
from padded_eval.metrics.deviance import D2TweedieScore as D2TweedieScore
from padded_eval.metrics.deviance import TweedieDevianceScore as TweedieDevianceScore
from padded_eval.metrics.margins import HingeLoss as HingeLoss
from padded_eval.metrics.operating_points import LogAUC as LogAUC
from padded_eval.metrics.rank_correlation import KendallTau as KendallTau
from padded_eval.metrics.rank_correlation import SpearmanCorrelation as SpearmanCorrelation
from padded_eval.metrics.similarity import CosineSimilarity as CosineSimilarity
from padded_eval.metrics.similarity import KLDivergence as KLDivergence
from padded_eval.metrics.values import FromFun as FromFun
from padded_eval.metrics.values import LastValue as LastValue
from padded_eval.metrics.values import from_fun as from_fun

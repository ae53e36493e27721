"""`feedback`: auditing BP, feedback alignment and direct feedback alignment (paper 002,
arXiv:2606.21126).

Specification: docs/papers/feedback.md. BP, FA and DFA train residual networks
(ResMLP and ViT-Mini with a terminal LayerNorm, StudentNet without) in one local-loss form and
differ only in the credit a_l each block receives. Every epoch the trainer audits the model on a
fixed evaluation batch: per-layer norms ||h_l||, the largest block amplification rho (D1),
the BP reference gradient ||g_L|| (D2) and per-layer cosines between the method's credit and
BP's. `frozen_blocks` trains the baseline that depth utility (D3) compares against; the protocol
report (report.py, served at GET /experiments/{id}/reports/protocol) pairs the runs.
"""

from trainers.feedback.config import MAX_DEPTH, FeedbackConfig
from trainers.feedback.credit import FeedbackMatrices, decode_feedback, draw_feedback
from trainers.feedback.models import ResidualNet, Teacher, build_model
from trainers.feedback.trainer import FeedbackOutcome, FeedbackTrainer, fit, step_losses

__all__ = [
    "MAX_DEPTH",
    "FeedbackConfig",
    "FeedbackMatrices",
    "FeedbackOutcome",
    "FeedbackTrainer",
    "ResidualNet",
    "Teacher",
    "build_model",
    "decode_feedback",
    "draw_feedback",
    "fit",
    "step_losses",
]

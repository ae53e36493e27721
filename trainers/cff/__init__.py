"""`cff`: margin clamping in Contrastive Forward-Forward (paper 000, arXiv:2603.00951).

Specification: shared/papers/cff-margin-clamping.md. `config` holds the run's settings and the
margin schedule, `model` the ViT split into layer-local units and the linear head, `trainer` the
layer-local stage 1, the head's stage 2 and the test evaluation, `estimate` the resource
estimate. The loss is trainers.losses.supcon_margin.
"""

from trainers.cff.config import MAX_DEPTH, CFFConfig, margin_schedule
from trainers.cff.estimate import cff_estimate, cff_parameters
from trainers.cff.model import build_head, build_layers, encode, patchify
from trainers.cff.trainer import CFFTrainer, evaluate

__all__ = [
    "MAX_DEPTH",
    "CFFConfig",
    "CFFTrainer",
    "build_head",
    "build_layers",
    "cff_estimate",
    "cff_parameters",
    "encode",
    "evaluate",
    "margin_schedule",
    "patchify",
]

"""`cff`: margin clamping in Contrastive Forward-Forward (paper 000, arXiv:2603.00951)."""

from trainers.cff.trainer import (
    Attention,
    Block,
    CFFConfig,
    CFFTrainer,
    build_head,
    build_layers,
    cff_parameters,
    clamp_activation_rate,
    evaluate,
    expected_positives_per_anchor,
    fit,
    margin_schedule,
    pair_similarities,
    patchify,
    supcon_margin_loss,
    supcon_margin_loss_from_similarities,
)

__all__ = [
    "Attention",
    "Block",
    "CFFConfig",
    "CFFTrainer",
    "build_head",
    "build_layers",
    "cff_parameters",
    "clamp_activation_rate",
    "evaluate",
    "expected_positives_per_anchor",
    "fit",
    "margin_schedule",
    "pair_similarities",
    "patchify",
    "supcon_margin_loss",
    "supcon_margin_loss_from_similarities",
]

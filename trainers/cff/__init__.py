"""`cff`: margin clamping in Contrastive Forward-Forward (paper 000, arXiv:2603.00951).

Specification: docs/papers/cff.md. A ViT is trained layer-locally: every layer
has its own AdamW and its own supervised contrastive loss on its token mean, and its input is
detached from the layer below. The positive-pair margin m_l is either clamped into the cosine,
min(s + m, 1) (CFF's code: saturated pairs get zero gradient), subtracted after the
log-probability (gradient-neutral), or left out. After stage 1 a LayerNorm + Linear head is
trained on the frozen last layer; test accuracy is the head's.

`config`: the run's settings and the margin schedule; `model`: the ViT as layer-local units and
the head; `trainer`: stages 1 and 2 and the test evaluation; `batched`: the seeds of a task as
one computation, on `stacked` copies of the model under vmap; `estimate`: the resource
estimate. The loss is trainers.losses.supcon_margin.
"""

from trainers.cff.config import CFFConfig, margin_schedule
from trainers.cff.estimate import cff_parameters
from trainers.cff.model import build_head, build_layers, patchify
from trainers.cff.trainer import CFFTrainer, evaluate

__all__ = [
    "CFFConfig",
    "CFFTrainer",
    "build_head",
    "build_layers",
    "cff_parameters",
    "evaluate",
    "margin_schedule",
    "patchify",
]

"""The `cff` trainer's resource estimate: pure arithmetic on a CFFConfig (no model, no data, no
allocation), counting what the trainer allocates (trainers/estimates.py explains the phases and
terms)."""

from __future__ import annotations

from trainers.base import ResourceEstimate
from trainers.cff.config import CFFConfig
from trainers.estimates import (
    FLOAT32,
    Term,
    augmented_batch_bytes,
    dataset_bytes,
    dataset_fields,
    dataset_shape,
    decode_phase,
    layer_norm_parameters,
    linear_parameters,
    peak,
    split_sizes,
    training_state_bytes,
    vit_block_activation_floats,
    vit_block_largest_floats,
    vit_block_parameters,
)

# Evaluation batch of `evaluate`.
EVAL_BATCH = 1024
# Bytes per anchor pair of the similarity matrices one layer's loss keeps for backward: about
# 13 float32 A x A matrices (s, s + m, the clamp, a, logits, exp, masked exp, log p, the
# positive terms and backward's gradients) and 5 boolean masks (eye, positives, their
# complements and products).
SIMILARITY_BYTES_PER_PAIR = 13 * FLOAT32 + 5


def cff_parameters(config: CFFConfig, channels: int, side: int, num_classes: int) -> int:
    """Encoder and head: layer 0's embedding Linear(C p^2 -> E) and positions (T E), L blocks
    (`vit_block_parameters`), the head LayerNorm(E) + Linear(E -> K)."""
    tokens = (side // config.patch) ** 2
    embedding = linear_parameters(channels * config.patch**2, config.width) + tokens * config.width
    blocks = config.depth * vit_block_parameters(config.width, config.mlp_ratio)
    head = layer_norm_parameters(config.width) + linear_parameters(config.width, num_classes)
    return embedding + blocks + head


def cff_logged_points(config: CFFConfig) -> int:
    """Per stage-1 epoch: loss, car and grad_norm of each of the L layers, the summed loss and
    positives_per_anchor (3 L + 2), and val_loss of each layer with select_by_validation; per
    head epoch head_loss (+ head_val_loss and head_val_accuracy with select_by_validation).
    Exact unless the loss turns non-finite (stage 1 then stops early)."""
    select = config.select_by_validation
    per_epoch = 3 * config.depth + 2 + (config.depth if select else 0)
    per_head_epoch = 1 + (2 if select else 0)
    return config.epochs * per_epoch + config.head_epochs * per_head_epoch


def cff_estimate(config: CFFConfig) -> ResourceEstimate:
    """Memory: the decoded dataset; parameters, gradients, AdamW's two moments and the best
    encoder's copy; then the larger of a stage-1 step and the test evaluation. A stage-1 step
    of A = 2 B anchors (two views of B images) holds the augmented views, one layer's
    activations (layers train one at a time on detached inputs; layer 0 adds the patches and
    its embedding), backward's gradient buffers and the A x A similarity matrices of its loss.
    Validation and the head stage run the same batches without a graph, so they stay below."""
    shape = dataset_shape(config)
    splits = split_sizes(config, shape)
    side, e, t = shape.side, config.width, (shape.side // config.patch) ** 2
    batch = min(config.batch_size, splits.train)
    anchors = 2 * batch
    parameters = cff_parameters(config, shape.channels, side, shape.num_classes)
    block = vit_block_activation_floats(t, e, config.heads, config.mlp_ratio)
    layer0_extra = t * (shape.channels * config.patch**2 + 3 * e)
    model_fields = ("width", "depth", "mlp_ratio")
    act_fields = ("batch_size", "image_size", "patch", "heads", "width")
    data = Term(dataset_bytes(shape), dataset_fields(config))
    state = Term(
        training_state_bytes(parameters, "adamw")
        + (FLOAT32 * parameters if config.select_by_validation else 0),
        model_fields,
    )
    largest = vit_block_largest_floats(t, e, config.heads, config.mlp_ratio)
    train = [
        data,
        state,
        Term(augmented_batch_bytes(config, shape, anchors), ("batch_size", "image_size")),
        Term(FLOAT32 * anchors * (block + t * e + layer0_extra), act_fields),
        Term(FLOAT32 * 2 * anchors * largest, act_fields),
        Term(SIMILARITY_BYTES_PER_PAIR * anchors**2, ("batch_size",)),
    ]
    eval_batch = min(EVAL_BATCH, splits.test)
    evaluation = [
        data,
        state,
        Term(FLOAT32 * 3 * eval_batch * shape.image_elements, ("image_size",)),
        Term(
            FLOAT32 * eval_batch * (block + t * e + layer0_extra),
            ("image_size", "patch", "heads", "width"),
        ),
    ]
    memory, fields = peak([decode_phase(config, shape), train, evaluation])
    return ResourceEstimate(
        memory,
        fields,
        cff_logged_points(config),
        ("epochs", "depth", "head_epochs", "select_by_validation"),
    )

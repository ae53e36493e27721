"""The `feedback` trainer's resource estimate: pure arithmetic on a FeedbackConfig (no model, no
data, no allocation), counting what `trainer.fit` allocates (trainers/estimates.py explains the
phases and terms)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainers.base import ResourceEstimate
from trainers.estimates import (
    AUGMENT_COPIES,
    FLOAT32,
    FLOAT64,
    INT64,
    Term,
    augmented_batch_bytes,
    dataset_bytes,
    dataset_fields,
    dataset_shape,
    decode_phase,
    layer_norm_parameters,
    linear_parameters,
    optimizer_state_per_parameter,
    peak,
    split_sizes,
    vit_block_activation_floats,
    vit_block_largest_floats,
    vit_block_parameters,
)
from trainers.feedback.config import FeedbackConfig

# Batch of `test_accuracy`.
TEST_BATCH = 1024
# Floats one sample keeps per MLP block: LayerNorm, fc1, activation and fc2 outputs and the new
# state h + f(h).
MLP_BLOCK_FLOATS = 5
# n x m float32 matrices alive while the teacher labels n inputs (u, gain u, tanh, the two
# weighted terms of phi).
TEACHER_COPIES = 4


@dataclass(frozen=True)
class TaskShape:
    """What a config's task feeds the model: input shape, classes, samples per split."""

    input_shape: tuple[int, ...]
    num_classes: int
    n_train: int
    n_test: int


def task_shape(config: FeedbackConfig) -> TaskShape:
    if config.arch == "studentnet":
        return TaskShape(
            (config.student_input_dim,),
            config.teacher_classes,
            config.student_train_size,
            config.student_test_size,
        )
    shape = dataset_shape(config)
    splits = split_sizes(config, shape)
    return TaskShape(
        (shape.channels, shape.side, shape.side), shape.num_classes, splits.train, splits.test
    )


def tokens_per_sample(config: FeedbackConfig, input_shape: tuple[int, ...]) -> int:
    """ViT-Mini: the CLS token and (S / p)^2 patches; ResMLP and StudentNet: one state."""
    if config.arch != "vit_mini":
        return 1
    return 1 + (input_shape[-1] // config.patch) ** 2


def embedding_parameters(config: FeedbackConfig, input_shape: tuple[int, ...]) -> int:
    """ResMLP/StudentNet: Linear(prod(input) -> d). ViT-Mini: Linear(C p^2 -> d), the CLS token
    (d) and positions ((T + 1) d)."""
    d = config.width
    if config.arch != "vit_mini":
        return linear_parameters(math.prod(input_shape), d)
    patch_dim = input_shape[0] * config.patch**2
    return linear_parameters(patch_dim, d) + d + tokens_per_sample(config, input_shape) * d


def branch_parameters(config: FeedbackConfig) -> tuple[int, int]:
    """One residual branch: (all its parameters, those the frozen-block baseline freezes, i.e.
    all but its LayerNorms). MLP: LayerNorm (2 d), fc1 and fc2 (d^2 + d each). ViT-Mini: cff's
    Block (`vit_block_parameters`), two LayerNorms (4 d)."""
    d = config.width
    if config.arch == "vit_mini":
        total = vit_block_parameters(d, config.mlp_ratio)
        return total, total - 2 * layer_norm_parameters(d)
    weights = 2 * linear_parameters(d, d)
    return layer_norm_parameters(d) + weights, weights


def feedback_parameters(
    config: FeedbackConfig, input_shape: tuple[int, ...], num_classes: int
) -> int:
    """Embedding, L branches, the terminal LayerNorm (2 d; none for StudentNet) and the head
    Linear(d -> C)."""
    d = config.width
    out_norm = 0 if config.arch == "studentnet" else layer_norm_parameters(d)
    return (
        embedding_parameters(config, input_shape)
        + config.depth * branch_parameters(config)[0]
        + out_norm
        + linear_parameters(d, num_classes)
    )


def trainable_parameters(
    config: FeedbackConfig, input_shape: tuple[int, ...], num_classes: int
) -> int:
    """All parameters but the frozen branch weights (frozen_blocks) and the embedding
    (embed_credit none)."""
    frozen = config.depth * branch_parameters(config)[1] if config.frozen_blocks else 0
    if config.embed_credit == "none":
        frozen += embedding_parameters(config, input_shape)
    return feedback_parameters(config, input_shape, num_classes) - frozen


def feedback_matrix_floats(config: FeedbackConfig, num_classes: int) -> int:
    """DFA: L + 1 matrices C x d; FA: B_top (C x d) and L matrices d x d; BP (and the
    frozen-block baseline, trained by BP): none."""
    d, c, depth = config.width, num_classes, config.depth
    method = "bp" if config.frozen_blocks else config.method
    if method == "dfa":
        return (depth + 1) * c * d
    if method == "fa":
        return c * d + depth * d * d
    return 0


def forward_floats(
    config: FeedbackConfig, input_shape: tuple[int, ...], num_classes: int
) -> tuple[int, int]:
    """Per sample, one forward pass with its graph: (floats kept for backward, the largest
    single activation). ResMLP/StudentNet: the embedding (d) and MLP_BLOCK_FLOATS d per block;
    ViT-Mini: the patches (C S^2), the embedding's projection, CLS concatenation and positions
    (3 T d) and `vit_block_activation_floats` per block; then the terminal norm and logits."""
    d, depth = config.width, config.depth
    if config.arch != "vit_mini":
        kept = d + depth * MLP_BLOCK_FLOATS * d + d + num_classes
        return kept, max(d, math.prod(input_shape))
    t = tokens_per_sample(config, input_shape)
    block = vit_block_activation_floats(t, d, config.heads, config.mlp_ratio)
    kept = math.prod(input_shape) + 3 * t * d + depth * block + d + num_classes
    return kept, vit_block_largest_floats(t, d, config.heads, config.mlp_ratio)


def credit_floats(config: FeedbackConfig, tokens: int, method: str) -> int:
    """Per sample, the credits a_0..a_L: BP's are per token (L + 1) T d; FA/DFA's per sample
    (L + 1) d, spread to every token as a view, or into a zero T x d copy for CLS-only credit."""
    per_state = config.width * (
        tokens if method == "bp" or (tokens > 1 and config.vit_credit_tokens == "cls") else 1
    )
    return (config.depth + 1) * per_state


def feedback_logged_points(config: FeedbackConfig) -> int:
    """Each audit logs residual_growth_max, ref_grad_norm, deep_cos, aggregate_cos, h_norm and
    ref_grad_norm of the L + 1 states and one cosine per pair (L + 1 with output pairing, L
    with input pairing): S = 4 + 2 (L + 1) + pairs. Epoch 0 logs S + test_accuracy; every
    epoch S + loss, local_loss, penalty_loss, train_accuracy and test_accuracy. Exact unless
    the loss turns non-finite (the run then stops)."""
    depth = config.depth
    pairs = depth + 1 if config.cosine_pairing == "output" else depth
    snapshot = 4 + 2 * (depth + 1) + pairs
    return (snapshot + 1) + config.epochs * (snapshot + 5)


def feedback_estimate(config: FeedbackConfig) -> ResourceEstimate:
    """Memory: the data (the decoded image dataset, or StudentNet's test set and a training
    set drawn per epoch, with the teacher's labelling copies while it is drawn), parameters,
    gradients and optimiser buffers of the trained ones, the feedback matrices and the fixed
    evaluation batch; then the largest of a training step (BP builds the full graph for its
    credits besides the local one: two forward passes), the audit on the evaluation batch
    (a forward graph, the reference gradients and credits of every state, float64 cosines)
    and the test pass (all L + 1 states of TEST_BATCH samples and one block's activations)."""
    task = task_shape(config)
    shape_in, classes = task.input_shape, task.num_classes
    method = "bp" if config.frozen_blocks else config.method
    d, depth = config.width, config.depth
    tokens = tokens_per_sample(config, shape_in)
    sample = math.prod(shape_in)
    batch = min(config.batch_size, task.n_train)
    eval_n = min(config.eval_batch_size, task.n_test)
    test_n = min(TEST_BATCH, task.n_test)
    kept, largest = forward_floats(config, shape_in, classes)
    credits = credit_floats(config, tokens, method)
    total = feedback_parameters(config, shape_in, classes)
    trainable = trainable_parameters(config, shape_in, classes)
    model_fields = ("width", "depth") + (("mlp_ratio",) if tokens > 1 else ())
    state = Term(
        FLOAT32
        * (
            total
            + trainable * (1 + optimizer_state_per_parameter(config.optimizer))
            + feedback_matrix_floats(config, classes)
        ),
        model_fields,
    )
    eval_batch = Term(FLOAT32 * eval_n * sample, ("eval_batch_size",))
    studentnet = config.arch == "studentnet"
    if studentnet:
        m = config.teacher_width
        data = Term(
            (FLOAT32 * sample + INT64) * task.n_test, ("student_test_size", "student_input_dim")
        )
        train_set = Term(
            (FLOAT32 * sample + 2 * INT64) * task.n_train,
            ("student_train_size", "student_input_dim"),
        )
        batch_data = Term((FLOAT32 * sample + INT64) * batch, ("batch_size",))
        labelling = Term(
            FLOAT32 * max(task.n_train, task.n_test) * (TEACHER_COPIES * m + classes),
            ("student_train_size", "teacher_width"),
        )
        setup = [[data, train_set, labelling]]
    else:
        shape = dataset_shape(config)
        data = Term(dataset_bytes(shape), dataset_fields(config))
        train_set = Term(0, ())
        copies = AUGMENT_COPIES if config.augment_strength > 0 else 2
        batch_data = Term(
            augmented_batch_bytes(config, shape, batch)
            if copies > 2
            else FLOAT32 * copies * batch * sample,
            ("batch_size", "image_size"),
        )
        setup = [decode_phase(config, shape)]
    act_fields: tuple[str, ...] = ("batch_size", "width", "depth")
    if tokens > 1:
        act_fields += ("image_size", "patch", "heads")
    passes = 2 if method == "bp" else 1
    train = [
        data,
        state,
        eval_batch,
        train_set,
        batch_data,
        Term(FLOAT32 * batch * (passes * kept + credits + 2 * largest), act_fields),
    ]
    audit_fields = ("eval_batch_size",) + act_fields[1:]
    audit = [
        data,
        state,
        eval_batch,
        train_set if studentnet and not config.student_online else Term(0, ()),
        Term(
            FLOAT32 * eval_n * (kept + (depth + 1) * tokens * d + credits + 2 * largest)
            + FLOAT64 * 3 * eval_n * d,
            audit_fields,
        ),
    ]
    block = (
        vit_block_activation_floats(tokens, d, config.heads, config.mlp_ratio)
        if tokens > 1
        else MLP_BLOCK_FLOATS * d
    )
    test = [
        data,
        state,
        eval_batch,
        Term(
            FLOAT32 * test_n * (2 * sample + (depth + 1) * tokens * d + block),
            ("width", "depth", "image_size"),
        ),
    ]
    memory, fields = peak([*setup, train, audit, test])
    return ResourceEstimate(
        memory, fields, feedback_logged_points(config), ("epochs", "depth", "cosine_pairing")
    )

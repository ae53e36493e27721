"""The `ssl` trainer's resource estimate: pure arithmetic on the config (no model, no data)."""

from __future__ import annotations

from trainers.base import ResourceEstimate
from trainers.estimates import (
    FLOAT32,
    FLOAT64,
    INT64,
    Term,
    dataset_bytes,
    dataset_fields,
    dataset_shape,
    decode_phase,
    linear_parameters,
    peak,
    split_sizes,
    training_state_bytes,
)
from trainers.ssl.config import SSLConfig
from trainers.ssl.evaluate import EMBED_BATCH, MAX_CLASSES_LOGGED
from trainers.ssl.model import BACKBONES

# Float copies of a batch alive while `simclr_augment` makes a view (input, crop, jitter
# candidates and their `where`) and held during a step (the batch and its two views).
VIEW_COPIES = 6 + 3
# Activations of the widest layer alive at once in a forward pass without a graph (a block's
# input, its two convolutions' and norms' outputs).
NO_GRAD_LAYERS = 5
# Rows of queries scikit-learn's kNN compares with the bank at once (its pairwise-distance
# chunks; counted against the whole bank, an upper bound).
SKLEARN_KNN_CHUNK = 256


def conv_output_side(side: int, stride: int) -> int:
    """A 3 x 3 (or 1 x 1) convolution with padding 1 (0) and stride s: ceil(S / s)."""
    return -(-side // stride)


def resnet_parameters(backbone: str, channels: int) -> int:
    """The CIFAR ResNet: 3 x 3 stem conv (9 C w0) and BatchNorm (2 w0); each BasicBlock
    cin -> cout two 3 x 3 convs (9 cin cout + 9 cout^2) and BatchNorms (4 cout), and where it
    changes width or stride a 1 x 1 shortcut conv and BatchNorm (cin cout + 2 cout)."""
    widths, blocks = BACKBONES[backbone]
    total = 9 * channels * widths[0] + 2 * widths[0]
    cin = widths[0]
    for stage, (cout, count) in enumerate(zip(widths, blocks, strict=True)):
        for index in range(count):
            stride = 2 if stage > 0 and index == 0 else 1
            total += 9 * cin * cout + 9 * cout * cout + 4 * cout
            if stride != 1 or cin != cout:
                total += cin * cout + 2 * cout
            cin = cout
    return total


def resnet_activations(backbone: str, side: int) -> tuple[int, int]:
    """Per sample: floats kept for backward (stem conv, BatchNorm and ReLU outputs, 3 w0 S^2;
    each block's conv, BatchNorm, ReLU, conv, BatchNorm, sum and ReLU outputs, 7 cout s^2,
    and the shortcut's conv and BatchNorm, 2 cout s^2, where it has one) and the largest
    single activation (w0 S^2, the stem's)."""
    widths, blocks = BACKBONES[backbone]
    total = 3 * widths[0] * side * side
    largest = widths[0] * side * side
    cin, s = widths[0], side
    for stage, (cout, count) in enumerate(zip(widths, blocks, strict=True)):
        for index in range(count):
            stride = 2 if stage > 0 and index == 0 else 1
            s = conv_output_side(s, stride)
            shortcut = stride != 1 or cin != cout
            total += (9 if shortcut else 7) * cout * s * s
            largest = max(largest, cout * s * s)
            cin = cout
    return total, largest


def head_parameters(config: SSLConfig, features: int) -> int:
    """Projector: SimCLR Linear(F -> p), Linear(p -> p); SimSiam/BYOL three Linear layers
    with BatchNorm after each (2 p each). Predictor (SimSiam/BYOL): Linear(p -> q),
    BatchNorm(q), Linear(q -> p)."""
    p, q = config.resolved("proj_dim"), config.pred_hidden
    if config.method == "simclr":
        return linear_parameters(features, p) + linear_parameters(p, p)
    projector = linear_parameters(features, p) + 2 * linear_parameters(p, p) + 3 * 2 * p
    predictor = linear_parameters(p, q) + 2 * q + linear_parameters(q, p)
    return projector + predictor


def head_activation_floats(config: SSLConfig) -> int:
    """Per sample and view: SimCLR projector Linear, ReLU, Linear outputs and the normalised
    embedding (4 p); SimSiam/BYOL projector Linear, BatchNorm (x 3) and ReLU (x 2) outputs
    (8 p), predictor Linear, BatchNorm, ReLU (3 q) and output and its normalisation (2 p)."""
    p, q = config.resolved("proj_dim"), config.pred_hidden
    if config.method == "simclr":
        return 4 * p
    return 10 * p + 3 * q


def ssl_parameters(config: SSLConfig, channels: int) -> int:
    """Backbone, projector and (SimSiam/BYOL) predictor."""
    features = BACKBONES[config.backbone][0][-1]
    return resnet_parameters(config.backbone, channels) + head_parameters(config, features)


def knn_eval_bytes(bank: int, queries: int, k: int, classes: int) -> int:
    """`knn_accuracy`'s working set per chunk of q queries: similarities (q x N), top-k values
    and indices, gathered labels and weights (q x k) and votes (q x C)."""
    q = min(EMBED_BATCH, queries)
    k = min(k, bank)
    return FLOAT32 * q * bank + (2 * FLOAT32 + 2 * INT64) * q * k + FLOAT32 * q * classes


def ssl_logged_points(config: SSLConfig) -> int:
    """Per epoch loss and lr; per evaluated epoch (every eval_every-th and the last:
    ceil(epochs / eval_every)) norm_mean, three norm quantiles, knn_accuracy and norm_class{c}
    of each in-distribution class (at most MAX_CLASSES_LOGGED). An upper bound: a class
    without training images logs no norm, a non-finite loss ends the run."""
    classes = dataset_shape(config).num_classes - config.held_out_classes
    logged_classes = max(0, min(classes, MAX_CLASSES_LOGGED))
    evaluated = -(-config.epochs // config.eval_every)
    return 2 * config.epochs + evaluated * (5 + logged_classes)


def ssl_estimate(config: SSLConfig) -> ResourceEstimate:
    """Memory: the decoded dataset; parameters, gradients, optimiser buffers (SGD momentum 1,
    Adam 2 per parameter) and BYOL's target network; then the largest of a training step and
    an evaluation. A step of B images keeps the batch, its two views and the augmentation's
    copies, both views' backbone and head activations (`resnet_activations`), backward's
    gradient buffers (twice the largest activation) and the loss's B x B matrices. An
    evaluation embeds the training set twice (norms and the kNN bank) and the test set, each
    doubled while its batches are joined, runs a forward pass of EMBED_BATCH images without a
    graph, the kNN chunks and scikit-learn's float64 copies for kNN accuracy by norm."""
    shape = dataset_shape(config)
    splits = split_sizes(config, shape)
    side, channels = shape.side, shape.channels
    n_train, n_test = splits.train, splits.test
    batch = min(config.batch_size, n_train)
    parameters = ssl_parameters(config, channels)
    features = BACKBONES[config.backbone][0][-1]
    dim = config.resolved("proj_dim")
    kept, largest = resnet_activations(config.backbone, side)
    data = Term(dataset_bytes(shape), dataset_fields(config))
    state = Term(
        training_state_bytes(parameters, config.optimizer)
        + (FLOAT32 * parameters if config.method == "byol" else 0),
        ("backbone", "proj_dim", "pred_hidden"),
    )
    act_fields = ("batch_size", "backbone", "image_size")
    image = shape.image_elements
    train = [
        data,
        state,
        Term(FLOAT32 * VIEW_COPIES * batch * image, ("batch_size", "image_size")),
        Term(FLOAT32 * 2 * batch * (kept + head_activation_floats(config)), act_fields),
        Term(FLOAT32 * 2 * 2 * batch * largest, act_fields),
        Term(FLOAT32 * 5 * batch * batch, ("batch_size",)),
    ]
    eval_batch = min(EMBED_BATCH, max(n_train, n_test))
    evaluation = [
        data,
        state,
        Term(
            FLOAT32 * 2 * (2 * n_train + n_test) * (features + dim),
            ("dataset", "train_size", "backbone", "proj_dim"),
        ),
        Term(
            FLOAT32 * eval_batch * (VIEW_COPIES * image + NO_GRAD_LAYERS * largest),
            ("backbone", "image_size"),
        ),
        Term(
            knn_eval_bytes(n_train, n_test, config.knn_k, shape.num_classes),
            ("dataset", "train_size"),
        ),
        Term(
            FLOAT64 * (3 * n_train * dim + SKLEARN_KNN_CHUNK * n_train),
            ("dataset", "train_size", "proj_dim"),
        ),
    ]
    memory, fields = peak([decode_phase(config, shape), train, evaluation])
    return ResourceEstimate(
        memory,
        fields,
        ssl_logged_points(config),
        ("epochs", "eval_every", "dataset", "held_out_classes"),
    )

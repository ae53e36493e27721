"""The `feedback` trainer's Config: method, architecture, task and the protocol's thresholds."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from api_schemas import MAX_SEED
from trainers.data import AUGMENT_STRENGTH, DEVICE, VAL_FRACTION, DataConfig

# Residual blocks at most; per-layer metric names go up to h_MAX_DEPTH (MAX_DEPTH + 1 states).
MAX_DEPTH = 16

Method = Literal["bp", "fa", "dfa"]
Arch = Literal["resmlp", "vit_mini", "studentnet"]


class FeedbackConfig(DataConfig):
    method: Method = Field(
        "bp",
        description=(
            "Credit rule of the residual blocks and the embedding: bp (a_l = dCE/dh_l), fa (a_l = "
            "B_l a_{l+1}, d x d random B_l) or dfa (a_l = e_T B_l, C x d random B_l). Ignored when "
            "frozen_blocks is true (the baseline trains by BP)"
        ),
    )
    arch: Arch = Field(
        "resmlp",
        description=(
            "resmlp: Linear embedding, pre-LN MLP blocks, terminal LayerNorm; vit_mini: patch "
            "embedding + CLS token, pre-LN transformer blocks, terminal LayerNorm; studentnet: the "
            "resmlp blocks without terminal LayerNorm on the synthetic teacher-student task (the "
            "image dataset fields are then ignored)"
        ),
    )
    width: int = Field(256, ge=4, le=4096, description=("Residual stream width d (paper: d = 256)"))
    depth: int = Field(
        4, ge=1, le=MAX_DEPTH, description=("Number of residual blocks L (paper: L = 4)")
    )
    activation: Literal["relu", "gelu", "tanh"] = Field(
        "relu", description=("Block nonlinearity phi (not published; seedgrid default ReLU)")
    )
    branch_init_std: float = Field(
        0.01,
        ge=0.0,
        le=10.0,
        description=(
            "Std of the residual branch's output weights W2 at init (paper: 0.01, a small branch)"
        ),
    )
    embed_credit: Literal["own", "next", "none"] = Field(
        "own",
        description=(
            "How the embedding is trained (not published): own (the credit of h_0 itself; BP's is "
            "exact), next (block 0's credit a_1, the spec's \"presumably a_0\") or none (left at "
            "its random init, as the spec's pseudo-code does; the frozen-block baseline then keeps "
            "it too)"
        ),
    )
    penalty: float = Field(
        0.0,
        ge=0.0,
        le=1e3,
        description=(
            "Scale penalty lambda in l_l = <f_l, a_l> + lambda ||f_l||^2 (paper sweep: 0, 1e-4, "
            "1e-2)"
        ),
    )
    frozen_blocks: bool = Field(
        False,
        description=(
            "Frozen-block baseline: residual blocks (all but their LayerNorms) stay at random "
            "init; embedding, LayerNorms and head are trained by BP for the same epochs"
        ),
    )
    epochs: int = Field(
        100,
        ge=1,
        le=100_000,
        description=(
            "Training epochs, each audited and logged after it ends (epoch 0 is the "
            "initialisation); paper: 100, 30 in the penalty sweep"
        ),
    )
    batch_size: int = Field(
        128,
        ge=2,
        le=65_536,
        description=(
            "Training samples per optimisation step (not published; seedgrid default 128)"
        ),
    )
    optimizer: Literal["adam", "sgd"] = Field(
        "adam",
        description=("Optimizer (not published; seedgrid default Adam lr 1e-3, no weight decay)"),
    )
    lr: float = Field(
        1e-3,
        gt=0.0,
        le=10.0,
        description=(
            "Learning rate of the optimizer, constant (not published; seedgrid default 1e-3)"
        ),
    )
    weight_decay: float = Field(
        0.0,
        ge=0.0,
        le=10.0,
        description=(
            "The optimizer's L2 weight decay on every trained parameter (not published; seedgrid "
            "default 0)"
        ),
    )
    fa_top_credit: Literal["through_norm", "direct"] = Field(
        "through_norm",
        description=(
            "FA: the top credit a_L is e_T B_top passed back through the terminal LayerNorm's "
            "Jacobian (through_norm: the head's weight replaced by B_top, Lillicrap style) or "
            "e_T B_top itself (direct)"
        ),
    )
    fa_skip: bool = Field(False, description=("FA: add the skip path, a_l = a_{l+1} + B_l a_{l+1}"))
    store_feedback_matrices: bool = Field(
        True,
        description=(
            "Store the feedback matrices (float32, base64) in the run's diagnostics; their SHA-256 "
            "is stored either way (they are redrawn from the seed's init generator)"
        ),
    )
    vit_credit_tokens: Literal["all", "cls"] = Field(
        "all",
        description=(
            "ViT-Mini: which tokens receive the per-sample FA/DFA credit (BP's is per token)"
        ),
    )
    heads: int = Field(
        4, ge=1, le=64, description=("vit_mini: attention heads of each block (must divide width)")
    )
    patch: int = Field(
        4, ge=1, le=64, description=("vit_mini: patch side in pixels (must divide the image side)")
    )
    mlp_ratio: int = Field(
        2, ge=1, le=16, description=("vit_mini: the blocks' MLP hidden width is mlp_ratio * width")
    )
    eval_batch_size: int = Field(
        256,
        ge=2,
        le=65_536,
        description=(
            "Protocol diagnostics: a fixed evaluation batch (the first eval_batch_size test "
            "samples, the same for every seed and epoch)"
        ),
    )
    ce_reduction: Literal["mean", "sum"] = Field(
        "mean", description=("Protocol diagnostics: CE reduction of the BP reference gradient")
    )
    cosine_pairing: Literal["output", "input"] = Field(
        "output",
        description=(
            "Per-layer cosine pairing: h_l with the credit of the module that produces it "
            "(output: BP gives 1 everywhere) or block l's credit with g at its input h_l (input)"
        ),
    )
    scale_growth_threshold: float = Field(
        50.0, gt=0.0, description=("Check D1 fails if rho > scale_growth_threshold")
    )
    ref_grad_floor: float = Field(
        1e-7,
        gt=0.0,
        description=("Check D2 fails if ||g_L|| < ref_grad_floor (10 x the cosine eps 1e-8)"),
    )
    depth_utility_margin_pp: float = Field(
        2.0,
        ge=-100.0,
        le=100.0,
        description=("Check D3 fails if acc - acc_frozen < depth_utility_margin_pp"),
    )
    # studentnet: the teacher and the test set come from teacher_seed (fixed across runs, like
    # a dataset), the training inputs from the run's data generator.
    student_input_dim: int = Field(
        32, ge=1, le=65_536, description=("studentnet: input dimension of the teacher z")
    )
    teacher_width: int = Field(128, ge=1, le=65_536, description="studentnet: teacher width")
    teacher_classes: int = Field(
        10, ge=2, le=1000, description=("studentnet: labels are the argmax over teacher_classes")
    )
    teacher_depth: int = Field(
        1, ge=1, le=64, description=("studentnet: a teacher of teacher_depth layers z -> phi(z A)")
    )
    teacher_gain: float = Field(
        1.0,
        gt=0.0,
        le=100.0,
        description=("studentnet: gain in phi(u) = (1 - alpha) u + alpha tanh(gain u)"),
    )
    teacher_alpha: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description=("studentnet: alpha in phi(u) = (1 - alpha) u + alpha tanh(gain u)"),
    )
    student_train_size: int = Field(
        10_000,
        ge=2,
        le=10_000_000,
        description=(
            "studentnet: training inputs, fresh every epoch (student_online) or one fixed set"
        ),
    )
    student_test_size: int = Field(
        2_000, ge=2, le=1_000_000, description=("studentnet: test inputs (from teacher_seed)")
    )
    student_online: bool = Field(
        True,
        description=(
            "studentnet: student_train_size fresh training inputs every epoch; false: one fixed set"
        ),
    )
    teacher_seed: int = Field(
        0,
        ge=0,
        le=MAX_SEED,
        description=(
            "studentnet: the teacher and the test set come from it (fixed across runs, like a "
            "dataset)"
        ),
    )
    # No validation split and no augmentation (the spec's recommendation).
    val_fraction: float = Field(0.0, ge=0.0, lt=1.0, description=VAL_FRACTION)
    augment_strength: float = Field(0.0, ge=0.0, le=1.0, description=AUGMENT_STRENGTH)
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description=DEVICE)

    @model_validator(mode="after")
    def _check(self) -> FeedbackConfig:
        if self.arch == "vit_mini":
            if self.width % self.heads:
                raise ValueError(f"width ({self.width}) must be divisible by heads ({self.heads})")
            side = self.resolved_image_size
            if side % self.patch:
                raise ValueError(f"image side {side} must be divisible by patch ({self.patch})")
        return self

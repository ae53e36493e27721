"""Credit rules (spec section 2.2), as pure functions.

Every method trains block l with the local loss of trainers.losses.local_credit,
l_l = <f_l(h_l), a_{l+1}> + lambda ||f_l(h_l)||^2 on a detached input h_l, and the embedding with
<embed(x), a_0>; the head and the terminal norm get their true CE gradient. Credits are indexed
by hidden state (a_l for h_l, l = 0..L) and are per-sample quantities (the gradient of the
sample's own CE), so that the batch-mean local loss makes BP's parameter gradients exactly those
of the batch-mean CE.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from trainers.feedback.models import ResidualNet, StackedNet

# The B initialisation is not published: TinyDFA's U[-1, 1) with the projection divided by
# sqrt(feedback_dim) (normalization=True), feedback_dim = d.
B_DISTRIBUTION = "uniform(-1, 1) / sqrt(width)"


@dataclass
class FeedbackMatrices:
    """The fixed random matrices of one run, drawn once from its `init` generator.

    dfa: `layers[l]` is B_l (C x d) for h_l, l = 0..L; a_l = e_T B_l.
    fa: `top` is B_top (C x d) and `layers[l]` is B_l (d x d), l = 0..L-1; a_l = B_l a_{l+1}.
    """

    method: str
    layers: list[torch.Tensor]
    top: torch.Tensor | None = None

    def named(self) -> list[tuple[str, torch.Tensor]]:
        prefix = "B_h" if self.method == "dfa" else "B_"
        named = [(f"{prefix}{i}", b) for i, b in enumerate(self.layers)]
        return ([("B_top", self.top)] if self.top is not None else []) + named

    def to(self, device: torch.device) -> FeedbackMatrices:
        return FeedbackMatrices(
            self.method,
            [b.to(device) for b in self.layers],
            None if self.top is None else self.top.to(device),
        )


def draw_feedback(
    method: str, depth: int, width: int, num_classes: int, generator: torch.Generator
) -> FeedbackMatrices | None:
    """B matrices for fa or dfa (None for bp), U[-1, 1) / sqrt(d) entries."""

    def uniform(rows: int) -> torch.Tensor:
        return (torch.rand(rows, width, generator=generator) * 2 - 1) / width**0.5

    if method == "dfa":
        return FeedbackMatrices("dfa", [uniform(num_classes) for _ in range(depth + 1)])
    if method == "fa":
        top = uniform(num_classes)
        return FeedbackMatrices("fa", [uniform(width) for _ in range(depth)], top)
    return None


def encode_feedback(matrices: FeedbackMatrices, *, include_data: bool) -> dict[str, Any]:
    """The matrices as stored with the run: names, shapes, SHA-256 of their float32
    little-endian bytes (in order) and, with `include_data`, those bytes in base64."""
    named = matrices.named()
    raw = [b.detach().cpu().to(torch.float32).numpy().astype("<f4").tobytes() for _, b in named]
    digest = hashlib.sha256(b"".join(raw)).hexdigest()
    stored: dict[str, Any] = {
        "method": matrices.method,
        "distribution": B_DISTRIBUTION,
        "dtype": "float32",
        "byte_order": "little",
        "names": [name for name, _ in named],
        "shapes": [list(b.shape) for _, b in named],
        "sha256": digest,
    }
    if include_data:
        stored["data"] = [base64.b64encode(r).decode("ascii") for r in raw]
    return stored


def decode_feedback(stored: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The matrices back from a run's stored diagnostics, by name; checks the SHA-256."""
    if "data" not in stored:
        raise ValueError(
            "the run stored only the feedback matrices' SHA-256 (store_feedback_matrices was false)"
        )
    raw = [base64.b64decode(d) for d in stored["data"]]
    if hashlib.sha256(b"".join(raw)).hexdigest() != stored["sha256"]:
        raise ValueError("stored feedback matrices do not match their SHA-256")
    return {
        name: torch.from_numpy(np.frombuffer(r, dtype="<f4").reshape(shape).copy())
        for name, shape, r in zip(stored["names"], stored["shapes"], raw, strict=True)
    }


def output_error(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """e_T = softmax(logits) - onehot(y): each sample's dCE_i/dlogits_i (detached)."""
    return (logits.softmax(-1) - F.one_hot(labels, logits.shape[-1]).to(logits.dtype)).detach()


def bp_credits(
    states: list[torch.Tensor], logits: torch.Tensor, labels: torch.Tensor
) -> list[torch.Tensor]:
    """BP: a_l = g_l = dCE_i/dh_l for every state of one autograd graph (per sample, so the
    gradient of the summed CE; per token for ViT). Leading axes before the classes (a seed
    axis) are flattened: each seed's credits are then those of its own CE."""
    loss = F.cross_entropy(logits.flatten(0, -2), labels.flatten(), reduction="sum")
    return [g.detach() for g in torch.autograd.grad(loss, states, retain_graph=True)]


def dfa_credits(error: torch.Tensor, matrices: FeedbackMatrices) -> list[torch.Tensor]:
    """DFA: a_l = e_T B_l (B x C @ C x d) for l = 0..L."""
    return [error @ b for b in matrices.layers]


def fa_credits(top: torch.Tensor, matrices: FeedbackMatrices, *, skip: bool) -> list[torch.Tensor]:
    """FA: a_L = top, a_l = B_l a_{l+1} (+ a_{l+1} with the skip path) for l = L-1..0
    (B_l may carry a leading seed axis)."""
    credits = [top]
    for b in reversed(matrices.layers):
        a = credits[0] @ b.mT
        credits.insert(0, a + credits[0] if skip else a)
    return credits


def fa_top_credit(
    model: ResidualNet | StackedNet,
    last: torch.Tensor,
    normed: torch.Tensor,
    error: torch.Tensor,
    b_top: torch.Tensor,
    mode: str,
) -> torch.Tensor:
    """e_T B_top (direct) or J_norm(h_L)^T e_T B_top (through_norm: the true Jacobian of the
    terminal norm, the head's weight replaced by B_top); `normed` = model.normed(last)."""
    projected = error @ b_top
    if mode == "direct":
        return projected
    (grad,) = torch.autograd.grad(normed, last, grad_outputs=projected, retain_graph=True)
    return model.vector(grad).detach()


def spread(credit: torch.Tensor, like: torch.Tensor, tokens: str) -> torch.Tensor:
    """A credit shaped like the state: per-sample B x d credits go to every token ("all") or to
    the CLS token only ("cls") of B x T x d states; per-token credits pass unchanged. A leading
    seed axis (K x B x d credits of K x B x T x d states) passes through."""
    if credit.shape == like.shape:
        return credit
    if tokens == "all":
        return credit.unsqueeze(-2).expand_as(like)
    out = torch.zeros_like(like)
    out[..., 0, :] = credit
    return out

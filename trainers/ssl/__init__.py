"""`ssl`: embedding norms in SimCLR, SimSiam and BYOL, with Cut-initialisation and GradScale
(paper 001, Draganov et al., ICML 2025, arXiv:2502.09252).

Specification: docs/papers/ssl.md. Under a loss that sees z only through
z/||z||, the gradient is orthogonal to z, so plain steps only grow ||z|| and the angular step
shrinks as 1/||z||^2. Cut-initialisation (divide every parameter by c) starts from small norms;
GradScale (multiply the embedding's gradient by ||z||^p) undoes the 1/||z|| of the gradient.
The trainer logs embedding norms (overall, per class, in- vs out-of-distribution) and kNN
accuracy on backbone features; `ssl_sim` (trainers/ssl_sim.py) runs the paper's simulations.
The losses live in trainers/losses/.
"""

from trainers.ssl.config import SSLConfig
from trainers.ssl.estimate import ssl_parameters
from trainers.ssl.evaluate import knn_accuracy, knn_accuracy_by_norm
from trainers.ssl.model import GradScale, SSLModel, cut_init, grad_scale
from trainers.ssl.trainer import SSLTrainer, learning_rate, ssl_loss

__all__ = [
    "GradScale",
    "SSLConfig",
    "SSLModel",
    "SSLTrainer",
    "cut_init",
    "grad_scale",
    "knn_accuracy",
    "knn_accuracy_by_norm",
    "learning_rate",
    "ssl_loss",
    "ssl_parameters",
]

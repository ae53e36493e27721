"""Losses shared by seedgrid's trainers: one loss per module, each a pure function (tensors in,
scalar out) whose docstring gives its equation and its paper, tested against a hand-written
float64 reference."""

"""Losses, one per module, each a pure function with its equation and paper."""

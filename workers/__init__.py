"""The Ray side of seedgrid: the remote task that runs one (condition, seed)."""

from workers.task import execute, run_task

__all__ = ["execute", "run_task"]

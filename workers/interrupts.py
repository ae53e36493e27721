"""Ray cancels a running task (`ray.cancel`, not forced) by interrupting the worker's main
thread (`_thread.interrupt_main`): the cancel arrives as the KeyboardInterrupt of Python's
SIGINT handler. A process that starts with SIGINT ignored gets no such handler from Python,
and then `interrupt_main` does nothing: every process started in the background by a
non-interactive shell (`seedgrid serve &` in a script, `nohup ray start`, a CI job) passes
SIGINT ignored to the raylet and from it to every worker. There a cancel never reached the
trainer, which trained on until the dispatcher's forced cancel, 15 s later."""

from __future__ import annotations

import signal
import threading


def accept_cancels() -> None:
    """Let Ray's cancel interrupt this task: Python's SIGINT handler in this worker process,
    in place of an inherited 'ignore' (or the default action, which would end the process
    instead of raising in the task). Only from the main thread, where Ray runs a task and
    where a handler can be set; elsewhere, and when a handler is set already, nothing."""
    if threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) in (signal.SIG_IGN, signal.SIG_DFL, None):
        signal.signal(signal.SIGINT, signal.default_int_handler)

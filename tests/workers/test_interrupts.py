"""Ray cancels a running task by `_thread.interrupt_main()` in its worker, which Python turns
into a KeyboardInterrupt only where its SIGINT handler is installed. A process started with
SIGINT ignored (in the background by a non-interactive shell: `seedgrid serve &` in a script,
`nohup ray start`, a CI job) passes that on to the raylet's workers, and Python then installs no
handler: the cancel was lost and the trainer trained on until the forced cancel 15 s later
(every e2e cancel test failed in a test run started that way). The task's body runs here as
Ray runs it, in a process that starts with SIGINT ignored."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A MetricBatch every 50 ms; 200 of them after the interrupt (10 s) is a cancel that was lost.
TASK = textwrap.dedent(
    """
    import _thread, signal, sys, threading
    from workers.messages import MetricBatch
    from workers.task import task_messages

    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN, "the test needs SIGINT ignored"
    messages = task_messages(
        "collapse", {"steps": 50_000_000, "n_samples": 64}, [0],
        batch_interval_s=0.05, system_metrics_interval_s=0.05,
    )
    batches_after = None
    try:
        for message in messages:
            if not isinstance(message, MetricBatch):
                continue
            if batches_after is None:
                batches_after = 0
                # what ray.cancel does, from another thread of the worker
                threading.Thread(target=_thread.interrupt_main).start()
            else:
                batches_after += 1
                if batches_after >= 200:
                    print("trained on after the interrupt", flush=True)
                    sys.exit(3)
    except KeyboardInterrupt:
        messages.close()  # as Ray leaves the generator (it ends the trainer thread)
        print(f"cancelled after {batches_after} more batches", flush=True)
        sys.exit(0)
    print("the run ended by itself", flush=True)
    sys.exit(4)
    """
)


def ignoring_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        preexec_fn=ignoring_sigint,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_cancel_reaches_a_task_whose_worker_started_with_sigint_ignored() -> None:
    done = run_python(TASK)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("cancelled after"), done.stdout


def test_a_handler_the_process_set_is_kept() -> None:
    code = textwrap.dedent(
        """
        import signal
        from workers.interrupts import accept_cancels

        def own(signum, frame):
            pass

        signal.signal(signal.SIGINT, own)
        accept_cancels()
        assert signal.getsignal(signal.SIGINT) is own
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        accept_cancels()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        print("ok")
        """
    )
    done = run_python(code)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stdout + done.stderr

"""Process hygiene for units: one math thread per unit, and workers that die with the driver.

* Same bytes for any worker count: a float reduction split over N threads rounds
  differently from one over 1 thread, so an embedding computed in the driver (workers=1)
  with a multi-threaded BLAS/torch differed by one float32 step from the same embedding
  in a single-threaded worker. Every unit therefore runs with one math thread, wherever
  it runs (driver, pool worker, Ray task).
* A worker must not outlive its driver: when the kernel's OOM killer (or ``kill -9``)
  takes the driver, pool workers would otherwise keep running (and keep memory).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator

_THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


@contextlib.contextmanager
def one_math_thread() -> Iterator[None]:
    """Run the body with BLAS/OpenMP/torch limited to one thread, then restore them."""
    from threadpoolctl import threadpool_limits

    saved_env = {var: os.environ.get(var) for var in _THREAD_VARS}
    for var in _THREAD_VARS:
        os.environ[var] = "1"  # read by torch / BLAS if they are first imported inside the body
    torch = sys.modules.get("torch")
    torch_threads = torch.get_num_threads() if torch is not None else None
    if torch is not None and torch_threads != 1:
        torch.set_num_threads(1)
    try:
        with threadpool_limits(limits=1):
            yield
    finally:
        for var, value in saved_env.items():
            if value is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = value
        if torch is not None and torch_threads is not None and torch_threads != 1:
            torch.set_num_threads(torch_threads)


def exit_with_parent(poll_seconds: float = 0.5) -> None:
    """Make this worker process exit as soon as the process that started it is gone."""
    parent = os.getppid()
    if sys.platform.startswith("linux"):
        _linux_parent_death_signal()
    if os.getppid() != parent or parent == 1:
        os._exit(1)

    def watch() -> None:
        import time

        while True:
            time.sleep(poll_seconds)
            if os.getppid() != parent:  # re-parented: the driver died
                os._exit(1)

    threading.Thread(target=watch, name="dataguard-parent-watch", daemon=True).start()


def _linux_parent_death_signal() -> None:
    """Ask the kernel to SIGKILL us when the parent dies (works even if Python is stuck in C)."""
    import ctypes
    import signal

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass  # the polling thread still covers it

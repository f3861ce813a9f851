"""Child processes for test_run_lock.py: runs that race for a model directory's lock, or hold it.

Started with multiprocessing's "spawn" (a fresh interpreter, nothing inherited but the
arguments), so that each is a process of its own as two `kt-train` commands are. They
load run_lock.py on its own: it imports only the standard library, and the package's
`__init__` (Keras, the backend) would cost each child seconds.
"""

import errno
import importlib.util
import os
import time
import warnings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

BARRIER_SECONDS = 120  # a child that waits longer has lost its partner: it fails


def run_lock():
    """keras_transformer/train/run_lock.py, loaded without the package."""
    spec = importlib.util.spec_from_file_location(
        "run_lock", os.path.join(REPO, "keras_transformer", "train", "run_lock.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def without_flock():
    """Makes `fcntl.flock` fail as it does on a network filesystem without it (ENOLCK)."""
    import fcntl

    def flock(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")

    fcntl.flock = flock
    warnings.simplefilter("ignore")  # the fallback's warning, once a round


def race(model_dirs, barrier, results, no_flock=False):
    """For each of `model_dirs`: waits at `barrier` with the other racer, then both take the lock.

    Puts `(round, pid, "won")` or `(round, pid, <the refusal's message>)` in `results`. The
    winner holds the lock until the loser has tried (the second barrier).
    """
    if no_flock:
        without_flock()
    lock = run_lock()
    for round_number, model_dir in enumerate(model_dirs):
        barrier.wait(BARRIER_SECONDS)
        try:
            with lock.exclusive_use(model_dir):
                results.put((round_number, os.getpid(), "won"))
                barrier.wait(BARRIER_SECONDS)
        except lock.ModelDirectoryInUse as error:
            results.put((round_number, os.getpid(), str(error)))
            barrier.wait(BARRIER_SECONDS)


def hold(model_dir, ready, no_flock=False, staging=None, staged_files=None):
    """Takes the lock of `model_dir`, writes `staged_files` ({path in `staging`: text}), sets `ready`, waits to be killed."""
    if no_flock:
        without_flock()
    with run_lock().exclusive_use(model_dir):
        for name, text in (staged_files or {}).items():
            path = os.path.join(staging, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as file:
                file.write(text)
        ready.set()
        time.sleep(600)

"""Ctrl-C in a `kt-*` command: one line on stderr and exit status 130, never a traceback.

Each command's `main` is decorated here. The `KeyboardInterrupt` is caught at the top
only, after it has unwound the work: a training run's `finally` blocks and context
managers (its lock, its staging directory) run as for any other exception, so the run
is left as a kill leaves it, and the same command resumes it
(`keras_transformer.train.run_directory`).

An interrupt cannot be lost: while `main` runs, SIGINT is recorded before it raises
(`keras_transformer.interrupts`), so one that a garbage-collector callback swallowed
(JAX's, loaded with TensorFlow) is raised again by the next long loop that checks, and
a `main` that ends in any other way after an interrupt (it returned, or the interrupt
became another error on its way up) still ends with the line and 130.

This module imports only the standard library and the leaf `interrupts`, like `common`.
"""

import contextlib
import functools
import signal
import subprocess
import sys

from keras_transformer import interrupts

# What a shell reports for a command that Ctrl-C (SIGINT, 2) ended: 128 + the signal.
EXIT_STATUS = 128 + signal.SIGINT

RESUMABLE = "interrupted; run the same command to resume"  # kt-train, kt-demo: the run resumes
INTERRUPTED = "interrupted"  # a command that starts over when run again (translate, export, ...)


def exits_on_interrupt(message=INTERRUPTED):
    """Decorates a command's `main`: a `KeyboardInterrupt` prints `message` and returns 130.

    SIGINT is handled by `interrupts.handle_sigint` while `main` runs, and a recorded
    interrupt returns 130 with `message` however `main` ended.

    Args:
        message: str, the one line written to stderr: `RESUMABLE` for a command whose
            work resumes when run again, else `INTERRUPTED` (the default).
    """

    def decorate(main):
        @functools.wraps(main)
        def interruptible_main(*args, **kwargs):
            with interrupts.sigint_recorded():
                try:
                    status = main(*args, **kwargs)
                except KeyboardInterrupt:
                    return _report(message)
                except BaseException:
                    # sentencepiece, for one, wraps its sentence iterator's KeyboardInterrupt
                    # in a RuntimeError: after Ctrl-C, whatever ended main is the interrupt.
                    if interrupts.interrupted():
                        return _report(message)
                    raise
                # A KeyboardInterrupt swallowed where no loop checked again: the user still asked to stop.
                return _report(message) if interrupts.interrupted() else status

        return interruptible_main

    return decorate


def _report(message):
    with contextlib.suppress(OSError, ValueError):  # a closed or broken stdout
        sys.stdout.flush()  # what the command printed comes first, then the line
    print(message, file=sys.stderr, flush=True)
    return EXIT_STATUS


def call_in_foreground(command, **kwargs):
    """Runs `command` to its end and returns its exit status; Ctrl-C is the child's to report.

    Ctrl-C reaches every process of the terminal's foreground group: this one ignores it
    while the child runs (with a handler, not SIG_IGN, which the child would inherit), so
    the child's line is the only one and its status, 130, is the command's. `subprocess.call`
    would instead kill the child a quarter of a second after the interrupt, whatever it was
    writing. `kwargs` go to `subprocess.call`.
    """
    previous = signal.signal(signal.SIGINT, lambda signum, frame: None)
    try:
        return subprocess.call(command, **kwargs)
    finally:
        signal.signal(signal.SIGINT, previous)


__all__ = ["EXIT_STATUS", "RESUMABLE", "INTERRUPTED", "exits_on_interrupt", "call_in_foreground"]

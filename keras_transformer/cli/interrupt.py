"""Ctrl-C in a `kt-*` command: one line on stderr and exit status 130, never a traceback.

Each command's `main` is decorated here. The `KeyboardInterrupt` is caught at the top
only, after it has unwound the work: a training run's `finally` blocks and context
managers (its lock, its staging directory) run as for any other exception, so the run
is left as a kill leaves it, and the same command resumes it
(`keras_transformer.train.run_directory`).

This module imports only the standard library, like `common`.
"""

import contextlib
import functools
import signal
import subprocess
import sys

# What a shell reports for a command that Ctrl-C (SIGINT, 2) ended: 128 + the signal.
EXIT_STATUS = 128 + signal.SIGINT

RESUMABLE = "interrupted; run the same command to resume"  # kt-train, kt-demo: the run resumes
INTERRUPTED = "interrupted"  # a command that starts over when run again (translate, export, ...)


def exits_on_interrupt(message=INTERRUPTED):
    """Decorates a command's `main`: a `KeyboardInterrupt` prints `message` and returns 130.

    Args:
        message: str, the one line written to stderr: `RESUMABLE` for a command whose
            work resumes when run again, else `INTERRUPTED` (the default).
    """

    def decorate(main):
        @functools.wraps(main)
        def interruptible_main(*args, **kwargs):
            try:
                return main(*args, **kwargs)
            except KeyboardInterrupt:
                with contextlib.suppress(OSError, ValueError):  # a closed or broken stdout
                    sys.stdout.flush()  # what the command printed comes first, then the line
                print(message, file=sys.stderr, flush=True)
                return EXIT_STATUS

        return interruptible_main

    return decorate


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

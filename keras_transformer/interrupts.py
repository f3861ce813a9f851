"""Ctrl-C that cannot be lost: SIGINT is recorded, and long loops raise it again.

Python runs a signal handler in the main thread between two bytecodes of whatever
Python code runs there, and that may be a garbage-collector callback. JAX registers one
(`_xla_gc_callback`), and TensorFlow's import loads JAX where it is installed; an
exception raised inside a gc callback is printed as "Exception ignored in: ..." and
dropped, so Python's own handler, which only raises `KeyboardInterrupt`, loses the
interrupt whenever the signal lands there (9 presses of 10 while a corpus was being
binarized).

`handle_sigint` (installed by `cli.interrupt.exits_on_interrupt` for every command)
records the interrupt before it raises. Long loops call `raise_if_interrupted()`
(binarizing, once a chunk; reading a corpus, every few thousand pairs; verifying a
binarized copy, once a block), which raises it again if it was swallowed, and a command
whose `main` ends in any way after an interrupt ends as an interrupted one.

A leaf module: the standard library only, so that `data/` and `cli/` both import it.
"""

import contextlib
import signal
import sys
import threading

_interrupted = threading.Event()  # set by the handler; read by the loops' checks
_depth = []  # one entry per `sigint_recorded` block open


def handle_sigint(signum=signal.SIGINT, frame=None):
    """The SIGINT handler: records the interrupt, then raises `KeyboardInterrupt` as Python's does."""
    _interrupted.set()
    raise KeyboardInterrupt


def interrupted():
    """Whether SIGINT arrived since the handler was installed (or `clear()` was called)."""
    return _interrupted.is_set()


def clear():
    """Forgets a recorded interrupt (a command starting, or a test)."""
    _interrupted.clear()


def raise_if_interrupted():
    """Raises `KeyboardInterrupt` if an interrupt was recorded: cheap enough for any loop.

    Once interrupted, every later check raises too: the work stops at the first loop
    that checks, whatever caught the first `KeyboardInterrupt`.
    """
    if _interrupted.is_set():
        raise KeyboardInterrupt


def checked(iterable, every=4096):
    """`iterable`'s items, with `raise_if_interrupted()` before the first and every `every` items."""
    for count, item in enumerate(iterable):
        if count % every == 0:
            raise_if_interrupted()
        yield item


def _quiet_unraisable(previous):
    """A `sys.unraisablehook` that drops a `KeyboardInterrupt` the handler recorded (raised again later)."""

    def hook(unraisable):
        if issubclass(unraisable.exc_type, KeyboardInterrupt) and _interrupted.is_set():
            return  # swallowed inside a gc callback or a __del__: the next check raises it again
        previous(unraisable)

    return hook


@contextlib.contextmanager
def sigint_recorded():
    """Installs `handle_sigint` for the block (main thread only), with a clear record, and restores what was there.

    SIGINT left ignored by the parent (`nohup`, a background job of a script) stays
    ignored, as Python itself leaves it. The interrupt recorded inside stays readable
    through `interrupted()` after the block.
    """
    installed = threading.current_thread() is threading.main_thread() and \
        signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
    previous_hook = sys.unraisablehook
    previous = signal.signal(signal.SIGINT, handle_sigint) if installed else None
    if not _depth:
        clear()  # a command inside another keeps the outer one's record
    _depth.append(True)
    sys.unraisablehook = _quiet_unraisable(previous_hook)
    try:
        yield
    finally:
        _depth.pop()
        sys.unraisablehook = previous_hook
        if installed:  # None: a handler installed outside Python, which Python's default stands for
            signal.signal(signal.SIGINT, signal.default_int_handler if previous is None else previous)


__all__ = ["handle_sigint", "interrupted", "clear", "raise_if_interrupted", "checked", "sigint_recorded"]

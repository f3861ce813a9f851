"""GraphCache: graphs captured, and maybe compiled, once per key of their inputs, with one fallback.

What PyTorch's captured training step, its compiled optimizer update and the captured
decoding step share (`train.torch_step`, `train.torch_optimizer_update`,
`inference.torch_decode_step`): each keeps one graph per key of its inputs
(`input_key`: every input's shape, dtype and device, what a captured graph is
specialised to), counts the calls of a key until it recurs often enough to repay a
capture (`capture_after`) and a compilation (`compile_after`), drops every graph when
the objects the graphs were made for change (`watch`: the variables after `enable_lora`,
a new optimizer or learning-rate schedule) or when told (`reset`), and runs the first
call of each new graph inside one guard.

The guard is the fallback. An optimization never ends a run: a capture that fails
(PyTorch's tracer cannot follow the model's Python, e.g. a branch on a tensor's value)
warns once, naming the exception and the layer it came from when the traceback has
one, and from then on the caller's eager path runs every call: the failure is in the
model's code, so another key would fail the same way, each try costing a trace. A
compilation that fails (no C++ compiler for inductor) warns once and stops compiling;
captured graphs go on running uncompiled. With `strict=True` (`jit_compile=True`, where
the user asked for the compiled step) either failure raises `CaptureError` instead.

No backend import: the callers pass their capture and compile functions.
"""

import collections
import re
import traceback
import warnings

import keras

from keras_transformer import checks


class CaptureError(RuntimeError):
    """A capture or compilation that `jit_compile=True` asked for failed; the message says why."""


class CaptureFallbackWarning(UserWarning):
    """A capture or compilation failed; the run goes on along the eager (or uncompiled) path."""


def input_key(*inputs):
    """What a captured graph is specialised to: every input's shape, dtype and device."""
    return tuple((tuple(leaf.shape), leaf.dtype, leaf.device) for leaf in keras.tree.flatten(inputs))


# Terminal colour codes (PyTorch's messages carry some) and the line Keras puts first in
# an error raised inside a layer's `call`: the layer is named separately, from the traceback.
_ANSI_CODE = re.compile(r"\x1b\[[0-9;]*m")
_KERAS_CALL_LINE = "Exception encountered when calling"


def describe_failure(error):
    """`"Type: first line of the message"`, and the innermost Keras layer the traceback went through.

    Keras' own first line ("Exception encountered when calling ...") and terminal colour
    codes are left out; a first line that ends in a colon is joined by the one it introduces.
    """
    lines = [line.strip() for line in _ANSI_CODE.sub("", str(error)).splitlines()]
    lines = [line for line in lines if line and not line.startswith(_KERAS_CALL_LINE)]
    if len(lines) > 1 and lines[0].endswith(":"):  # a heading ("backend='inductor' raised:"): and what it heads
        lines[0] = f"{lines[0]} {lines[1]}"
    reason = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
    layer = _innermost_layer(error)
    if layer is not None:
        reason += f", in layer {layer.name!r} ({type(layer).__name__})"
    return reason


def _innermost_layer(error):
    """The Keras layer whose method the innermost traceback frame with one ran, or None.

    A layer's own `call` keeps its frame in the traceback Keras filters (only Keras'
    internal frames leave), so the layer named is the user's or ours, not `Layer.__call__`.
    The errors that caused `error` are searched too, innermost first.
    """
    chain = []
    while error is not None and error not in chain:
        chain.append(error)
        error = error.__cause__ or error.__context__
    for link in reversed(chain):
        layer = None
        for frame, _ in traceback.walk_tb(link.__traceback__):
            candidate = frame.f_locals.get("self")
            if isinstance(candidate, keras.Layer) and not isinstance(candidate, keras.Model):
                layer = candidate
        if layer is not None:
            return layer
    return None


class GraphCache:
    """Graphs keyed by their inputs, captured at a key's `capture_after`-th call, compiled at its `compile_after`-th.

    Not thread-safe: its users are called by one thread at a time (`fit`, `Translator`'s lock).

    Args:
        what: str, what the graphs compute, for messages ("the PyTorch training step").
        capture_after: int >= 1, the call of a key at which its graph is captured;
            earlier calls take the caller's eager path. Defaults to 1.
        compile: None (graphs run as captured), or a function `graph -> compiled graph`
            (compilation may be lazy: the first call of the result is guarded too).
        compile_after: int, the call of a key at which its graph is compiled (at least
            `capture_after`). Defaults to `capture_after`.
        strict: bool. False (default): a failure warns once and falls back. True: it
            raises `CaptureError`.

    Attributes:
        captures: int, graphs captured (recaptures after `watch` or `reset` included).
        compiles: int, graphs compiled.
        failure: None, or why capturing failed (then every call takes the eager path).
    """

    def __init__(self, what, *, capture_after=1, compile=None, compile_after=None, strict=False):
        checks.check_positive_int("capture_after", capture_after)
        if compile_after is not None:
            checks.check_positive_int("compile_after", compile_after)
        self.what = what
        self.capture_after = capture_after
        self.compile = compile
        self.compile_after = compile_after
        self.strict = strict
        self.captures = 0
        self.compiles = 0
        self.failure = None
        self._graphs = {}
        self._calls = collections.Counter()  # per key, until its graph is final
        self._proven = set()  # keys whose graph has run once without error
        self._compiled = set()
        self._watched = ()

    def watch(self, objects):
        """Drops every graph when `objects` are not those of the last call (compared by identity).

        The objects are held, not their ids, so no id can be reused by a new object.
        """
        objects = tuple(objects)
        if not checks.same_objects(objects, self._watched):
            self.reset()
            self._watched = objects

    def reset(self):
        """Drops every graph and count: each key is captured (and compiled) again.

        A failure stays: what failed is the model's Python, which a reset does not change.
        """
        self._graphs.clear()
        self._calls.clear()
        self._proven.clear()
        self._compiled.clear()

    def graphs(self):
        """The current graphs, `{key: graph}` (a copy)."""
        return dict(self._graphs)

    def run(self, key, capture, run):
        """`run(graph)` with `key`'s graph, captured by `capture()` when due; None means "run eagerly".

        `run` must return a value other than None. The first call of each new graph is
        guarded (see the module docstring); later calls run unguarded, as any code does.
        """
        if self.failure is not None:
            return None
        graph = self._graphs.get(key)
        if key in self._proven and (self.compile is None or key in self._compiled):
            return run(graph)
        self._calls[key] += 1
        calls = self._calls[key]
        if graph is None:
            if calls < self.capture_after:
                return None
            try:
                graph = capture()
            except Exception as error:
                return self._capture_failed(error)
            self._graphs[key] = graph
            self.captures += 1
        compile_after = max(self.compile_after or self.capture_after, self.capture_after)
        if self.compile is not None and key not in self._compiled and calls >= compile_after:
            try:
                compiled = self.compile(graph)
                result = run(compiled)
            except Exception as error:
                self._compile_failed(error)  # compiling stops; the captured graph runs below
            else:
                self._graphs[key] = compiled
                self._compiled.add(key)
                self._proven.add(key)
                self.compiles += 1
                return result
        if key in self._proven:
            return run(graph)
        try:
            result = run(graph)
        except Exception as error:
            return self._capture_failed(error)
        self._proven.add(key)
        return result

    def _capture_failed(self, error):
        reason = describe_failure(error)
        if self.strict:
            raise CaptureError(
                f"{self.what} could not be captured as a graph ({reason}). With jit_compile='auto' "
                "it runs eagerly instead, with a warning; jit_compile=False never captures it."
            ) from error
        self.failure = reason
        self.reset()
        warnings.warn(
            f"{self.what} could not be captured as a graph ({reason}); it runs eagerly from now on.",
            CaptureFallbackWarning,
            stacklevel=3,
        )

    def _compile_failed(self, error):
        reason = describe_failure(error)
        if self.strict:
            raise CaptureError(
                f"{self.what} could not be compiled ({reason}). With jit_compile='auto' it runs "
                "captured but uncompiled; jit_compile=False runs it eagerly."
            ) from error
        self.compile = None
        warnings.warn(
            f"{self.what} could not be compiled ({reason}); its captured graphs run uncompiled from now on.",
            CaptureFallbackWarning,
            stacklevel=3,
        )


__all__ = ["CaptureError", "CaptureFallbackWarning", "GraphCache", "describe_failure", "input_key"]

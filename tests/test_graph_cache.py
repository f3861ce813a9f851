"""`GraphCache`: keys counted to their thresholds, graphs dropped on a change, and the one fallback.

The "graphs" here are plain functions that record their calls, so the rules are checked
on every backend in milliseconds; tests/test_torch_step.py and
tests/test_torch_model_options.py run the cache's real users on PyTorch.
"""

import types
import warnings

import keras
import numpy as np
import pytest

from keras_transformer.graph_cache import (
    CaptureError,
    CaptureFallbackWarning,
    GraphCache,
    describe_failure,
    input_key,
)


class Recorder:
    """A capture function that makes graphs `x -> (name, x)` and counts what it made."""

    def __init__(self, name="captured"):
        self.name = name
        self.made = 0

    def __call__(self):
        self.made += 1
        return lambda x: (self.name, x)


def call(cache, key, capture, x=0):
    return cache.run(key, capture, lambda graph: graph(x))


def test_a_key_is_captured_at_its_nth_call_and_compiled_at_its_mth():
    capture = Recorder()
    compiled = []
    cache = GraphCache("g", capture_after=2, compile=lambda graph: compiled.append(graph) or (lambda x: ("compiled", x)), compile_after=4)
    results = [call(cache, "a", capture, i) for i in range(5)]
    assert results == [None, ("captured", 1), ("captured", 2), ("compiled", 3), ("compiled", 4)]
    assert (cache.captures, cache.compiles, capture.made, len(compiled)) == (1, 1, 1, 1)
    assert call(cache, "b", capture) is None  # each key counts its own calls
    assert call(cache, "b", capture) == ("captured", 0)
    assert cache.captures == 2


def test_watched_objects_are_compared_by_identity_and_a_change_or_reset_recaptures():
    capture = Recorder()
    cache = GraphCache("g")
    first, equal_copy = [1.0], [1.0]
    cache.watch([first])
    call(cache, "a", capture)
    cache.watch([first])
    call(cache, "a", capture)
    assert cache.captures == 1
    cache.watch([equal_copy])  # equal, but another object: the graph was made for `first`
    call(cache, "a", capture)
    assert cache.captures == 2
    cache.reset()
    call(cache, "a", capture)
    assert cache.captures == 3


def failing_capture():
    raise ValueError("cannot trace this\nsecond line")


def test_a_failed_capture_warns_once_and_every_later_call_runs_eagerly():
    cache = GraphCache("The step")
    with pytest.warns(CaptureFallbackWarning) as caught:
        assert call(cache, "a", failing_capture) is None
    assert [str(w.message) for w in caught] == [
        "The step could not be captured as a graph (ValueError: cannot trace this); it runs eagerly from now on."
    ]
    capture = Recorder()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning
        assert [call(cache, key, capture) for key in ("a", "b", "a")] == [None, None, None]
    assert (capture.made, cache.captures, cache.failure) == (0, 0, "ValueError: cannot trace this")
    cache.reset()  # the model's Python is what failed: a reset does not retry it
    assert call(cache, "c", capture) is None and capture.made == 0


def test_a_graph_whose_first_run_fails_counts_as_a_failed_capture():
    def broken(x):
        raise RuntimeError("no kernel")

    cache = GraphCache("The step")
    with pytest.warns(CaptureFallbackWarning, match=r"\(RuntimeError: no kernel\); it runs eagerly"):
        assert cache.run("a", lambda: broken, lambda graph: graph(0)) is None
    assert cache.graphs() == {}


def test_strict_raises_capture_error_naming_the_reason():
    cache = GraphCache("The step", strict=True)
    with pytest.raises(CaptureError, match=r"^The step could not be captured as a graph \(ValueError: cannot trace this\)\. With jit_compile='auto'") as raised:
        call(cache, "a", failing_capture)
    assert isinstance(raised.value.__cause__, ValueError)


def failing_compile(graph):
    def compiled(x):  # lazy, like torch.compile: the build fails at the first call
        raise RuntimeError("no C++ compiler")

    return compiled


def test_a_failed_compilation_warns_once_and_the_captured_graphs_run_uncompiled():
    capture = Recorder()
    cache = GraphCache("The decoding step", compile=failing_compile, compile_after=2)
    assert call(cache, "a", capture, 1) == ("captured", 1)
    with pytest.warns(CaptureFallbackWarning) as caught:
        assert call(cache, "a", capture, 2) == ("captured", 2)  # the same call, uncompiled
    assert [str(w.message) for w in caught] == [
        "The decoding step could not be compiled (RuntimeError: no C++ compiler); "
        "its captured graphs run uncompiled from now on."
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [call(cache, key, capture, 3) for key in ("a", "b", "b")] == [("captured", 3)] * 3
    assert (cache.captures, cache.compiles, cache.failure) == (2, 0, None)
    strict = GraphCache("The step", compile=failing_compile, strict=True)
    with pytest.raises(CaptureError, match=r"could not be compiled \(RuntimeError: no C\+\+ compiler\)"):
        call(strict, "a", Recorder())


def test_describe_failure_names_the_innermost_layer_and_the_first_line():
    class Untraceable(keras.layers.Layer):
        def call(self, x):
            raise TypeError("\x1b[1mread a value\x1b[0m\nmore")

    class Outer(keras.layers.Layer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.inner = Untraceable(name="reader")

        def call(self, x):
            return self.inner(x)

    def run():
        Outer(name="outer")(np.ones((1, 3), "float32"))

    with pytest.raises(TypeError) as raised:
        run()
    # Keras' first line ("Exception encountered when calling ...") and colour codes are left out.
    assert describe_failure(raised.value) == "TypeError: read a value, in layer 'reader' (Untraceable)"
    with pytest.raises(RuntimeError) as raised:
        try:
            run()
        except TypeError as error:
            raise RuntimeError("wrapped") from error
    # The layer is found in the traceback of the error that caused this one.
    assert describe_failure(raised.value) == "RuntimeError: wrapped, in layer 'reader' (Untraceable)"
    assert describe_failure(KeyError()) == "KeyError"


def test_input_key_is_every_leaf_shape_dtype_and_device():
    def leaf(shape, dtype="float32", device="cpu"):
        return types.SimpleNamespace(shape=shape, dtype=dtype, device=device)

    key = input_key({"a": leaf((2, 5)), "b": leaf((2, 6), "int32")}, leaf([3]))
    assert key == (((2, 5), "float32", "cpu"), ((2, 6), "int32", "cpu"), ((3,), "float32", "cpu"))
    assert input_key(leaf((2, 5), device="cuda:0")) != input_key(leaf((2, 5)))

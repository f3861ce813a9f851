"""Compiled decoding: one trace per input shape, on each backend.

`decoding.py` is backend-agnostic; making it fast is backend-specific, so it lives here:

- TensorFlow: `tf.function(jit_compile=True, reduce_retracing=True)`: the whole search,
  `while_loop` and caches included, compiles with XLA. Variables are captured by
  reference, so later weight updates are seen.
- JAX: `jax.jit` of a pure function that takes the model's variable values as
  arguments and maps them onto the variables with `keras.StatelessScope`, so weights are
  inputs of the compiled program, not constants baked into it, and updates are seen.
- PyTorch: the loop runs in Python under `torch.no_grad()` (`keras.ops.while_loop` is a
  Python loop on this backend), and the model's `decode_step`, where the time goes, runs
  as a graph captured once per shape (`inference.torch_decode_step`) instead of through
  the Keras layers' Python, compiled by inductor once the shape has recurred for
  `COMPILE_AFTER` steps; `jit_compile=False` keeps it eager, and so does a step that
  cannot be captured (after one warning).

A `CompiledDecoder` traces once per distinct `[B, S]` input shape (plus dtype), so
batches bucketed to the same shape reuse one compiled program; `trace_count` counts
the traces (a Python side effect inside the traced function runs only when tracing).
The inputs that change from call to call are tensor arguments of the program, never
constants traced into it: the forced prefixes (`prefix_ids [B, P]`, one trace per
shape too) and, for sampling, the seed (`seed`, int32 `[2]`).

A traced program knows the variables that existed when it was traced: one made before
`Dense.enable_lora` (`Transformer.enable_lora`) or `model.quantize` would go on running
the old computation. So each call compares the model's variables (the objects, by
identity) with those of the last build and, when they differ, builds afresh and
retraces. The comparison is one pass over `model.variables` per call, small beside
a decode.
"""

import os
import threading
import warnings

import keras
from keras import ops

from keras_transformer import checks
from keras_transformer.inference import decoding, sampling

_METHODS = {
    "beam": decoding.beam_decode,
    "greedy": decoding.greedy_decode,
    "greedy_uncached": decoding.greedy_decode_uncached,
    "sample": sampling.sample_decode,
}
# The most bytes `use_jax_compilation_cache` lets JAX's cache directory hold.
JAX_CACHE_MAX_BYTES = 2**30


class CompiledDecoder:
    """Callable `encoder_inputs [B, S] -> (tokens, scores)` compiled for the backend.

    Wraps one of `decoding.beam_decode`, `greedy_decode`, `greedy_decode_uncached` or
    `sampling.sample_decode` with fixed keyword arguments. Calling it with a new input
    shape traces (and on TensorFlow / JAX compiles) once; later calls with that shape
    reuse the program. Inputs are cast to int32 first, so NumPy int64 arrays do not
    trace separately. A call may also pass `prefix_ids` (int `[B, P]`, forced first
    output tokens, any method) and must pass `seed` (int32 `[2]`) to "sample"; both
    are inputs of the program, so new values reuse it.

    Args:
        model: a `keras_transformer.Transformer`, or an `inference.ensemble.Ensemble`.
        method: "beam" (default), "greedy", "greedy_uncached" or "sample".
        jit_compile: bool. On TensorFlow, compile with XLA (default True); False runs a
            plain `tf.function` graph. On PyTorch, True (default) runs the decoder step
            as a captured graph, compiled by inductor for a shape that recurs, False
            eagerly. Ignored on JAX.
        **decode_kwargs: passed to the decoding function (`beam_size`, `alpha`,
            `max_length`, `max_extra`, `return_all_beams`; `temperature`, `top_k`,
            `top_p` for "sample").

    Attributes:
        trace_count: int, how many times the function was traced (0 on PyTorch),
            retraces after a change of the model's variables included.
        captured_steps: on PyTorch with `jit_compile`, the `CapturedDecodeSteps` the
            search runs (its captures, compiles and fallback); otherwise None.

    Example:

    ```python
    decoder = CompiledDecoder(model, "beam", beam_size=4)
    tokens, scores = decoder(keras.ops.array([[5, 6, 7, 0]]))
    ```
    """

    def __init__(self, model, method="beam", jit_compile=True, **decode_kwargs):
        checks.check_choice("method", method, tuple(_METHODS))
        self.model = model
        self.method = method
        self.jit_compile = jit_compile
        self.decode_kwargs = dict(decode_kwargs)
        self.trace_count = 0
        self.backend = keras.backend.backend()
        builders = {
            "tensorflow": self._build_tensorflow,
            "jax": self._build_jax,
            "torch": self._build_torch,
        }
        if self.backend not in builders:
            raise ValueError(
                f"CompiledDecoder supports the tensorflow, jax and torch backends. "
                f"Received: backend={self.backend!r}"
            )
        self._builder = builders[self.backend]
        self.captured_steps = None  # PyTorch's CapturedDecodeSteps, made by the first build
        self._build_lock = threading.Lock()
        self._build(list(self.model.variables))

    def _build(self, variables):
        # The list holds the variables themselves, so their ids cannot be reused by
        # new objects while they are compared against.
        self._variables = variables
        self._function = self._builder(variables)

    def _current_function(self):
        """The compiled function, rebuilt first if the model's variables changed."""
        variables = list(self.model.variables)
        if not checks.same_objects(variables, self._variables):
            with self._build_lock:
                if not checks.same_objects(variables, self._variables):
                    self._build(variables)
        return self._function

    def _decode(self, encoder_inputs, inputs, model=None):
        """The decoding function on `encoder_inputs` and the per-call `inputs` (a dict).

        `model` stands in for `self.model` (PyTorch's captured decoder steps).
        """
        model = self.model if model is None else model
        return _METHODS[self.method](model, encoder_inputs, **inputs, **self.decode_kwargs)

    def _build_tensorflow(self, variables):
        # tf.function captures the variables it reads while tracing, by reference.
        del variables
        import tensorflow as tf

        def traced(encoder_inputs, inputs):
            self.trace_count += 1  # runs only while tracing
            return self._decode(encoder_inputs, inputs)

        # No AutoGraph: the searches are backend-neutral code with no Python branch on a
        # tensor (jax.jit traces them too), and converting them tripled the time of a
        # first greedy translation of the tiny model.
        return tf.function(traced, jit_compile=self.jit_compile, reduce_retracing=True, autograph=False)

    def _build_jax(self, variables):
        import jax

        def pure(values, encoder_inputs, inputs):
            self.trace_count += 1  # runs only while tracing
            with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                return self._decode(encoder_inputs, inputs)

        jitted = jax.jit(pure)
        return lambda encoder_inputs, inputs: jitted([v.value for v in variables], encoder_inputs, inputs)

    def _build_torch(self, variables):
        # Every call reads the variables as they are (the captured step takes them as inputs).
        import torch

        model = self.model
        if self.jit_compile:
            if self.captured_steps is None:
                from keras_transformer.inference.torch_decode_step import CapturedDecodeSteps
                from keras_transformer.torch_capture import default_compiler

                self.captured_steps = CapturedDecodeSteps(self.model, variables, compiler=default_compiler())
            else:  # new variables (enable_lora, quantize): the steps' graphs are captured again
                self.captured_steps.watch(variables)
            model = self.captured_steps

        def run(encoder_inputs, inputs):
            with torch.no_grad():
                return self._decode(encoder_inputs, inputs, model)

        return run

    def __call__(self, encoder_inputs, *, prefix_ids=None, seed=None):
        """Decodes `encoder_inputs [B, S]`: `(tokens, scores)` as the decoding function returns.

        Args:
            encoder_inputs: int `[B, S]` source ids, padded with 0.
            prefix_ids: optional int `[B, P]`, forced first output tokens (0-padded).
            seed: int32 `[2]` (or an int), required by "sample" and refused otherwise.
        """
        if (seed is None) != (self.method != "sample"):
            raise ValueError(
                f"`seed` is required by the \"sample\" method and taken by no other. "
                f"Received: method={self.method!r}, seed={seed!r}"
            )
        inputs = {}
        if prefix_ids is not None:
            inputs["prefix_ids"] = _int32(prefix_ids)
        if seed is not None:
            inputs["seed"] = sampling.seed_tensor(seed)
        function = self._current_function()
        return function(_int32(encoder_inputs), inputs)


def user_cache_dir():
    """`$KERAS_TRANSFORMER_CACHE`, else `$XDG_CACHE_HOME/keras_transformer` (`~/.cache/...`)."""
    return os.environ.get("KERAS_TRANSFORMER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "keras_transformer"
    )


def use_jax_compilation_cache(directory=None):
    """Points JAX's persistent compilation cache at `directory`; returns the directory in use.

    On JAX, a `Translator` compiles its search once per batch shape (seconds each on a
    CPU); with the cache, a later process reads the compiled programs back instead.
    JAX keys each entry by the program, its shapes, the JAX version and the machine, so
    an entry is only reused where it is valid. Does nothing (and returns what is set, or
    None) off JAX or where the process already chose a cache directory. Defaults to
    `user_cache_dir()/jax_compilation`, holding at most `JAX_CACHE_MAX_BYTES` (JAX drops
    the least recently used entries). A directory that cannot be made leaves the cache
    off, with one warning saying why.
    """
    if keras.backend.backend() != "jax":
        return None
    import jax

    if jax.config.jax_compilation_cache_dir:
        return jax.config.jax_compilation_cache_dir
    directory = os.fspath(directory) if directory is not None else os.path.join(user_cache_dir(), "jax_compilation")
    try:
        os.makedirs(directory, exist_ok=True)
    except OSError as error:
        warnings.warn(
            f"JAX's compilation cache stays off: its directory {directory!r} cannot be made "
            f"({error}); each process compiles its searches afresh.",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_compilation_cache_max_size", JAX_CACHE_MAX_BYTES)
    return directory


def _int32(x):
    return ops.cast(ops.convert_to_tensor(x), "int32")


__all__ = ["CompiledDecoder", "JAX_CACHE_MAX_BYTES", "use_jax_compilation_cache", "user_cache_dir"]

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
  `COMPILE_AFTER` steps; `jit_compile=False` keeps it eager.

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

A batch whose key/value caches would outgrow `max_cache_bytes` is decoded in chunks of
sentences (`sentences_per_call`), each one call of the same compiled program: every
decoding step reads and rewrites the whole cache several times (the write at the step's
position, the beam reorder, the attention), so a cache that stays in the processor's
last-level cache decodes several times faster per row than one that spills to memory
(docs/fast_inference.md measures it). A sentence decodes the same in any chunk: the
searches never mix rows.
"""

import threading

import keras
import numpy as np
from keras import ops

from keras_transformer import checks
from keras_transformer.inference import decoding, sampling
from keras_transformer.special_tokens import EOS_ID

_METHODS = {
    "beam": decoding.beam_decode,
    "greedy": decoding.greedy_decode,
    "greedy_uncached": decoding.greedy_decode_uncached,
    "sample": sampling.sample_decode,
}
# The methods that `max_cache_bytes` splits into chunks: sampling draws each row's random
# numbers by its position in the batch, so a chunk would draw other numbers.
_CHUNKED_METHODS = ("beam", "greedy")
# Key/value cache bytes of one call: the default keeps a call's caches within a 32 MiB
# last-level cache, where beam 4 of the `small` preset ran 2-4x faster per row than at
# twice the rows (docs/fast_inference.md).
DEFAULT_MAX_CACHE_BYTES = 32 * 2**20


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
        max_cache_bytes: int or None. "beam" and "greedy" decode a batch whose
            key/value caches would hold more bytes than this in chunks of sentences
            (`sentences_per_call`), one call of the compiled program each; None decodes
            every batch whole. Defaults to `DEFAULT_MAX_CACHE_BYTES`.
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

    def __init__(self, model, method="beam", jit_compile=True, max_cache_bytes=DEFAULT_MAX_CACHE_BYTES, **decode_kwargs):
        checks.check_choice("method", method, tuple(_METHODS))
        if max_cache_bytes is not None:
            checks.check_positive_int("max_cache_bytes", max_cache_bytes)
        self.model = model
        self.method = method
        self.jit_compile = jit_compile
        self.max_cache_bytes = max_cache_bytes
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
        # tensor (jax.jit traces them too), and converting them cost ~2 s of a first
        # translation (greedy 3.1 s against 1.0 s, tiny model, 2-core AMD EPYC).
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
            from keras_transformer.inference.torch_decode_step import CapturedDecodeSteps

            model = self.captured_steps = CapturedDecodeSteps(self.model, variables, compiler="inductor")

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
        encoder_inputs = _int32(encoder_inputs)
        batch, source_length = ops.shape(encoder_inputs)
        chunk = self.sentences_per_call(source_length)
        if chunk is None or batch <= chunk:
            return function(encoder_inputs, inputs)
        return self._decode_in_chunks(function, encoder_inputs, inputs, chunk)

    def sentences_per_call(self, source_length):
        """Sentences one call decodes for sources padded to `source_length`, or None: all.

        The largest power of two whose key/value caches (self-attention over the output
        width, cross-attention over the source, each hypothesis, every decoder layer of
        every model) fit `max_cache_bytes`, and at least 1. None for the methods that
        decode a batch whole ("sample", "greedy_uncached") or without a budget.
        """
        if self.max_cache_bytes is None or self.method not in _CHUNKED_METHODS:
            return None
        per_sentence = sentence_cache_bytes(
            self.model,
            source_length,
            hypotheses=self.decode_kwargs.get("beam_size", decoding.BEAM_SIZE) if self.method == "beam" else 1,
            max_length=self.decode_kwargs.get("max_length"),
            max_extra=self.decode_kwargs.get("max_extra", decoding.MAX_DECODE_EXTRA),
        )
        sentences = max(1, self.max_cache_bytes // per_sentence)
        return 1 << (sentences.bit_length() - 1)  # a power of two: batches of 2^n split evenly

    def _decode_in_chunks(self, function, encoder_inputs, inputs, chunk):
        """Decodes `chunk` sentences per call (the last padded with lone-EOS rows); results joined."""
        sources = ops.convert_to_numpy(encoder_inputs)
        prefixes = inputs.get("prefix_ids")
        prefixes = None if prefixes is None else ops.convert_to_numpy(prefixes)
        batch = len(sources)
        tokens, scores = [], []
        for start in range(0, batch, chunk):
            rows = _padded_rows(sources[start : start + chunk], chunk, EOS_ID)
            chunk_inputs = dict(inputs)
            if prefixes is not None:
                chunk_inputs["prefix_ids"] = ops.convert_to_tensor(_padded_rows(prefixes[start : start + chunk], chunk, 0))
            chunk_tokens, chunk_scores = function(ops.convert_to_tensor(rows), chunk_inputs)
            kept = min(chunk, batch - start)
            tokens.append(ops.convert_to_numpy(chunk_tokens)[:kept])
            scores.append(ops.convert_to_numpy(chunk_scores)[:kept])
        return ops.convert_to_tensor(np.concatenate(tokens)), ops.convert_to_tensor(np.concatenate(scores))


def sentence_cache_bytes(model, source_length, hypotheses=1, max_length=None, max_extra=decoding.MAX_DECODE_EXTRA):
    """Bytes of key/value cache one sentence decodes with (`decoding.decode_lengths`' width).

    Each hypothesis holds, in every decoder layer of every model (an `Ensemble`'s
    members), keys and values over the output width and over the source.

    Example:
    >>> from keras_transformer.model.config import TransformerConfig
    >>> from keras_transformer.model.transformer import Transformer
    >>> model = Transformer(TransformerConfig.from_preset("tiny", vocab_size=100))
    >>> sentence_cache_bytes(model, 8, hypotheses=4, max_length=8)  # 4 x 2 layers x 2 x 16 x 64 x 4 bytes
    65536
    """
    total = 0
    for member in getattr(model, "models", [model]):
        config = member.config
        cap = config.max_length - 1
        width = max_length if max_length is not None else max(1, min(source_length + max_extra, cap))
        itemsize = np.dtype(keras.backend.standardize_dtype(member.compute_dtype)).itemsize
        total += config.num_decoder_layers * 2 * (width + source_length) * config.d_model * itemsize
    return hypotheses * total


def _padded_rows(rows, count, fill):
    """`rows` with rows appended up to `count`: column 0 holds `fill`, the rest 0 (PAD)."""
    if len(rows) == count:
        return rows
    padded = np.zeros((count,) + rows.shape[1:], rows.dtype)
    padded[: len(rows)] = rows
    padded[len(rows) :, 0] = fill
    return padded


def _int32(x):
    return ops.cast(ops.convert_to_tensor(x), "int32")


__all__ = ["CompiledDecoder", "DEFAULT_MAX_CACHE_BYTES", "sentence_cache_bytes"]

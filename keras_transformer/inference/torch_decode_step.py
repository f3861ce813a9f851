"""PyTorch decoding: the model's `decode_step` captured once per shape and run as a graph.

On PyTorch `keras.ops.while_loop` is a Python loop, so every decoding step runs the
decoder's Keras layers eagerly: their Python (`Layer.__call__`, dtype policies, name
scopes), not the arithmetic, is most of a step at decoding's small batches. As for
training (`train.torch_step`), `torch.export` in its non-strict mode runs that Python
once with fake tensors and records the aten ops of `decode_step` as a pure function of
the weights, the token ids, the step index and the caches; later steps run that graph.
The index is an input, so one graph serves every step of every search of that shape.

`CapturedDecodeSteps(model)` stands in for the model inside the search: it answers
`decode_step` from the graphs and passes every other attribute (`encode`,
`initial_cache`, `config`) to the model. A shape is captured at its `capture_after`-th
step, so a search of a few steps never pays for a capture, and its graph is compiled
(inductor, `torch_capture.default_compiler`) at its `compile_after`-th step
(`COMPILE_AFTER`, several searches' worth), so only a shape that recurs, as bucketed
batches of a long translation job do, pays for a build (`docs/benchmarks.md`, decoding
across backends, measures what it saves). The graphs are kept in a
`graph_cache.GraphCache`, which also holds the fallback.
"""

import keras
import torch

from keras_transformer import internals
from keras_transformer.graph_cache import GraphCache, input_key
from keras_transformer.torch_capture import capture, compile_graph

# Steps of one shape run eagerly before that shape is captured: a capture takes about
# as long as a few dozen eager steps of the tiny model (bench/decode.py, PyTorch rows).
CAPTURE_AFTER = 8
# Steps of one shape before its graph is compiled: four searches of 64 steps. A build
# takes seconds to tens of seconds and saves a fraction of each step, so a shape must
# recur for hundreds of steps to repay it (bench/decode.py measures both).
COMPILE_AFTER = 256


class _DecodeStep(torch.nn.Module):
    """`(weights, ids, index, caches, mask) -> decode_step(...)`: what `torch.export` traces."""

    def __init__(self, model, variables):
        super().__init__()
        self._model = [model]  # in a list: its parameters are not this module's
        self._variables = variables

    def forward(self, values, token_ids, index, self_caches, cross_caches, encoder_padding_mask):
        with keras.StatelessScope(state_mapping=list(zip(self._variables, values))):
            return self._model[0].decode_step(token_ids, index, self_caches, cross_caches, encoder_padding_mask)


class CapturedDecodeSteps:
    """A model whose `decode_step` runs as a captured graph per input shape.

    A `decode_step` that cannot be captured (or compiled) warns once and runs eagerly
    (or uncompiled) from then on: decoding never fails for its optimization.

    Args:
        model: a `keras_transformer.Transformer` on the PyTorch backend.
        variables: the model's variables, as the caller compared them (their values are
            read at every step, so weight updates are seen). `watch` replaces them.
        capture_after: int >= 1, the step of a shape at which it is captured.
        compiler: a `torch.compile` backend that compiles a shape's graph at its
            `compile_after`-th step, or None to run graphs as captured.
        compile_after: int >= `capture_after`, that step. Defaults to `COMPILE_AFTER`.

    Attributes:
        graphs: the `GraphCache` of the graphs (`graphs.capture_after`, ... may be set).
        captures: int, how many shapes were captured.
        compiles: int, how many captured graphs were compiled.
    """

    def __init__(self, model, variables, capture_after=CAPTURE_AFTER, compiler=None, compile_after=COMPILE_AFTER):
        self._model = model
        self.compiler = compiler
        self.graphs = GraphCache(
            "The PyTorch decoding step",
            capture_after=capture_after,
            compile=None if compiler is None else lambda graph: compile_graph(graph, compiler),
            compile_after=compile_after,
        )
        self.watch(variables)

    def watch(self, variables):
        """Decodes with `variables` from now on; graphs captured for other objects are dropped."""
        self._variables = list(variables)
        self.graphs.watch(self._variables)

    @property
    def captures(self):
        return self.graphs.captures

    @property
    def compiles(self):
        return self.graphs.compiles

    @property
    def compile_after(self):
        return self.graphs.compile_after

    def __getattr__(self, name):
        return getattr(self._model, name)

    def decode_step(self, token_ids, index, self_caches, cross_caches, encoder_padding_mask, return_states=False):
        arguments = (token_ids, index, self_caches, cross_caches, encoder_padding_mask)
        if return_states:  # the attention maps' path, not a search's: eager
            return self._model.decode_step(*arguments, return_states=True)
        result = self.graphs.run(
            input_key(*arguments),
            lambda: capture(_DecodeStep(self._model, self._variables), (self._values(), *arguments)),
            lambda graph: graph(self._values(), *arguments),
        )
        return self._model.decode_step(*arguments) if result is None else result

    def _values(self):
        return internals.variable_tensors(self._variables)

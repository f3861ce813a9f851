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
step, so a search of a few steps never pays for a capture, and its graph is compiled by
inductor at its `compile_after`-th step (`COMPILE_AFTER`, several searches' worth), so
only a shape that recurs, as bucketed batches of a long translation job do, pays for a
build (seconds to tens of seconds on a 2-core CPU), after which `small` at batch 32
decoded 1.40x faster greedy and 1.35x with beam 4 (`docs/benchmarks.md`, decoding across
backends).
"""

import collections

import keras
import torch

from keras_transformer import checks
from keras_transformer.torch_capture import capture, compile_graph, variable_tensors

# Steps of one shape run eagerly before that shape is captured: a capture takes about
# as long as a few dozen eager steps of the tiny model (bench/decode.py, PyTorch rows).
CAPTURE_AFTER = 8
# Steps of one shape before its graph is compiled by inductor: four searches of 64 steps.
# A build takes seconds to tens of seconds; a greedy step of `small` at batch 32 saves about 4 ms
# compiled (2-core AMD EPYC), so a shape must recur for hundreds of steps to repay it.
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


def _key(*tensors):
    """What a graph is specialised to: every input's shape, dtype and device (a compiled
    graph runs without dynamo's guards, which would check them again)."""
    return tuple((tuple(t.shape), t.dtype, t.device) for t in keras.tree.flatten(tensors))


class CapturedDecodeSteps:
    """A model whose `decode_step` runs as a captured graph per input shape.

    Args:
        model: a `keras_transformer.Transformer` on the PyTorch backend.
        variables: the model's variables, as the caller compared them (their values are
            read at every step, so weight updates are seen).
        capture_after: int >= 1, the step of a shape at which it is captured.
        compiler: a `torch.compile` backend that compiles a shape's graph at its
            `compile_after`-th step ("inductor"), or None to run graphs as captured.
        compile_after: int >= `capture_after`, that step. Defaults to `COMPILE_AFTER`.

    Attributes:
        captures: int, how many shapes were captured.
        compiles: int, how many captured graphs were compiled.
    """

    def __init__(self, model, variables, capture_after=CAPTURE_AFTER, compiler=None, compile_after=COMPILE_AFTER):
        checks.check_positive_int("capture_after", capture_after)
        checks.check_positive_int("compile_after", compile_after)
        self._model = model
        self._variables = list(variables)
        self.capture_after = capture_after
        self.compiler = compiler
        self.compile_after = compile_after
        self._graphs = {}
        self._steps_seen = collections.Counter()
        self._compiled = set()
        self.captures = 0
        self.compiles = 0

    def __getattr__(self, name):
        return getattr(self._model, name)

    def decode_step(self, token_ids, index, self_caches, cross_caches, encoder_padding_mask, return_states=False):
        arguments = (token_ids, index, self_caches, cross_caches, encoder_padding_mask)
        if return_states:  # the attention maps' path, not a search's: eager
            return self._model.decode_step(*arguments, return_states=True)
        key = _key(*arguments)
        graph = self._graphs.get(key)
        if graph is None or (self.compiler is not None and key not in self._compiled):
            self._steps_seen[key] += 1  # counted until the shape's graph is final
            steps = self._steps_seen[key]
            if graph is None:
                if steps < self.capture_after:
                    return self._model.decode_step(*arguments)
                graph = self._graphs[key] = self._capture(arguments)
            if self.compiler is not None and steps >= max(self.compile_after, self.capture_after):
                graph = self._graphs[key] = compile_graph(graph, self.compiler)
                self._compiled.add(key)
                self.compiles += 1
        return graph(variable_tensors(self._variables), *arguments)

    def _capture(self, arguments):
        values = variable_tensors(self._variables)
        self.captures += 1
        return capture(_DecodeStep(self._model, self._variables), (values, *arguments))

"""The PyTorch training step as one captured graph per batch shape, optionally compiled.

Keras runs a PyTorch model eagerly: every step walks the layers' Python (`Layer.__call__`,
dtype policies, name scopes, tree utilities), tens of microseconds a layer call, and
`torch.compile` of Keras' own step breaks its graph inside that machinery (NumPy dtype
reads in `convert_to_tensor`, iterators in the tree utilities, `SDPAParams`) and then
recompiles the shared attention code per layer past dynamo's limit. So the forward pass
and the loss are captured instead, once per batch shape, by `torch.export` in its
non-strict mode: it *runs* the Keras Python with fake tensors and records only the aten
ops, as a pure function of the weights (`model.stateless_call`). What remains per step is
that graph, which updates the metrics too (run as it is, or compiled by inductor for
`jit_compile=True`), the backward pass, and the optimizer's update: Keras' `apply`, or with
a compiler the update captured and compiled as well (`train.torch_optimizer_update`).

A bucketed pipeline feeds a few batch shapes, each captured (and compiled) once;
`captures` counts them, so a test can show that nothing recompiles after warm-up. With
`capture_after=n` a shape is captured at its n-th batch and the first n - 1 take Keras'
eager step, so shapes seen once or twice (a short `fit`, an epoch's last partial batch)
never pay for a capture. Batches the capture cannot trace (sample weights) take Keras'
eager step too. A change of the model's variables (`enable_lora`, `quantize`) drops the
graphs, which were captured for the old ones, and so does `reset()` (called by
`model.make_train_function(force=True)`, the way a callback says that Python values a
compiled step baked in, such as a schedule's `total_steps`, have changed).
"""

import collections

import keras
import torch

from keras_transformer import checks
from keras_transformer.torch_capture import capture, compile_graph, variable_tensors
from keras_transformer.train.torch_optimizer_update import CompiledOptimizerUpdate

# `jit_compile="auto"`: a shape is captured at its 32nd batch. A capture takes seconds
# (2.6 s for the tiny model at batch 8 on a 2-core AMD EPYC, bench/torch_step.py), so a
# shape that recurs this often in a run is likely to recur long enough to repay it.
AUTO_CAPTURE_AFTER = 32


class _ForwardLossMetrics(torch.nn.Module):
    """`(weights, batch) -> (loss, logs, non-trainable values, metric values)`: what is traced.

    The metrics are updated in the graph too, as Keras' JAX trainer updates them (a
    `StatelessScope` over the metrics' variables): their Python (the loss tracker, the
    compiled metrics, `result()`) costs about 0.8 ms a step on the tiny model eagerly.
    """

    def __init__(self, model):
        super().__init__()
        # In a list, so the model's parameters are not this module's: the graph reads
        # the weights from its inputs only, never from captured tensors.
        self._model = [model]

    def forward(self, trainable, non_trainable, metrics, x, y):
        model = self._model[0]
        y_pred, non_trainable = model.stateless_call(trainable, non_trainable, x, training=True)
        loss = model.compute_loss(x=x, y=y, y_pred=y_pred, training=True)
        metrics_variables = model.metrics_variables
        with keras.StatelessScope(state_mapping=list(zip(metrics_variables, metrics))) as scope:
            batch_size = keras.tree.flatten(x)[0].shape[0]
            model._loss_tracker.update_state(loss.detach(), sample_weight=batch_size)
            logs = model.compute_metrics(x, y, y_pred.detach(), sample_weight=None)
        metrics = [
            value if (value := scope.get_current_value(variable)) is not None else old
            for variable, old in zip(metrics_variables, metrics)
        ]
        return loss, logs, non_trainable, metrics


def _shape_key(x, y):
    """What a captured graph is specialised to: every input's shape, dtype and device."""
    leaves = keras.tree.flatten((x, y))
    return tuple((tuple(leaf.shape), leaf.dtype, leaf.device) for leaf in leaves)


def _as_tensors(x):
    return keras.tree.map_structure(lambda value: keras.ops.convert_to_tensor(value), x)


class CapturedTrainStep:
    """The training step of a Keras model on PyTorch, captured once per batch shape.

    Args:
        model: a compiled `keras.Model` on the PyTorch backend.
        compiler: None to run each captured graph as it is (no Keras Python per step),
            or a `torch.compile` backend name ("inductor" for `jit_compile=True`).
        capture_after: int >= 1, the batch of a shape at which that shape is captured;
            earlier ones run Keras' eager step. Defaults to 1.
    """

    def __init__(self, model, compiler=None, capture_after=1):
        checks.check_positive_int("capture_after", capture_after)
        if keras.backend.backend() != "torch":
            raise ValueError(
                f"CapturedTrainStep runs on the PyTorch backend. Received: KERAS_BACKEND={keras.backend.backend()!r}"
            )
        self.model = model
        self.compiler = compiler
        self.capture_after = capture_after
        self._graphs = {}
        self._batches_seen = collections.Counter()
        self._variables = []
        self.captures = 0
        # With a compiler the optimizer's update is compiled too (a few fused kernels in
        # place of Keras' per-weight ones); run as it is, its graph would be slower than Keras'.
        self.optimizer_update = CompiledOptimizerUpdate(model, compiler) if compiler is not None else None

    def reset(self):
        """Drops every captured graph and the optimizer's compiled update: each is captured again.

        For Python values the graphs baked in when they were traced (a schedule's
        `total_steps`, a dropout rate); `Transformer.make_train_function(force=True)` calls it.
        """
        self._graphs.clear()
        self._batches_seen.clear()
        if self.optimizer_update is not None:
            self.optimizer_update.reset()

    def _capture(self, x, y):
        model = self.model
        trainable = variable_tensors(model.trainable_variables)
        non_trainable = variable_tensors(model.non_trainable_variables)
        metrics = variable_tensors(model.metrics_variables)
        graph = capture(_ForwardLossMetrics(model), (trainable, non_trainable, metrics, x, y))
        self.captures += 1
        if self.compiler is not None:
            graph = compile_graph(graph, self.compiler)
        return graph

    def __call__(self, data):
        model = self.model
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        if sample_weight is not None or y is None:
            return None  # the caller runs Keras' own step
        x, y = _as_tensors(x), _as_tensors(y)
        trainable_variables = model.trainable_variables
        non_trainable_variables = model.non_trainable_variables
        metrics_variables = model.metrics_variables
        variables = trainable_variables + non_trainable_variables + metrics_variables
        if not checks.same_objects(variables, self._variables):
            self._graphs.clear()
            self._variables = variables
        key = _shape_key(x, y)
        graph = self._graphs.get(key)
        if graph is None:
            self._batches_seen[key] += 1
            if self._batches_seen[key] < self.capture_after:
                return None  # the caller runs Keras' own step
            graph = self._graphs[key] = self._capture(x, y)
        model.zero_grad()
        trainable = variable_tensors(trainable_variables)
        non_trainable = variable_tensors(non_trainable_variables)
        metrics = variable_tensors(metrics_variables)
        loss, logs, new_non_trainable, new_metrics = graph(trainable, non_trainable, metrics, x, y)
        with torch.no_grad():
            for tensor, value in zip(non_trainable + metrics, new_non_trainable + new_metrics):
                if value is not tensor:
                    tensor.copy_(value)
        model.optimizer.scale_loss(loss).backward()
        gradients = [tensor.grad for tensor in trainable]
        if self.optimizer_update is None or not self.optimizer_update(gradients, trainable_variables):
            with torch.no_grad():
                model.optimizer.apply(gradients, trainable_variables)
        return logs

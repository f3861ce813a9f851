"""The PyTorch training step as one captured graph per batch shape, optionally compiled.

Keras runs a PyTorch model eagerly: every step walks the layers' Python (`Layer.__call__`,
dtype policies, name scopes, tree utilities) at every layer call, and
`torch.compile` of Keras' own step breaks its graph inside that machinery (NumPy dtype
reads in `convert_to_tensor`, iterators in the tree utilities, `SDPAParams`) and then
recompiles the shared attention code per layer past dynamo's limit. So the forward pass
and the loss are captured instead, once per batch shape, by `torch.export` in its
non-strict mode: it *runs* the Keras Python with fake tensors and records only the aten
ops, as a pure function of the weights (`model.stateless_call`). What remains per step is
that graph, which updates the metrics too (run as it is, or compiled for
`jit_compile=True`), the backward pass, and the optimizer's update: Keras' `apply`, or with
a compiler the update captured and compiled as well (`train.torch_optimizer_update`).

The graphs live in a `graph_cache.GraphCache`: one per batch shape (a bucketed pipeline
feeds a few), captured at a shape's `capture_after`-th batch, so shapes seen once or twice
(a short `fit`, an epoch's last partial batch) never pay for a capture; `captures` counts
them, so a test can show that nothing recompiles after warm-up. A change of the model's
variables (`enable_lora`, `quantize`) drops the graphs, which were captured for the old
ones, and so does `reset()` (called by `model.make_train_function(force=True)`, the way a
callback says that Python values a compiled step baked in, such as a schedule's
`total_steps`, have changed). A model the tracer cannot follow trains through Keras' eager
step after one warning (`jit_compile="auto"`), or stops with `CaptureError` saying why
(`jit_compile=True`). Batches the capture does not take (sample weights) run Keras' step too.
"""

import keras
import torch

from keras_transformer import internals
from keras_transformer.graph_cache import GraphCache, input_key
from keras_transformer.torch_capture import capture, compile_graph
from keras_transformer.train.torch_optimizer_update import CompiledOptimizerUpdate

# `jit_compile="auto"`: a shape is captured at its 32nd batch. A capture takes seconds
# (`bench/torch_step.py` times it), so a shape that recurs this often in a run is likely
# to recur long enough to repay it.
AUTO_CAPTURE_AFTER = 32


class _ForwardLossMetrics(torch.nn.Module):
    """`(weights, batch) -> (loss, logs, non-trainable values, metric values)`: what is traced.

    The metrics are updated in the graph too, as Keras' JAX trainer updates them (a
    `StatelessScope` over the metrics' variables): their Python (the loss tracker, the
    compiled metrics, `result()`) is otherwise a large part of a small model's step.
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
            internals.loss_tracker(model).update_state(loss.detach(), sample_weight=batch_size)
            logs = model.compute_metrics(x, y, y_pred.detach(), sample_weight=None)
        metrics = [
            value if (value := scope.get_current_value(variable)) is not None else old
            for variable, old in zip(metrics_variables, metrics)
        ]
        return loss, logs, non_trainable, metrics


def _as_tensors(x):
    return keras.tree.map_structure(lambda value: keras.ops.convert_to_tensor(value), x)


class CapturedTrainStep:
    """The training step of a Keras model on PyTorch, captured once per batch shape.

    Call it with a batch, as Keras' `train_step`: it returns the logs, or None when the
    caller must run Keras' own step (a shape not yet due, sample weights, a failed capture).

    Args:
        model: a compiled `keras.Model` on the PyTorch backend.
        compiler: None to run each captured graph as it is (no Keras Python per step),
            or a `torch.compile` backend name (`jit_compile=True` passes
            `torch_capture.default_compiler()`, inductor unless the environment says).
        capture_after: int >= 1, the batch of a shape at which that shape is captured;
            earlier ones run Keras' eager step. Defaults to 1.
        strict: bool. False (default): a capture or compilation that fails warns once
            and the model trains through Keras' step. True (`jit_compile=True`): it
            raises `graph_cache.CaptureError`, naming the reason.

    Attributes:
        graphs: the `GraphCache` of the step's graphs (`graphs.failure` says why none runs).
        optimizer_update: the `CompiledOptimizerUpdate` with a compiler, else None.
        gradient_sync: None, or in a run over several processes the
            `torch_data_parallel.DataParallelStep` that averages each step's gradients
            and metrics across them, around the backward pass.
    """

    gradient_sync = None

    def __init__(self, model, compiler=None, capture_after=1, strict=False):
        if keras.backend.backend() != "torch":
            raise ValueError(
                f"CapturedTrainStep runs on the PyTorch backend. Received: KERAS_BACKEND={keras.backend.backend()!r}"
            )
        self.model = model
        self.graphs = GraphCache(
            "The PyTorch training step",
            capture_after=capture_after,
            compile=None if compiler is None else lambda graph: compile_graph(graph, compiler),
            strict=strict,
        )
        # With a compiler the optimizer's update is compiled too (a few fused kernels in
        # place of Keras' per-weight ones); run as it is, its graph would be slower than Keras'.
        self.optimizer_update = None if compiler is None else CompiledOptimizerUpdate(model, compiler, strict=strict)

    @property
    def captures(self):
        """int, how many batch shapes were captured (recaptures after a change included)."""
        return self.graphs.captures

    @property
    def capture_after(self):
        return self.graphs.capture_after

    def reset(self):
        """Drops every captured graph and the optimizer's compiled update: each is captured again.

        For Python values the graphs baked in when they were traced (a schedule's
        `total_steps`, a dropout rate); `Transformer.make_train_function(force=True)` calls it.
        """
        self.graphs.reset()
        if self.optimizer_update is not None:
            self.optimizer_update.reset()

    def __call__(self, data):
        model = self.model
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        if sample_weight is not None or y is None:
            return None  # the caller runs Keras' own step
        x, y = _as_tensors(x), _as_tensors(y)
        trainable_variables = model.trainable_variables
        variables = (trainable_variables, model.non_trainable_variables, model.metrics_variables)
        self.graphs.watch([variable for group in variables for variable in group])
        gradients = self.graphs.run(
            input_key(x, y),
            lambda: self._capture(variables, x, y),
            lambda graph: self._forward_backward(graph, variables, x, y),
        )
        if gradients is None:
            return None  # the caller runs Keras' own step
        gradients, logs = gradients
        if self.optimizer_update is None or not self.optimizer_update(gradients, trainable_variables):
            with torch.no_grad():
                model.optimizer.apply(gradients, trainable_variables)
        return logs

    def _capture(self, variables, x, y):
        return capture(_ForwardLossMetrics(self.model), (*map(internals.variable_tensors, variables), x, y))

    def _forward_backward(self, graph, variables, x, y):
        """Runs `graph` and the backward pass; writes the new non-trainable and metric values last.

        Last, so that a graph whose first run fails (a compilation, which is lazy, or the
        backward pass) has written nothing, and Keras' step can take the batch instead.
        """
        self.model.zero_grad()
        trainable, non_trainable, metrics = map(internals.variable_tensors, variables)
        loss, logs, new_non_trainable, new_metrics = graph(trainable, non_trainable, metrics, x, y)
        sync = self.gradient_sync
        if sync is not None:  # several processes: the all-reduce opens before backward, closes after
            sync.before_backward(y, loss, metrics, new_metrics)
        self.model.optimizer.scale_loss(loss).backward()
        if sync is not None:
            new_metrics = sync.after_backward(metrics, new_metrics)
        with torch.no_grad():
            for tensor, value in zip(non_trainable + metrics, new_non_trainable + new_metrics):
                if value is not tensor:
                    tensor.copy_(value)
        return [tensor.grad for tensor in trainable], logs

"""The Keras optimizer's update on PyTorch as one compiled, in-place kernel set.

Keras' PyTorch Adam already updates all weights with `torch._foreach_*` ops, but on a CPU
those loop over the weights in C++ one small kernel at a time (about 9 kernels a weight,
765 for the tiny model's 85 weights) after Keras' Python (`apply`'s checks, casts of the
betas and the step, the learning-rate schedule). `torch.compile` of `apply` itself breaks
its graph inside Keras, so the update is captured instead, like the forward pass
(`keras_transformer.torch_capture`): `optimizer.stateless_apply`, a pure function of the
optimizer's variables, the gradients and the weights, traced once, then compiled by
inductor with its results copied back into the same tensors. The arithmetic is Keras'
own (its epsilon placement, weight decay, `clipnorm`, the schedule), so a step gives the
weights Keras' `apply` gives, to float rounding (`tests/test_torch_step.py`);
`bench/torch_step.py --breakdown` times the two.

Optimizers whose update branches on tensor values cannot be traced and keep Keras'
`apply`: a `LossScaleOptimizer` (it skips steps with non-finite gradients), gradient
accumulation (it applies every N-th step), an EMA of the weights. So does a step in
which a weight has no gradient, and the first step (it builds the optimizer).
"""

import keras
import torch

from keras_transformer import internals
from keras_transformer.graph_cache import GraphCache
from keras_transformer.torch_capture import capture, compile_graph


def untraceable_reason(optimizer):
    """Why `optimizer`'s update cannot be captured as one graph, or None when it can."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return "a LossScaleOptimizer skips steps whose gradients are not finite"
    if optimizer.gradient_accumulation_steps:
        return "gradient accumulation applies the update every N-th step only"
    if optimizer.use_ema:
        return "the EMA of the weights is updated every N-th step only"
    return None


class _StatelessApply(torch.nn.Module):
    """`(optimizer values, gradients, weights) -> (new weights, new optimizer values)`."""

    def __init__(self, optimizer):
        super().__init__()
        self._optimizer = [optimizer]  # in a list: not a submodule, its tensors are inputs

    def forward(self, optimizer_values, gradients, trainable_values):
        return self._optimizer[0].stateless_apply(optimizer_values, gradients, trainable_values)


class CompiledOptimizerUpdate:
    """`optimizer.apply(gradients, variables)` of a model's Keras optimizer, captured and compiled.

    Call it with the gradients and the model's trainable variables, as `apply`; it
    returns True when it updated them and False when the caller must run Keras' `apply`
    (see the module docstring for when). A change of the optimizer, of its learning-rate
    schedule object or of its or the model's variables (a new `compile`, `enable_lora`)
    captures the update again, and so does `reset()`: the graph bakes in the schedule's
    Python numbers (a `BudgetSchedule`'s `total_steps`), which `StepBudgetEstimator`
    changes during `fit` before it forces a new train function. An update that cannot be
    captured or compiled warns once and runs through `apply` from then on, or with
    `strict=True` raises `graph_cache.CaptureError`.

    Args:
        model: the `keras.Model` whose `optimizer` to run.
        compiler: the `torch.compile` backend. Defaults to "inductor".
        strict: bool, see above. Defaults to False.
    """

    def __init__(self, model, compiler="inductor", strict=False):
        self.model = model
        self.compiler = compiler
        # One graph (the update takes every weight whatever the batch shape), captured
        # and compiled in one go: run uncompiled, it would be slower than Keras' `apply`.
        self.graphs = GraphCache("The optimizer's update", strict=strict)

    @property
    def captures(self):
        """int, how many times the update was captured (after each change or reset)."""
        return self.graphs.captures

    def reset(self):
        """Drops the compiled update (its graph baked in the schedule's Python values)."""
        self.graphs.reset()

    def _capture(self, optimizer, optimizer_values, gradients, trainable_values):
        with torch.no_grad():
            graph = capture(_StatelessApply(optimizer), (optimizer_values, gradients, trainable_values))

        def update(optimizer_values, gradients, trainable_values):
            new_trainable, new_optimizer = graph(optimizer_values, gradients, trainable_values)
            internals.foreach_copy(trainable_values, new_trainable)
            internals.foreach_copy(optimizer_values, new_optimizer)

        return compile_graph(update, self.compiler)

    def __call__(self, gradients, trainable_variables):
        optimizer = self.model.optimizer
        if not optimizer.built or untraceable_reason(optimizer) is not None:
            return False
        if any(gradient is None for gradient in gradients):
            return False
        # What the graph was captured for, compared by identity: the schedule object too,
        # whose Python values are traced into the graph.
        self.graphs.watch(
            (optimizer, internals.learning_rate_object(optimizer), *optimizer.variables, *trainable_variables)
        )
        trainable_values = internals.variable_tensors(trainable_variables)
        optimizer_values = internals.variable_tensors(optimizer.variables)
        arguments = (optimizer_values, gradients, trainable_values)

        def run(update):
            with torch.no_grad():  # the compilation happens at the first call, before any write
                update(*arguments)
            return True

        return bool(self.graphs.run((), lambda: self._capture(optimizer, *arguments), run))

"""`LateDropout`: dropout off for the first updates of a run, on for the rest.

Liu et al. (2023, "Dropout Reduces Underfitting") call this late dropout: dropout
regularizes a model that has begun to overfit, and before that it only slows learning.
A wall-clock budget makes the trade-off concrete. On Multi30k the attention and
activation dropouts (tensor2tensor's) leave a model behind in validation loss, step for
step, for the first ~12 epochs and ahead after them, and on a 2-core CPU they also cost
9-17% a step (attention leaves the fused kernel for the explicit einsum path). A machine
that reads 22 epochs in 45 minutes gains from them and one that reads 10 loses
(docs/benchmarks.md). Turning them on at a share of the budget's updates keeps the
early learning of a run without them and the late regularization of a run with them.

The model is built with the rates it should end with (its `TransformerConfig`); the
callback sets the chosen kinds' `keras.layers.Dropout` rates to 0 when `fit` starts and
back to the built rates at the start step. Only the Dropout sub-layers' `rate` changes,
so the layers' configs (`get_config`, `model.keras`) keep the built rates whatever step
a checkpoint or a kill happens at. Compiled steps (TensorFlow graphs, XLA, `jax.jit`)
bake a rate in, so the switch rebuilds the train function once
(`model.make_train_function(force=True)`, as `StepBudgetEstimator` does); eager PyTorch
reads the new rate anyway.

Kinds, each the Dropout sub-layers of one place in the blocks:

- `"attention"`: on the attention weights (`MultiHeadAttention`, `attention_dropout`);
- `"activation"`: after the feed-forward activation (`PositionwiseFeedForward`,
  `activation_dropout`);
- `"word"`: the `WordDropout` layers that drop whole token embeddings
  (`source_word_dropout`, `target_word_dropout`);
- `"residual"`: every other one: the paper's P_drop on each sub-layer's output and on
  the embedding sums (`dropout`).
"""

import math

import keras

from keras_transformer import checks
from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.feed_forward import PositionwiseFeedForward
from keras_transformer.layers.word_dropout import WordDropout
from keras_transformer.train.accumulation import applied_updates
from keras_transformer.train.budget_estimate import budget_schedule_of

KINDS = ("attention", "activation", "word", "residual")
# The two tensor2tensor added to the paper's residual dropout: what a budget run delays.
DEFAULT_KINDS = ("attention", "activation")
# The attribute that keeps a Dropout layer's built rate while LateDropout changes `rate`.
BUILT_RATE = "_late_dropout_built_rate"


def dropout_layers(model):
    """The `keras.layers.Dropout` sub-layers of `model`, by kind (see the module docstring).

    Returns:
        dict mapping each of `KINDS` to a list of Dropout layers (possibly empty).
    """
    # `_flatten_layers` (Keras' own walk, as `Layer.quantize` uses) reaches the layers
    # inside our blocks; `model.layers` lists the top level only.
    layers = list(model._flatten_layers(include_self=False))
    owned = {"attention": [], "activation": [], "word": []}
    for layer in layers:
        if isinstance(layer, MultiHeadAttention):
            owned["attention"].append(layer.dropout_layer)
        elif isinstance(layer, PositionwiseFeedForward) and hasattr(layer, "dropout_layer"):
            owned["activation"].append(layer.dropout_layer)
        elif isinstance(layer, WordDropout):
            owned["word"].append(layer)
    taken = {id(layer) for group in owned.values() for layer in group}
    residual = [l for l in layers if isinstance(l, keras.layers.Dropout) and id(l) not in taken]
    return {**owned, "residual": residual}


class LateDropout(keras.callbacks.Callback):
    """Keeps some of the model's dropouts off until an update, then on (late dropout).

    Args:
        start_step: int >= 0, the update from which the dropouts are on. Give this or
            `start_fraction`.
        start_fraction: float in [0, 1), the share of the run's updates trained without
            them: on from `ceil(start_fraction * total_steps)`, where `total_steps` is the
            optimizer's `BudgetSchedule`'s (read at every check, so it follows the total
            a `StepBudgetEstimator` sets from the measured step time).
        kinds: which dropouts to delay, from `("attention", "activation", "word", "residual")`;
            defaults to `("attention", "activation")`.
        print_fn: callable taking a str, for the line printed at the switch; `print`.

    Attributes:
        switched_at: the update at which the dropouts came on in the latest `fit`, or None.

    Raises:
        ValueError: a bad argument, naming it; at `fit`'s start, `start_fraction` with an
            optimizer whose learning rate is not a `BudgetSchedule`, or a model in which
            the chosen kinds have no dropout to delay (all rates 0).

    Example:

    ```python
    config = kt.TransformerConfig.from_preset("small", attention_dropout=0.1, activation_dropout=0.1)
    model = kt.build_transformer(config)
    kt.compile_transformer(model, kt.TrainingConfig(decay="cosine", total_steps=6000))
    model.fit(batches, epochs=20, callbacks=[LateDropout(start_fraction=0.5)])
    # late dropout: attention and activation dropout on from step 3,000 of 6,000
    ```
    """

    def __init__(self, start_step=None, *, start_fraction=None, kinds=DEFAULT_KINDS, print_fn=print):
        super().__init__()
        if (start_step is None) == (start_fraction is None):
            raise ValueError(
                "Give exactly one of `start_step` and `start_fraction`. Received: "
                f"start_step={start_step!r}, start_fraction={start_fraction!r}"
            )
        if start_step is not None:
            checks.check_non_negative_int("start_step", start_step)
        else:
            checks.check_rate("start_fraction", start_fraction)
        if isinstance(kinds, str) or not isinstance(kinds, (list, tuple)) or not kinds:
            raise ValueError(f"`kinds` must be a non-empty list of {KINDS}. Received: kinds={kinds!r}")
        for kind in kinds:
            checks.check_choice("kinds", kind, KINDS)
        if not callable(print_fn):
            raise ValueError(f"`print_fn` must be callable. Received: print_fn={print_fn!r}")
        self.start_step = start_step
        self.start_fraction = None if start_fraction is None else float(start_fraction)
        self.kinds = tuple(dict.fromkeys(kinds))
        self.print_fn = print_fn
        self.switched_at = None
        self._layers = []  # (Dropout layer, its built rate) for the delayed kinds
        self._schedule = None
        self._updates = None  # updates applied, counted from the first epoch's start
        self._batches = 0  # batches of this fit, to count updates without reading the model
        self._epoch_base = 0
        self._on = False

    def start(self):
        """The update from which the dropouts are on (with `start_fraction`, of the current total)."""
        if self.start_step is not None:
            return self.start_step
        return math.ceil(self.start_fraction * self._schedule.total_steps)

    # ------------------------------------------------------------ Keras' hooks
    def on_train_begin(self, logs=None):
        self.switched_at = None
        optimizer = self.model.optimizer
        inner = getattr(optimizer, "inner_optimizer", optimizer)  # through a LossScaleOptimizer
        self._accumulation = getattr(inner, "gradient_accumulation_steps", None) or 1
        self._schedule = None
        if self.start_fraction is not None:
            self._schedule, _ = budget_schedule_of(optimizer)
        found = dropout_layers(self.model)
        layers = [layer for kind in self.kinds for layer in found[kind]]
        for layer in layers:
            # Kept on the layer the first time a LateDropout sees it: a fit stopped by an
            # exception skips on_train_end, and the next fit must not take 0 for its rate.
            if not hasattr(layer, BUILT_RATE):
                setattr(layer, BUILT_RATE, layer.rate)
        self._layers = [(layer, getattr(layer, BUILT_RATE)) for layer in layers if getattr(layer, BUILT_RATE) > 0]
        if not self._layers:
            raise ValueError(
                f"LateDropout has nothing to delay: the model's {', '.join(self.kinds)} dropout "
                "rates are all 0. Build the model with the rates it should end with, e.g. "
                "TransformerConfig(attention_dropout=0.1, activation_dropout=0.1)."
            )
        self._updates = None
        self._batches = 0
        self._epoch_base = 0
        self._set(on=False)

    def on_epoch_begin(self, epoch, logs=None):
        # After every on_train_begin: BackupAndRestore has restored a resumed run's step.
        if self._updates is None:
            self._updates = applied_updates(self.model.optimizer)
            self._batches = 0
        self._epoch_base = self._batches

    def on_train_batch_begin(self, batch, logs=None):
        # Updates are counted from the batches rather than read from the optimizer: on
        # JAX reading the model's state would sync it every batch. The switch comes
        # before the batch, so the step that runs it is the rebuilt one.
        self._maybe_switch(self._updates + (self._epoch_base + batch) // self._accumulation)

    def on_train_batch_end(self, batch, logs=None):
        self._batches = self._epoch_base + batch + 1

    def on_train_end(self, logs=None):
        # The model leaves fit with the rates it was built with, switched or not.
        for layer, rate in self._layers:
            layer.rate = rate

    # --------------------------------------------------------------- internals
    def _maybe_switch(self, updates):
        if self._on or updates < self.start():
            return
        self._set(on=True)
        self.switched_at = updates
        of = f" of {self._schedule.total_steps:,}" if self._schedule is not None else ""
        self.print_fn(f"late dropout: {' and '.join(self.kinds)} dropout on from step {updates:,}{of}")

    def _set(self, on):
        for layer, rate in self._layers:
            layer.rate = rate if on else 0.0
        self._on = on
        # A compiled step holds the rates it was traced with.
        self.model.make_train_function(force=True)


__all__ = ["LateDropout", "dropout_layers", "KINDS", "DEFAULT_KINDS"]

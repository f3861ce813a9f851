"""Cross-entropy over token ids with label smoothing, ignoring padding (Vaswani et al., 2017).

The per-token helpers here are shared with `metrics.py`, so that the loss, masked
accuracy and perplexity agree on which tokens count and how labels are read.

A label outside `[0, vocab_size)` (other than the ignored padding id) is never turned
into a finite number: gathered as it is, it would read another class's log-probability
(negative labels wrap around on every backend), read garbage (PyTorch) or NaN (JAX).
Where the labels' values can be read (eager calls, PyTorch's eager `fit`) the loss
raises a `ValueError` naming the label and its position; inside compiled steps
(TensorFlow's and JAX's `fit`) it cannot raise, so its value is NaN, which
`keras.callbacks.TerminateOnNaN` (in the default callbacks) turns into a stop.
"""


import keras
from keras import ops

from keras_transformer import checks
from keras_transformer.special_tokens import PAD_ID

# Vaswani et al. (2017), section 5.4: "we employed label smoothing of value eps_ls = 0.1".
LABEL_SMOOTHING = 0.1

NAN_LOSS_HINT = (
    "A NaN loss has two usual causes: a label or token id outside [0, vocab_size) "
    "(the loss and the token embedding make it NaN on purpose inside compiled steps: "
    "was the data tokenized with another vocabulary?), or a diverging run (lower the "
    "learning rate or raise warmup_steps)."
)
"""What to print when training stops on a NaN loss (see the module docstring)."""


def sparse_labels(y_true, logits):
    """Integer labels shaped like `logits` without its class axis.

    Accepts `[B, T]` or `[B, T, 1]` labels of any numeric dtype (Keras hands
    `y_true` to losses as floats); returns `[B, T]` int32.

    Args:
        y_true: tensor of token ids, `[B, T]` or `[B, T, 1]`.
        logits: tensor `[B, T, V]`.

    Example:

    ```python
    sparse_labels(np.array([[[5.0], [0.0]]]), np.zeros((1, 2, 32)))  # [[5, 0]] int32
    ```
    """
    y_true = ops.convert_to_tensor(y_true)
    if len(y_true.shape) == len(logits.shape) and y_true.shape[-1] == 1:
        y_true = ops.squeeze(y_true, axis=-1)
    return ops.cast(y_true, "int32")


def out_of_range_labels(labels, num_classes, ignore_id=PAD_ID):
    """Bool `[B, T]`: True where a label is outside `[0, num_classes)` and is not `ignore_id`.

    Example:

    ```python
    out_of_range_labels(np.array([[4, 0, 32, -1]]), 32)  # [[False, False, True, True]]
    ```
    """
    outside = ops.logical_or(ops.less(labels, 0), ops.greater_equal(labels, num_classes))
    if ignore_id is None:
        return outside
    return ops.logical_and(outside, ops.not_equal(labels, ignore_id))


def token_weights(labels, ignore_id=PAD_ID, sample_weight=None):
    """Float32 weight of each token: 0 where `labels == ignore_id`, else the sample weight.

    `sample_weight` may be per example (`[B]`), per token (`[B, T]`) or `[B, T, 1]`;
    it is broadcast over the tokens of each example. Without it, real tokens weigh 1.

    Args:
        labels: int tensor `[B, T]` (see `sparse_labels`).
        ignore_id: int or None, the label id to ignore. Defaults to `PAD_ID` (0);
            None ignores nothing.
        sample_weight: optional tensor, `[B]`, `[B, T]` or `[B, T, 1]`.

    Example:

    ```python
    token_weights(np.array([[4, 7, 0]]))  # [[1., 1., 0.]]
    ```
    """
    if ignore_id is None:
        weights = ops.ones_like(labels, dtype="float32")
    else:
        weights = ops.cast(ops.not_equal(labels, ignore_id), "float32")
    if sample_weight is None:
        return weights
    sample_weight = ops.cast(ops.convert_to_tensor(sample_weight), "float32")
    rank = len(labels.shape)
    if len(sample_weight.shape) == rank + 1 and sample_weight.shape[-1] == 1:
        sample_weight = ops.squeeze(sample_weight, axis=-1)
    while len(sample_weight.shape) < rank:
        sample_weight = ops.expand_dims(sample_weight, axis=-1)
    return weights * sample_weight


def token_cross_entropy(labels, logits, label_smoothing=0.0, ignore_id=PAD_ID, *, differentiated=True):
    """Per-token cross-entropy from logits, with uniform label smoothing, in float32.

    The target distribution is `(1 - eps) * onehot(label) + eps / V` (the convention
    of `keras.losses.CategoricalCrossentropy(label_smoothing=...)` and PyTorch's
    `label_smoothing`), so each token's loss is
    `-(1 - eps) * log_p[label] - eps * mean_over_vocab(log_p)`. Logits are cast to
    float32 first, so float16 and bfloat16 models get a float32 loss. Ignored positions
    hold exactly 0, whatever their logits; a label outside `[0, V)` that is not
    `ignore_id` gives NaN, so that a wrong label can never pass for a finite loss, even
    where it cannot be checked.

    How the label term is read depends on the backend (the values agree to float32
    rounding): JAX and PyTorch gather it with `take_along_axis`, so no `[B, T, V]`
    target is built. On TensorFlow, where the loss is differentiated, it is the sum of
    `log_p` times the dense target distribution: the gradient of a gather there is a
    scatter (`UnsortedSegmentSum`) that cost more than the rest of the loss, and a dense
    product's gradient is a product (gathering is the faster choice on JAX and PyTorch;
    docs/benchmarks.md, "Training throughput", has what the product saves TensorFlow's
    training step).

    Args:
        labels: int tensor `[B, T]` (see `sparse_labels`).
        logits: float tensor `[B, T, V]`, unnormalised scores.
        label_smoothing: float in [0, 1), `eps` above. Defaults to 0.0.
        ignore_id: int or None, label id whose positions get loss 0. Defaults to
            `PAD_ID` (0).
        differentiated: bool, whether a gradient will be taken (the loss); False (a
            metric) gathers on every backend, the cheaper forward pass. Defaults to True.

    Returns:
        float32 tensor `[B, T]`.

    Example:

    ```python
    token_cross_entropy(np.array([[1, 0]]), np.zeros((1, 2, 4)))  # [[log 4, 0.]]
    ```
    """
    labels = sparse_labels(labels, logits)
    log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
    return _token_cross_entropy_from_log_probs(
        labels, log_probs, label_smoothing, ignore_id, differentiated=differentiated
    )


def _token_cross_entropy_from_log_probs(labels, log_probs, label_smoothing, ignore_id, *, differentiated):
    """`token_cross_entropy` from float32 log-probabilities `[B, T, V]`; `labels` int `[B, T]`."""
    if ignore_id is None:
        is_real = ops.ones_like(labels, dtype="bool")
    else:
        is_real = ops.not_equal(labels, ignore_id)
    # The ignore id need not be a valid index (e.g. -100), and a bad label is no index
    # at all: gather class 0 at both, and put NaN at the bad labels below.
    invalid = out_of_range_labels(labels, _num_classes(log_probs), ignore_id)
    safe_labels = ops.where(ops.logical_and(is_real, ops.logical_not(invalid)), labels, 0)
    dense = differentiated and keras.backend.backend() == "tensorflow"
    losses = smoothed_label_loss(log_probs, safe_labels, label_smoothing, dense=dense)
    losses = ops.where(invalid, float("nan"), losses)
    # `where`, not a product, so inf/NaN logits at padding cannot leak into the loss.
    return ops.where(is_real, losses, 0.0)


def smoothed_label_loss(log_probs, labels, label_smoothing, dense=False):
    """`-(1 - eps) * log_p[label] - eps * mean_over_vocab(log_p)` for valid `labels`.

    `dense=False` gathers `log_p[label]` with `take_along_axis`; `dense=True` sums
    `log_p` times the target distribution `(1 - eps) * onehot(label) + eps / V`, whose
    gradient is a product rather than a scatter (`token_cross_entropy` says which
    backend uses which; `bench/loss_speed.py` times both).

    Args:
        log_probs: float tensor `[B, T, V]`.
        labels: int tensor `[B, T]`, every value in `[0, V)`.
        label_smoothing: float in [0, 1).
        dense: bool. Defaults to False.

    Returns:
        float tensor `[B, T]`.
    """
    if dense:
        num_classes = _num_classes(log_probs)
        targets = ops.one_hot(labels, num_classes, dtype=log_probs.dtype) * (1.0 - label_smoothing)
        if label_smoothing:
            targets = targets + label_smoothing / ops.cast(num_classes, log_probs.dtype)
        return -ops.sum(log_probs * targets, axis=-1)
    losses = -ops.squeeze(ops.take_along_axis(log_probs, ops.expand_dims(labels, axis=-1), axis=-1), axis=-1)
    if label_smoothing:
        losses = (1.0 - label_smoothing) * losses - label_smoothing * ops.mean(log_probs, axis=-1)
    return losses


def _num_classes(logits):
    """V of `[B, T, V]` logits: the static size when known, else a tensor."""
    size = logits.shape[-1]
    return size if size is not None else ops.shape(logits)[-1]


def check_labels(y_true, logits, ignore_id=PAD_ID, name="y_true"):
    """Raises ValueError naming the first label outside `[0, V)` (not `ignore_id`), when it can.

    Only concrete values are checked (eager calls, PyTorch's eager training step);
    traced ones (compiled `fit`) are left to the NaN of `token_cross_entropy`.
    """
    if checks.is_concrete(y_true) and logits.shape[-1] is not None:
        checks.check_ids_in_range(
            name, ops.convert_to_numpy(y_true), logits.shape[-1], ignore_id=ignore_id
        )


@keras.saving.register_keras_serializable(package="keras_transformer")
class LabelSmoothedCrossEntropy(keras.losses.Loss):
    """Sparse cross-entropy from logits with label smoothing, averaged over real tokens.

    Each token's loss is `-(1 - eps) * log_p[label] - eps * mean_over_vocab(log_p)`
    (see `token_cross_entropy`, also for how each backend reads the label). Tokens whose
    label is `ignore_id` (padding) are left out, and the batch loss is the sum of the
    real tokens' losses divided by the number of real tokens (a token-level mean, not
    Keras' mean over all `B * T` positions); a batch with no real token gives 0.
    `sample_weight` (`[B]` or `[B, T]`) scales each token's loss but does not change
    the divisor, as in Keras' own losses. Padding is read from the labels; a Keras mask
    on the predictions is not used. Computed in float32 whatever the logits' dtype.
    A label outside `[0, V)` that is not `ignore_id` raises `ValueError` where the
    labels can be read (eager calls, PyTorch's `fit`) and makes the loss NaN inside
    compiled steps (TensorFlow's and JAX's `fit`), never a finite wrong number.
    Under `tf.distribute`, each replica returns its sum over the real-token count of
    all replicas (all-reduced), so the replicas' summed gradients are those of the mean
    over every real token of the step, as on one device.
    `call(y_true, y_pred)` returns the per-token losses `[B, T]` (0 at padding).

    Args:
        label_smoothing: float in [0, 1), `eps` above. Defaults to 0.1 (the paper).
        ignore_id: int or None, label id that marks padding. Defaults to `PAD_ID` (0);
            None averages over every position.
        name: str, name of the loss. Defaults to "label_smoothed_cross_entropy".

    Example:

    ```python
    model.compile(
        optimizer=keras.optimizers.Adam(TransformerSchedule(512)),
        loss=LabelSmoothedCrossEntropy(),  # labels [B, T] int, logits [B, T, V]
    )
    ```

    References:
        Vaswani et al., "Attention Is All You Need", NeurIPS 2017, section 5.4.
        Szegedy et al., "Rethinking the Inception Architecture", CVPR 2016, section 7.
    """

    def __init__(
        self,
        label_smoothing=LABEL_SMOOTHING,
        ignore_id=PAD_ID,
        name="label_smoothed_cross_entropy",
    ):
        super().__init__(name=name)
        checks.check_rate("label_smoothing", label_smoothing)
        check_ignore_id(ignore_id)
        self.label_smoothing = float(label_smoothing)
        self.ignore_id = None if ignore_id is None else int(ignore_id)

    def __call__(self, y_true, y_pred, sample_weight=None):
        # Keras' reductions divide by B * T (or by the sum of weights); the paper's
        # loss is a mean over real tokens, so the reduction is done here instead.
        with keras.name_scope(self.name):
            y_pred = ops.convert_to_tensor(y_pred)
            labels = sparse_labels(y_true, y_pred)
            check_labels(labels, y_pred, self.ignore_id)
            losses = self.call(labels, y_pred)
            weights = token_weights(labels, self.ignore_id, sample_weight)
            num_real = ops.sum(token_weights(labels, self.ignore_id))
            # max(., 1) rather than divide_no_nan: an all-padding batch sums to 0, so its
            # loss is 0, and no 0/0 is computed even in a discarded `where` branch, whose
            # gradient could be NaN.
            loss = ops.sum(losses * weights) / ops.maximum(num_real, 1.0)
            return _scale_loss_for_distribution(loss, num_real)

    def call(self, y_true, y_pred):
        return token_cross_entropy(
            y_true, y_pred, self.label_smoothing, self.ignore_id
        )

    def get_config(self):
        return {
            "name": self.name,
            "label_smoothing": self.label_smoothing,
            "ignore_id": self.ignore_id,
        }


def _scale_loss_for_distribution(loss, num_real):
    """Under `tf.distribute`, this replica's share of the mean over the step's real tokens.

    `loss` averages over this replica's `num_real` tokens; the distribution code turns
    it into `sum / (real tokens on all replicas)`, so the replicas' summed gradients
    are those of the whole batch on one device (see
    `keras_transformer.distribute.replica_share_of_global_mean`). `loss` itself elsewhere.
    """
    from keras_transformer import distribute

    return distribute.replica_share_of_global_mean(loss, num_real)


def check_ignore_id(ignore_id):
    """Raise ValueError unless `ignore_id` is an integer or None (shared with metrics)."""
    if ignore_id is not None and not checks.is_int(ignore_id):
        raise ValueError(
            f"`ignore_id` must be an integer or None. Received: ignore_id={ignore_id!r}"
        )

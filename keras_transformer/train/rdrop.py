"""R-Drop: each batch read twice under different dropout, the two predictions pulled together.

Liang et al. (2021) run every training example through the model twice; dropout makes
the two forward passes two different sub-models, and the loss adds to both passes'
cross-entropy the symmetric KL divergence between their next-token distributions. A
regularizer for corpora the model can memorise (their IWSLT'14 de->en: +2.6 BLEU).

Here the two passes are one forward pass over a batch holding every example twice: the
data side (`keras_transformer.data.duplication.duplicate_batches`) concatenates each
batch with itself, the first half is the first pass and the second half the second.
`RDropCrossEntropy` reads them so. The loss is fairseq's R-Drop criterion
(`label_smoothed_cross_entropy_with_rdrop`), normalised by the real tokens of the whole
doubled batch, so `alpha` means what it means there (5 in their IWSLT setting):

    loss = [sum over both halves of CE + alpha * sum over pairs of (KL(p1||p2) + KL(p2||p1)) / 2]
           / real tokens of both halves

Without dropout (evaluation) the two halves are the same, the KL term is 0 and the loss
is the label-smoothed cross-entropy of `LabelSmoothedCrossEntropy`.

A batch that is not two equal halves would pull unrelated sentences together, so it is
refused: where the labels can be read (eager calls, PyTorch's `fit`) with a
`ValueError`; inside compiled steps, where nothing can raise, the loss is NaN (and
`keras.callbacks.TerminateOnNaN` stops the run), as for a label outside the vocabulary.
"""

import keras
from keras import ops

from keras_transformer import checks
from keras_transformer.special_tokens import PAD_ID
from keras_transformer.train.losses import (
    LABEL_SMOOTHING,
    LabelSmoothedCrossEntropy,
    _scale_loss_for_distribution,
    check_labels,
    sparse_labels,
    token_cross_entropy_from_log_probs,
    token_weights,
)


def symmetric_kl(logits_a, logits_b):
    """`KL(p_a || p_b) + KL(p_b || p_a)` per position, in float32: `sum_v (p_a - p_b)(log p_a - log p_b)`.

    Args:
        logits_a: float tensor `[..., V]`.
        logits_b: float tensor `[..., V]`, the same shape.

    Returns:
        float32 tensor `[...]`, >= 0.

    Example:

    ```python
    symmetric_kl(np.log([[0.5, 0.5]]), np.log([[0.9, 0.1]]))  # [0.4 * log 9] = [0.879]
    ```
    """
    log_a = ops.log_softmax(ops.cast(logits_a, "float32"), axis=-1)
    log_b = ops.log_softmax(ops.cast(logits_b, "float32"), axis=-1)
    return symmetric_kl_from_log_probs(log_a, log_b)


def symmetric_kl_from_log_probs(log_a, log_b):
    """`symmetric_kl` from log-probabilities already computed."""
    return ops.sum((ops.exp(log_a) - ops.exp(log_b)) * (log_a - log_b), axis=-1)


def halves(x):
    """The first and second half of `x` along the batch axis (an odd batch's last row left out)."""
    half = ops.shape(x)[0] // 2
    return x[:half], x[half : 2 * half]


@keras.saving.register_keras_serializable(package="keras_transformer")
class RDropCrossEntropy(LabelSmoothedCrossEntropy):
    """Label-smoothed cross-entropy plus R-Drop's symmetric KL between a batch's two halves.

    Expects batches holding every example twice, the copies in the two halves (see the
    module docstring and `keras_transformer.data.duplication.duplicate_batches`); the
    labels of the halves must be equal. Padding is ignored as in
    `LabelSmoothedCrossEntropy`; `sample_weight` scales the cross-entropy of each token
    (not the KL term). `call(y_true, y_pred)` returns the per-token cross-entropy
    `[B, T]`, as the parent's does.

    Args:
        alpha: float > 0, the KL term's weight (R-Drop's alpha, fairseq's
            `--reg-alpha`). Defaults to 5.0 (their IWSLT'14 setting).
        label_smoothing: float in [0, 1). Defaults to 0.1 (the paper).
        ignore_id: int or None, the padding label. Defaults to `PAD_ID` (0).
        name: str. Defaults to "rdrop_cross_entropy".

    Example:

    ```python
    model.compile(optimizer="adam", loss=RDropCrossEntropy(alpha=5.0))
    model.fit(duplicate_batches(dataset))  # each batch concatenated with itself
    ```

    References:
        Liang et al., "R-Drop: Regularized Dropout for Neural Networks", NeurIPS 2021.
    """

    def __init__(self, alpha=5.0, label_smoothing=LABEL_SMOOTHING, ignore_id=PAD_ID, name="rdrop_cross_entropy"):
        super().__init__(label_smoothing=label_smoothing, ignore_id=ignore_id, name=name)
        checks.check_positive_number("alpha", alpha)
        self.alpha = float(alpha)

    def __call__(self, y_true, y_pred, sample_weight=None):
        with keras.name_scope(self.name):
            y_pred = ops.convert_to_tensor(y_pred)
            labels = sparse_labels(y_true, y_pred)
            check_labels(labels, y_pred, self.ignore_id)
            _check_twin_halves(labels)
            # One log-softmax for both terms (the cross-entropy's and the KL's).
            log_probs = ops.log_softmax(ops.cast(y_pred, "float32"), axis=-1)
            cross_entropy = token_cross_entropy_from_log_probs(
                labels, log_probs, self.label_smoothing, self.ignore_id
            )
            weights = token_weights(labels, self.ignore_id, sample_weight)
            num_real = ops.sum(token_weights(labels, self.ignore_id))
            first, second = halves(log_probs)
            first_labels, second_labels = halves(labels)
            # Pairs count where the first copy's token is real (the copies' labels match).
            pair_weights = token_weights(first_labels, self.ignore_id)
            kl = ops.where(ops.cast(pair_weights, "bool"), symmetric_kl_from_log_probs(first, second), 0.0)
            total = ops.sum(cross_entropy * weights) + self.alpha * ops.sum(kl) / 2.0
            # Halves that differ (or an odd batch) would pair unrelated sentences: NaN
            # where a compiled step cannot raise (see the module docstring).
            same = ops.logical_and(
                ops.equal(ops.shape(labels)[0] % 2, 0),
                ops.all(ops.equal(first_labels, second_labels)),
            )
            loss = ops.where(same, total / ops.maximum(num_real, 1.0), float("nan"))
            return _scale_loss_for_distribution(loss, num_real)

    def get_config(self):
        return {**super().get_config(), "alpha": self.alpha}


def _check_twin_halves(labels):
    """Raises ValueError when concrete labels are not two equal halves."""
    if not checks.is_concrete(labels):
        return
    values = ops.convert_to_numpy(labels)
    half = values.shape[0] // 2
    if values.shape[0] % 2 or (values[:half] != values[half:]).any():
        raise ValueError(
            "RDropCrossEntropy expects each batch to hold every example twice, the copies in "
            "its two halves (keras_transformer.data.duplication.duplicate_batches): the "
            f"labels' halves differ. Received: labels of shape {tuple(values.shape)}"
            + (" (an odd batch size)" if values.shape[0] % 2 else "")
        )


__all__ = ["RDropCrossEntropy", "symmetric_kl"]

"""Token accuracy and perplexity over non-padding labels, accumulated across batches.

As with the loss, a label outside `[0, vocab_size)` other than the ignored id is never
counted as a plain miss: it makes the metric NaN (until `reset_state`), so a batch
of wrong labels cannot pass for a low accuracy.
"""

import keras
from keras import ops

from keras_transformer.train.losses import check_ignore_id
from keras_transformer.train.losses import out_of_range_labels
from keras_transformer.train.losses import sparse_labels
from keras_transformer.train.losses import token_cross_entropy
from keras_transformer.train.losses import token_weights
from keras_transformer.special_tokens import PAD_ID


class _TokenMean(keras.metrics.Metric):
    """Weighted mean of a per-token value over real tokens, summed across batches.

    Holds a weighted total and a token count, so that a batch with many tokens counts
    for more than a short one (a mean of batch means would not). Subclasses give
    `_token_values(labels, y_pred)` -> float32 `[B, T]`.
    """

    def __init__(self, ignore_id=PAD_ID, name=None, dtype=None):
        super().__init__(name=name, dtype=dtype)
        check_ignore_id(ignore_id)
        self.ignore_id = None if ignore_id is None else int(ignore_id)
        self.total = self.add_variable(shape=(), initializer="zeros", name="total")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_pred = ops.convert_to_tensor(y_pred)
        labels = sparse_labels(y_true, y_pred)
        values = self._token_values(labels, y_pred)
        invalid = out_of_range_labels(labels, ops.shape(y_pred)[-1], self.ignore_id)
        values = ops.where(invalid, float("nan"), values)
        weights = token_weights(labels, self.ignore_id, sample_weight)
        self.total.assign_add(ops.cast(ops.sum(values * weights), self.dtype))
        self.count.assign_add(ops.cast(ops.sum(weights), self.dtype))

    def _token_values(self, labels, y_pred):
        raise NotImplementedError

    def _mean(self):
        return ops.divide_no_nan(self.total, self.count)

    def get_config(self):
        return {**super().get_config(), "ignore_id": self.ignore_id}


@keras.saving.register_keras_serializable(package="keras_transformer")
class MaskedAccuracy(_TokenMean):
    """Fraction of real (non-padding) tokens whose arg-max logit is the label.

    Positions whose label is `ignore_id` are left out; the result is the number of
    correct real tokens over the number of real tokens seen since the last reset
    (0 before any real token). `sample_weight` (`[B]` or `[B, T]`) weighs tokens, and
    the result is then the weighted mean.

    Args:
        ignore_id: int or None, label id that marks padding. Defaults to `PAD_ID` (0).
        name: str. Defaults to "masked_accuracy".
        dtype: dtype of the accumulators. Defaults to `keras.backend.floatx()`.

    Example:

    ```python
    metric = MaskedAccuracy()
    metric.update_state([[3, 0]], [[[0.0, 0.0, 0.0, 1.0], [9.0, 0.0, 0.0, 0.0]]])
    float(metric.result())  # 1.0: the padded position is not counted
    ```
    """

    def __init__(self, ignore_id=PAD_ID, name="masked_accuracy", dtype=None):
        super().__init__(ignore_id=ignore_id, name=name, dtype=dtype)

    def _token_values(self, labels, y_pred):
        predictions = ops.cast(ops.argmax(y_pred, axis=-1), "int32")
        return ops.cast(ops.equal(predictions, labels), "float32")

    def result(self):
        return self._mean()


@keras.saving.register_keras_serializable(package="keras_transformer")
class Perplexity(_TokenMean):
    """Exponential of the mean cross-entropy (no label smoothing) over real tokens.

    Accumulates the total negative log-likelihood and the number of real tokens
    across batches and returns `exp(total_nll / total_tokens)`, the per-token
    perplexity of the whole set seen since the last reset (1 before any real token).
    Label smoothing is never applied here, so the number is comparable across runs
    that smooth differently. Computed in float32 from logits.

    Args:
        ignore_id: int or None, label id that marks padding. Defaults to `PAD_ID` (0).
        name: str. Defaults to "perplexity".
        dtype: dtype of the accumulators. Defaults to `keras.backend.floatx()`.

    Example:

    ```python
    metric = Perplexity()
    metric.update_state([[3, 0]], np.zeros((1, 2, 32)))  # uniform over 32 classes
    float(metric.result())  # 32.0
    ```
    """

    def __init__(self, ignore_id=PAD_ID, name="perplexity", dtype=None):
        super().__init__(ignore_id=ignore_id, name=name, dtype=dtype)

    def _token_values(self, labels, y_pred):
        return token_cross_entropy(labels, y_pred, ignore_id=self.ignore_id, differentiated=False)

    def result(self):
        return ops.exp(self._mean())

"""Word dropout: drop whole token embeddings while training (Marian's `--dropout-src/-trg`)."""

import keras

from keras_transformer.checks import check_rate


@keras.saving.register_keras_serializable(package="keras_transformer")
class WordDropout(keras.layers.Dropout):
    """Zeroes each token's whole embedding with probability `rate` while training.

    Ordinary dropout drops single channels; word dropout drops every channel of a
    token at once (noise shape `[B, T, 1]`), so the model sees the sentence with some
    words missing and must lean on their context. It is the word dropout of Gal and
    Ghahramani (2016) and Sennrich and Zhang (2019, a regularizer for low-resource
    NMT), and Marian's `--dropout-src` / `--dropout-trg`. Kept embeddings are scaled
    by `1 / (1 - rate)`, as Keras' `Dropout` does, so inference needs no rescaling.
    In a Transformer it applies to the scaled token embeddings, before the position
    encoding is added: a dropped word keeps its position.

    Args:
        rate: float in [0, 1), the probability of dropping a token's embedding.
        seed: int or None, the seed of the drops.

    Call arguments:
        inputs: embeddings `[B, T, D]`.
        training: bool. Drops only when true; otherwise returns `inputs`.

    Example:
    >>> layer = WordDropout(0.5, seed=1)
    >>> x = keras.ops.ones((1, 4, 3))
    >>> keras.ops.convert_to_numpy(layer(x, training=True))[0].tolist()  # 4 tokens, kept whole or dropped whole
    [[2.0, 2.0, 2.0], [0.0, 0.0, 0.0], [2.0, 2.0, 2.0], [0.0, 0.0, 0.0]]
    """

    def __init__(self, rate, seed=None, **kwargs):
        check_rate("rate", rate)
        kwargs.pop("noise_shape", None)  # fixed by the layer; present in Dropout's config
        super().__init__(rate, noise_shape=(None, None, 1), seed=seed, **kwargs)

    def call(self, inputs, training=False):
        # Checked here: Keras' Dropout is built when made, so `build` never sees a shape.
        if len(inputs.shape) != 3:
            raise ValueError(
                "WordDropout expects token embeddings of shape [batch, time, width]. "
                f"Received: shape={tuple(inputs.shape)}"
            )
        return super().call(inputs, training=training)


__all__ = ["WordDropout"]

"""Word dropout: drop whole token embeddings while training (Marian's `--dropout-src/-trg`)."""

import keras
from keras import ops

from keras_transformer.checks import check_rate

# lowbias32, a 32-bit integer hash (Chris Wellons, "Prospecting for hash functions"): two
# multiply-xorshift rounds, every output bit depending on every input bit. Its second
# multiplier, 0x846ca68b, written as the int32 of the same bits.
_HASH_MULTIPLIERS = (0x7FEB352D, 0x846CA68B - (1 << 32))
_HASH_SHIFTS = (16, 15, 16)
_UNIFORM_BITS = 24  # a float32 holds 24-bit integers exactly: draws are multiples of 2^-24


def _logical_right_shift(x, bits):
    """`x >>> bits` for int32 `x` (the arithmetic shift's sign bits masked off)."""
    return ops.bitwise_and(ops.right_shift(x, bits), (1 << (32 - bits)) - 1)


def _hash32(x):
    """lowbias32 of int32 `x`, in wrapping int32 arithmetic (as every backend computes it)."""
    for shift, multiplier in zip(_HASH_SHIFTS, _HASH_MULTIPLIERS + (None,)):
        x = ops.bitwise_xor(x, _logical_right_shift(x, shift))
        if multiplier is not None:
            x = ops.multiply(x, multiplier)
    return x


def token_uniform(batch_size, length, seed):
    """Uniform draws in [0, 1), float32 `[B, T, 1]`: one per token, a hash of its index and `seed`.

    `seed`: int `[2]`, a `SeedGenerator`'s state (`next()`). Counter-based: each draw is
    a pure function of the token's index and the seed, computed in `keras.ops` int32
    arithmetic, so it is the same on every backend and traceable where Keras' seeded
    random ops are not (on PyTorch they seed a `torch.Generator` from the state's value,
    read on the host, which `torch.export` cannot trace).
    """
    seed = ops.cast(seed, "int32")
    key = _hash32(ops.bitwise_xor(_hash32(seed[1]), seed[0]))  # distinct for each counter value
    index = ops.reshape(ops.arange(batch_size * length, dtype="int32"), (batch_size, length, 1))
    bits = _hash32(ops.bitwise_xor(_hash32(ops.add(index, key)), key))
    top = _logical_right_shift(bits, 32 - _UNIFORM_BITS)
    return ops.cast(top, "float32") * (1.0 / (1 << _UNIFORM_BITS))


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

    The drops are seeded by the layer's `SeedGenerator`, whose state advances each
    call, but drawn by `token_uniform` rather than `keras.random`: the same drops on
    every backend for the same seed, and a layer that PyTorch's captured training step
    can trace.

    Args:
        rate: float in [0, 1), the probability of dropping a token's embedding.
        seed: int or None, the seed of the drops.

    Call arguments:
        inputs: embeddings `[B, T, D]`.
        training: bool. Drops only when true; otherwise returns `inputs`.

    Example:
    >>> layer = WordDropout(0.5, seed=3)
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
        if not training or self.rate == 0:
            return inputs
        keep = 1.0 - self.rate
        batch_size, length = ops.shape(inputs)[0], ops.shape(inputs)[1]
        kept = token_uniform(batch_size, length, self.seed_generator.next()) < keep
        return ops.where(kept, inputs / keep, ops.zeros_like(inputs))


__all__ = ["WordDropout"]

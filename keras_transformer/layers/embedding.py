"""Token embeddings (tied with the output projection) and position encodings."""

import math

import keras
from keras import ops

from keras_transformer.checks import check_bool, check_positive_int
from keras_transformer.layers.initializers import clone_initializer
from keras_transformer.layers.scale_norm import unit_vectors

# Positions use wavelengths up to 10000 * 2 pi (Vaswani et al., 2017, 3.5).
SINUSOID_BASE = 10000.0
# FixNorm's floor under a row's norm: a row of zeros stays zero rather than becoming NaN.
FIX_NORM_EPSILON = 1e-12


@keras.saving.register_keras_serializable(package="keras_transformer")
class TokenEmbedding(keras.layers.Layer):
    """Learned token embeddings multiplied by `sqrt(d_model)` (Vaswani et al., 2017, 3.4).

    With `reverse=True` the layer maps hidden states back to vocabulary logits with the
    same matrix, `logits = x E^T`: the paper shares one matrix between the source and
    target embeddings and the pre-softmax projection. Logits are returned in float32
    whatever the compute dtype, so softmax and loss stay accurate under mixed precision.

    The default initializer, normal with stddev `d_model^-0.5`, makes the scaled
    embeddings unit-variance (as tensor2tensor does) and keeps tied logits of order one.

    An id outside `[0, vocab_size)` embeds as NaN, on every backend. Left to the
    backends, a negative id would wrap around to the end of the table everywhere and a
    too-large one would raise (TensorFlow on CPU), read zeros (TensorFlow on GPU) or
    NaN (JAX): inside compiled `fit` and `predict`, where ids cannot be checked, a bad
    id must be loud, never another token's embedding. Eager calls of the model refuse
    such ids before they get here.

    With `fix_norm=True` every row of the matrix is used at unit length, in both directions
    (FixNorm: Nguyen and Chiang, 2018; with ScaleNorm in Nguyen and Salazar, 2019): an
    embedding is `sqrt(d_model) * e / ||e||`, and the tied logits `x (E / ||E||)^T` are the
    cosines of `x` with each word, times `||x||`, so that rare words' shorter vectors do not
    lose to frequent words' longer ones. Not in the paper.

    With `output_bias=True` the reverse projection adds a learned bias, `x E^T + b`
    (`b` of shape `[vocab_size]`, zeros at first): not in the paper, but pretrained
    models such as Marian / OPUS-MT have one ("final_logits_bias").

    Args:
        vocab_size: int. Number of tokens.
        d_model: int. Embedding width.
        embeddings_initializer: initializer of the matrix. Defaults to
            `RandomNormal(stddev=d_model**-0.5)`.
        scale: bool. Multiply by `sqrt(d_model)`. Defaults to True (the paper).
        output_bias: bool. Add a bias to the logits of `reverse=True`. Defaults to
            False (the paper).
        fix_norm: bool. Use every row at unit length (FixNorm). Defaults to False (the
            paper).

    Call arguments:
        inputs: int ids `[B, T]`, or hidden states `[B, T, d_model]` with `reverse=True`.
        reverse: bool. Project hidden states to logits `[B, T, vocab_size]`.

    Example:
    >>> emb = TokenEmbedding(vocab_size=32, d_model=8)
    >>> x = emb(keras.ops.array([[4, 5, 0]]))
    >>> tuple(emb(x, reverse=True).shape)
    (1, 3, 32)
    """

    def __init__(
        self,
        vocab_size,
        d_model,
        embeddings_initializer=None,
        scale=True,
        output_bias=False,
        fix_norm=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("vocab_size", vocab_size)
        check_positive_int("d_model", d_model)
        check_bool("scale", scale)
        check_bool("output_bias", output_bias)
        check_bool("fix_norm", fix_norm)
        if embeddings_initializer is None:
            embeddings_initializer = keras.initializers.RandomNormal(stddev=d_model**-0.5)
        self.vocab_size = vocab_size
        self.d_model = d_model
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        self.scale = scale
        self.output_bias = output_bias
        self.fix_norm = fix_norm

    def build(self, inputs_shape=None):
        self.embeddings = self.add_weight(
            name="embeddings",
            shape=(self.vocab_size, self.d_model),
            initializer=clone_initializer(self.embeddings_initializer),
        )
        # Made after the matrix, and only when asked: models without it keep their weights.
        self.logits_bias = None
        if self.output_bias:
            self.logits_bias = self.add_weight(name="output_bias", shape=(self.vocab_size,), initializer="zeros")
        self.built = True

    def call(self, inputs, reverse=False):
        if reverse:
            kernel = unit_vectors(self.embeddings, FIX_NORM_EPSILON) if self.fix_norm else self.embeddings
            kernel = ops.cast(kernel, inputs.dtype)
            logits = ops.cast(ops.matmul(inputs, ops.transpose(kernel)), "float32")
            if self.logits_bias is not None:
                logits = logits + ops.cast(self.logits_bias, "float32")  # added in float32, as the loss reads it
            return logits
        ids = ops.cast(inputs, "int32")
        in_range = ops.logical_and(ops.greater_equal(ids, 0), ops.less(ids, self.vocab_size))
        outputs = ops.take(self.embeddings, ops.where(in_range, ids, 0), axis=0)
        if self.fix_norm:
            outputs = unit_vectors(outputs, FIX_NORM_EPSILON)
        outputs = ops.where(ops.expand_dims(in_range, -1), outputs, float("nan"))
        outputs = ops.cast(outputs, self.compute_dtype)
        if self.scale:
            outputs = outputs * ops.cast(math.sqrt(self.d_model), self.compute_dtype)
        return outputs

    def compute_output_shape(self, inputs_shape, reverse=False):
        if reverse:
            return tuple(inputs_shape[:-1]) + (self.vocab_size,)
        return tuple(inputs_shape) + (self.d_model,)

    def compute_output_spec(self, inputs, reverse=False):
        shape = self.compute_output_shape(inputs.shape, reverse=reverse)
        dtype = "float32" if reverse else self.compute_dtype
        return keras.KerasTensor(shape, dtype=dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocab_size": self.vocab_size,
                "d_model": self.d_model,
                "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
                "scale": self.scale,
                "output_bias": self.output_bias,
                "fix_norm": self.fix_norm,
            }
        )
        return config


def sinusoidal_table(positions, width, dtype="float32"):
    """`PE(pos, 2i) = sin(pos / 10000^(2i/d))`, `PE(pos, 2i+1) = cos(...)`: `[..., T]` -> `[..., T, D]`.

    Interleaved as in the paper (sin on even channels, cos on odd), not the
    concatenated [sin..., cos...] layout some libraries use.
    """
    positions = ops.expand_dims(ops.cast(positions, "float32"), axis=-1)  # [..., T, 1]
    pair_index = ops.arange(width, dtype="int32") // 2  # i of channel 2i and 2i+1
    inverse_wavelength = ops.power(
        SINUSOID_BASE, -2.0 * ops.cast(pair_index, "float32") / float(width)
    )  # [D]
    angles = positions * inverse_wavelength  # [..., T, D]
    is_even = ops.equal(ops.arange(width, dtype="int32") % 2, 0)
    table = ops.where(is_even, ops.sin(angles), ops.cos(angles))
    return ops.cast(table, dtype)


@keras.saving.register_keras_serializable(package="keras_transformer")
class SinusoidalPositionEncoding(keras.layers.Layer):
    """The fixed sinusoidal position encoding of Vaswani et al., 2017, 3.5.

    Returns the encoding for the positions of `inputs` (`[B, T, D]`), broadcast to the
    inputs' shape, to be added to the scaled token embeddings. `start_index` shifts the
    positions for incremental decoding, where one token at position `i` is fed at a time.
    It has no weights; `max_length` is the longest sequence the model accepts.

    Args:
        max_length: int. Longest sequence, checked when the length is static.

    Call arguments:
        inputs: `[B, T, D]` embeddings.
        start_index: int scalar, the position of the first token. Defaults to 0.

    Example:
    >>> pos = SinusoidalPositionEncoding(max_length=16)
    >>> round(float(pos(keras.ops.zeros((1, 3, 4)))[0, 1, 0]), 4)  # sin(1)
    0.8415
    """

    def __init__(self, max_length, **kwargs):
        super().__init__(**kwargs)
        check_positive_int("max_length", max_length)
        self.max_length = max_length
        self.built = True

    def call(self, inputs, start_index=0):
        _check_length(inputs, self.max_length)
        positions = _positions(inputs, start_index)
        table = sinusoidal_table(positions, inputs.shape[-1], dtype=self.compute_dtype)
        return ops.broadcast_to(table, ops.shape(inputs))

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update({"max_length": self.max_length})
        return config


@keras.saving.register_keras_serializable(package="keras_transformer")
class LearnedPositionEmbedding(keras.layers.Layer):
    """Learned position embeddings, the paper's alternative to sinusoids (Table 3, row E).

    Returns the embeddings of the positions of `inputs`, broadcast to its shape. Unlike
    sinusoids these cannot extrapolate beyond `max_length`.

    Args:
        max_length: int. Number of positions with an embedding.
        initializer: initializer of the table. Defaults to "glorot_uniform".

    Call arguments:
        inputs: `[B, T, D]` embeddings.
        start_index: int scalar, the position of the first token. Defaults to 0.
    """

    table_trainable = True

    def __init__(self, max_length, initializer="glorot_uniform", **kwargs):
        super().__init__(**kwargs)
        check_positive_int("max_length", max_length)
        self.max_length = max_length
        self.initializer = keras.initializers.get(initializer)

    def build(self, inputs_shape):
        self.position_embeddings = self.add_weight(
            name="position_embeddings",
            shape=(self.max_length, inputs_shape[-1]),
            initializer=clone_initializer(self.initializer),
            trainable=self.table_trainable,
        )
        self.built = True

    def call(self, inputs, start_index=0):
        _check_length(inputs, self.max_length)
        positions = _positions(inputs, start_index)
        table = ops.take(self.position_embeddings, positions, axis=0)
        return ops.broadcast_to(ops.cast(table, self.compute_dtype), ops.shape(inputs))

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "max_length": self.max_length,
                "initializer": keras.initializers.serialize(self.initializer),
            }
        )
        return config


def _positions(inputs, start_index):
    """`start_index, start_index + 1, ...`, one position per token of `inputs` `[T]`."""
    return ops.arange(ops.shape(inputs)[-2], dtype="int32") + ops.cast(start_index, "int32")


def _check_length(inputs, max_length):
    """Raises if the static length exceeds `max_length`; a symbolic length passes.

    Only a plain int is compared: while tracing, the length is None (TensorFlow) or a
    symbolic dimension (JAX's shape-polymorphic export, which Keras' `model.export`
    uses), and comparing one of those with an int fails or is inconclusive.
    """
    length = inputs.shape[-2]
    if isinstance(length, int) and length > max_length:
        raise ValueError(
            f"Sequence length {length} exceeds max_length={max_length}. "
            f"Received: inputs.shape={tuple(inputs.shape)}"
        )


@keras.saving.register_keras_serializable(package="keras_transformer")
class PaperSinusoids(keras.initializers.Initializer):
    """Initializes a `[positions, width]` table with the paper's interleaved sinusoids."""

    def __call__(self, shape, dtype=None):
        return sinusoidal_table(ops.arange(shape[0]), shape[1], dtype=dtype or "float32")


@keras.saving.register_keras_serializable(package="keras_transformer")
class FixedPositionEmbedding(LearnedPositionEmbedding):
    """A position table held as non-trainable weights: encodings loaded from a checkpoint.

    For pretrained models whose fixed encodings are laid out otherwise than the paper's
    (Hugging Face's Marian puts every sine in the first half of the channels and every
    cosine in the second, where the paper interleaves them, 3.5). The table is whatever
    was loaded into it; a new layer holds the paper's interleaved sinusoids, so it
    computes what `SinusoidalPositionEncoding` does until a checkpoint is loaded. The
    weight is made non-trainable, so `fit` never changes it, whatever
    `layer.trainable` says. Like learned embeddings it cannot go beyond `max_length`.

    Args:
        max_length: int. Number of positions in the table.

    Call arguments:
        inputs: `[B, T, D]` embeddings.
        start_index: int scalar, the position of the first token. Defaults to 0.

    Example:
    >>> pos = FixedPositionEmbedding(max_length=16)
    >>> round(float(pos(keras.ops.zeros((1, 3, 4)))[0, 1, 0]), 4)  # sin(1) until loaded
    0.8415
    """

    # Non-trainable, so `fit` never changes a loaded table.
    table_trainable = False

    def __init__(self, max_length, **kwargs):
        # A seedless initializer: a seeded default (glorot) would draw from the global
        # seed at construction and shift every weight initialized after this layer.
        super().__init__(max_length, initializer=PaperSinusoids(), **kwargs)

    def get_config(self):
        config = super().get_config()
        del config["initializer"]  # the table starts as the paper's sinusoids, always
        return config

"""Multi-head scaled dot-product attention with an incremental-decoding cache."""

import math

import keras
from keras import ops

from keras_transformer.layers import masks as masks_lib
from keras_transformer.checks import check_bool, check_positive_int, check_rate
from keras_transformer.layers.initializers import clone_initializer

# A masked score: the finite float32 minimum, so a softmax over it never sees -inf - -inf.
_LOWEST = float(-3.4e38)


@keras.saving.register_keras_serializable(package="keras_transformer")
class MultiHeadAttention(keras.layers.Layer):
    """Multi-head attention of "Attention Is All You Need" (Vaswani et al., 2017, 3.2).

    Computes `softmax(Q K^T / sqrt(d_k)) V` for `num_heads` heads of width `key_dim`,
    concatenates the heads and projects them with `W^O`. Masks are boolean, True where a
    query may attend a key, broadcastable to `[B, T, S]`; build them with
    `keras_transformer.layers.masks`. A query row with no visible key returns zeros, never
    NaN, whatever the dtype.

    When no attention scores are requested and attention dropout is inactive, the layer
    calls the fused `keras.ops.dot_product_attention`, or, for a single query position
    (a decoding step), sums products over the head width and then over the keys, which
    reads the keys and values once where they lie (`single_query_attention`); otherwise
    it runs the explicit softmax path. All give the same numbers (the tests compare them
    with NumPy).

    For incremental decoding, `cache` holds the keys and values of earlier steps as one
    tensor `[B, 2, S_max, N, H]`. With `cache_update_index`, the keys and values of the
    new query tokens are written into the cache at that index before attending (decoder
    self-attention). Without it, the cache is used as it is and `key`/`value` are ignored
    (cross-attention over an encoder output projected once).

    Args:
        num_heads: int. Number of heads `N` (the paper: 8 for base).
        key_dim: int. Width `H` of each query/key head (the paper: d_model / N = 64).
        value_dim: int, optional. Width of each value head. Defaults to `key_dim`.
        dropout: float. Dropout on the attention probabilities. Defaults to 0.0: the
            paper names residual and embedding dropout only.
        use_bias: bool. Whether the projections have biases. Defaults to True.
        output_dim: int, optional. Width of the output. Defaults to the query's width.
        kernel_initializer: initializer of the projection kernels.
        bias_initializer: initializer of the projection biases.

    Call arguments:
        query: `[B, T, D]` queries.
        value: `[B, S, D]` values (and keys when `key` is None).
        key: optional `[B, S, D]` keys.
        attention_mask: optional boolean mask broadcastable to `[B, T, S]`.
        cache: optional `[B, 2, S_max, N, H]` key/value cache.
        cache_update_index: optional int scalar, where the new keys/values go.
        return_attention_scores: bool, also return the `[B, N, T, S]` probabilities.
        training: bool, whether dropout is active.

    Returns:
        `output`, then `scores` if requested, then the (updated) `cache` if one was given.

    Example:
    >>> layer = MultiHeadAttention(num_heads=2, key_dim=4)
    >>> x = keras.random.normal((2, 5, 8))
    >>> tuple(layer(x, x).shape)
    (2, 5, 8)

    References:
        Vaswani et al., "Attention Is All You Need", NeurIPS 2017.
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        dropout=0.0,
        use_bias=True,
        output_dim=None,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("num_heads", num_heads)
        check_positive_int("key_dim", key_dim)
        if value_dim is not None:
            check_positive_int("value_dim", value_dim)
        if output_dim is not None:
            check_positive_int("output_dim", output_dim)
        check_rate("dropout", dropout)
        check_bool("use_bias", use_bias)
        self.num_heads = num_heads
        self.key_dim = key_dim
        self.value_dim = value_dim if value_dim is not None else key_dim
        self.dropout = dropout
        self.use_bias = use_bias
        self.output_dim = output_dim
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.supports_masking = False

    def build(self, query_shape, value_shape, key_shape=None):
        key_shape = value_shape if key_shape is None else key_shape
        self.query_dense = self._projection(self.num_heads * self.key_dim, "query")
        self.query_dense.build(query_shape)
        self.key_dense = self._projection(self.num_heads * self.key_dim, "key")
        self.key_dense.build(key_shape)
        self.value_dense = self._projection(self.num_heads * self.value_dim, "value")
        self.value_dense.build(value_shape)
        output_dim = self.output_dim if self.output_dim is not None else query_shape[-1]
        self.output_dense = self._projection(output_dim, "attention_output")
        self.output_dense.build(tuple(query_shape[:-1]) + (self.num_heads * self.value_dim,))
        self.dropout_layer = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)
        self.built = True

    def _projection(self, units, name):
        return keras.layers.Dense(
            units,
            use_bias=self.use_bias,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )

    def call(
        self,
        query,
        value,
        key=None,
        attention_mask=None,
        cache=None,
        cache_update_index=None,
        return_attention_scores=False,
        training=None,
    ):
        key = value if key is None else key
        if cache is not None and cache_update_index is None:
            # Keys and values were projected once (cross-attention over the encoder).
            (query_heads,) = self._project_heads(query, (self.query_dense,), self.key_dim)
            key_heads, value_heads = cache[:, 0], cache[:, 1]
        else:
            if key is query and value is query and self.value_dim == self.key_dim:
                # Self-attention: Q, K and V from one matmul (see `_project_heads`).
                query_heads, key_heads, value_heads = self._project_heads(
                    query, (self.query_dense, self.key_dense, self.value_dense), self.key_dim
                )
            else:
                (query_heads,) = self._project_heads(query, (self.query_dense,), self.key_dim)
                key_heads, value_heads = self._key_value_heads(key, value)
            if cache is not None:
                key_heads = _write_at(cache[:, 0], cache_update_index, key_heads)
                value_heads = _write_at(cache[:, 1], cache_update_index, value_heads)
                cache = ops.stack([key_heads, value_heads], axis=1)

        outputs, scores = self._compute_attention(
            query_heads,
            key_heads,
            value_heads,
            attention_mask,
            return_attention_scores=return_attention_scores,
            training=training,
        )
        outputs = self._merge_heads(outputs)  # [B, T, N, H] -> [B, T, D]

        results = (outputs,)
        if return_attention_scores:
            results += (scores,)
        if cache is not None:
            results += (cache,)
        return results[0] if len(results) == 1 else results

    def compute_cross_attention_cache(self, value, key=None):
        """Projects encoder outputs once into a `[B, 2, S, N, H]` cache for decoding."""
        key = value if key is None else key
        key_heads, value_heads = self._key_value_heads(key, value)
        return ops.stack([key_heads, value_heads], axis=1)

    def _key_value_heads(self, key, value):
        """`[B, S, N, H]` keys and values; one matmul when both come from one tensor."""
        if key is value and self.value_dim == self.key_dim:
            return self._project_heads(value, (self.key_dense, self.value_dense), self.key_dim)
        (key_heads,) = self._project_heads(key, (self.key_dense,), self.key_dim)
        (value_heads,) = self._project_heads(value, (self.value_dense,), self.value_dim)
        return key_heads, value_heads

    def _project_heads(self, x, denses, head_dim):
        """Projects `[B, T, D]` with each of `denses` into `[B, T, N, H]` heads, in one matmul.

        The projections keep their own `Dense` weights (`query/kernel`, ...: the paths
        that checkpoints, layout maps and tests use), but are applied here as one
        `tensordot` over their kernels viewed as `[D, N, H]` and concatenated along the
        head axis: one larger matmul instead of three, and heads come out split, with no
        reshape or transpose. The `[D, N, H]` tensordot is chosen for speed, measured per
        backend (bench/train_throughput.py): on JAX's CPU backend the kernel gradient of a
        plain `[B, T, D] @ [D, N * H]` falls back to a matmul ~1.4x slower than XLA's
        fast library, while this form stays on it; TensorFlow runs it as fast as MatMul
        (its `einsum` gradient is ~2x slower); PyTorch runs all forms alike.
        """
        if any(_quantized(dense) for dense in denses):
            # A quantized kernel is integers plus a scale that only the layer's own call
            # applies: each projection runs through its `Dense`, then splits into heads.
            return tuple(self._split_heads(dense(x), head_dim) for dense in denses)
        kernels, biases = [], []
        for dense in denses:
            kernel = ops.cast(dense.kernel, self.compute_dtype)
            kernels.append(ops.reshape(kernel, (-1, self.num_heads, head_dim)))
            if self.use_bias:
                bias = ops.cast(dense.bias, self.compute_dtype)
                biases.append(ops.reshape(bias, (self.num_heads, head_dim)))
        kernel = kernels[0] if len(kernels) == 1 else ops.concatenate(kernels, axis=1)
        heads = ops.tensordot(x, kernel, axes=1)  # [B, T, k * N, H]
        if self.use_bias:
            heads = heads + (biases[0] if len(biases) == 1 else ops.concatenate(biases, axis=0))
        if len(denses) == 1:
            return (heads,)
        return tuple(ops.split(heads, len(denses), axis=2))

    def _merge_heads(self, heads):
        """`W^O` over the concatenated heads: `[B, T, N, H]` -> `[B, T, D]`, one tensordot."""
        if _quantized(self.output_dense):  # see `_project_heads`
            shape = ops.shape(heads)
            return self.output_dense(ops.reshape(heads, (shape[0], shape[1], self.num_heads * self.value_dim)))
        kernel = ops.cast(self.output_dense.kernel, self.compute_dtype)
        kernel = ops.reshape(kernel, (self.num_heads, self.value_dim, -1))  # [N, H, D]
        outputs = ops.tensordot(heads, kernel, axes=2)
        if self.use_bias:
            outputs = outputs + ops.cast(self.output_dense.bias, self.compute_dtype)
        return outputs

    def _split_heads(self, projected, head_dim):
        """`[B, T, N * H]` -> `[B, T, N, H]`."""
        shape = ops.shape(projected)
        return ops.reshape(projected, (shape[0], shape[1], self.num_heads, head_dim))

    def _compute_attention(self, query, key, value, attention_mask, return_attention_scores, training):
        """Attends `[B, T, N, H]` queries over `[B, S, N, H]` keys/values."""
        scale = 1.0 / math.sqrt(self.key_dim)
        visible_rows = None
        if attention_mask is not None:
            mask = ops.cast(attention_mask, "bool")
            if len(mask.shape) == 2:  # [T, S]
                mask = mask[None, :, :]
            # [B, T, 1]: rows that see at least one key. Rows that see none attend
            # everywhere (so no softmax over an empty set) and are zeroed afterwards.
            visible_rows = masks_lib.any_key_visible(mask)
            attention_mask = ops.logical_or(mask, ops.logical_not(visible_rows))

        # The rate the dropout sub-layer applies (a callback may change it during fit).
        dropout_active = self.dropout_layer.rate > 0.0 and bool(training)
        if not return_attention_scores and not dropout_active:
            if query.shape[1] == 1:  # a decoding step
                outputs = single_query_attention(query, key, value, attention_mask, scale)
            else:
                outputs = fused_attention(query, key, value, attention_mask, scale)
            scores = None
        else:
            scores = ops.einsum("btnh,bsnh->bnts", query, key) * ops.cast(scale, query.dtype)
            scores = self._masked_softmax(scores, attention_mask)
            if visible_rows is not None:
                scores = scores * ops.cast(visible_rows[:, None, :, :], scores.dtype)
            probabilities = self.dropout_layer(scores, training=training)
            outputs = ops.einsum("bnts,bsnh->btnh", probabilities, value)

        if visible_rows is not None:
            # [B, T, 1] -> [B, T, 1, 1] over [B, T, N, H].
            outputs = outputs * ops.cast(visible_rows[:, :, :, None], outputs.dtype)
        return outputs, scores

    def _masked_softmax(self, scores, attention_mask):
        # Softmax in float32: float16 logits lose the small probabilities otherwise.
        scores_32 = ops.cast(scores, "float32")
        if attention_mask is not None:
            lowest = ops.convert_to_tensor(_LOWEST, "float32")
            scores_32 = ops.where(attention_mask[:, None, :, :], scores_32, lowest)
        return ops.cast(ops.softmax(scores_32, axis=-1), scores.dtype)

    def compute_output_shape(self, query_shape, value_shape, key_shape=None):
        output_dim = self.output_dim if self.output_dim is not None else query_shape[-1]
        return tuple(query_shape[:-1]) + (output_dim,)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "key_dim": self.key_dim,
                "value_dim": self.value_dim,
                "dropout": self.dropout,
                "use_bias": self.use_bias,
                "output_dim": self.output_dim,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config


def fused_attention(query, key, value, attention_mask, scale):
    """`keras.ops.dot_product_attention` of `[B, T, N, H]` queries over `[B, S, N, H]` keys/values.

    `attention_mask` is None or boolean `[B, T, S]` (or `[1, T, S]`), True where a query
    may attend.
    """
    mask = None
    if attention_mask is not None:
        batch, query_length = ops.shape(query)[0], ops.shape(query)[1]
        key_length = ops.shape(key)[1]
        # The fused op wants [B, N, T, S]; one head axis broadcasts over N.
        mask = ops.broadcast_to(attention_mask[:, None, :, :], (batch, 1, query_length, key_length))
    return ops.dot_product_attention(query, key, value, mask=mask, scale=scale)


def single_query_attention(query, key, value, attention_mask, scale):
    """Attention of one query position `[B, 1, N, H]` over keys/values `[B, S, N, H]`.

    A decoding step attends with one query per head: a matrix-vector product. Written as
    a product summed over H (the scores) and a product summed over S (the output), it
    reads the keys and values once, in the `[B, S, N, H]` layout the cache holds them. A
    batched matmul wants `[B, N, S, H]`, and XLA's CPU backend copies the whole key and
    value cache into that layout for every layer at every step. Measured side by side,
    this way was the faster on each backend (docs/fast_inference.md, "The attention of
    a decoding step", has the numbers). Scores, softmax and sums run in float32, as the
    explicit path's softmax does.

    Args:
        query: `[B, 1, N, H]`.
        key, value: `[B, S, N, H]`.
        attention_mask: None, or boolean broadcastable to `[B, 1, S]`, True where the
            query may attend; every row must see at least one key (the layer zeroes
            rows that see none).
        scale: float, the scores' factor (`1 / sqrt(H)`).

    Returns:
        `[B, 1, N, H]` in the query's dtype.
    """
    dtype = query.dtype
    query = ops.cast(query, "float32")
    scores = ops.sum(query * ops.cast(key, "float32"), axis=-1) * scale  # [B, S, N]
    if attention_mask is not None:
        mask = ops.cast(attention_mask, "bool")[:, 0, :, None]  # [B, S, 1]
        scores = ops.where(mask, scores, ops.convert_to_tensor(_LOWEST, "float32"))
    probabilities = ops.softmax(scores, axis=1)
    outputs = ops.sum(probabilities[..., None] * ops.cast(value, "float32"), axis=1, keepdims=True)
    return ops.cast(outputs, dtype)


def _quantized(dense):
    """Whether `dense` holds a quantized kernel (`model.quantize("int8")` and the like)."""
    return getattr(dense, "quantization_mode", None) is not None


def _write_at(cache, index, update):
    """Writes `update` `[B, T, N, H]` into `cache` `[B, S, N, H]` at positions `index..index+T-1`.

    A select over positions instead of `ops.slice_update`: on TensorFlow that traces to
    `XlaDynamicUpdateSlice`, which stock TensorFlow Serving refuses to run without XLA
    JIT (tensorflow/serving#2217), and exported graphs must load there. The extra work
    is one pass over the cache, which attention reads in full anyway.
    """
    length = ops.shape(update)[1]
    offsets = ops.arange(ops.shape(cache)[1], dtype="int32") - ops.cast(index, "int32")
    inside = ops.logical_and(ops.greater_equal(offsets, 0), ops.less(offsets, length))
    written = ops.take(update, ops.clip(offsets, 0, length - 1), axis=1)
    return ops.where(inside[None, :, None, None], written, cache)


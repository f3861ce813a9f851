"""The JAX peer: a Flax linen Transformer of our shape, trained by one jitted optax step.

What a JAX user would write by hand for the paper's model (after flax's WMT example,
examples/wmt/models.py and train.py), built to a `TransformerConfig`:

- one `nn.Embed` (normal init, stddev d_model^-0.5) shared by the source embedding, the
  target embedding and the pre-softmax projection (`Embed.attend`); embeddings scaled
  by sqrt(d_model) plus fixed sinusoids, then dropout;
- post-norm blocks, `LayerNorm(x + Dropout(sublayer(x)))`: `nn.MultiHeadDotProductAttention`
  (padding masks on keys, causal in decoder self-attention, attention dropout
  `config.attention_dropout` as ours) and a ReLU feed-forward network;
- Adam (optax) with the paper's betas and epsilon on the warmup schedule
  `d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)`;
- the label-smoothed cross-entropy over non-pad tokens, written without a one-hot
  `[B, T, V]` target: `logsumexp - (1 - eps) * logit[label] - eps * mean(logits)`;
- one `jax.jit`ted step `(state, batch) -> (state, loss)` whose state (parameters,
  optimizer state, dropout key) is donated, so XLA updates it in place.

Under a mixed policy ("mixed_bfloat16", "mixed_float16") the parameters stay float32 and
the layers compute in the half type (flax's `dtype=`); the logits are cast to float32
for the loss, as ours does. float16 has no loss scaling here.

flax and optax are optional (not dependencies of the package): importing this module
raises ImportError without them, and `bench/gpu.py` skips the peer with that reason.

Example:
>>> state, step = make_flax_peer(TransformerConfig.from_preset("tiny"), policy="float32")
>>> state, loss = step(state, source_ids, decoder_ids, labels)  # int32 [B, S], [B, T], [B, T]
"""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

PAD_ID = 0
COMPUTE_DTYPES = {"float32": jnp.float32, "mixed_bfloat16": jnp.bfloat16, "mixed_float16": jnp.float16}


def sinusoids(length, d_model):
    """`[length, d_model]` float32: sin on even channels, cos on odd (as the PyTorch peer)."""
    positions = np.arange(length)[:, None]
    channels = np.arange(d_model)
    angles = positions / np.power(10000.0, (2 * (channels // 2)) / d_model)
    return np.where(channels % 2 == 0, np.sin(angles), np.cos(angles)).astype(np.float32)


def _add_and_norm(x, sublayer_output, config, dtype, train):
    """The paper's `LayerNorm(x + Dropout(sublayer(x)))`, inside a compact method."""
    sublayer_output = nn.Dropout(config.dropout)(sublayer_output, deterministic=not train)
    return nn.LayerNorm(epsilon=config.layer_norm_epsilon, dtype=dtype)(x + sublayer_output)


def _attention(config, dtype, train):
    return nn.MultiHeadDotProductAttention(
        num_heads=config.num_heads,
        qkv_features=config.d_model,
        out_features=config.d_model,
        dropout_rate=config.attention_dropout,
        deterministic=not train,
        dtype=dtype,
    )


def _feed_forward(x, config, dtype):
    x = nn.relu(nn.Dense(config.d_ff, dtype=dtype)(x))
    return nn.Dense(config.d_model, dtype=dtype)(x)


class FlaxTransformer(nn.Module):
    """`(source_ids [B, S], decoder_ids [B, T]) -> logits [B, T, V]` in `dtype`."""

    config: object  # a keras_transformer TransformerConfig (frozen dataclass)
    dtype: object = jnp.float32

    @nn.compact
    def __call__(self, source_ids, decoder_ids, train=True):
        config, dtype = self.config, self.dtype
        embedding = nn.Embed(
            config.vocab_size,
            config.d_model,
            embedding_init=nn.initializers.normal(stddev=config.d_model**-0.5),
            dtype=dtype,
            name="embedding",
        )
        table = jnp.asarray(sinusoids(config.max_length, config.d_model), dtype)

        def embed(token_ids):
            x = embedding(token_ids) * math.sqrt(config.d_model) + table[: token_ids.shape[1]]
            return nn.Dropout(config.dropout)(x, deterministic=not train)

        source_real, target_real = source_ids != PAD_ID, decoder_ids != PAD_ID
        source_mask = nn.make_attention_mask(source_real, source_real)  # [B, 1, S, S]
        self_mask = nn.combine_masks(
            nn.make_attention_mask(target_real, target_real), nn.make_causal_mask(decoder_ids)
        )  # [B, 1, T, T]
        cross_mask = nn.make_attention_mask(target_real, source_real)  # [B, 1, T, S]
        x = embed(source_ids)
        for _ in range(config.num_encoder_layers):
            x = _add_and_norm(x, _attention(config, dtype, train)(x, x, mask=source_mask), config, dtype, train)
            x = _add_and_norm(x, _feed_forward(x, config, dtype), config, dtype, train)
        y = embed(decoder_ids)
        for _ in range(config.num_decoder_layers):
            y = _add_and_norm(y, _attention(config, dtype, train)(y, y, mask=self_mask), config, dtype, train)
            y = _add_and_norm(y, _attention(config, dtype, train)(y, x, mask=cross_mask), config, dtype, train)
            y = _add_and_norm(y, _feed_forward(y, config, dtype), config, dtype, train)
        return embedding.attend(y)  # the tied pre-softmax projection


def smoothed_cross_entropy(logits, labels, smoothing, pad_id=PAD_ID):
    """Mean over non-pad tokens of the cross-entropy against `(1 - e) one_hot + e / V`.

    `-sum_v q_v log p_v` with that `q` is `logsumexp - (1 - e) logit[label] - e mean(logits)`,
    so no `[B, T, V]` one-hot is made. Logits are cast to float32 first.
    """
    logits = logits.astype(jnp.float32)
    log_normalizer = jax.nn.logsumexp(logits, axis=-1)
    label_logits = jnp.take_along_axis(logits, labels[..., None], axis=-1)[..., 0]
    per_token = log_normalizer - (1.0 - smoothing) * label_logits - smoothing * jnp.mean(logits, axis=-1)
    weights = (labels != pad_id).astype(jnp.float32)
    return jnp.sum(per_token * weights) / jnp.maximum(jnp.sum(weights), 1.0)


def paper_schedule(d_model, warmup_steps):
    """optax schedule of eq. 3; optax counts from 0, the paper's step from 1."""

    def schedule(count):
        step = count + 1
        return d_model**-0.5 * jnp.minimum(step**-0.5, step * warmup_steps**-1.5)

    return schedule


def make_flax_peer(config, training_config=None, policy="float32", seed=0):
    """Returns `(state, step)`: the initial training state and the jitted, donating step.

    `step(state, source_ids, decoder_ids, labels)` (int32 `[B, S]`, `[B, T]`, `[B, T]`)
    runs forward, backward and one Adam update and returns `(new_state, loss)`; `state`
    is donated, so the caller must keep only the new one. `state` is
    `(params, opt_state, dropout_key)`; its parameter count is `count_parameters(state)`.
    """
    from keras_transformer.train.config import TrainingConfig

    if policy not in COMPUTE_DTYPES:
        raise ValueError(f"Unknown policy {policy!r}; expected one of {sorted(COMPUTE_DTYPES)}.")
    training = training_config or TrainingConfig()
    model = FlaxTransformer(config, dtype=COMPUTE_DTYPES[policy])
    optimizer = optax.adam(
        paper_schedule(config.d_model, training.warmup_steps),
        b1=training.adam_beta_1,
        b2=training.adam_beta_2,
        eps=training.adam_epsilon,
    )
    init_key, dropout_key = jax.random.split(jax.random.key(seed))
    example = jnp.ones((1, 2), jnp.int32)
    params = jax.jit(lambda key: model.init(key, example, example, train=False))(init_key)["params"]
    state = (params, optimizer.init(params), dropout_key)

    def loss_of(params, source_ids, decoder_ids, labels, key):
        logits = model.apply({"params": params}, source_ids, decoder_ids, train=True, rngs={"dropout": key})
        return smoothed_cross_entropy(logits, labels, training.label_smoothing)

    def step(state, source_ids, decoder_ids, labels):
        params, opt_state, key = state
        key, step_key = jax.random.split(key)
        loss, gradients = jax.value_and_grad(loss_of)(params, source_ids, decoder_ids, labels, step_key)
        updates, opt_state = optimizer.update(gradients, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state, key), loss

    return state, jax.jit(step, donate_argnums=0)


def count_parameters(state):
    """Number of trainable values in a `make_flax_peer` state."""
    return int(sum(leaf.size for leaf in jax.tree_util.tree_leaves(state[0])))

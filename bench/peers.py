"""The models ours is measured against, built to the same `TransformerConfig`.

- `build_keras_hub_transformer`: the same encoder-decoder assembled from keras-hub's
  `TransformerEncoder` / `TransformerDecoder`, a tied `ReversibleEmbedding` (source
  embedding, target embedding and output projection share one matrix, as in ours) and
  `SinePositionEncoding`; post-norm, ReLU, padding masks from pad id 0, a causal
  decoder. It is compiled by the caller exactly as ours is.
- `make_torch_peer` (`TorchTransformer` and its step): plain PyTorch,
  `torch.nn.Transformer` between a tied `nn.Embedding` (scaled by sqrt(d_model), plus
  sinusoids) and the tied output projection; Adam with the `TrainingConfig`'s betas and epsilon; `cross_entropy` with
  its `label_smoothing` and `ignore_index` = pad. On a GPU (`bench/gpu.py`): the weights
  on the device, bfloat16 autocast, fused Adam, and optionally `torch.compile`.
- `KerasHubGenerator`: decoding with the keras-hub model's layers the way keras-hub's
  own encoder-decoder (`BartSeq2SeqLM`) generates: `TransformerDecoder` key/value
  caches, a `next(prompt, cache, index)` function, `GreedySampler` / `BeamSampler`,
  compiled as `CausalLM.make_generate_function` does.

The JAX peer, a Flax linen model trained by optax, is `bench/flax_peer.py` (flax and
optax are optional, so it is a module of its own).

The keras-hub and PyTorch peers take one `dropout` for residual *and* attention-probability dropout (neither
library separates them), while ours has `attention_dropout=0` by default (the paper
names residual and embedding dropout only). The benchmark therefore also times ours with
`attention_dropout = dropout`, so the comparison can be read either way.
"""

import math

import keras

from keras_transformer.special_tokens import BOS_ID, EOS_ID

PAD_ID = 0


def build_keras_hub_transformer(config):
    """A functional keras.Model from keras-hub layers, same inputs/outputs as ours."""
    import keras_hub

    encoder_inputs = keras.Input(shape=(None,), dtype="int32", name="encoder_inputs")
    decoder_inputs = keras.Input(shape=(None,), dtype="int32", name="decoder_inputs")
    embedding = keras_hub.layers.ReversibleEmbedding(
        config.vocab_size,
        config.d_model,
        tie_weights=True,
        embeddings_initializer=keras.initializers.RandomNormal(stddev=config.d_model**-0.5),
        name="token_embedding",
    )
    scale = math.sqrt(config.d_model)

    def embed(token_ids, side):
        x = embedding(token_ids) * scale
        x = x + keras_hub.layers.SinePositionEncoding(name=f"{side}_positions")(x)
        return keras.layers.Dropout(config.dropout, name=f"{side}_embedding_dropout")(x)

    encoder_mask = keras.ops.not_equal(encoder_inputs, PAD_ID)
    decoder_mask = keras.ops.not_equal(decoder_inputs, PAD_ID)
    x = embed(encoder_inputs, "encoder")
    for index in range(config.num_encoder_layers):
        x = keras_hub.layers.TransformerEncoder(
            config.d_ff,
            config.num_heads,
            dropout=config.dropout,
            layer_norm_epsilon=config.layer_norm_epsilon,
            name=f"encoder_layer_{index}",
        )(x, padding_mask=encoder_mask)
    y = embed(decoder_inputs, "decoder")
    for index in range(config.num_decoder_layers):
        y = keras_hub.layers.TransformerDecoder(
            config.d_ff,
            config.num_heads,
            dropout=config.dropout,
            layer_norm_epsilon=config.layer_norm_epsilon,
            name=f"decoder_layer_{index}",
        )(y, x, decoder_padding_mask=decoder_mask, encoder_padding_mask=encoder_mask)
    logits = embedding(y, reverse=True)
    return keras.Model(
        {"encoder_inputs": encoder_inputs, "decoder_inputs": decoder_inputs},
        logits,
        name="keras_hub_transformer",
    )


def make_torch_peer(
    config, training_config=None, *, device=None, autocast_dtype=None, fused_adam=False, compile_loss=False
):
    """Returns `(model, step)`: a `torch.nn.Transformer` model and its training step.

    `step(source_ids, decoder_ids, labels)` (int64 torch tensors `[B, S]`, `[B, T]`,
    `[B, T]`, on `device`) runs forward, backward and one Adam update and returns the
    loss (a tensor: reading it is the caller's choice, as in a hand-written loop). Adam
    and label smoothing follow `training_config` (default `TrainingConfig()`, as
    `compile_transformer` does for ours).

    The keyword options are what a PyTorch user adds on a GPU; their defaults give the
    plain float32 eager CPU peer the CPU benchmarks compare with.

    Args:
        device: where the weights live (`torch.device` or str); None keeps PyTorch's
            default (the CPU).
        autocast_dtype: None (float32), or `torch.bfloat16` / `torch.float16` for the
            forward pass and loss under `torch.autocast` (mixed precision: float32
            weights, half-precision matmuls; `cross_entropy` autocasts to float32).
            float16 has no gradient scaler here, so bfloat16 is the one to time.
        fused_adam: `torch.optim.Adam(fused=True)`, one fused kernel for all weights
            (needs the weights on a CUDA device).
        compile_loss: `torch.compile` (inductor, static shapes) of the forward pass and
            the loss; the backward pass then runs as the compiled graph's backward.
            Every peer compiles the same function with new weights: a process that
            makes several calls `torch._dynamo.reset()` between them, or dynamo's
            recompile limit silently leaves the later ones eager.
    """
    import contextlib

    import torch
    import torch.nn.functional as F

    from keras_transformer.train.config import TrainingConfig

    training = training_config or TrainingConfig()

    class TorchTransformer(torch.nn.Module):
        """Tied embeddings + sinusoids + `nn.Transformer` (post-norm) + tied projection."""

        def __init__(self):
            super().__init__()
            self.embedding = torch.nn.Embedding(config.vocab_size, config.d_model)
            torch.nn.init.normal_(self.embedding.weight, std=config.d_model**-0.5)
            self.transformer = torch.nn.Transformer(
                d_model=config.d_model,
                nhead=config.num_heads,
                num_encoder_layers=config.num_encoder_layers,
                num_decoder_layers=config.num_decoder_layers,
                dim_feedforward=config.d_ff,
                dropout=config.dropout,
                layer_norm_eps=config.layer_norm_epsilon,
                batch_first=True,
            )
            self.dropout = torch.nn.Dropout(config.dropout)
            positions = torch.arange(config.max_length, dtype=torch.float32)[:, None]
            channels = torch.arange(config.d_model)
            angles = positions / torch.pow(10000.0, (2 * (channels // 2)) / config.d_model)
            table = torch.where(channels % 2 == 0, torch.sin(angles), torch.cos(angles))
            self.register_buffer("positions", table, persistent=False)
            self.scale = math.sqrt(config.d_model)

        def embed(self, token_ids):
            x = self.embedding(token_ids) * self.scale + self.positions[: token_ids.shape[1]]
            return self.dropout(x)

        def forward(self, source_ids, decoder_ids):
            target_length = decoder_ids.shape[1]
            # Boolean like the padding masks (True = may not attend), so PyTorch does
            # not convert between mask kinds at every call.
            causal = torch.ones(target_length, target_length, dtype=torch.bool, device=decoder_ids.device).triu(1)
            hidden = self.transformer(
                self.embed(source_ids),
                self.embed(decoder_ids),
                tgt_mask=causal,
                src_key_padding_mask=source_ids == PAD_ID,
                tgt_key_padding_mask=decoder_ids == PAD_ID,
                memory_key_padding_mask=source_ids == PAD_ID,
                tgt_is_causal=True,
            )
            return hidden @ self.embedding.weight.T  # tied pre-softmax projection

    model = TorchTransformer()
    if device is not None:
        model.to(device)  # before Adam: a fused Adam checks where its weights are
    optimizer = torch.optim.Adam(
        model.parameters(),
        lr=1e-4,
        betas=(training.adam_beta_1, training.adam_beta_2),
        eps=training.adam_epsilon,
        **({"fused": True} if fused_adam else {}),
    )
    model.train()

    def forward_loss(source_ids, decoder_ids, labels):
        autocast = contextlib.nullcontext()
        if autocast_dtype is not None:
            autocast = torch.autocast(device_type=source_ids.device.type, dtype=autocast_dtype)
        with autocast:
            logits = model(source_ids, decoder_ids)
            return F.cross_entropy(
                logits.reshape(-1, config.vocab_size),
                labels.reshape(-1),
                ignore_index=PAD_ID,
                label_smoothing=training.label_smoothing,
            )

    if compile_loss:
        forward_loss = torch.compile(forward_loss, dynamic=False)

    def step(source_ids, decoder_ids, labels):
        optimizer.zero_grad(set_to_none=True)
        loss = forward_loss(source_ids, decoder_ids, labels)
        loss.backward()
        optimizer.step()
        return loss

    return model, step


# ------------------------------------------------------------------ decoding peer
class KerasHubGenerator:
    """Generation with the keras-hub peer's layers, driven by a keras-hub sampler.

    Follows keras-hub's own encoder-decoder task, `BartSeq2SeqLM.generate_step`
    (keras_hub/src/models/bart/bart_seq_2_seq_lm.py): the encoder runs once, a decoder
    call with `cross_attention_cache_update_index=0` projects the encoder output into
    each layer's cross-attention cache, then `next(prompt, cache, index)` feeds the
    token at `index - 1` through every `TransformerDecoder` with
    `self_attention_cache_update_index=index - 1`, and a `keras_hub.samplers.Sampler`
    loops over it. The prompt is int32 `[B, 1 + L]`: BOS, then L slots the sampler
    fills (its mask protects BOS). The encoder output and padding mask ride in the
    cache, as in BART, so `BeamSampler` tiles them to the beams.

    Two departures from BART's code, both in keras-hub's favour: the caches are seeded
    from BOS alone rather than by a decoder pass over the whole empty prompt, and each
    layer's cache stays a separate tensor in a tuple rather than being stacked into one
    `[B, layers, 2, L, N, H]` tensor (which costs a copy of the whole cache per step).

    `next_uncached` is the no-cache baseline: at each step it reruns the decoder stack
    over the whole prompt (the causal mask hides the empty slots; the encoder output
    is reused) and keeps the logits at `index - 1`.

    Args:
        model: the functional model from `build_keras_hub_transformer`.
        config: its `TransformerConfig`.

    Example:
    >>> generator = KerasHubGenerator(build_keras_hub_transformer(config), config)
    >>> generate = generator.generate_function(keras_hub.samplers.GreedySampler(), 32)
    >>> token_ids = generate(source_ids)  # [B, 33]: BOS, then 32 generated ids
    """

    def __init__(self, model, config, bos_id=BOS_ID):
        self.model = model
        self.config = config
        self.bos_id = bos_id
        self.embedding = model.get_layer("token_embedding")
        self.encoder_positions = model.get_layer("encoder_positions")
        self.decoder_positions = model.get_layer("decoder_positions")
        self.encoder_layers = [model.get_layer(f"encoder_layer_{i}") for i in range(config.num_encoder_layers)]
        self.decoder_layers = [model.get_layer(f"decoder_layer_{i}") for i in range(config.num_decoder_layers)]
        self.scale = math.sqrt(config.d_model)

    def _embed(self, token_ids, positions, start_index=0):
        # As `build_keras_hub_transformer`'s `embed`, without the (inference no-op) dropout.
        x = self.embedding(token_ids) * self.scale
        return x + positions(x, start_index=start_index)

    def encode(self, source_ids):
        """`(encoder_outputs [B, S, D], encoder_padding_mask [B, S])`."""
        mask = keras.ops.not_equal(source_ids, PAD_ID)
        x = self._embed(source_ids, self.encoder_positions)
        for layer in self.encoder_layers:
            x = layer(x, padding_mask=mask)
        return x, mask

    def call_with_cache(self, token_ids, index, cache, cross_update_index=None):
        """Decoder stack on `token_ids [B, 1]` at position `index`: `(logits [B, 1, V], cache)`.

        `cache` is `(self_caches, encoder_outputs, encoder_padding_mask, cross_caches)`,
        caches being tuples with one `[B, 2, length, N, H]` tensor per layer.
        """
        self_caches, encoder_outputs, encoder_mask, cross_caches = cache
        x = self._embed(token_ids, self.decoder_positions, start_index=index)
        new_self, new_cross = [], []
        for layer, self_cache, cross_cache in zip(self.decoder_layers, self_caches, cross_caches):
            x, self_cache, cross_cache = layer(
                decoder_sequence=x,
                encoder_sequence=encoder_outputs,
                encoder_padding_mask=encoder_mask,
                self_attention_cache=self_cache,
                self_attention_cache_update_index=index,
                cross_attention_cache=cross_cache,
                cross_attention_cache_update_index=cross_update_index,
            )
            new_self.append(self_cache)
            new_cross.append(cross_cache)
        logits = self.embedding(x, reverse=True)
        return logits, (tuple(new_self), encoder_outputs, encoder_mask, tuple(new_cross))

    def initial_cache(self, source_ids, prompt_length):
        """The sampler's cache for a `[B, prompt_length]` prompt, cross-attention projected."""
        encoder_outputs, encoder_mask = self.encode(source_ids)
        batch, source_length = keras.ops.shape(source_ids)[0], keras.ops.shape(source_ids)[1]
        head_dim = self.config.d_model // self.config.num_heads
        layers = len(self.decoder_layers)

        def zeros(length):
            shape = (batch, 2, length, self.config.num_heads, head_dim)
            return tuple(keras.ops.zeros(shape, dtype=self.model.compute_dtype) for _ in range(layers))

        cache = (zeros(prompt_length), encoder_outputs, encoder_mask, zeros(source_length))
        bos = keras.ops.full((batch, 1), self.bos_id, dtype="int32")
        _, cache = self.call_with_cache(bos, 0, cache, cross_update_index=0)
        return cache

    def next(self, prompt, cache, index):
        """keras-hub's `next(prompt, cache, index) -> (logits [B, V], hidden, cache)`, cached."""
        previous = index - 1  # the cache index is the index of the previous token
        token_ids = keras.ops.slice(prompt, [0, previous], [keras.ops.shape(prompt)[0], 1])
        logits, cache = self.call_with_cache(token_ids, previous, cache)
        return keras.ops.squeeze(logits, axis=1), None, cache

    def next_uncached(self, prompt, cache, index):
        """As `next`, but reruns the decoder over the whole prompt; `cache` = encoder output, mask."""
        encoder_outputs, encoder_mask = cache
        x = self._embed(prompt, self.decoder_positions)
        for layer in self.decoder_layers:
            x = layer(x, encoder_outputs, encoder_padding_mask=encoder_mask)
        logits = self.embedding(x, reverse=True)
        return keras.ops.take(logits, index - 1, axis=1), None, cache

    def generate_step(self, source_ids, sampler, output_length, cached=True, stop_token_ids=None):
        """Runs `sampler` from BOS for `output_length` steps (fewer if every row stopped).

        Returns what the sampler returns: the prompt `[B, 1 + L]` (BOS first), or with
        `BeamSampler(return_all_beams=True)` all beams `[B, K, 1 + L]` and their log-probs.
        """
        batch = keras.ops.shape(source_ids)[0]
        prompt = keras.ops.concatenate(
            [
                keras.ops.full((batch, 1), self.bos_id, dtype="int32"),
                keras.ops.zeros((batch, output_length), dtype="int32"),
            ],
            axis=1,
        )
        mask = keras.ops.concatenate(
            [keras.ops.ones((batch, 1), "bool"), keras.ops.zeros((batch, output_length), "bool")], axis=1
        )
        if cached:
            next_fn, cache = self.next, self.initial_cache(source_ids, output_length + 1)
        else:
            next_fn, cache = self.next_uncached, self.encode(source_ids)
        return sampler(
            next=next_fn,
            prompt=prompt,
            cache=cache,
            index=1,
            mask=mask,
            stop_token_ids=stop_token_ids,
            model=self.model,
        )

    def generate_function(self, sampler, output_length, cached=True, stop_token_ids=(EOS_ID,)):
        """`generate(source_ids [B, S])`, compiled as keras-hub's `CausalLM.make_generate_function`.

        Copied from keras_hub/src/models/causal_lm.py: `tf.function(jit_compile=True)` on
        TensorFlow; on JAX `jax.jit` of a function that maps the sampler's and the model's
        variable values onto the variables with `keras.StatelessScope` (stop ids are
        static, here closed over); eager under `torch.no_grad()` on PyTorch. Stopping at
        EOS (`stop_token_ids`) is `Seq2SeqLM.generate`'s default.
        """
        stop_token_ids = tuple(stop_token_ids) if stop_token_ids is not None else None

        def step(source_ids):
            return self.generate_step(source_ids, sampler, output_length, cached, stop_token_ids)

        backend = keras.config.backend()
        if backend == "tensorflow":
            import tensorflow as tf

            return tf.function(step, jit_compile=True)
        if backend == "jax":
            return self._jax_generate_function(step, sampler)
        if backend == "torch":
            import torch

            def run(source_ids):
                with torch.no_grad():
                    return step(source_ids)

            return run
        raise ValueError(f"Unsupported backend {backend!r}; expected tensorflow, jax or torch.")

    def _jax_generate_function(self, step, sampler):
        import itertools

        import jax

        model = self.model

        @jax.jit
        def compiled(source_ids, state):
            sampler_values, trainable_values, non_trainable_values = state
            mapping = itertools.chain(
                zip(sampler.variables, sampler_values),
                zip(model.trainable_variables, trainable_values),
                zip(model.non_trainable_variables, non_trainable_values),
            )
            with keras.StatelessScope(state_mapping=mapping) as scope:
                outputs = step(source_ids)
            updated = []
            for variable in sampler.variables:
                value = scope.get_current_value(variable)
                updated.append(variable if value is None else value)
            return outputs, updated

        def run(source_ids):
            state = (
                [v.value for v in sampler.variables],
                [v.value for v in model.trainable_variables],
                [v.value for v in model.non_trainable_variables],
            )
            outputs, sampler_values = compiled(keras.ops.convert_to_tensor(source_ids), state)
            # Only the sampler's variables (random seeds) change during generation.
            for variable, value in zip(sampler.variables, sampler_values):
                variable.assign(value)
            return outputs

        return run

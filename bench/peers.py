"""The models ours is measured against, built to the same `TransformerConfig`.

- `build_keras_hub_transformer`: the same encoder-decoder assembled from keras-hub's
  `TransformerEncoder` / `TransformerDecoder`, a tied `ReversibleEmbedding` (source
  embedding, target embedding and output projection share one matrix, as in ours) and
  `SinePositionEncoding`; post-norm, ReLU, padding masks from pad id 0, a causal
  decoder. It is compiled by the caller exactly as ours is.
- `TorchTransformer` + `torch_train_step`: plain PyTorch, `torch.nn.Transformer` between
  a tied `nn.Embedding` (scaled by sqrt(d_model), plus sinusoids) and the tied output
  projection; Adam with the config's betas and epsilon; `cross_entropy` with
  `label_smoothing` and `ignore_index` = pad.

Both peers take one `dropout` for residual *and* attention-probability dropout (neither
library separates them), while ours has `attention_dropout=0` by default (the paper
names residual and embedding dropout only). The benchmark therefore also times ours with
`attention_dropout = dropout`, so the comparison can be read either way.
"""

import math

import keras

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


def make_torch_peer(config):
    """Returns `(model, step)`: a `torch.nn.Transformer` model and its training step.

    `step(source_ids, decoder_ids, labels)` (int64 torch tensors `[B, S]`, `[B, T]`,
    `[B, T]`) runs forward, backward and one Adam update and returns the loss.
    """
    import torch
    import torch.nn.functional as F

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
            causal = torch.ones(target_length, target_length, dtype=torch.bool).triu(1)
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
    optimizer = torch.optim.Adam(
        model.parameters(),
        lr=1e-4,
        betas=(config.adam_beta_1, config.adam_beta_2),
        eps=config.adam_epsilon,
    )
    model.train()

    def step(source_ids, decoder_ids, labels):
        optimizer.zero_grad(set_to_none=True)
        logits = model(source_ids, decoder_ids)
        loss = F.cross_entropy(
            logits.reshape(-1, config.vocab_size),
            labels.reshape(-1),
            ignore_index=PAD_ID,
            label_smoothing=config.label_smoothing,
        )
        loss.backward()
        optimizer.step()
        return loss

    return model, step

"""CTranslate2 export: a model directory as a CTranslate2 model, through CTranslate2's converter.

CTranslate2 (OpenNMT's C++ inference engine) is the field's reference for translation
on CPUs. `export_ctranslate2` fills a `ctranslate2.specs.TransformerSpec` from the
model's weights and hands it to CTranslate2's own `Converter`, which validates it,
quantizes it and writes the model directory CTranslate2 loads:

- the architecture: post-norm (the paper) or pre-norm with the final LayerNorms
  (`norm_first`), the FFN activation (ReLU, GELU or swish) and its gate (`gated_ffn`),
  the layer-norm epsilon;
- the weights: CTranslate2 keeps PyTorch's `[out, in]` layout, so every Keras kernel
  `[in, out]` is transposed; self-attention's Q, K and V are fused into one matrix and
  cross-attention's K and V into another, CTranslate2's layout;
- the embeddings, scaled by `sqrt(d_model)` as in the model, shared between source,
  target and the pre-softmax projection when the model shares them (with the logits
  bias where the model has one), or the untied projection;
- the positions: the model's own table (the paper's interleaved sinusoids, or the
  learned/loaded one) for its `max_length` positions. CTranslate2's built-in sinusoids
  put every sine before every cosine, so they are never used;
- the vocabulary: the tokenizer's pieces in id order, so CTranslate2's ids are ours
  (PAD 0, UNK 1, BOS 2 = `<s>` the decoder start, EOS 3 = `</s>`), and
  `add_source_eos`, so the source gets its EOS as the model was trained.

Besides CTranslate2's files (`model.bin`, `config.json`, `shared_vocabulary.json`), the
directory holds the tokenizer (`tokenizer.model`) and `keras_transformer.json` (the
model's `max_length` and the export's settings), which `CTranslate2Translator` reads.

A Keras int8 model (`model.quantize("int8")`) exports too: its kernels are dequantized
(`int8 / scale`) first. `ctranslate2` is an optional dependency:
`pip install keras-transformer[ctranslate2]`.
"""

import dataclasses
import json
import os

import keras
import numpy as np

from keras_transformer import checks, internals
from keras_transformer.atomic import write_directory_atomically
from keras_transformer.layers.embedding import sinusoidal_table
from keras_transformer.model.config import TransformerConfig
from keras_transformer.model.directory import load_model_and_tokenizer

# What `quantization` may be: CTranslate2's weight types that make sense for a CPU
# model (None keeps float32). "int8" stores int8 weights and computes in int8;
# "int8_float32" the same with float32 for what is not a matmul; "float16" halves the file
# (on a CPU, CTranslate2 computes it in float32).
QUANTIZATIONS = (None, "int8", "int8_float32", "float16")
SETTINGS_FILE = "keras_transformer.json"  # what CTranslate2Translator needs beyond CTranslate2's files
SETTINGS_FORMAT = 1
INSTALL_HINT = "pip install keras-transformer[ctranslate2]"

# The FFN activations CTranslate2 has, by the names `TransformerConfig.activation` takes.
# Keras' "gelu" is the exact (erf) one, CTranslate2's GELU; swish is x * sigmoid(x).
_ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "swish": "SWISH"}

# `TransformerConfig` fields the export maps (or that do not change inference). A field
# added later and not listed here is exported only at its default value: a model that
# uses it is refused instead of converted wrong.
_MAPPED_FIELDS = frozenset(
    {
        "vocab_size",
        "d_model",
        "num_heads",
        "d_ff",
        "num_encoder_layers",
        "num_decoder_layers",
        "dropout",  # training only
        "attention_dropout",  # training only
        "activation_dropout",  # training only
        "source_word_dropout",  # training only
        "target_word_dropout",  # training only
        "max_length",
        "share_embeddings",
        "norm_first",
        "position_encoding",
        "layer_norm_epsilon",
        "activation",
        "gated_ffn",
        "scale_embeddings",
        "output_bias",
        "dtype_policy",  # weights are exported as float32, then quantized by `quantization`
    }
)


def import_ctranslate2():
    """The `ctranslate2` module, or an `ImportError` that says how to install it."""
    try:
        import ctranslate2
        import ctranslate2.converters
        import ctranslate2.specs
    except ImportError as error:
        raise ImportError(
            "The CTranslate2 engine needs the `ctranslate2` package, an optional "
            f"dependency of keras-transformer: `{INSTALL_HINT}` (or `pip install "
            f"ctranslate2`). ({error})"
        ) from error
    return ctranslate2


def check_quantization(quantization):
    """Raises ValueError unless `quantization` is one of `QUANTIZATIONS`."""
    if quantization is not None and not isinstance(quantization, str):
        raise ValueError(
            f"`quantization` must be one of {QUANTIZATIONS}. Received: quantization={quantization!r}"
        )
    checks.check_choice("quantization", quantization, QUANTIZATIONS)


def export_ctranslate2(
    model_dir_or_model, output_dir, quantization=None, *, tokenizer=None, overwrite=False
):
    """Writes a CTranslate2 model directory of a model; returns its path.

    The directory is written beside `output_dir` under a hidden name and renamed into
    place when complete (`keras_transformer.atomic`), so a failed export leaves any
    earlier one whole. Translate with it through `CTranslate2Translator(output_dir)`
    or with CTranslate2 itself (`ctranslate2.Translator(output_dir)`, whose source
    tokens are the tokenizer's pieces, without EOS: CTranslate2 adds it).

    Args:
        model_dir_or_model: a model directory (`model.keras` + `tokenizer.model`) or a
            `keras_transformer.Transformer` (then `tokenizer` is required).
        output_dir: str or path-like, the CTranslate2 model directory to write.
        quantization: None (float32 weights), "int8", "int8_float32" or "float16":
            the weight type CTranslate2 stores (`ctranslate2.Translator` can still
            convert it at load time with `compute_type`).
        tokenizer: the `SubwordTokenizer` (or its path); defaults to the directory's.
        overwrite: bool, replace an existing `output_dir` instead of raising.

    Returns:
        str, `output_dir`.

    Raises:
        ImportError: `ctranslate2` is not installed (the message names the extra).
        ValueError: a `quantization` outside `QUANTIZATIONS`, or a model option
            CTranslate2 does not have (named).
        FileExistsError: `output_dir` exists and `overwrite` is False.

    Example:

    ```python
    export_ctranslate2("saved_models/demo", "saved_models/demo_ct2", quantization="int8")
    # 'saved_models/demo_ct2'
    ```
    """
    check_quantization(quantization)
    checks.check_bool("overwrite", overwrite)
    ctranslate2 = import_ctranslate2()
    output_dir = os.fspath(output_dir)
    if os.path.exists(output_dir) and not overwrite:
        raise FileExistsError(f"{output_dir} already exists; pass overwrite=True (--overwrite) to replace it.")
    model, tokenizer = load_model_and_tokenizer(model_dir_or_model, tokenizer)
    spec = transformer_spec(model, tokenizer)
    settings = {
        "format": SETTINGS_FORMAT,
        "max_length": model.config.max_length,
        "vocab_size": model.config.vocab_size,
        "quantization": quantization,
        "tokenizer_sha256": tokenizer.fingerprint,
        "ctranslate2_version": ctranslate2.__version__,
    }

    def write(directory):
        save_spec(spec, directory, quantization)
        tokenizer.save(directory)
        with open(os.path.join(directory, SETTINGS_FILE), "w", encoding="utf-8") as file:
            json.dump(settings, file, indent=2, sort_keys=True)
            file.write("\n")

    write_directory_atomically(output_dir, write, overwrite=overwrite)
    return output_dir


def save_spec(spec, directory, quantization=None):
    """Writes `spec` as a CTranslate2 model in `directory` (replaced if it exists).

    Through CTranslate2's own `Converter.convert`: it validates the spec, quantizes the
    weights to `quantization` and saves `model.bin`, `config.json` and the vocabulary.
    """
    check_quantization(quantization)
    ctranslate2 = import_ctranslate2()

    class _SpecConverter(ctranslate2.converters.Converter):
        """CTranslate2's converter over a spec made here."""

        def _load(self):
            return spec

    return _SpecConverter().convert(os.fspath(directory), quantization=quantization, force=True)


def transformer_spec(model, tokenizer):
    """A `ctranslate2.specs.TransformerSpec` holding `model`'s weights and `tokenizer`'s vocabulary.

    `tokenizer` needs `vocab_size` and `id_to_piece` only (a benchmark of random
    weights passes made-up pieces).

    Raises:
        ValueError: the model uses an option CTranslate2 does not have.
    """
    ctranslate2 = import_ctranslate2()
    specs = ctranslate2.specs
    config = model.config
    _check_exportable(config)
    activation = getattr(specs.Activation, _ACTIVATIONS[getattr(config, "activation", "relu")])
    spec = specs.TransformerSpec.from_config(
        (config.num_encoder_layers, config.num_decoder_layers),
        config.num_heads,
        pre_norm=config.norm_first,  # pre-norm adds the stacks' final LayerNorms
        activation=activation,
        ffn_glu=bool(getattr(config, "gated_ffn", False)),
    )
    spec.config.layer_norm_epsilon = float(config.layer_norm_epsilon)
    spec.config.add_source_eos = True  # the model was trained on sources ending with EOS

    encoder, decoder = model.encoder_stack, model.decoder_stack
    _set_inputs(spec.encoder, spec.encoder.embeddings[0], encoder, config)
    _set_inputs(spec.decoder, spec.decoder.embeddings, decoder, config)
    if config.norm_first:
        _set_layer_norm(spec.encoder.layer_norm, encoder.final_norm)
        _set_layer_norm(spec.decoder.layer_norm, decoder.final_norm)
    for layer_spec, block in zip(spec.encoder.layer, encoder.blocks):
        _set_attention(layer_spec.self_attention, block.self_attention, block.self_attention_norm, fused=3)
        _set_feed_forward(layer_spec.ffn, block)
    for layer_spec, block in zip(spec.decoder.layer, decoder.blocks):
        _set_attention(layer_spec.self_attention, block.self_attention, block.self_attention_norm, fused=3)
        _set_attention(layer_spec.attention, block.cross_attention, block.cross_attention_norm, fused=2)
        _set_feed_forward(layer_spec.ffn, block)

    if decoder.output_projection is None:  # shared embeddings: logits = x E^T (+ b)
        spec.decoder.projection.weight = spec.decoder.embeddings.weight
        logits_bias = getattr(decoder.token_embedding, "logits_bias", None)
        if logits_bias is not None:
            spec.decoder.projection.bias = _numpy(logits_bias)
    else:
        _set_linear(spec.decoder.projection, decoder.output_projection)

    vocabulary = [tokenizer.id_to_piece(i) for i in range(tokenizer.vocab_size)]
    spec.register_source_vocabulary(vocabulary)
    spec.register_target_vocabulary(vocabulary)
    return spec


def _check_exportable(config):
    """Raises ValueError naming the first option of `config` the export cannot carry over."""
    activation = getattr(config, "activation", "relu")
    if activation not in _ACTIVATIONS:
        raise ValueError(
            "CTranslate2 has no FFN activation "
            f"{activation!r}; the export supports {tuple(_ACTIVATIONS)}. Received: activation={activation!r}"
        )
    defaults = {field.name: field.default for field in dataclasses.fields(TransformerConfig)}
    for name, default in defaults.items():
        value = getattr(config, name)
        if name not in _MAPPED_FIELDS and value != default:
            raise ValueError(
                f"The CTranslate2 export does not carry over the model option {name}={value!r} "
                f"(only its default, {default!r}); this model cannot be converted."
            )


def _numpy(variable):
    """A float32 NumPy copy of a Keras variable (any backend, any float dtype)."""
    return np.asarray(keras.ops.convert_to_numpy(variable), dtype=np.float32)


def _dense_kernel(dense):
    """The float32 `[in, out]` kernel of a `Dense`: dequantized if int8, LoRA merged if on."""
    mode = dense.quantization_mode
    if mode is None:
        return _numpy(dense.kernel)  # includes the LoRA term when LoRA is enabled
    if mode != "int8":
        raise ValueError(
            f"The CTranslate2 export reads float or int8 kernels; {dense.path} is quantized "
            f"with {mode!r}. Export the float model, with quantization='int8' if wanted."
        )
    # Keras' int8 Dense computes `(x @ q) / scale`, one scale per output unit.
    kernel = keras.ops.convert_to_numpy(internals.stored_kernel(dense)).astype(np.float32) / _numpy(dense.kernel_scale)
    if dense.lora_enabled:
        kernel = kernel + (dense.lora_alpha / dense.lora_rank) * (
            _numpy(dense.lora_kernel_a) @ _numpy(dense.lora_kernel_b)
        )
    return kernel


def _set_linear(spec, dense):
    spec.weight = np.ascontiguousarray(_dense_kernel(dense).T)  # Keras [in, out] -> [out, in]
    if dense.use_bias:
        spec.bias = _numpy(dense.bias)


def _fuse_linear(spec, denses):
    """One `[k * out, in]` matrix (and bias) of `denses`: CTranslate2's fused projections."""
    spec.weight = np.concatenate([_dense_kernel(dense).T for dense in denses], axis=0)
    if all(dense.use_bias for dense in denses):
        spec.bias = np.concatenate([_numpy(dense.bias) for dense in denses], axis=0)


def _set_layer_norm(spec, norm):
    spec.gamma = _numpy(norm.gamma)
    spec.beta = _numpy(norm.beta)


def _set_attention(spec, attention, norm, fused):
    """Self-attention (`fused=3`: Q, K, V in one matrix) or cross-attention (`fused=2`: K, V)."""
    query, key, value = attention.query_dense, attention.key_dense, attention.value_dense
    if fused == 3:
        _fuse_linear(spec.linear[0], (query, key, value))
    else:
        _set_linear(spec.linear[0], query)
        _fuse_linear(spec.linear[1], (key, value))
    _set_linear(spec.linear[-1], attention.output_dense)
    # Post-norm: CTranslate2 normalizes x + attention(x); pre-norm: the sub-layer's input.
    _set_layer_norm(spec.layer_norm, norm)


def _set_feed_forward(spec, block):
    feed_forward = block.feed_forward
    _set_linear(spec.linear_0, feed_forward.intermediate_dense)  # activated
    if feed_forward.gate_dense is not None:  # CTranslate2 multiplies act(linear_0) by linear_0_noact
        _set_linear(spec.linear_0_noact, feed_forward.gate_dense)
    _set_linear(spec.linear_1, feed_forward.output_dense)
    _set_layer_norm(spec.layer_norm, block.feed_forward_norm)


def _set_inputs(stack_spec, embeddings_spec, stack, config):
    """Token embeddings, their `sqrt(d_model)` scale and the position table of one stack."""
    embeddings_spec.weight = _numpy(stack.token_embedding.embeddings)
    stack_spec.scale_embeddings = bool(getattr(config, "scale_embeddings", True))
    stack_spec.position_encodings.encodings = position_table(stack.position_encoding, config)


def position_table(position_layer, config):
    """float32 `[max_length, d_model]`: what the model adds at each position.

    The sinusoidal layer computes its table (it has no weights); learned and loaded
    tables are the layer's weights.
    """
    table = getattr(position_layer, "position_embeddings", None)
    if table is not None:
        return _numpy(table)
    positions = keras.ops.arange(config.max_length, dtype="int32")
    return np.asarray(keras.ops.convert_to_numpy(sinusoidal_table(positions, config.d_model)), np.float32)


__all__ = [
    "QUANTIZATIONS",
    "SETTINGS_FILE",
    "INSTALL_HINT",
    "import_ctranslate2",
    "check_quantization",
    "export_ctranslate2",
    "transformer_spec",
    "save_spec",
    "position_table",
]

"""Reading a Hugging Face `MarianMTModel` directory: config, weights and tokenizer files.

The directory is what `save_pretrained` writes (and what `huggingface-cli download
Helsinki-NLP/opus-mt-de-en` fetches): `config.json`, `model.safetensors` (or
`pytorch_model.bin`), `source.spm`, `target.spm`, `vocab.json`, `tokenizer_config.json`.
`transformer_config` says how Marian's architecture maps onto `TransformerConfig`, and
refuses, naming the setting, what this package cannot represent.

Reading the config needs `transformers` (its `MarianConfig` supplies the defaults that
an old `config.json` leaves out) and the weights need `safetensors`: the `marian` extra,
`pip install 'keras-transformer[marian]'`. A `pytorch_model.bin` also needs `torch`.
"""

import json
import os

import numpy as np

from keras_transformer.model.config import TransformerConfig

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX_FILE = "model.safetensors.index.json"
PYTORCH_FILE = "pytorch_model.bin"
SOURCE_SPM_FILE = "source.spm"
TARGET_SPM_FILE = "target.spm"
VOCAB_FILE = "vocab.json"
TARGET_VOCAB_FILE = "target_vocab.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"

# Hugging Face's names of FFN activations -> ours (`TransformerConfig.activation`).
_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}
# torch.nn.LayerNorm's default, which every Marian layer norm uses.
MARIAN_LAYER_NORM_EPSILON = 1e-5
_EXTRA_MESSAGE = "pip install 'keras-transformer[marian]'"


def check_marian_directory(hf_dir):
    """Returns `hf_dir` as a str, after checking it holds a Marian model's files.

    Raises:
        FileNotFoundError: no such directory, or one of the files is missing (named).
    """
    hf_dir = os.fspath(hf_dir)
    if not os.path.isdir(hf_dir):
        raise FileNotFoundError(
            f"No Hugging Face model directory at {hf_dir!r}; download one first, e.g. "
            "`huggingface-cli download Helsinki-NLP/opus-mt-de-en --local-dir DIR`."
        )
    for name in (CONFIG_FILE, SOURCE_SPM_FILE, TARGET_SPM_FILE, VOCAB_FILE):
        if not os.path.isfile(os.path.join(hf_dir, name)):
            raise FileNotFoundError(
                f"{hf_dir} has no {name}: a Marian model directory holds config.json, "
                "the weights, source.spm, target.spm and vocab.json."
            )
    if not any(
        os.path.isfile(os.path.join(hf_dir, name))
        for name in (SAFETENSORS_FILE, SAFETENSORS_INDEX_FILE, PYTORCH_FILE)
    ):
        raise FileNotFoundError(
            f"{hf_dir} has no weights: expected {SAFETENSORS_FILE} or {PYTORCH_FILE}."
        )
    return hf_dir


def read_marian_config(hf_dir):
    """The `transformers.MarianConfig` of `hf_dir/config.json`, with Hugging Face's defaults.

    Raises:
        ImportError: transformers is not installed (the message names the extra).
        ValueError: the config is not a Marian model's.
    """
    try:
        from transformers import MarianConfig
    except ImportError as error:
        raise ImportError(
            f"Importing a Marian model needs the `transformers` package: {_EXTRA_MESSAGE}"
        ) from error
    path = os.path.join(os.fspath(hf_dir), CONFIG_FILE)
    with open(path, encoding="utf-8") as file:
        try:
            values = json.load(file)
        except ValueError as error:
            raise ValueError(f"{path} is corrupt: {error}") from None
    if values.get("model_type") != "marian":
        raise ValueError(
            f"{path} is not a Marian model's config: model_type={values.get('model_type')!r}, "
            "expected 'marian' (a MarianMTModel, as the OPUS-MT models are)."
        )
    return MarianConfig.from_pretrained(os.fspath(hf_dir))


def transformer_config(marian_config, vocab_size):
    """The `TransformerConfig` that computes what `marian_config` describes.

    Args:
        marian_config: a `transformers.MarianConfig`.
        vocab_size: int, our vocabulary size (`MarianVocabulary.vocab_size`).

    Raises:
        ValueError: a setting this package cannot represent, named.
    """
    c = marian_config
    refusals = []
    if not getattr(c, "share_encoder_decoder_embeddings", True):
        refusals.append(
            "share_encoder_decoder_embeddings=False (separate source and target vocabularies): "
            "this package has one vocabulary for both sides"
        )
    elif (c.decoder_vocab_size or c.vocab_size) != c.vocab_size:
        refusals.append(f"decoder_vocab_size={c.decoder_vocab_size} differs from vocab_size={c.vocab_size}")
    if c.encoder_attention_heads != c.decoder_attention_heads:
        refusals.append(
            f"encoder_attention_heads={c.encoder_attention_heads} differs from "
            f"decoder_attention_heads={c.decoder_attention_heads}: one num_heads here"
        )
    if c.encoder_ffn_dim != c.decoder_ffn_dim:
        refusals.append(
            f"encoder_ffn_dim={c.encoder_ffn_dim} differs from decoder_ffn_dim={c.decoder_ffn_dim}: one d_ff here"
        )
    if c.activation_function not in _ACTIVATIONS:
        refusals.append(
            f"activation_function={c.activation_function!r}: expected one of {sorted(_ACTIVATIONS)}"
        )
    if c.d_model % c.encoder_attention_heads:
        refusals.append(f"d_model={c.d_model} is not divisible by {c.encoder_attention_heads} heads")
    if refusals:
        raise ValueError("This Marian model cannot be represented: " + "; ".join(refusals) + ".")
    return TransformerConfig(
        vocab_size=vocab_size,
        d_model=c.d_model,
        num_heads=c.encoder_attention_heads,
        d_ff=c.encoder_ffn_dim,
        num_encoder_layers=c.encoder_layers,
        num_decoder_layers=c.decoder_layers,
        dropout=float(c.dropout),
        attention_dropout=float(c.attention_dropout),
        activation_dropout=float(c.activation_dropout),
        max_length=c.max_position_embeddings,
        share_embeddings=True,
        norm_first=False,  # Hugging Face's Marian layers are post-norm, whatever else config.json says
        position_encoding="fixed",  # Marian's sinusoids, sines before cosines: loaded as a table
        layer_norm_epsilon=MARIAN_LAYER_NORM_EPSILON,
        activation=_ACTIVATIONS[c.activation_function],
        scale_embeddings=bool(c.scale_embedding),
        output_bias=True,  # final_logits_bias
    )


def read_weights(hf_dir):
    """{name: float32 numpy array} of the model's weights, from safetensors or a torch file.

    Raises:
        ImportError: safetensors (or, for a `.bin`, torch) is not installed.
    """
    hf_dir = os.fspath(hf_dir)
    index = os.path.join(hf_dir, SAFETENSORS_INDEX_FILE)
    single = os.path.join(hf_dir, SAFETENSORS_FILE)
    if os.path.isfile(single) or os.path.isfile(index):
        try:
            from safetensors.numpy import load_file
        except ImportError as error:
            raise ImportError(f"Reading {SAFETENSORS_FILE} needs safetensors: {_EXTRA_MESSAGE}") from error
        if os.path.isfile(single):
            files = [single]
        else:
            with open(index, encoding="utf-8") as file:
                files = sorted({os.path.join(hf_dir, name) for name in json.load(file)["weight_map"].values()})
        weights = {}
        for path in files:
            weights.update(load_file(path))
    else:
        try:
            import torch
        except ImportError as error:
            raise ImportError(
                f"Reading {PYTORCH_FILE} needs torch; or convert it to {SAFETENSORS_FILE}."
            ) from error
        state = torch.load(os.path.join(hf_dir, PYTORCH_FILE), map_location="cpu", weights_only=True)
        weights = {name: tensor.float().numpy() for name, tensor in state.items()}
    return {name: np.asarray(value, dtype="float32") for name, value in weights.items()}


def marian_position_table(positions, width):
    """Hugging Face's Marian sinusoids `[positions, width]`: every sine, then every cosine.

    The frequencies are the paper's (3.5), `pos / 10000^(2i / width)`; the layout is
    not: channel `i < ceil(width / 2)` holds the sine of pair `i`, the rest the cosines
    (`MarianSinusoidalPositionalEmbedding`, which `save_pretrained` does not save).
    """
    pos = np.arange(positions, dtype="float64")[:, None]
    j = np.arange(width)
    angles = pos / np.power(10000.0, 2 * (j // 2) / width)  # [positions, width]
    half = (width + 1) // 2
    table = np.empty((positions, width), dtype="float64")
    table[:, :half] = np.sin(angles[:, 0::2])
    table[:, half:] = np.cos(angles[:, 1::2])
    return table.astype("float32")


def read_tokenizer_files(hf_dir):
    """`(source_spm bytes, target_spm bytes, vocab dict, unk piece)` of `hf_dir`.

    Raises:
        ValueError: separate source and target vocabularies (`target_vocab.json`,
            `separate_vocabs`), which one shared vocabulary cannot hold.
    """
    hf_dir = os.fspath(hf_dir)
    settings = {}
    settings_path = os.path.join(hf_dir, TOKENIZER_CONFIG_FILE)
    if os.path.isfile(settings_path):
        with open(settings_path, encoding="utf-8") as file:
            settings = json.load(file)
    if settings.get("separate_vocabs") or os.path.isfile(os.path.join(hf_dir, TARGET_VOCAB_FILE)):
        raise ValueError(
            f"{hf_dir} has separate source and target vocabularies ({TARGET_VOCAB_FILE}); "
            "this package has one vocabulary for both sides, so it cannot represent them."
        )
    with open(os.path.join(hf_dir, VOCAB_FILE), encoding="utf-8") as file:
        vocab = json.load(file)
    unk = settings.get("unk_token", "<unk>")
    if isinstance(unk, dict):  # an AddedToken, as some versions write it
        unk = unk.get("content", "<unk>")
    spm = []
    for name in (SOURCE_SPM_FILE, TARGET_SPM_FILE):
        with open(os.path.join(hf_dir, name), "rb") as file:
            spm.append(file.read())
    return spm[0], spm[1], vocab, unk


__all__ = [
    "check_marian_directory",
    "read_marian_config",
    "transformer_config",
    "read_weights",
    "marian_position_table",
    "read_tokenizer_files",
    "MARIAN_LAYER_NORM_EPSILON",
]

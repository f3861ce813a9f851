"""Presets in keras-hub's format: a model and its tokenizer as one directory to share.

`save_preset` writes what keras-hub's `save_to_preset` writes for a backbone and a
SentencePiece tokenizer (keras_hub/src/utils/preset_utils.py, `KerasPresetSaver`), so
`keras_hub.upload_preset("kaggle://...", preset_dir)` or `("hf://...", preset_dir)`
accepts the directory, and keras-hub's own preset loader reads it back:

```text
preset_dir/
  config.json                     the model, as keras.saving.serialize_keras_object writes it
                                  ("module", "class_name", "config", "registered_name")
  model.weights.h5                its weights (model.save_weights), any backend
  tokenizer.json                  a keras_hub.tokenizers.SentencePieceTokenizer
  assets/tokenizer/vocabulary.spm the sentencepiece model (the model directory's tokenizer.model)
  metadata.json                   keras_version, keras_hub_version, parameter_count,
                                  date_saved, tasks; and keras_transformer_version and
                                  tokenizer_sha256 (the tokenizer's fingerprint)
```

`load_preset(handle)` returns `(model, tokenizer)`: from a local directory with this
package alone, and from a `kaggle://` or `hf://` handle through keras-hub's `get_file`
(the function its `from_preset` downloads with; keras-hub is the optional extra `hub`).
Writing needs no keras-hub: the tokenizer's entry is the JSON keras-hub writes for it.
"""

import datetime
import importlib.metadata
import json
import os

import keras

from keras_transformer import atomic

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.weights.h5"
TOKENIZER_CONFIG_FILE = "tokenizer.json"
VOCABULARY_FILE = "assets/tokenizer/vocabulary.spm"  # keras-hub's SentencePieceTokenizer asset
METADATA_FILE = "metadata.json"
# What a preset must hold; metadata.json is written, but loading does not need it.
REQUIRED_FILES = (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_CONFIG_FILE, VOCABULARY_FILE)
REGISTERED_NAME = "keras_transformer>Transformer"
HUB_INSTALL_HINT = "pip install 'keras-transformer[hub]'"

# What keras_hub.tokenizers.SentencePieceTokenizer(proto=...) serializes to (keras-hub
# 0.32): the vocabulary travels as the asset file, so "proto" is null here.
_TOKENIZER_CONFIG = {
    "module": "keras_hub.src.tokenizers.sentence_piece_tokenizer",
    "class_name": "SentencePieceTokenizer",
    "config": {
        "name": "sentence_piece_tokenizer",
        "trainable": True,
        "dtype": {
            "module": "keras",
            "class_name": "DTypePolicy",
            "config": {"name": "int32"},
            "registered_name": None,
        },
        "config_file": TOKENIZER_CONFIG_FILE,
        "proto": None,
        "sequence_length": None,
        "add_bos": False,
        "add_eos": False,
    },
    "registered_name": "keras_hub>SentencePieceTokenizer",
}


def save_preset(model_dir_or_model, preset_dir, tokenizer=None, *, overwrite=False):
    """Writes a model and its tokenizer as a keras-hub preset directory; returns its path.

    The directory is written beside `preset_dir` and renamed into place when complete,
    so a failure leaves no half-written preset.

    Args:
        model_dir_or_model: a model directory (its `model.keras` and `tokenizer.model`)
            or a `Transformer`.
        preset_dir: str or path, the directory to write.
        tokenizer: the `SubwordTokenizer` (or its path); needed with a model object,
            and checked against the directory's manifest with a model directory.
        overwrite: bool, replace an existing `preset_dir`. Default False.

    Raises:
        FileExistsError: `preset_dir` exists and `overwrite` is False.
        FileNotFoundError, ValueError, TypeError: as `load_model_and_tokenizer`; and
            `ValueError` for a tokenizer that is not one sentencepiece vocabulary.

    Example:

    ```python
    kt.save_preset("saved_models/demo", "presets/demo_en_de")
    # keras_hub.upload_preset("kaggle://user/demo/keras/en_de", "presets/demo_en_de")
    ```
    """
    from keras_transformer.model.directory import load_model_and_tokenizer

    from keras_transformer.data.tokenizer import SubwordTokenizer

    model, tokenizer = load_model_and_tokenizer(model_dir_or_model, tokenizer)
    if not isinstance(tokenizer, SubwordTokenizer):
        raise ValueError(
            "A preset holds one joint sentencepiece vocabulary (keras-hub's "
            f"SentencePieceTokenizer). Received a {type(tokenizer).__name__}."
        )
    preset_dir = os.fspath(preset_dir)

    def write(directory):
        os.makedirs(os.path.join(directory, os.path.dirname(VOCABULARY_FILE)))
        _write_json(os.path.join(directory, CONFIG_FILE), model_config_json(model))
        model.save_weights(os.path.join(directory, WEIGHTS_FILE))
        _write_json(os.path.join(directory, TOKENIZER_CONFIG_FILE), _TOKENIZER_CONFIG)
        with open(os.path.join(directory, VOCABULARY_FILE), "wb") as file:
            file.write(tokenizer.model_proto)
        _write_json(os.path.join(directory, METADATA_FILE), _metadata(model, tokenizer))

    atomic.write_directory_atomically(preset_dir, write, overwrite=overwrite)
    return preset_dir


def load_preset(handle):
    """The `(model, tokenizer)` of a preset: a local directory, or a `kaggle://` / `hf://` handle.

    The model is built from `config.json` (which must name this package's
    `Transformer`) and given the weights of `model.weights.h5`, whichever backend wrote
    them; the tokenizer is the sentencepiece model in `assets/tokenizer/`. When
    `metadata.json` records the tokenizer's sha256 it must match, as must the
    vocabulary sizes. Handles with a scheme are fetched by keras-hub (cached by
    kagglehub or huggingface_hub) and need `pip install 'keras-transformer[hub]'`.

    Args:
        handle: str or path: a preset directory, or `"kaggle://owner/model/keras/variant"`
            / `"hf://owner/model"`.

    Returns:
        `(Transformer, SubwordTokenizer)`, the same pair `load_model_and_tokenizer`
        gives for a model directory.

    Raises:
        FileNotFoundError: no directory at `handle`, or the preset lacks a file (named,
            with the directory).
        ValueError: a `config.json` of another model, weights that do not fit it, a
            tokenizer that is not the model's.
        ImportError: a remote handle without keras-hub installed.
    """
    handle = os.fspath(handle)
    files = _remote_files(handle) if "://" in handle else _local_files(handle)
    model = _load_model(files, handle)
    tokenizer = _load_tokenizer(files, handle, model)
    return model, tokenizer


def model_config_json(model):
    """`config.json` of a preset: the model serialized as keras-hub's saver writes it.

    `keras.saving.serialize_keras_object(model)` without the compile and build configs
    (keras-hub drops both: a preset is for inference and fine-tuning, compiled anew).
    """
    config = keras.saving.serialize_keras_object(model)
    _drop_keys(config, ("compile_config", "build_config"))
    return config


# ----------------------------------------------------------------------- internals
def _local_files(directory):
    if not os.path.isdir(directory):
        raise FileNotFoundError(
            f"No preset directory at {directory!r}. Expected a directory written by "
            "kt.save_preset, or a 'kaggle://' or 'hf://' handle."
        )
    files = {name: os.path.join(directory, name) for name in (*REQUIRED_FILES, METADATA_FILE)}
    for name in REQUIRED_FILES:
        if not os.path.isfile(files[name]):
            raise FileNotFoundError(
                f"The preset directory {directory!r} has no {name}. A preset holds "
                f"{', '.join(REQUIRED_FILES)} (and {METADATA_FILE}), as kt.save_preset writes them."
            )
    if not os.path.isfile(files[METADATA_FILE]):
        files[METADATA_FILE] = None
    return files


def _remote_files(handle):
    """Local paths of a remote preset's files, fetched (and cached) by keras-hub."""
    try:
        from keras_hub.src.utils import preset_utils
    except ImportError as error:
        raise ImportError(
            f"Loading the preset {handle!r} needs keras-hub, an optional extra: {HUB_INSTALL_HINT}"
        ) from error
    files = {}
    for name in REQUIRED_FILES:
        try:
            files[name] = preset_utils.get_file(handle, name)
        except FileNotFoundError as error:
            raise FileNotFoundError(
                f"The preset {handle!r} has no {name} ({error}). A preset holds "
                f"{', '.join(REQUIRED_FILES)}, as kt.save_preset writes them."
            ) from error
    has_metadata = preset_utils.check_file_exists(handle, METADATA_FILE)
    files[METADATA_FILE] = preset_utils.get_file(handle, METADATA_FILE) if has_metadata else None
    return files


def _load_model(files, handle):
    from keras_transformer.model.config import TransformerConfig
    from keras_transformer.model.transformer import Transformer

    config = _read_json(files[CONFIG_FILE], handle)
    registered = config.get("registered_name") if isinstance(config, dict) else None
    if registered != REGISTERED_NAME:
        raise ValueError(
            f"{CONFIG_FILE} of the preset {handle!r} describes {registered!r}, not a "
            f"keras_transformer Transformer ({REGISTERED_NAME!r}); load it with keras-hub."
        )
    try:
        values = dict(config["config"])
        model_config = TransformerConfig.from_dict(values.pop("config"))
        # Built here, not by deserialize_keras_object: the file can only make this class.
        model = Transformer(model_config, name=values.get("name", "transformer"))
    except (KeyError, TypeError, ValueError) as error:
        raise ValueError(f"{CONFIG_FILE} of the preset {handle!r} is not a Transformer config: {error}") from None
    try:
        model.load_weights(files[WEIGHTS_FILE])
    except (OSError, ValueError, KeyError) as error:
        raise ValueError(
            f"{WEIGHTS_FILE} of the preset {handle!r} does not hold this model's weights "
            f"({type(error).__name__}: {error})"
        ) from None
    return model


def _load_tokenizer(files, handle, model):
    from keras_transformer.data.tokenizer import SubwordTokenizer

    with open(files[VOCABULARY_FILE], "rb") as file:
        proto = file.read()
    tokenizer = SubwordTokenizer(proto, source=f"{VOCABULARY_FILE} of the preset {handle!r}")
    if files[METADATA_FILE] is not None:
        expected = _read_json(files[METADATA_FILE], handle).get("tokenizer_sha256")
        if expected is not None and expected != tokenizer.fingerprint:
            raise ValueError(
                f"{VOCABULARY_FILE} of the preset {handle!r} is not the tokenizer it was saved "
                f"with: its sha256 is {tokenizer.fingerprint[:16]}..., {METADATA_FILE} records "
                f"{str(expected)[:16]}...."
            )
    if tokenizer.vocab_size != model.config.vocab_size:
        raise ValueError(
            f"The preset {handle!r} pairs a tokenizer of {tokenizer.vocab_size} pieces with a "
            f"model of vocab_size {model.config.vocab_size}: they were not trained together."
        )
    return tokenizer


def _metadata(model, tokenizer):
    """keras-hub's metadata.json fields, plus this package's version and the tokenizer's sha256."""
    from keras_transformer.version import __version__

    try:
        keras_hub_version = importlib.metadata.version("keras-hub")
    except importlib.metadata.PackageNotFoundError:
        keras_hub_version = None  # written without keras-hub; it reads the preset all the same
    return {
        "keras_version": keras.version(),
        "keras_hub_version": keras_hub_version,
        "parameter_count": model.count_params(),
        "date_saved": datetime.datetime.now().strftime("%Y-%m-%d@%H:%M:%S"),
        "tasks": [],  # keras-hub lists its Task classes for the backbone; none here
        "keras_transformer_version": __version__,
        "tokenizer_sha256": tokenizer.fingerprint,
    }


def _read_json(path, handle):
    try:
        with open(path, encoding="utf-8") as file:
            return json.load(file)
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{os.path.basename(path)} of the preset {handle!r} is not valid JSON: {error}") from None


def _write_json(path, value):
    with open(path, "w", encoding="utf-8") as file:
        file.write(json.dumps(value, indent=4))


def _drop_keys(config, keys):
    """Removes `keys` from a nested dict, in place (keras-hub's `_recursive_pop`)."""
    for key in keys:
        config.pop(key, None)
    for value in config.values():
        if isinstance(value, dict):
            _drop_keys(value, keys)


__all__ = ["save_preset", "load_preset", "model_config_json", "REQUIRED_FILES"]

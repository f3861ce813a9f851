"""The layout of a model directory: the names of what a training run writes.

One directory per run (`saved_models/<name>/`) holds everything needed to use or
continue it, under these names, defined here once for the trainer, the callbacks, the
evaluation and the command-line tools:

```
model.keras            the trained model (architecture, weights, optimizer state)
tokenizer.model        the joint sentencepiece vocabulary
config.toml            the RunConfig that produced it, [model] and [training] resolved
training_log.csv       one row per epoch (CSVLogger)
training_curves.png    loss / accuracy / learning rate / BLEU per epoch
logs/                  TensorBoard event files
checkpoints/           epoch_NNN.weights.h5, the last few epochs
backup/                BackupAndRestore's state while a run is unfinished
metrics.json           test scores written by kt-demo and kt-evaluate --write-metrics
```

`load_model_and_tokenizer(model_dir)` reads the first two back, and
`read_model_config(model_dir)` the model's `TransformerConfig` without its weights;
`RunConfig.from_toml(os.path.join(model_dir, "config.toml"))` gives the run back.
"""

import json
import os
import zipfile

import keras

# The names of a model directory's parts, defined once. tests/test_callbacks.py checks
# the tokenizer agrees.
MODEL_FILE = "model.keras"
TOKENIZER_FILE = "tokenizer.model"
CONFIG_FILE = "config.toml"
CSV_LOG_FILE = "training_log.csv"
CURVES_FILE = "training_curves.png"
TENSORBOARD_DIR = "logs"
CHECKPOINT_DIR = "checkpoints"
CHECKPOINT_PATTERN = "epoch_{epoch:03d}.weights.h5"  # Keras fills in the 1-based epoch
BACKUP_DIR = "backup"
METRICS_FILE = "metrics.json"

def load_model_and_tokenizer(model_dir_or_model, tokenizer=None):
    """The `(Transformer, SubwordTokenizer)` of a model directory, or the ones given.

    Args:
        model_dir_or_model: a directory with `model.keras` (and `tokenizer.model`
            unless `tokenizer` is given), or a `Transformer`.
        tokenizer: a `SubwordTokenizer`, a path to one, or None (the directory's).

    Returns:
        `(model, tokenizer)`, checked to share one vocabulary size.

    Raises:
        FileNotFoundError, TypeError, ValueError: with what was received.
    """
    from keras_transformer.data.tokenizer import SubwordTokenizer  # TensorFlow: load lazily
    from keras_transformer.model.transformer import Transformer

    if isinstance(model_dir_or_model, (str, os.PathLike)):
        model_dir = os.fspath(model_dir_or_model)
        model_path = os.path.join(model_dir, MODEL_FILE)
        if not os.path.isfile(model_path):
            raise FileNotFoundError(
                f"No {MODEL_FILE} in the model directory {model_dir!r}; expected the "
                "file written by model.save()."
            )
        model = keras.models.load_model(model_path, compile=False, safe_mode=True)
        if tokenizer is None:
            tokenizer = model_dir
    elif isinstance(model_dir_or_model, Transformer):
        model = model_dir_or_model
        if tokenizer is None:
            raise ValueError(
                "A model object needs its tokenizer: pass `tokenizer=` (a SubwordTokenizer "
                "or the path of its tokenizer.model)."
            )
    else:
        raise TypeError(
            "`model_dir_or_model` must be a model directory (str or path) or a "
            f"keras_transformer.Transformer. Received: {type(model_dir_or_model).__name__}"
        )
    if not isinstance(model, Transformer):
        raise TypeError(
            f"{MODEL_FILE} must hold a keras_transformer.Transformer. "
            f"Received: {type(model).__name__}"
        )
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = SubwordTokenizer.load(tokenizer)
    if not isinstance(tokenizer, SubwordTokenizer):
        raise TypeError(
            "`tokenizer` must be a SubwordTokenizer or the path of a tokenizer.model. "
            f"Received: {type(tokenizer).__name__}"
        )
    if tokenizer.vocab_size != model.config.vocab_size:
        raise ValueError(
            f"The tokenizer's vocab_size ({tokenizer.vocab_size}) differs from the model's "
            f"config.vocab_size ({model.config.vocab_size}): they were not trained together."
        )
    return model, tokenizer


def read_model_config(model_dir):
    """The `TransformerConfig` of a model directory's `model.keras`, without its weights.

    Reads the config that `model.save` wrote into the `.keras` archive (a zip holding
    `config.json`), so nothing is built and no weights are loaded.

    Raises:
        FileNotFoundError: the directory has no `model.keras`.
        ValueError: the file is not a `.keras` archive of a keras_transformer model.
    """
    from keras_transformer.model.config import TransformerConfig

    path = os.path.join(os.fspath(model_dir), MODEL_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"No {MODEL_FILE} in the model directory {os.fspath(model_dir)!r}.")
    try:
        with zipfile.ZipFile(path) as archive:
            saved = json.loads(archive.read("config.json"))
        values = saved["config"]["config"]
    except (zipfile.BadZipFile, KeyError, ValueError) as error:
        raise ValueError(
            f"{path} is not a .keras file of a keras_transformer model ({error})."
        ) from None
    return TransformerConfig.from_dict(values)


__all__ = [
    "load_model_and_tokenizer",
    "read_model_config",
    "MODEL_FILE",
    "TOKENIZER_FILE",
    "CONFIG_FILE",
    "CSV_LOG_FILE",
    "CURVES_FILE",
    "TENSORBOARD_DIR",
    "CHECKPOINT_DIR",
    "CHECKPOINT_PATTERN",
    "BACKUP_DIR",
    "METRICS_FILE",
]

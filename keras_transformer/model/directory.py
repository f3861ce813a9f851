"""The layout of a model directory: the names of what a training run writes.

One directory per run (`saved_models/<name>/`) holds everything needed to use or
continue it, under these names (defined once, in `keras_transformer.file_names`, and
importable from here):

```
model.keras            the trained model (architecture, weights, optimizer state)
tokenizer.model        the joint sentencepiece vocabulary
  or, for a model imported from Marian / OPUS-MT (keras_transformer.marian):
source.spm, target.spm, vocab.json, marian_tokenizer.json
config.toml            the RunConfig that produced it, [model] and [training] resolved;
                       its eval_beam_size, eval_length_penalty: the model's beam search
manifest.json          what the run's parts are: the tokenizer's sha256 (its fingerprint)
training_log.csv       one row per epoch (CSVLogger)
training_curves.png    loss / accuracy / learning rate / BLEU per epoch
logs/                  TensorBoard event files
checkpoints/           epoch_NNN.weights.h5, the last few epochs
backup/                BackupAndRestore's state while a run is unfinished
metrics.json           test scores written by kt-demo and kt-evaluate --write-metrics
```

`load_model_and_tokenizer(model_dir)` reads the model and its tokenizer back (the kind
of tokenizer that `manifest.json` names: "sentencepiece", the default, or "marian")
and checks that the tokenizer is the one the model was trained with (the manifest's fingerprint; a
directory without a manifest, written by 0.1 or by hand, is checked by vocabulary size
only), and `read_model_config(model_dir)` gives the model's `TransformerConfig`
without its weights; `RunConfig.from_toml(os.path.join(model_dir, "config.toml"))`
gives the run back. A `model.keras` or `tokenizer.model` that is truncated or corrupt
is refused with a `ValueError` that names the file.

While a run trains, its directory is written beside the target, in the hidden
`.<name>.staging/` (see `keras_transformer.train.run`), and renamed into place when it
is complete, so `saved_models/<name>/` is always a whole run: the old one or the new.
"""

import hashlib
import json
import os
import tomllib
import zipfile
import zlib

import keras

from keras_transformer import checks
from keras_transformer.atomic import write_text_atomically

# The names of a model directory's parts, defined once in a leaf module (the tokenizers
# write their files under them) and importable from here.
from keras_transformer.file_names import (
    BACKUP_DIR,
    CHECKPOINT_DIR,
    CHECKPOINT_PATTERN,
    CONFIG_FILE,
    CSV_LOG_FILE,
    CURVES_FILE,
    MANIFEST_FILE,
    MARIAN_SOURCE_SPM_FILE,
    MARIAN_TARGET_SPM_FILE,
    MARIAN_TOKENIZER_FILE,
    MARIAN_VOCAB_FILE,
    METRICS_FILE,
    MODEL_FILE,
    TENSORBOARD_DIR,
    TOKENIZER_FILE,
)
from keras_transformer.search_defaults import BEAM_SIZE, LENGTH_PENALTY
# The version of manifest.json's layout: 2 added "tokenizer_kind", written only for a
# tokenizer other than sentencepiece, so that a reader of format 1 refuses such a
# directory ("newer than this package reads") instead of looking for tokenizer.model.
MANIFEST_FORMAT = 2
# The kinds of tokenizer a model directory may hold; the manifest's "tokenizer_kind".
SENTENCEPIECE_KIND = "sentencepiece"
MARIAN_KIND = "marian"
TOKENIZER_KINDS = (SENTENCEPIECE_KIND, MARIAN_KIND)
# What reading a damaged zip archive raises; a missing or unreadable file
# (FileNotFoundError, PermissionError) is not a damaged one and keeps its own error.
_ARCHIVE_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, KeyError, json.JSONDecodeError, UnicodeDecodeError)

def load_model_and_tokenizer(model_dir_or_model, tokenizer=None):
    """The `(Transformer, tokenizer)` of a model directory, or the ones given.

    The tokenizer is a `SubwordTokenizer`, or for a model imported from Marian /
    OPUS-MT a `keras_transformer.marian.MarianTokenizer`: the kind the directory's
    manifest names (or, without a manifest, the files it holds).

    From a directory with a `manifest.json`, the tokenizer (the directory's own, or the
    one given) must be the one recorded there: its sha256 is compared, so a tokenizer
    of the same vocabulary size trained on other text is refused, as is a damaged
    copy. Without a manifest (a 0.1 directory, or one made by hand) only the
    vocabulary sizes are compared.

    Args:
        model_dir_or_model: a directory with `model.keras` (and its tokenizer's files
            unless `tokenizer` is given), or a `Transformer`.
        tokenizer: a tokenizer object, a path to one (a `tokenizer.model` file, or a
            directory holding `tokenizer.model` or a Marian tokenizer's files), or
            None (the directory's).

    Returns:
        `(model, tokenizer)`, checked to belong together.

    Raises:
        FileNotFoundError: a missing `model.keras` or tokenizer file.
        ValueError: a corrupt or truncated file (named), or a tokenizer that is not
            the model's.
        TypeError: arguments of the wrong kind.
    """
    model_dir, model, manifest = _read_model(model_dir_or_model, tokenizer)
    if tokenizer is None:
        tokenizer = model_dir  # a directory's own (`_read_model` refuses a model object without one)
    source = "the tokenizer given"
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer, source = _load_tokenizer(os.fspath(tokenizer), manifest, model_dir)
    if not isinstance(tokenizer, _tokenizer_classes()):
        raise TypeError(
            "`tokenizer` must be a SubwordTokenizer, a MarianTokenizer, or the path of one. "
            f"Received: {type(tokenizer).__name__}"
        )
    if manifest is not None:
        _check_fingerprint(tokenizer.fingerprint, manifest, source, model_dir)
    if tokenizer.vocab_size != model.config.vocab_size:
        raise ValueError(
            f"The tokenizer's vocab_size ({tokenizer.vocab_size}) differs from the model's "
            f"config.vocab_size ({model.config.vocab_size}): they were not trained together."
        )
    return model, tokenizer


def _read_model(model_dir_or_model, tokenizer):
    """`(model_dir, model, manifest)`: a directory's model and manifest, or the model given.

    `model_dir` and `manifest` are None for a model object; a directory without a
    manifest (0.1) has `manifest` None.
    """
    from keras_transformer.model.transformer import Transformer

    manifest = None
    model_dir = None
    if isinstance(model_dir_or_model, (str, os.PathLike)):
        model_dir = os.fspath(model_dir_or_model)
        model = load_model_file(os.path.join(model_dir, MODEL_FILE))
        manifest = read_manifest(model_dir)
    elif isinstance(model_dir_or_model, Transformer):
        model = model_dir_or_model
        if tokenizer is None:
            raise ValueError(
                "A model object needs its tokenizer: pass `tokenizer=` (a SubwordTokenizer "
                "or the path of its tokenizer.model)."
            )
    else:
        hint = ""
        if type(model_dir_or_model).__name__ == "Ensemble":
            hint = (
                ": an Ensemble decodes with a Translator; to export or serve one model, "
                "average the checkpoints (kt-average-checkpoints)"
            )
        raise TypeError(
            "`model_dir_or_model` must be a model directory (str or path) or a "
            f"keras_transformer.Transformer. Received: {type(model_dir_or_model).__name__}{hint}"
        )
    if not isinstance(model, Transformer):
        raise TypeError(
            f"{MODEL_FILE} must hold a keras_transformer.Transformer. "
            f"Received: {type(model).__name__}"
        )
    return model_dir, model, manifest


def _load_tokenizer(source, manifest, model_dir):
    """`(tokenizer, file)`: the tokenizer at `source` (its file, or a directory holding it).

    A sentencepiece file is checked against the manifest's fingerprint before it is parsed.
    """
    from keras_transformer.data.tokenizer import SubwordTokenizer  # TensorFlow: load lazily

    kind = _tokenizer_kind_at(source, manifest if source == model_dir else None)
    if kind == MARIAN_KIND:
        return _marian_tokenizer_class().load(source), source
    if os.path.isdir(source):
        source = os.path.join(source, TOKENIZER_FILE)
    if manifest is not None and os.path.isfile(source):
        # Before the file is parsed: a cut copy may still parse, as a smaller vocabulary.
        with open(source, "rb") as file:
            _check_fingerprint(hashlib.sha256(file.read()).hexdigest(), manifest, source, model_dir)
    return SubwordTokenizer.load(source), source


def tokenizer_kind(tokenizer):
    """The kind of a tokenizer object: "marian" for a MarianTokenizer, else "sentencepiece"."""
    return getattr(tokenizer, "kind", SENTENCEPIECE_KIND)


def _tokenizer_kind_at(path, manifest):
    """The kind of tokenizer at `path`: the manifest's word, else what the files say."""
    if manifest is not None:
        return manifest.get("tokenizer_kind", SENTENCEPIECE_KIND)
    if os.path.isfile(os.path.join(path, MARIAN_TOKENIZER_FILE)):
        return MARIAN_KIND
    return SENTENCEPIECE_KIND


def _marian_tokenizer_class():
    from keras_transformer.marian.tokenizer import MarianTokenizer  # TensorFlow: load lazily

    return MarianTokenizer


def _tokenizer_classes():
    from keras_transformer.data.tokenizer import SubwordTokenizer

    return (SubwordTokenizer, _marian_tokenizer_class())


def _check_fingerprint(fingerprint, manifest, source, model_dir):
    """Raises ValueError unless `fingerprint` is the tokenizer sha256 the manifest records."""
    expected = manifest["tokenizer_sha256"]
    if fingerprint != expected:
        raise ValueError(
            f"{source} is not the tokenizer {model_dir} was trained with: its sha256 is "
            f"{fingerprint[:16]}..., {MANIFEST_FILE} records {expected[:16]}.... It is "
            "corrupt (truncated or damaged) or another run's tokenizer, whose ids would "
            "mean other words to this model; put back the run's own tokenizer files "
            f"({TOKENIZER_FILE}, or a Marian model's {MARIAN_TOKENIZER_FILE} and the files beside it)."
        )


def load_model_file(path):
    """The model of a `model.keras` file, loaded in safe mode without compiling.

    The file is checked whole first (`check_model_file`), so a truncated or damaged
    one is refused with its name instead of Keras' "File not found" or `BadZipFile`.

    Raises:
        FileNotFoundError: no file at `path`.
        ValueError: the file is truncated or corrupt (named), or Keras refuses it.
    """
    path = check_model_file(path)
    try:
        return keras.models.load_model(path, compile=False, safe_mode=True)
    except _ARCHIVE_ERRORS as error:
        raise ValueError(f"{path} is corrupt: {type(error).__name__}: {error}") from error


def check_model_file(path):
    """Checks that a `model.keras` file is a whole zip archive; returns `path`.

    Keras says "File not found" of a truncated archive, raises `BadZipFile` from deep
    inside a damaged one, and, when reading the weights whole fails, reads them again
    in pieces, where a damaged byte may go unnoticed. So every member's checksum is
    verified here (`ZipFile.testzip`: one more read of the file, about a second per GB).

    Raises:
        FileNotFoundError: no file at `path`.
        ValueError: the file is truncated or corrupt, with its path.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(
            f"No {MODEL_FILE} in the model directory {os.path.dirname(path)!r}; expected the "
            "file written by model.save()."
        )
    if not zipfile.is_zipfile(path):
        raise ValueError(
            f"{path} is corrupt or truncated: it is not a .keras (zip) archive "
            f"({os.path.getsize(path)} bytes). Copy it again, or train again."
        )
    try:
        with zipfile.ZipFile(path) as archive:
            damaged = archive.testzip()
    except _ARCHIVE_ERRORS as error:
        raise ValueError(f"{path} is corrupt: {type(error).__name__}: {error}") from error
    if damaged is not None:
        raise ValueError(f"{path} is corrupt: the checksum of {damaged} inside it does not match")
    return path


def write_manifest(model_dir, tokenizer):
    """Writes `model_dir/manifest.json`, recording the tokenizer's fingerprint; returns its path.

    Written atomically: a reader sees no manifest, or a whole one. A tokenizer other
    than sentencepiece is named ("tokenizer_kind", format 2); a sentencepiece one writes
    format 1, which every version reads.
    """
    manifest = {"format": 1, "tokenizer_sha256": tokenizer.fingerprint}
    kind = tokenizer_kind(tokenizer)
    if kind != SENTENCEPIECE_KIND:
        manifest.update(format=2, tokenizer_kind=kind)
    text = json.dumps(manifest, indent=2, sort_keys=True) + "\n"
    return write_text_atomically(os.path.join(os.fspath(model_dir), MANIFEST_FILE), text)


def read_manifest(model_dir):
    """The manifest of a model directory as a dict, or None where it has none (0.1).

    Raises:
        ValueError: the file is not a manifest (corrupt, or of a newer format).
    """
    path = os.path.join(os.fspath(model_dir), MANIFEST_FILE)
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as file:
            manifest = json.load(file)
        layout, fingerprint = manifest["format"], manifest["tokenizer_sha256"]
        if not (isinstance(fingerprint, str) and len(fingerprint) == 64):
            raise ValueError(f"tokenizer_sha256={fingerprint!r} is not a sha256")
        if not isinstance(layout, int) or layout < 1:
            raise ValueError(f"format={layout!r} is not a format number")
        kind = manifest.get("tokenizer_kind", SENTENCEPIECE_KIND)
        if layout <= MANIFEST_FORMAT and kind not in TOKENIZER_KINDS:
            raise ValueError(f"tokenizer_kind={kind!r} is not one of {TOKENIZER_KINDS}")
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path} is corrupt: {type(error).__name__}: {error}") from None
    if layout > MANIFEST_FORMAT:
        raise ValueError(
            f"{path} has format {layout}, newer than this package reads "
            f"({MANIFEST_FORMAT}): upgrade keras-transformer."
        )
    return manifest


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
    except (zipfile.BadZipFile, zlib.error, EOFError, KeyError, ValueError) as error:
        raise ValueError(
            f"{path} is not a .keras file of a keras_transformer model: corrupt, truncated "
            f"or another kind of file ({type(error).__name__}: {error})."
        ) from None
    return TransformerConfig.from_dict(values)


def read_search_settings(model_dir):
    """The beam search saved with a model directory, as `Translator` arguments.

    The `eval_beam_size` and `eval_length_penalty` of the run's `config.toml` (a
    `RunConfig`'s, chosen on the validation split): `{"beam_size": 6,
    "length_penalty": 1.0}`. Only the keys the file holds; `{}` for a directory without
    a `config.toml` (an import, or one made by hand). Read alone, with `tomllib`: the
    rest of the run config (its data paths) need not exist where the model is used.

    Raises:
        ValueError: a `config.toml` that is not TOML, or a value of the wrong type
            (named, with the file).
    """
    path = os.path.join(os.fspath(model_dir), CONFIG_FILE)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, "rb") as file:
            values = tomllib.load(file)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is not valid TOML: {error}") from None
    settings = {}
    try:
        if "eval_beam_size" in values:
            checks.check_positive_int("eval_beam_size", values["eval_beam_size"])
            settings["beam_size"] = values["eval_beam_size"]
        if "eval_length_penalty" in values:
            checks.check_non_negative_number("eval_length_penalty", values["eval_length_penalty"])
            settings["length_penalty"] = float(values["eval_length_penalty"])
    except ValueError as error:
        raise ValueError(f"{path}: {error}") from None
    return settings


def write_search_settings(model_dir, beam_size, length_penalty):
    """Saves a beam search in a model directory's `config.toml`; returns the file's path.

    Sets the run's `eval_beam_size` and `eval_length_penalty` (so `read_search_settings`
    gives them back and a `Translator` of the directory uses them), keeping every other
    line of the file as it was; written atomically. For a search chosen on the
    validation split after training (`bench/search_settings.py --save`).

    Raises:
        FileNotFoundError: the directory has no `config.toml` (it was not written by a run).
        ValueError: a beam size or length penalty out of range.
    """
    checks.check_positive_int("beam_size", beam_size)
    checks.check_non_negative_number("length_penalty", length_penalty)
    path = os.path.join(os.fspath(model_dir), CONFIG_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"No {CONFIG_FILE} in the model directory {os.fspath(model_dir)!r}.")
    read_search_settings(model_dir)  # refuses a file that is not TOML before it is changed
    with open(path, encoding="utf-8") as file:
        lines = file.read().splitlines()
    values = {"eval_beam_size": repr(int(beam_size)), "eval_length_penalty": repr(float(length_penalty))}
    # Top-level keys come before the first [table]: replace them there, or add them there.
    end = next((i for i, line in enumerate(lines) if line.lstrip().startswith("[")), len(lines))
    while end > 0 and not lines[end - 1].strip():
        end -= 1  # new keys go after the last top-level line, not after the blank before a table
    for key, value in values.items():
        found = [i for i in range(end) if _line_key(lines[i]) == key]
        if found:
            lines[found[0]] = f"{key} = {value}"
        else:
            lines.insert(end, f"{key} = {value}")
            end += 1
    write_text_atomically(path, "\n".join(lines) + "\n")
    return path


def _line_key(line):
    """The key a TOML line assigns (`"beam = 4  # x"` -> "beam"), or None."""
    key, equals, _ = line.partition("=")
    key = key.strip()
    return key if equals and key and not key.startswith("#") else None


def resolve_search(model_dir_or_model, beam_size=None, length_penalty=None):
    """`(beam_size, length_penalty)`: those given, a None one from the model directory.

    A None is the directory's (`read_search_settings`) when `model_dir_or_model` is a
    directory that saved one (for a list, an ensemble's members, its first), else the paper's (beam 4, alpha 0.6, section 6.1). What a
    `Translator`, `export_saved_model` and the `kt-*` commands decode with by default.

    Example:
    >>> resolve_search("no/such/run", beam_size=2)  # nothing saved there: the paper's alpha
    (2, 0.6)
    """
    if isinstance(model_dir_or_model, (list, tuple)) and model_dir_or_model:
        model_dir_or_model = model_dir_or_model[0]  # an ensemble: its first member's
    if beam_size is None or length_penalty is None:
        saved = {}
        if isinstance(model_dir_or_model, (str, os.PathLike)):
            saved = read_search_settings(model_dir_or_model)
        if beam_size is None:
            beam_size = saved.get("beam_size", BEAM_SIZE)
        if length_penalty is None:
            length_penalty = saved.get("length_penalty", LENGTH_PENALTY)
    return beam_size, length_penalty


__all__ = [
    "load_model_and_tokenizer",
    "read_search_settings",
    "write_search_settings",
    "resolve_search",
    "load_model_file",
    "check_model_file",
    "read_model_config",
    "write_manifest",
    "read_manifest",
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
    "MANIFEST_FILE",
    "MARIAN_SOURCE_SPM_FILE",
    "MARIAN_TARGET_SPM_FILE",
    "MARIAN_VOCAB_FILE",
    "MARIAN_TOKENIZER_FILE",
    "TOKENIZER_KINDS",
    "tokenizer_kind",
]

"""Checkpoint averaging (Vaswani et al., 2017, section 6.1) and checkpoint file lists.

"For the base models, we used a single model obtained by averaging the last 5
checkpoints, which were written at 10-minute intervals. For the big models, we
averaged the last 20 checkpoints." Here checkpoints are the `.weights.h5` files that
`KeepLastCheckpoints` writes each epoch (`epoch_001.weights.h5`, ...) or, with
`every_steps` N (a run config's `checkpoint_every_steps`), every N optimizer updates
(`step_0000500.weights.h5`, ...), so that the last few span the last minutes of a run
rather than its last epochs.
"""

import os
import re
import shutil

import keras
import numpy as np

from keras_transformer import checks
from keras_transformer.atomic import save_model_atomically, write_directory_atomically

# Checkpoint averaging, Vaswani et al. (2017), section 6.1: the last 5 (base), 20 (big).
CHECKPOINTS_TO_AVERAGE = 5

_NUMBERED_WEIGHTS = re.compile(r"(\d+)\.weights\.h5$")
# The checkpoints written every N updates, named by the update count (zero-padded so that
# a listing sorts them too; `latest_checkpoints` orders by the number whatever its width).
STEP_CHECKPOINT_PATTERN = "step_{step:07d}.weights.h5"
_STEP_WEIGHTS = re.compile(r"step_(\d+)\.weights\.h5")


def latest_checkpoints(directory, k=CHECKPOINTS_TO_AVERAGE):
    """The newest `k` numbered `.weights.h5` files of `directory`, oldest first.

    Files are ordered by the last number in their name (`epoch_012.weights.h5` is
    epoch 12), not by modification time, which copying can change.

    Args:
        directory: str or path-like.
        k: int >= 1. Default 5.

    Returns:
        list of str paths, at most `k` (fewer if fewer exist; empty if none).

    Raises:
        FileNotFoundError: `directory` does not exist.

    Example:

    ```python
    latest_checkpoints("saved_models/demo/checkpoints", 2)
    # ['saved_models/demo/checkpoints/epoch_009.weights.h5', '.../epoch_010.weights.h5']
    ```
    """
    checks.check_positive_int("k", k)
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"No checkpoint directory at {directory}")
    numbered = []
    for name in os.listdir(directory):
        match = _NUMBERED_WEIGHTS.search(name)
        if match:
            numbered.append((int(match.group(1)), name))
    numbered.sort()
    return [os.path.join(directory, name) for _, name in numbered[-k:]]


def prune_checkpoints(directory, keep):
    """Deletes all numbered `.weights.h5` files of `directory` but the newest `keep`.

    Returns:
        list of str, the deleted paths.
    """
    if not os.path.isdir(directory):
        return []
    everything = latest_checkpoints(directory, k=10**9)
    doomed = everything[: max(len(everything) - keep, 0)]
    for path in doomed:
        os.remove(path)
    return doomed


def remove_step_checkpoints_after(directory, step):
    """Deletes the `step_NNNNNNN.weights.h5` files of `directory` numbered above `step`.

    A run resumed from its last epoch's backup trains again the steps its killed process
    made after that backup; their checkpoints are of a lost past, and newer by number
    than the ones the resumed run writes, so they would be averaged in. Epoch
    checkpoints are left alone (a resumed run rewrites the epoch it redoes).

    Args:
        directory: str or path-like; a missing directory holds nothing to delete.
        step: int >= 0, the update count the run starts from.

    Returns:
        list of str, the deleted paths.

    Example:

    ```python
    remove_step_checkpoints_after("saved_models/.run.staging/checkpoints", 1200)
    # ['saved_models/.run.staging/checkpoints/step_0001300.weights.h5']
    ```
    """
    checks.check_non_negative_int("step", step)
    directory = os.fspath(directory)
    if not os.path.isdir(directory):
        return []
    removed = []
    for name in sorted(os.listdir(directory)):
        match = _STEP_WEIGHTS.fullmatch(name)
        if match and int(match.group(1)) > step:
            path = os.path.join(directory, name)
            os.remove(path)
            removed.append(path)
    return removed


def average_checkpoints(model, paths):
    """Sets `model`'s weights to the element-wise mean of the weights in `paths`.

    Each file is loaded into `model` in turn (so the files must come from a model of
    the same architecture) and its variables summed in float64; the model ends with
    the mean, cast back to each variable's dtype. Integer variables (such as a
    dropout seed's state) are not averaged: they keep the last file's values.
    Optimizer state in the files is ignored.

    Args:
        model: a built `keras.Model`.
        paths: non-empty list of `.weights.h5` files saved from such a model.

    Returns:
        The same `model`, with averaged weights.

    Example:

    ```python
    average_checkpoints(model, latest_checkpoints("saved_models/base/checkpoints", 5))
    model.save("saved_models/base_averaged/model.keras")  # kt-average-checkpoints does all this
    ```
    """
    paths = [os.fspath(path) for path in paths]
    if not paths:
        raise ValueError("`paths` must name at least one .weights.h5 file. Received: []")
    for path in paths:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"No checkpoint file at {path}")
    variables = model.weights
    sums = None
    for path in paths:
        model.load_weights(path, skip_mismatch=False)
        values = [np.asarray(keras.ops.convert_to_numpy(v.value)) for v in variables]
        if sums is None:
            sums = [value.astype("float64") for value in values]
        else:
            sums = [total + value for total, value in zip(sums, values)]
    for variable, total in zip(variables, sums):
        if np.issubdtype(np.dtype(keras.backend.standardize_dtype(variable.dtype)), np.floating):
            variable.assign((total / len(paths)).astype(variable.dtype))
    return model


def average_model_directory(model_dir, last=CHECKPOINTS_TO_AVERAGE, output_dir=None, *, overwrite=False):
    """Averages the last `last` checkpoints of a model directory into a new model directory.

    Loads the architecture from `model_dir/model.keras`, averages the newest `last`
    files of `model_dir/checkpoints/` into it (`average_checkpoints`), and writes a
    complete model directory that `Translator`, `kt-translate`, `kt-evaluate` and
    `kt-export` accept: `model.keras` with the averaged weights (no optimizer state),
    copies of `tokenizer.model` and (when there is one) `config.toml`, and a
    `manifest.json` with the tokenizer's fingerprint. The directory
    is filled under a hidden temporary name beside `output_dir` and renamed into place,
    so a crash leaves no half-written model. `kt-average-checkpoints` runs this.

    Args:
        model_dir: str or path-like, a directory written by a training run.
        last: int >= 1, how many checkpoints to average. Default 5 (section 6.1).
        output_dir: str or path-like, the directory to write; default
            `<model_dir>_averaged`, a sibling of `model_dir`.
        overwrite: bool, replace an existing non-empty `output_dir` instead of raising.

    Returns:
        `(output_dir, paths)`: the written directory and the checkpoints averaged.

    Raises:
        FileNotFoundError: no checkpoints, `model.keras` or `tokenizer.model` in `model_dir`.
        FileExistsError: `output_dir` exists, is not empty, and `overwrite` is False.
        ValueError: `output_dir` is `model_dir` itself.

    Example:

    ```python
    average_model_directory("saved_models/base", last=5)
    # ('saved_models/base_averaged', [...epoch_016..., ..., ...epoch_020...])
    ```
    """
    # Imported here: the model directory's loader imports the tokenizer (TensorFlow).
    from keras_transformer.model import directory as model_directory

    checks.check_positive_int("last", last)
    checks.check_bool("overwrite", overwrite)
    model_dir = os.fspath(model_dir)
    output_dir = _averaged_output_dir(model_dir, output_dir, overwrite)
    # The model and its tokenizer, checked whole and against each other (the manifest's
    # fingerprint, or the vocabulary size for directories without one).
    model, tokenizer = model_directory.load_model_and_tokenizer(model_dir)
    checkpoint_dir = os.path.join(model_dir, model_directory.CHECKPOINT_DIR)
    paths = latest_checkpoints(checkpoint_dir, last) if os.path.isdir(checkpoint_dir) else []
    if not paths:
        raise FileNotFoundError(f"No checkpoints (*.weights.h5) in {checkpoint_dir}")
    average_checkpoints(model, paths)

    def write(directory):
        os.makedirs(directory)
        model.save(os.path.join(directory, model_directory.MODEL_FILE))
        tokenizer.save(directory)
        config = os.path.join(model_dir, model_directory.CONFIG_FILE)
        if os.path.isfile(config):  # optional: a model directory made by hand has none
            shutil.copy2(config, os.path.join(directory, model_directory.CONFIG_FILE))
        model_directory.write_manifest(directory, tokenizer)  # the average knows its tokenizer

    # An empty directory (made by the user beforehand) is replaced without `overwrite`.
    write_directory_atomically(output_dir, write, overwrite=overwrite or os.path.isdir(output_dir))
    return output_dir, paths


def _averaged_output_dir(model_dir, output_dir, overwrite):
    """`output_dir` (default `<model_dir>_averaged`), refused if it is `model_dir` or in the way."""
    if output_dir is None:
        output_dir = os.path.normpath(model_dir) + "_averaged"
    output_dir = os.fspath(output_dir)
    if os.path.abspath(output_dir) == os.path.abspath(model_dir):
        raise ValueError(
            "`output_dir` must differ from `model_dir`: the averaged model is written beside "
            f"the trained one, not over it. Received: output_dir={output_dir!r}"
        )
    if os.path.isdir(output_dir) and os.listdir(output_dir) and not overwrite:
        raise FileExistsError(
            f"{output_dir} already exists and is not empty; pass overwrite=True "
            "(--overwrite) to replace it, or choose another output directory."
        )
    if os.path.exists(output_dir) and not os.path.isdir(output_dir):
        raise FileExistsError(f"{output_dir} exists and is not a directory.")
    return output_dir


def weights_are_finite(model):
    """Whether every floating-point weight of `model` is finite (no NaN, no inf)."""
    return all(np.all(np.isfinite(keras.ops.convert_to_numpy(w))) for w in model.weights)


def save_final_model(model, path, checkpoint_dir):
    """Saves `model` to `path` atomically, never with non-finite weights.

    A run stopped by `TerminateOnNaN` ends with NaN weights. Then the newest
    checkpoint in `checkpoint_dir` (`KeepLastCheckpoints` writes only finite ones) is
    loaded into `model` first, so `path` holds the last good weights; with no
    checkpoint to fall back on nothing is written, and any earlier file at `path` is
    kept.

    Args:
        model: the trained `keras.Model`.
        path: str, the `.keras` file to write.
        checkpoint_dir: str, the directory of `epoch_NNN.weights.h5` (or
            `step_NNNNNNN.weights.h5`) checkpoints.

    Returns:
        `(saved, restored_from)`: whether `path` was written, and the checkpoint the
        weights were restored from (None when the trained weights were finite).
    """
    restored_from = None
    if not weights_are_finite(model):
        newest = latest_checkpoints(checkpoint_dir, 1) if os.path.isdir(checkpoint_dir) else []
        if not newest:
            return False, None
        restored_from = newest[-1]
        model.load_weights(restored_from)
    save_model_atomically(model, path)
    return True, restored_from


__all__ = [
    "CHECKPOINTS_TO_AVERAGE",
    "latest_checkpoints",
    "prune_checkpoints",
    "remove_step_checkpoints_after",
    "STEP_CHECKPOINT_PATTERN",
    "weights_are_finite",
    "save_final_model",
    "average_checkpoints",
    "average_model_directory",
]

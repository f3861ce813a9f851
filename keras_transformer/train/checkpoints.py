"""Checkpoint averaging (Vaswani et al., 2017, section 6.1) and checkpoint file lists.

"For the base models, we used a single model obtained by averaging the last 5
checkpoints, which were written at 10-minute intervals. For the big models, we
averaged the last 20 checkpoints." Here checkpoints are the `.weights.h5` files that
`KeepLastCheckpoints` writes each epoch (`epoch_001.weights.h5`, ...).
"""

import os
import re

import keras
import numpy as np

from keras_transformer import checks
from keras_transformer.atomic import save_model_atomically, save_weights_atomically

# Checkpoint averaging, Vaswani et al. (2017), section 6.1: the last 5 (base), 20 (big).
CHECKPOINTS_TO_AVERAGE = 5

_NUMBERED_WEIGHTS = re.compile(r"(\d+)\.weights\.h5$")


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
    >>> latest_checkpoints("saved_models/demo/checkpoints", 2)
    ['saved_models/demo/checkpoints/epoch_009.weights.h5', '.../epoch_010.weights.h5']
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
    >>> average_checkpoints(model, latest_checkpoints("saved_models/base/checkpoints", 5))
    >>> model.save("saved_models/base/model_averaged.keras")
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


def average_model_directory(model_dir, last=CHECKPOINTS_TO_AVERAGE, output=None):
    """Averages the last `last` checkpoints of a model directory into a new model file.

    Loads the architecture from `model_dir/model.keras`, averages the newest `last`
    files of `model_dir/checkpoints/` into it (`average_checkpoints`), and saves the
    result to `output`: a whole model if it ends in `.keras`, weights only if it ends
    in `.weights.h5`. The command `python -m training.average_checkpoints` runs this.

    Args:
        model_dir: str or path-like, a directory written by a training run.
        last: int >= 1, how many checkpoints to average. Default 5 (section 6.1).
        output: str, where to write; default `model_dir/model_averaged.keras`.

    Returns:
        `(output, paths)`: the written file and the checkpoints averaged.

    Example:
    >>> average_model_directory("saved_models/base", last=5)
    ('saved_models/base/model_averaged.keras', [...epoch_016..., ..., ...epoch_020...])
    """
    from keras_transformer.model import directory as model_directory  # imports the tokenizer (TensorFlow)

    model_dir = os.fspath(model_dir)
    output = output or os.path.join(model_dir, "model_averaged.keras")
    if not (output.endswith(".keras") or output.endswith(".weights.h5")):
        raise ValueError(f"`output` must end in .keras or .weights.h5. Received: output={output!r}")
    paths = latest_checkpoints(os.path.join(model_dir, model_directory.CHECKPOINT_DIR), last)
    if not paths:
        raise FileNotFoundError(
            f"No checkpoints (*.weights.h5) in {os.path.join(model_dir, model_directory.CHECKPOINT_DIR)}"
        )
    model_path = os.path.join(model_dir, model_directory.MODEL_FILE)
    if not os.path.isfile(model_path):
        raise FileNotFoundError(
            f"No {model_directory.MODEL_FILE} in {model_dir} to take the architecture from"
        )
    model = keras.saving.load_model(model_path, compile=False, safe_mode=True)
    average_checkpoints(model, paths)
    if output.endswith(".keras"):
        save_model_atomically(model, output)
    else:
        save_weights_atomically(model, output)
    return output, paths


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
        checkpoint_dir: str, the directory of `epoch_NNN.weights.h5` checkpoints.

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
    "weights_are_finite",
    "save_final_model",
    "average_checkpoints",
    "average_model_directory",
]

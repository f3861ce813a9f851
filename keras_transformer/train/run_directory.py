"""The model directory of a training run: plan it, stage the run beside it, swap it in.

A run never writes into `output_dir/name` directly. `plan_model_directory` reads what
is there (nothing or the user's own files: a new run; a finished run: refused unless
`overwrite`; an interrupted run: resumed if it trains the same settings), the run is
written into the hidden sibling `output_dir/.name.staging/` (`stage_run`), and
`finish_run` writes `manifest.json` and renames the staging directory into place, the
earlier run moved aside in the same breath and deleted (the user's own files in it are
carried over). A kill at any point leaves `output_dir/name` as it was or whole;
`recover_interrupted_swap` completes a rename that a kill interrupted, and
`repair_backup` restores a backup that Keras was writing when the kill came.

All of it runs under the lock of `run_lock.exclusive_use`, taken before anything here
reads the directory: one staging directory per model directory is enough, since one
run at a time writes it.
"""

import dataclasses
import json
import os
import shutil

from keras_transformer import atomic
from keras_transformer.train.run_config import RunConfig
from keras_transformer.model import directory as model_directory


# What a run leaves in its model directory (TF Serving versions are the numbered
# subdirectories that the demo's export adds beside them). Anything else found in a
# directory a new run replaces is the user's, and is carried over into the new one.
_RUN_OUTPUTS = (
    model_directory.MODEL_FILE,
    model_directory.TOKENIZER_FILE,
    model_directory.CONFIG_FILE,
    model_directory.MANIFEST_FILE,
    model_directory.CSV_LOG_FILE,
    model_directory.CURVES_FILE,
    model_directory.METRICS_FILE,
    model_directory.TENSORBOARD_DIR,
    model_directory.CHECKPOINT_DIR,
    model_directory.BACKUP_DIR,
)


# Siblings of output_dir/name, hidden (RunConfig refuses names starting with "."):
STAGING_SUFFIX = ".staging"  # the run being written
_RETIRED_SUFFIX = ".retired"  # the earlier run, for the moment between two renames
# (and `.name.lock`, run_lock.py's: held by the run for its whole length)


# The files of Keras' BackupAndRestore(double_checkpoint=True) in backup/.
_BACKUP_FILES = ("latest.weights.h5", "training_metadata.json")


@dataclasses.dataclass(frozen=True)
class RunDirectory:
    """Where a run writes, and what it found there (`plan_model_directory`).

    Attributes:
        target: str, `output_dir/name`, where the finished run ends up.
        staging: str, where it is written until then: `output_dir/.name.staging`, or
            `target` itself for a run interrupted in place by an earlier version (its
            `backup/` is there) and for a non-chief worker's scratch directory.
        resuming: bool, an interrupted run of the same settings resumes in `staging`.
        replaces: tuple of str, the earlier run's entries in `target` that go.
        keeps: tuple of str, the user's own entries in `target`, carried over.
        discards: str, why an unfinished run in `staging` is thrown away ("" if none).
    """

    target: str
    staging: str
    resuming: bool = False
    replaces: tuple = ()
    keeps: tuple = ()
    discards: str = ""

    @property
    def in_place(self):
        return self.staging == self.target


def plan_model_directory(run_config):
    """What `output_dir/name` holds, and so where and how the run writes: a `RunDirectory`.

    Reads only. A new run is staged in `output_dir/.name.staging/`; an interrupted run
    there (one with `backup/`) resumes when its `config.toml` trains the same settings;
    one without `backup/` had nothing to resume and starts again. A run interrupted in
    place by an earlier version (`backup/` in the model directory) resumes in place.

    Raises:
        FileExistsError: a finished run and `overwrite` is false, or a file in the way.
        ValueError: an interrupted run of other settings and `overwrite` is false; the
            message lists the settings that differ.
    """
    target = run_config.model_dir
    staging = staging_directory(target)
    for path in (target, staging):
        if os.path.lexists(path) and not os.path.isdir(path):
            raise FileExistsError(f"{path} exists and is not a directory; choose another `name` or `output_dir`.")
    entries = sorted(os.listdir(target)) if os.path.isdir(target) else []
    earlier = tuple(name for name in entries if _is_run_output(name))
    kept = tuple(name for name in entries if not _is_run_output(name) and not atomic.is_partial_file(name))
    if model_directory.BACKUP_DIR in entries:
        differences = _differences_from_stored(run_config, target)
        if not differences:
            return RunDirectory(target=target, staging=target, resuming=True)
        if not run_config.overwrite:
            raise ValueError(_other_settings_message(target, differences))
    elif earlier and not run_config.overwrite:
        staged = f" (the run staged in {staging} would replace it)" if os.path.isdir(staging) else ""
        raise FileExistsError(
            f"{target} already holds a finished run ({', '.join(earlier)}){staged}. Set "
            "`overwrite = true` (--set overwrite=true) to replace it, or choose another "
            "`name` or `output_dir`."
        )
    resuming, discards = False, ""
    if os.path.isdir(staging):
        if not os.path.isdir(os.path.join(staging, model_directory.BACKUP_DIR)):
            discards = "an interrupted run that had finished no epoch: started again"
        else:
            differences = _differences_from_stored(run_config, staging)
            unreadable = "" if differences else _tokenizer_error(staging)
            if unreadable:
                discards = f"an interrupted run whose tokenizer does not load ({unreadable}): started again"
            elif not differences:
                resuming = True
            elif run_config.overwrite:
                discards = "an interrupted run of other settings: discarded, as overwrite is true"
            else:
                raise ValueError(_other_settings_message(staging, differences))
    return RunDirectory(target, staging, resuming, earlier, kept, discards)


def staging_directory(model_dir):
    """Where a run for `model_dir` is written until it is complete: `.<name>.staging` beside it."""
    return _sibling(model_dir, STAGING_SUFFIX)


def stage_run(plan, run_config, config, tokenizer, print_fn=print):
    """Starts writing the run in `plan.staging`: the first write of `run_training`.

    A new run gets an empty staging directory (an unfinished one there is discarded)
    holding `tokenizer.model` and `config.toml`. A resumed run keeps its directory; its
    `backup/` is checked (`repair_backup`) and its `config.toml` rewritten, since the
    settings a resumed run may change (`RESUMABLE_CHANGES`) are recorded there too.
    """
    if plan.discards:
        print_fn(f"{plan.staging}: {plan.discards}")
    if not plan.resuming and not plan.in_place and os.path.lexists(plan.staging):
        shutil.rmtree(plan.staging)
    os.makedirs(plan.staging, exist_ok=True)
    if plan.resuming:
        repaired = repair_backup(os.path.join(plan.staging, model_directory.BACKUP_DIR))
        if repaired:
            print_fn(f"{plan.staging}: {repaired}")
        atomic.remove_partial_files(plan.staging)
    else:
        tokenizer.save(plan.staging)
    atomic.write_text_atomically(
        os.path.join(plan.staging, model_directory.CONFIG_FILE), run_config.to_toml(config)
    )


def repair_backup(backup_dir):
    """Makes a killed run's `backup/` one that `BackupAndRestore` restores; says what it did.

    Keras rewrites `latest.weights.h5` and `training_metadata.json` in place, after
    copying them to `*.bkp` (`double_checkpoint=True`). A kill in the middle leaves a
    latest pair that does not read; its own fallback catches only an unreadable weights
    file, and only when a previous pair exists. Here: an unreadable latest pair is
    replaced by a readable previous one; with none, `backup/` is removed and training
    starts again from the first epoch (the kill came during the first epoch's backup).

    Returns:
        str, what was done, or "" when the backup was whole (or absent).
    """
    if not os.path.isdir(backup_dir):
        return ""
    latest = [os.path.join(backup_dir, name) for name in _BACKUP_FILES]
    previous = [f"{path}.bkp" for path in latest]
    if _backup_readable(*latest):
        return ""
    if _backup_readable(*previous):
        for source, path in zip(previous, latest):
            with atomic.atomic_path(path) as temporary:
                shutil.copyfile(source, temporary)
        return "the latest backup was cut short by the kill; resuming from the one before it"
    shutil.rmtree(backup_dir)
    return "the first backup was cut short by the kill; training starts again from epoch 1"


def backed_up_epochs(backup_dir):
    """The epochs a killed run finished, as the `backup/` it resumes from records them.

    The pair `repair_backup` keeps: the latest when it reads whole, else the one before
    it; 0 when there is none (the run starts again from the first epoch). Read before
    the backup is repaired, so that the data can start where training will.
    """
    latest = [os.path.join(backup_dir, name) for name in _BACKUP_FILES]
    for weights, metadata in (latest, [f"{path}.bkp" for path in latest]):
        if _backup_readable(weights, metadata):
            with open(metadata, encoding="utf-8") as file:
                return json.load(file)["epoch"]
    return 0


def finish_run(plan, tokenizer, print_fn=print):
    """Completes the run: `manifest.json`, then the staging directory renamed into place.

    The manifest is written last in the staging directory and marks it complete: from
    then on a kill is repaired by completing the rename (`recover_interrupted_swap`).
    `backup/` goes only after it, so a kill during the final save resumes (and trains
    no more epochs) instead of losing the run.

    Returns:
        str, the model directory (`plan.target`).
    """
    model_directory.write_manifest(plan.staging, tokenizer)
    if plan.in_place:
        shutil.rmtree(os.path.join(plan.staging, model_directory.BACKUP_DIR), ignore_errors=True)
        atomic.remove_partial_files(plan.staging)
        return plan.target
    replace_with_staged_run(plan.staging, plan.target)
    print_fn(f"{plan.target} now holds this run")
    return plan.target


def replace_with_staged_run(staging, target):
    """Renames the complete run in `staging` to `target`; the earlier run there goes.

    Each step can be killed and the whole done again (`recover_interrupted_swap` does):
    the staging directory is cleaned (`backup/`, temporaries); the user's own files
    move from `target` into it; `target` is renamed to `.<name>.retired`, the staging
    directory to `target`, and the retired one deleted. Between the two renames (two
    system calls) `target` is briefly absent; there is no moment at which it holds a
    part of a run.
    """
    shutil.rmtree(os.path.join(staging, model_directory.BACKUP_DIR), ignore_errors=True)
    atomic.remove_partial_files(staging)
    retired = _sibling(target, _RETIRED_SUFFIX)
    if os.path.isdir(target):
        if os.path.isdir(retired):  # left by an earlier replacement killed while deleting it
            shutil.rmtree(retired)
        for name in os.listdir(target):
            if not _is_run_output(name) and not atomic.is_partial_file(name):
                if not os.path.lexists(os.path.join(staging, name)):
                    os.rename(os.path.join(target, name), os.path.join(staging, name))
        os.rename(target, retired)
    os.rename(staging, target)
    atomic.fsync_directory(os.path.dirname(os.path.abspath(target)))
    shutil.rmtree(retired, ignore_errors=True)


def recover_interrupted_swap(model_dir, print_fn=print):
    """Completes what a run killed while renaming its directory into place left undone.

    A complete staging directory (it has `manifest.json`) is renamed into place; a
    leftover `.<name>.retired` is deleted (or, if the model directory is missing,
    which no step leaves, renamed back). Anything else is left alone.

    Returns:
        bool, whether anything was done.
    """
    staging, retired = staging_directory(model_dir), _sibling(model_dir, _RETIRED_SUFFIX)
    if os.path.isfile(os.path.join(staging, model_directory.MANIFEST_FILE)):
        print_fn(f"{model_dir}: completing the replacement a killed run left unfinished")
        replace_with_staged_run(staging, model_dir)
        return True
    if os.path.isdir(retired):
        if os.path.isdir(model_dir):
            shutil.rmtree(retired)
        else:
            os.rename(retired, model_dir)
        return True
    return False


def describe_plan(plan, run_config):
    """One line: where the run goes, whether it resumes, and what it will replace."""
    line = f"Run {run_config.name!r} -> {plan.target} ("
    line += "resuming an interrupted run" if plan.resuming else "a new run"
    if not plan.in_place:
        line += f", written in {plan.staging} until it is complete"
    line += ")"
    if plan.replaces:
        line += f"; it will replace the earlier run's {', '.join(plan.replaces)}"
    if plan.keeps:
        line += f"; keeps {', '.join(plan.keeps)}"
    return line


def _is_run_output(name):
    return name in _RUN_OUTPUTS or name.isdigit()


def _sibling(model_dir, suffix):
    parent, name = os.path.split(os.path.normpath(model_dir))
    return os.path.join(parent, f".{name}{suffix}")


def _differences_from_stored(run_config, directory):
    """`RunConfig.differences` between the run stored in `directory` and `run_config`."""
    path = os.path.join(directory, model_directory.CONFIG_FILE)
    try:
        stored = RunConfig.from_toml(path)
    except (OSError, ValueError) as error:
        return [(model_directory.CONFIG_FILE, f"unreadable ({error})", "a run config")]
    return stored.differences(run_config)


def _other_settings_message(directory, differences):
    listed = "; ".join(f"{key}: {stored!r} there, {new!r} now" for key, stored, new in differences)
    return (
        f"{directory} holds an interrupted run of other settings ({listed}). Run again with "
        "its settings to resume it, set `overwrite = true` (--set overwrite=true) to discard "
        "it, or choose another `name` or `output_dir`."
    )


def _tokenizer_error(directory):
    """Why the tokenizer in `directory` does not load, or "" if it does."""
    from keras_transformer.data.tokenizer import SubwordTokenizer

    try:
        SubwordTokenizer.load(directory)
    except (OSError, ValueError) as error:
        return str(error)
    return ""


def _backup_readable(weights_path, metadata_path):
    """Whether a BackupAndRestore pair reads whole: the epoch number, and every weight."""
    import h5py  # Keras' own weights format

    try:
        with open(metadata_path, encoding="utf-8") as file:
            epoch = json.load(file)["epoch"]
        if not isinstance(epoch, int) or epoch < 0:
            return False
        with h5py.File(weights_path, "r") as weights:
            weights.visititems(_read_dataset)
    except (OSError, ValueError, KeyError, TypeError, RuntimeError):
        return False
    return True


def _read_dataset(_, item):
    """For `h5py.Group.visititems`: reads a dataset whole (a cut file fails here). None: go on."""
    import h5py

    if isinstance(item, h5py.Dataset):
        item[()]


__all__ = [
    "RunDirectory",
    "plan_model_directory",
    "describe_plan",
    "staging_directory",
    "stage_run",
    "repair_backup",
    "backed_up_epochs",
    "finish_run",
    "replace_with_staged_run",
    "recover_interrupted_swap",
]

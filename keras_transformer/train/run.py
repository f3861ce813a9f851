"""`run_training(run_config)`: a whole training run, from corpus to a model directory.

The library function behind `kt-train` and `kt-demo`. It follows the paper's recipe as a
sequence of small steps, each a function of its own. Everything that can refuse the run
comes first, before anything is written:

1. `plan_model_directory`: what `output_dir/name` holds. Nothing, or the user's own
   files: a new run. A finished run: refused unless `overwrite`. An interrupted run:
   resumed if it trains the same settings (`RunConfig.trained_settings`), refused with
   the differences if not (discarded with `overwrite`).
2. `load_corpus`: the sentence pairs of each split (the readers refuse bad ones).
3. `prepare_tokenizer`: one joint subword vocabulary for both languages (5.1), trained
   in memory (an interrupted run's own is reloaded).
4. `make_datasets`: token-budget batches of sentences of similar length (5.1); refuses
   a corpus with nothing to train on.
5. `build_and_compile`: the model of `[model]`, Adam on the warmup schedule with the
   label-smoothed loss of `[training]` (5.3, 5.4), in the distribution scope.

Then the run is written beside its target, in the hidden `output_dir/.name.staging/`:

6. `stage_run`: `tokenizer.model` and `config.toml` (or, resuming, a check of the
   backup the kill left).
7. `fit`: `model.fit` with the default callbacks (checkpoints, logs, time budget) and,
   for a budgeted decay with a time budget but no `total_steps`, `StepBudgetEstimator`.
8. `save_outputs`: `model.keras` (never with NaN weights) and the training-curve PNG.
9. `finish_run`: `manifest.json` (the tokenizer's fingerprint), then the staging
   directory is renamed to `output_dir/name`, the earlier run moved aside in the same
   breath and deleted (the user's own files in it are carried over).

So a failure or a kill at any point leaves `output_dir/name` as it was, or (after the
last rename) holding the whole new run. The same command run again resumes from the
staging directory's `backup/`, or completes a rename that a kill interrupted
(`recover_interrupted_swap`). See `keras_transformer.model.directory` for what the model
directory holds.
"""

import contextlib
import dataclasses
import itertools
import os
import shutil
import tempfile
import time
import typing

import keras

from keras_transformer import distribute
from keras_transformer.model import directory as model_directory
from keras_transformer.model.transformer import build_transformer
from keras_transformer.train.budget_estimate import StepBudgetEstimator
from keras_transformer.train.callbacks import ResumableEarlyStopping, TimeBudget, default_callbacks
from keras_transformer.train.checkpoints import save_final_model
from keras_transformer.train.compile import compile_transformer, make_schedule
from keras_transformer.train.curves import plot_training_curves
from keras_transformer.train.run_config import RunConfig
from keras_transformer.train.run_directory import (
    RunDirectory,
    backed_up_epochs,
    describe_plan,
    finish_run,
    plan_model_directory,
    recover_interrupted_swap,
    stage_run,
)
from keras_transformer.train.run_lock import exclusive_use


@dataclasses.dataclass
class TrainingResult:
    """What `run_training` returns: where it wrote, and what it trained and measured.

    Attributes:
        model_dir: str, the model directory (the staging directory if training ended
            without a model to save, so the earlier run was kept).
        model: the trained `Transformer`.
        tokenizer: its `SubwordTokenizer`.
        history: the `keras.callbacks.History` of `fit`.
        train_seconds: float, wall-clock seconds of `fit` (compilation included).
        steps: int, optimizer updates applied in this process (with
            `gradient_accumulation_steps` N, each one the mean of N batches).
        target_tokens_per_second: float, real target tokens (with EOS) per second of
            `fit`, estimated from the average tokens per batch; NaN if unknown.
        stopped_by_time_budget: bool.
        stopped_early: bool, whether early stopping ended training.
        best_epoch: int, with early stopping on: the 1-based epoch whose weights the
            model holds (with per-epoch checkpoints, its checkpoint is
            `checkpoints/epoch_NNN.weights.h5`); else None.
        steps_per_epoch: int, batches (Keras steps) in one epoch; an epoch applies
            `steps_per_epoch / gradient_accumulation_steps` updates.
        estimated_total_steps: int, with a budgeted decay and no `total_steps` (the
            steps estimated from `max_train_seconds`): the update at which the schedule
            reaches its floor, after the last estimate; else None. Each estimate is also
            printed, and the `schedule_total_steps` column of the CSV log holds the
            total at each epoch's end.
        seconds_per_step: float, the seconds per update that estimate used; else None.
    """

    model_dir: str
    model: object
    tokenizer: object
    history: object
    train_seconds: float
    steps: int
    target_tokens_per_second: float
    stopped_by_time_budget: bool
    steps_per_epoch: int
    stopped_early: bool = False
    best_epoch: typing.Optional[int] = None
    estimated_total_steps: typing.Optional[int] = None
    seconds_per_step: typing.Optional[float] = None


def run_training(run_config, *, print_fn=print):
    """Runs the training described by `run_config`; returns a `TrainingResult`.

    Checks the run config, the model directory, the corpus, the tokenizer and the
    batches before it writes anything; then trains in `output_dir/.name.staging/` and
    renames that to `output_dir/name` when `model.keras` and `manifest.json` are
    written. A run killed on the way, started again with the same trained settings,
    resumes at the epoch after its last finished one, with its tokenizer.

    Args:
        run_config: `RunConfig`.
        print_fn: callable for the summary lines; default `print`.

    Raises:
        FileExistsError: the directory holds a finished run and `overwrite` is false;
            `run_lock.ModelDirectoryInUse`, one, when another run holds it now.
        ValueError: a bad corpus, or an interrupted run of other settings in the way
            (with the settings that differ).
    """
    if not isinstance(run_config, RunConfig):
        raise ValueError(f"`run_config` must be a RunConfig. Received: {type(run_config).__name__}")
    if keras.backend.backend() in ("tensorflow", "jax", "torch"):
        # MultiWorkerMirroredStrategy must exist before TensorFlow runs any op (tokenizer,
        # tf.data below); the scope around fit reuses this cached strategy. torchrun's
        # processes join here, each taking its GPU before any tensor is made; JAX's
        # (KERAS_DISTRIBUTION_*) before JAX starts its backend.
        distribute.select_strategy(run_config.strategy or None)
    check_sampling_strategy(run_config)
    chief = distribute.is_chief()
    # The lock first, before the directory is read: of two runs started together one
    # waits for nothing and the other is refused. Only the chief writes there.
    with _jax_failure_reported(), exclusive_use(run_config.model_dir) if chief else contextlib.nullcontext():
        plan = _plan_run(run_config, chief, print_fn)
        keras.utils.set_random_seed(run_config.seed)
        splits = _timed(print_fn, "corpus", lambda: load_corpus(run_config))
        tokenizer = _timed(
            print_fn, "tokenizer", lambda: prepare_tokenizer(run_config, splits["train"], plan.staging, plan.resuming)
        )
        config = run_config.model_config(tokenizer.vocab_size)
        backup = os.path.join(plan.staging, model_directory.BACKUP_DIR)
        datasets = make_datasets(
            run_config, config, splits, tokenizer,
            completed_epochs=_chief_value(backed_up_epochs(backup) if plan.resuming else 0), print_fn=print_fn,
        )
        fitted = _build_and_fit(run_config, plan, config, tokenizer, splits, datasets, print_fn)
        model_dir = _save_run(fitted.model, plan, tokenizer, print_fn)
        _jax_processes_done(chief, plan)
        _torch_processes_done(chief, plan)
    return _training_result(run_config, model_dir, tokenizer, datasets, fitted, print_fn)


@dataclasses.dataclass
class _Fitted:
    """What `_build_and_fit` trained: the model, its callbacks and what `fit` measured."""

    model: object
    callbacks: list
    history: object
    seconds: float
    steps: int  # optimizer updates
    tokens_per_step: float  # real target tokens per batch, estimated


def _plan_run(run_config, chief, print_fn):
    """The chief's `RunDirectory` (an interrupted swap completed first); a worker's scratch one."""
    if not chief:  # every worker runs the callbacks, but only the chief's files are kept
        scratch = tempfile.mkdtemp(prefix="keras_transformer_worker_")
        return RunDirectory(target=scratch, staging=scratch)
    recover_interrupted_swap(run_config.model_dir, print_fn)
    plan = plan_model_directory(run_config)
    print_fn(describe_plan(plan, run_config))
    return plan


def _build_and_fit(run_config, plan, config, tokenizer, splits, datasets, print_fn):
    """Builds, compiles, stages the run and fits, in the distribution scope; returns `_Fitted`."""
    # Build, compile and fit in the scope: tf.distribute places variables as they
    # are made, and keras.distribution (JAX) is set for the scope's duration only.
    with distribute.distribution_scope(run_config.strategy or None, config=config) as engine:
        replicas = distribute.num_replicas(engine)
        model = build_and_compile(run_config, config)
        # Everything is checked: from here on the run writes, in plan.staging.
        stage_run(plan, run_config, config, tokenizer, print_fn)
        callbacks = _run_callbacks(run_config, plan.staging, splits, tokenizer, print_fn)
        target_tokens = datasets.target_tokens or _target_tokens(tokenizer, splits["train"])
        tokens_per_step = target_tokens / max(datasets.train_stats.num_batches, 1)
        _print_summary(print_fn, run_config, config, model, replicas, datasets.train_stats, tokens_per_step)
        history, seconds, steps = fit(model, run_config, datasets, callbacks, replicas)
    return _Fitted(model, callbacks, history, seconds, steps, tokens_per_step)


def _save_run(model, plan, tokenizer, print_fn):
    """Saves the outputs and renames the staging directory into place; returns where the run is."""
    if save_outputs(model, plan.staging, print_fn):
        return finish_run(plan, tokenizer, print_fn)
    # Non-finite weights and no checkpoint: nothing to resume from either.
    shutil.rmtree(os.path.join(plan.staging, model_directory.BACKUP_DIR), ignore_errors=True)
    if not plan.in_place:
        print_fn(f"{plan.target} is left as it was; this run's logs are in {plan.staging}")
    return plan.staging


def _training_result(run_config, model_dir, tokenizer, datasets, fitted, print_fn):
    """The `TrainingResult`, with its closing lines printed: the best epoch, the speed."""
    callbacks, seconds, steps = fitted.callbacks, fitted.seconds, fitted.steps
    # `steps` counts updates; with gradient accumulation each one read N batches.
    batches = steps * run_config.training_config().gradient_accumulation_steps
    tokens_per_second = batches * fitted.tokens_per_step / seconds if seconds else float("nan")
    stopped = any(isinstance(c, TimeBudget) and c.stopped_early for c in callbacks)
    early = [c for c in callbacks if isinstance(c, ResumableEarlyStopping)]
    best_epoch = early[0].best_epoch + 1 if early and early[0].best is not None else None
    stopped_early = bool(early and early[0].stopped_epoch)
    estimator = next((c for c in callbacks if isinstance(c, StepBudgetEstimator)), None)
    if best_epoch is not None:
        print_fn(
            ("stopped early: " if stopped_early else "")
            + f"the model holds epoch {best_epoch}'s weights, the best {run_config.early_stopping_monitor}"
            f" ({early[0].best:.4g})"
        )
    print_fn(
        f"trained {steps} steps in {seconds:.0f} s ({steps / max(seconds, 1e-9):.2f} steps/s, "
        f"~{tokens_per_second:,.0f} target tokens/s)" + ("; stopped by the time budget" if stopped else "")
    )
    return TrainingResult(
        model_dir=model_dir,
        model=fitted.model,
        tokenizer=tokenizer,
        history=fitted.history,
        train_seconds=seconds,
        steps=steps,
        target_tokens_per_second=tokens_per_second,
        stopped_by_time_budget=stopped,
        steps_per_epoch=run_config.steps_per_epoch or datasets.train_stats.num_batches,
        stopped_early=stopped_early,
        best_epoch=best_epoch,
        estimated_total_steps=estimator.estimated_total_steps if estimator else None,
        seconds_per_step=estimator.seconds_per_step if estimator else None,
    )


# ------------------------------------------------------------------------- steps


def load_corpus(run_config):
    """The sentence pairs of each split named in `run_config`: `{split: [(src, tgt)]}`.

    Keys are `"train"`, `"validation"` and `"test"`; a split whose name is empty in the
    config is absent. `corpus="demo"` generates the built-in corpus (its own train /
    validation / test splits); `"files"` reads `data_dir/{split}.{lang}` line-aligned
    pairs; `"tsv"` reads `data_dir/{split}.tsv` (source, target columns); `"tfds"` loads
    `tfds_name` splits (prepared beforehand; nothing is downloaded).
    """
    names = {
        "train": run_config.train_split,
        "validation": run_config.validation_split,
        "test": run_config.test_split,
    }
    names = {key: name for key, name in names.items() if name}
    if run_config.corpus == "demo":
        from keras_transformer.data.demo_corpus import make_demo_corpus

        corpus = make_demo_corpus(seed=run_config.demo_seed, num_train=run_config.demo_num_train)
        splits = {key: corpus[key] for key in names}
    else:
        splits = {key: _read_split(run_config, name) for key, name in names.items() if key != "train"}
        if "train" in names:
            # A TextCorpus streams (make_datasets binarizes it once); a list is read whole.
            corpus = _text_corpus(run_config, names["train"])
            splits["train"] = corpus if streams_training_split(run_config) else list(corpus)
    if run_config.max_train_pairs and isinstance(splits.get("train"), list):
        splits["train"] = splits["train"][: run_config.max_train_pairs]
    return splits


def streams_training_split(run_config):
    """Whether the training split is streamed and binarized rather than held as a list.

    A file, TSV or TFDS corpus is. The demo corpus is generated in memory (and batched
    from an in-memory `BinarizedCorpus`); subword sampling cuts the text anew each
    epoch, so a sampled run holds its text (`data.pipeline.make_dataset`).
    """
    return run_config.corpus != "demo" and not _samples_subwords(run_config)


def _samples_subwords(run_config):
    return bool(run_config.subword_sampling_source or run_config.subword_sampling_target)


def prepare_tokenizer(run_config, train_pairs, model_dir=None, resuming=False):
    """The joint tokenizer of the run, in memory; `stage_run` saves it.

    Trained on both sides of `train_pairs`; when `resuming` an interrupted run, that
    run's own is read from `model_dir` instead, so the restored weights keep meaning
    the same ids.
    """
    from keras_transformer.data.text_corpus import TextCorpus, cached_tokenizer
    from keras_transformer.data.tokenizer import SubwordTokenizer, train_tokenizer

    if resuming:
        return SubwordTokenizer.load(model_dir)
    pairs = itertools.islice(train_pairs, max(1, run_config.tokenizer_max_sentences // 2))  # a list or a stream
    options = {"split_digits": True} if run_config.tokenizer_split_digits else {}
    settings = dict(vocab_size=run_config.vocab_size, model_type=run_config.tokenizer_model_type, seed=run_config.seed)

    def train():
        return train_tokenizer([sentence for pair in pairs for sentence in pair], **settings, **options)

    if not isinstance(train_pairs, TextCorpus):
        return train()
    # A streamed corpus's tokenizer is kept beside its binarized copy: a later run skips training it.
    settings_key = {**settings, **options, "max_sentences": run_config.tokenizer_max_sentences}
    return cached_tokenizer(train_pairs, settings_key, _binarized_dir(run_config), train)


def _binarized_dir(run_config):
    """Where the run's binarized corpora and their tokenizers are kept.

    By default a user cache, as Hugging Face datasets keeps its own: outside the run's
    output directory (which a refused run must leave as it was) and outside the corpus's
    directory (which may be read-only or shared).
    """
    if run_config.binarized_dir:
        return run_config.binarized_dir
    cache = os.environ.get("KERAS_TRANSFORMER_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "keras_transformer"
    )
    return os.path.join(cache, "binarized")


@dataclasses.dataclass
class Datasets:
    """The batches `fit` reads: training, validation (or None), and training's stats."""

    train: object
    validation: object
    train_stats: object
    # Batches in one Keras epoch; None: one pass over `train` (it then ends).
    steps_per_epoch: typing.Optional[int] = None
    # Real target tokens (with EOS) of the training split, when counted while binarizing.
    target_tokens: typing.Optional[int] = None


def make_datasets(run_config, config, splits, tokenizer, completed_epochs=0, print_fn=print):
    """Training and validation batches (token budget, padded to length buckets).

    The training split becomes a `BinarizedCorpus` and is batched from index arrays
    (`_binarized_datasets`): a streamed one (a `TextCorpus`: any file, TSV or TFDS
    corpus) binarized once to files (cached), a list of pairs (the demo corpus) in
    memory. Either way a resumed run's stream starts at the batch after its
    `completed_epochs`, and each worker of a multi-worker run reads its rows.

    With subword sampling, which cuts the text anew each epoch from sentencepiece's
    unseeded draws, the training batches are `make_dataset`'s instead: they repeat, a
    Keras epoch is `steps_per_epoch` batches (default one unsampled pass's worth), and
    a resumed run starts its epoch afresh (`check_sampling_strategy` refuses several
    workers).
    """
    from keras_transformer.data.in_memory_corpus import in_memory_corpus
    from keras_transformer.data.pipeline import make_dataset
    from keras_transformer.data.text_corpus import TextCorpus, binarized_corpus

    batching = dict(
        vocab_size=config.vocab_size,  # ids beyond the model's embedding are refused here
        max_length=config.max_length,
        tokens_per_batch=run_config.tokens_per_batch,
        bucket_boundaries=run_config.bucket_boundaries(config.max_length),
    )
    validation = None
    if splits.get("validation"):
        validation, _ = make_dataset(splits["validation"], tokenizer, shuffle=False, **batching)
    train = splits["train"]
    if _samples_subwords(run_config):
        if isinstance(train, TextCorpus):
            train = list(train)
        sampling = (run_config.subword_sampling_source, run_config.subword_sampling_target)
        # Sampled segmentations change the batches an epoch holds: always repeated.
        batches, train_stats = make_dataset(
            train, tokenizer, seed=run_config.seed, repeat=True, subword_sampling=sampling, **batching
        )
        steps_per_epoch = run_config.steps_per_epoch or train_stats.num_batches
        return Datasets(train=batches, validation=validation, train_stats=train_stats, steps_per_epoch=steps_per_epoch)
    if isinstance(train, TextCorpus):
        binarized = binarized_corpus(
            train, tokenizer, _binarized_dir(run_config), vocab_size=config.vocab_size, print_fn=print_fn,
            progress=run_config.verbose == 1,
        )
    else:
        binarized = in_memory_corpus(train, tokenizer, vocab_size=config.vocab_size)
    return _binarized_datasets(run_config, config, binarized, validation, completed_epochs)


def build_and_compile(run_config, config):
    """The model of `config`, compiled with the run's `[training]` recipe.

    A budgeted decay without `total_steps` (`run_config.estimates_total_steps`) starts
    with a provisional total, which the run's `StepBudgetEstimator` sets during `fit`.
    """
    model = build_transformer(config)
    compile_transformer(
        model,
        run_config.training_config(),
        jit_compile=run_config.jit_compile,
        steps_per_execution=run_config.steps_per_execution,
        estimate_total_steps=run_config.estimates_total_steps,
    )
    return model


def fit(model, run_config, datasets, callbacks, replicas):
    """`model.fit` over the datasets; returns `(history, seconds, optimizer steps)`."""
    train, validation = datasets.train, datasets.validation
    if replicas > 1 and keras.backend.backend() == "jax":
        # JAX shards each batch evenly; token-budget batches vary in size.
        train, validation = _jax_batches(run_config, train, validation, replicas)
    counter = _StepCounter()
    epochs = run_config.epochs
    for callback in callbacks:
        stopped = callback.saved_stopped_epoch() if isinstance(callback, ResumableEarlyStopping) else None
        if stopped is not None:
            # A run killed after it stopped early (while saving): its backup holds that
            # epoch, so fit trains nothing more and only restores the best weights.
            epochs = min(epochs, stopped + 1)
    started = time.monotonic()
    history = model.fit(
        train,
        validation_data=validation,
        epochs=epochs,
        steps_per_epoch=datasets.steps_per_epoch or run_config.steps_per_epoch or None,
        callbacks=callbacks + [counter],  # after BackupAndRestore: counts from the restored step
        verbose=run_config.verbose,
        shuffle=False,  # the dataset shuffles itself, seeded (True would only warn)
    )
    return history, time.monotonic() - started, counter.steps


def save_outputs(model, model_dir, print_fn=print):
    """Writes `model.keras` (renamed into place; never NaN weights) and the curves PNG.

    Returns:
        bool, whether `model.keras` was written.
    """
    saved, restored_from = save_final_model(
        model,
        os.path.join(model_dir, model_directory.MODEL_FILE),
        os.path.join(model_dir, model_directory.CHECKPOINT_DIR),
    )
    if restored_from:
        print_fn(f"training ended with non-finite weights; {model_directory.MODEL_FILE} holds {restored_from}")
    elif not saved:
        print_fn(f"training ended with non-finite weights and no checkpoint: {model_directory.MODEL_FILE} not written")
    csv_path = os.path.join(model_dir, model_directory.CSV_LOG_FILE)
    if os.path.isfile(csv_path) and os.path.getsize(csv_path):
        plot_training_curves(csv_path, os.path.join(model_dir, model_directory.CURVES_FILE))
    if saved:
        print_fn(
            f"saved {model_directory.MODEL_FILE}, {model_directory.TOKENIZER_FILE}, "
            f"{model_directory.CONFIG_FILE} and logs in {model_dir}"
        )
    return saved


# --------------------------------------------------------------------- internals
class _StepCounter(keras.callbacks.Callback):
    """Optimizer steps taken by this `fit`, counted from the (possibly restored) start."""

    def __init__(self):
        super().__init__()
        self.steps = 0
        self._start = 0

    def _iterations(self):
        return int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))

    def on_train_begin(self, logs=None):
        self._start = self._iterations()

    def on_train_end(self, logs=None):
        self.steps = self._iterations() - self._start


def _run_callbacks(run_config, model_dir, splits, tokenizer, print_fn=print):
    callbacks = default_callbacks(
        model_dir,
        keep_checkpoints=run_config.keep_checkpoints,
        checkpoint_every_steps=run_config.checkpoint_every_steps,
        validation_pairs=splits.get("validation") or None,
        tokenizer=tokenizer,
        bleu_every_epochs=run_config.bleu_every_epochs,
        bleu_samples=run_config.bleu_samples,
        sample_translations=run_config.sample_translations,
        max_train_seconds=run_config.max_train_seconds or None,
        jit_compile=run_config.jit_compile is not False,
        early_stopping_patience=run_config.early_stopping_patience,
        early_stopping_monitor=run_config.early_stopping_monitor,
        early_stopping_min_delta=run_config.early_stopping_min_delta,
    )
    for callback in callbacks:
        if isinstance(callback, keras.callbacks.BackupAndRestore):
            # finish_run deletes backup/ once model.keras and the manifest are written:
            # a kill during the final save then resumes instead of starting again.
            callback.delete_checkpoint = False
    if run_config.estimates_total_steps:
        # Right after TimeBudget: both start their clocks as fit begins. Its estimate is
        # kept in backup/, so that a resumed run starts from it (budget_estimate.py).
        estimator = StepBudgetEstimator(
            run_config.max_train_seconds,
            state_dir=os.path.join(model_dir, model_directory.BACKUP_DIR),
            print_fn=print_fn,
        )
        after = next(i for i, c in enumerate(callbacks) if isinstance(c, TimeBudget)) + 1
        callbacks.insert(after, estimator)
    if keras.backend.backend() == "torch":
        from keras_transformer import torch_processes

        if torch_processes.is_multi_process():  # last: the chief's state, stop and schedule are final
            callbacks.append(torch_processes.ProcessSync())
    if keras.backend.backend() == "jax":
        from keras_transformer import jax_processes

        if jax_processes.is_multi_process():  # last: the chief's state, stop and schedule are final
            callbacks.append(jax_processes.ProcessSync())
    return callbacks


def _read_split(run_config, name):
    from keras_transformer.data import readers

    if run_config.corpus == "files":
        stem = os.path.join(run_config.data_dir, name)
        pairs, _ = readers.read_parallel_files(
            f"{stem}.{run_config.source_lang}", f"{stem}.{run_config.target_lang}"
        )
    elif run_config.corpus == "tsv":
        path = os.path.join(run_config.data_dir, name)
        pairs, _ = readers.read_tsv(path if path.endswith(".tsv") else f"{path}.tsv")
    else:
        pairs, _ = readers.load_tfds(
            run_config.tfds_name,
            split=name,
            source_lang=run_config.source_lang,
            target_lang=run_config.target_lang,
            data_dir=run_config.data_dir or None,
        )
    return pairs


def _text_corpus(run_config, name):
    """The split `name` as a `TextCorpus`: read on demand, never held whole."""
    from keras_transformer.data.text_corpus import TextCorpus

    common = dict(split=name, skip_malformed=run_config.skip_malformed, max_pairs=run_config.max_train_pairs)
    stem = os.path.join(run_config.data_dir, name)
    if run_config.corpus == "files":
        paths = (_plain_or_gzip(f"{stem}.{run_config.source_lang}"), _plain_or_gzip(f"{stem}.{run_config.target_lang}"))
        return TextCorpus("files", paths=paths, **common)
    if run_config.corpus == "tsv":
        return TextCorpus("tsv", paths=(stem if stem.endswith(".tsv") else f"{stem}.tsv",), **common)
    return TextCorpus(
        "tfds", tfds_name=run_config.tfds_name, source_lang=run_config.source_lang,
        target_lang=run_config.target_lang, data_dir=run_config.data_dir, **common,
    )


def _plain_or_gzip(path):
    """`path`, or `path.gz` when only the compressed file is there (the reader then names `path`)."""
    return f"{path}.gz" if not os.path.exists(path) and os.path.exists(f"{path}.gz") else path


def _binarized_datasets(run_config, config, binarized, validation, completed_epochs):
    """`Datasets` of a training split's `BinarizedCorpus` (on disk or in memory), batched from index arrays.

    The batch stream is endless and positioned by batch number: a run resumed after
    `completed_epochs` Keras epochs starts at the batch after the last one trained, and
    reads nothing before it (`data.index_batches`).
    """
    from keras_transformer.data.index_batches import IndexBatches, Shard, distributed_dataset

    def make_batches(shard):
        return IndexBatches(
            binarized, max_length=config.max_length, tokens_per_batch=run_config.tokens_per_batch,
            bucket_boundaries=run_config.bucket_boundaries(config.max_length), seed=run_config.seed, shard=shard,
        )

    batches = make_batches(Shard())
    if batches.stats.kept == 0:
        raise ValueError(
            f"No pair fits max_length={config.max_length}: all {batches.stats.total} pairs are "
            "longer. Raise max_length or use overlong='truncate'."
        )
    steps_per_epoch = run_config.steps_per_epoch or batches.num_batches
    start = completed_epochs * steps_per_epoch
    strategy = _multi_worker_strategy(run_config)
    train = _torch_processes_batches(run_config, binarized, make_batches, start)
    train = train or _jax_processes_batches(run_config, binarized, make_batches, start)
    return Datasets(
        # Several workers: each one's pipeline gathers only its rows of every global batch.
        train=train or (distributed_dataset(strategy, make_batches, start) if strategy else batches.dataset(start)),
        validation=validation,
        train_stats=batches.stats,
        steps_per_epoch=steps_per_epoch,
        target_tokens=binarized.meta["target_tokens"] + binarized.num_pairs,
    )


def check_sampling_strategy(run_config):
    """Refuses subword sampling in a run of several worker processes, naming both settings.

    A sampled run's batches come from sentencepiece's draws, which no seed makes the same
    in two processes (`set_random_generator_seed` repeats them within one process only):
    workers would cut the same pair differently, plan different batches and step apart.
    Such a run is one process, and resumes at the start of the epoch it was killed in.

    Raises:
        ValueError: sampling and a multi-worker strategy, or several JAX or PyTorch processes.
    """
    if not _samples_subwords(run_config):
        return
    processes = None if run_config.strategy == "multi_worker" else _worker_processes(run_config)
    if processes is None or processes > 1:
        raise ValueError(
            "Subword sampling does not combine with training in several worker processes: each "
            "process would draw other segmentations of the same pairs (sentencepiece's draws "
            "cannot be seeded across processes), so the workers' batches would disagree. "
            f"Received: subword_sampling_source={run_config.subword_sampling_source}, "
            f"subword_sampling_target={run_config.subword_sampling_target} and "
            f"strategy={run_config.strategy!r} ({processes or 'several'} worker processes). "
            "Set both alphas to 0, or train in one process."
        )


def _worker_processes(run_config):
    """How many worker processes train this run together: 1 for this one alone; None: several, uncounted."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        if _multi_worker_strategy(run_config) is None:
            return 1
        return None  # MultiWorkerMirroredStrategy: one process per worker (TF_CONFIG's cluster)
    if backend == "jax":
        from keras_transformer import jax_processes

        if jax_processes.is_multi_process():
            import jax

            return jax.process_count()
        # Not joined yet (select_strategy joins them later): Keras' process variables say so.
        # JAX's backend must not start here, or this process could not join the others.
        if not jax_processes.requested():
            return 1
        count = os.environ.get("KERAS_DISTRIBUTION_NUM_PROCESSES", "").strip()
        return int(count) if count.isdigit() else None
    import torch.distributed

    initialized = torch.distributed.is_available() and torch.distributed.is_initialized()
    return torch.distributed.get_world_size() if initialized else 1


def _chief_value(value):
    """The chief's `value` in every PyTorch or JAX process of the run (only the chief reads the model directory)."""
    if keras.backend.backend() == "jax":
        from keras_transformer import jax_processes

        return jax_processes.chief_value(value)
    if keras.backend.backend() != "torch":
        return value
    from keras_transformer import torch_processes

    return torch_processes.chief_value(value)


def _torch_processes_batches(run_config, binarized, make_batches, start):
    """In a PyTorch run over several processes, this process's rows of every global batch; else None.

    First every process's run config and corpus (its tokenizer's fingerprint included) are
    compared: processes that would train different runs are refused, naming what differs.
    """
    if keras.backend.backend() != "torch":
        return None
    from keras_transformer import torch_processes

    if not torch_processes.is_multi_process():
        return None
    torch_processes.check_same_run({**_shared_settings(run_config), "corpus": torch_processes.corpus_fingerprint(binarized)})
    return torch_processes.process_dataset(make_batches, start)


def _jax_processes_batches(run_config, binarized, make_batches, start):
    """In a JAX run over several processes, this process's rows of every global batch; else None.

    First every process's run config and corpus (its tokenizer's fingerprint included) are
    compared: processes that would train different runs are refused, naming what differs.
    """
    if keras.backend.backend() != "jax":
        return None
    from keras_transformer import jax_processes
    from keras_transformer.torch_processes import corpus_fingerprint  # no torch import: a digest of the arrays

    if not jax_processes.is_multi_process():
        return None
    jax_processes.check_same_run({**_shared_settings(run_config), "corpus": corpus_fingerprint(binarized)})
    return jax_processes.process_dataset(make_batches, distribute.select_strategy(run_config.strategy or None), start)


def _torch_processes_done(chief, plan):
    """Over several PyTorch processes, the others delete their scratch directory (their callbacks' files)."""
    if keras.backend.backend() != "torch" or chief:
        return
    from keras_transformer import torch_processes

    if torch_processes.is_multi_process():
        shutil.rmtree(plan.staging, ignore_errors=True)


# Settings each JAX or PyTorch process may hold its own value of: where the chief writes, what each prints.
_PER_PROCESS_SETTINGS = frozenset({"name", "output_dir", "binarized_dir", "data_dir", "overwrite", "verbose", "keep_checkpoints"})


def _shared_settings(run_config):
    """The settings every process of a run must agree on: what is trained, and how.

    More than `trained_settings`: the epochs, the compilation and the callbacks' decoding
    (BLEU, samples) run collectives, and a process running one the others do not would
    wait forever. The corpus is compared by content, not by `data_dir`.
    """
    values = {**run_config.to_dict(), **run_config.trained_settings()}  # the tables resolved, key by key
    return {key: value for key, value in values.items() if key not in _PER_PROCESS_SETTINGS | {"model", "training"}}


def _jax_batches(run_config, train, validation, replicas):
    """`(train, validation)` for JAX's even sharding: each batch padded with all-padding rows to divide.

    Over several processes the training batches are this process's rows already
    (`_jax_processes_batches`), and each process keeps its rows of every validation batch.
    """
    from keras_transformer import jax_processes

    if jax_processes.is_multi_process():
        engine = distribute.select_strategy(run_config.strategy or None)
        return train, None if validation is None else jax_processes.process_rows(validation, engine)
    pad = distribute.pad_batches_for_replicas
    return pad(train, replicas), None if validation is None else pad(validation, replicas)


def _jax_failure_reported():
    """Over several JAX processes, an error here stops the others at once, with one line naming it."""
    if keras.backend.backend() != "jax":
        return contextlib.nullcontext()
    from keras_transformer import jax_processes

    return jax_processes.failure_reported()


def _jax_processes_done(chief, plan):
    """Over several JAX processes: every one waits for the chief's final save, and the others delete their scratch.

    JAX's shutdown at exit waits for every process only `jax_processes.heartbeat_seconds()`.
    """
    if keras.backend.backend() != "jax":
        return
    from keras_transformer import jax_processes

    if not jax_processes.is_multi_process():
        return
    jax_processes.wait_for_all("keras_transformer: the run is saved")
    if not chief:
        shutil.rmtree(plan.staging, ignore_errors=True)


def _multi_worker_strategy(run_config):
    """The run's `tf.distribute.MultiWorkerMirroredStrategy` on TensorFlow, else None."""
    if keras.backend.backend() != "tensorflow":
        return None
    import tensorflow as tf

    strategy = distribute.select_strategy(run_config.strategy or None)  # made first thing in run_training
    return strategy if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) else None


def _timed(print_fn, what, make):
    started = time.monotonic()
    value = make()
    if isinstance(value, dict):
        detail = ", ".join(
            f"{len(pairs) if isinstance(pairs, list) else 'streamed'} {split}" for split, pairs in value.items()
        ) + " pairs"
    else:
        detail = f"{value.vocab_size} pieces"
    print_fn(f"{what}: {detail} ({time.monotonic() - started:.1f} s)")
    return value


def _print_summary(print_fn, run_config, config, model, replicas, train_stats, tokens_per_step):
    steps_per_epoch = run_config.steps_per_epoch or train_stats.num_batches
    training = run_config.training_config()
    print_fn(
        f"model: {model.count_params():,} parameters (d_model {config.d_model}, "
        f"{config.num_encoder_layers}+{config.num_decoder_layers} layers, {config.num_heads} "
        f"heads, d_ff {config.d_ff}, dropout {config.dropout}) on {replicas} replica(s)"
    )
    print_fn(
        f"batches: <= {run_config.tokens_per_batch} padded tokens a side, ~{tokens_per_step:.0f} "
        f"real target tokens per batch; {steps_per_epoch} steps per epoch; {train_stats}"
    )
    if training.gradient_accumulation_steps > 1:
        accumulation = training.gradient_accumulation_steps
        print_fn(
            f"gradient accumulation: one update per {accumulation} batches "
            f"(~{tokens_per_step * accumulation:.0f} real target tokens per update, "
            f"{steps_per_epoch / accumulation:g} updates per epoch); the schedule counts updates"
        )
    budget = f", at most {run_config.max_train_seconds:g} s" if run_config.max_train_seconds else ""
    schedule = make_schedule(config.d_model, training, estimate_total_steps=run_config.estimates_total_steps)
    if training.decay == "rsqrt":
        decay = ""
    elif run_config.estimates_total_steps:
        decay = f"; {training.decay} decay to the floor at the end of the budget (steps estimated as it trains)"
    else:
        decay = f"; {training.decay} decay to the floor at step {training.total_steps:,}"
    print_fn(
        f"training: up to {run_config.epochs} epochs{budget}; peak learning rate "
        f"{schedule.peak_learning_rate:.2e} at step {training.warmup_steps}{decay}"
    )
    note = jit_compile_note(run_config.jit_compile)
    if note:
        print_fn(note)


def jit_compile_note(jit_compile, backend=None):
    """A line for a run whose `jit_compile` means less than its config intends, else None.

    `jit_compile = false` (the CPU configs' choice: plain TensorFlow graphs, no XLA
    compilation per bucket shape) has no such middle ground on JAX, whose only compiled
    step is XLA's: there every step runs eagerly, about 1.6x the jitted step's time on
    the en->de recipe (bench/step_speed.py measures it).
    """
    backend = backend or keras.backend.backend()
    if jit_compile is False and backend == "jax":
        return (
            "jit_compile=false: JAX runs every training step eagerly (about 1.6x slower on a CPU); "
            "--set jit_compile=auto compiles it with XLA, once per batch shape"
        )
    return None


def _target_tokens(tokenizer, pairs, sample_size=100_000):
    """Real target tokens (with EOS) in `pairs`, estimated from a sample of a big corpus."""
    sample = pairs[:sample_size]
    tokens = sum(len(ids) + 1 for ids in tokenizer.encode([target for _, target in sample]))
    return tokens * len(pairs) / max(len(sample), 1)


__all__ = [
    "TrainingResult",
    "run_training",
    "load_corpus",
    "check_sampling_strategy",
    "prepare_tokenizer",
    "make_datasets",
    "build_and_compile",
    "fit",
    "save_outputs",
]

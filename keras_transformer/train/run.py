"""`train(run_config)`: a whole training run, from corpus to a model directory.

The library function behind `python -m training.train` and `make demo`. In order: read
the corpus, train (or, when resuming, reload) the joint tokenizer, build the token-budget
tf.data pipeline, build and compile the model (inside the distribution scope of
`run_config.strategy`), print a summary, `fit` with the default callbacks, then save
`model.keras`, `tokenizer.model`, `config.toml` and the training-curve PNG into the model
directory (see `keras_transformer.model.directory` for the layout).
"""

import contextlib
import dataclasses
import json
import os
import shutil
import tempfile
import time

import keras

from keras_transformer.model import directory as model_directory
from keras_transformer.train.callbacks import TimeBudget, default_callbacks
from keras_transformer.train.checkpoints import save_final_model
from keras_transformer.model.transformer import build_transformer
from keras_transformer.train.curves import plot_training_curves
from keras_transformer.train.run_config import RunConfig
from keras_transformer.train.compile import compile_transformer


@dataclasses.dataclass
class TrainingResult:
    """What `run_training` returns: where it wrote, and what it trained and measured.

    Attributes:
        model_dir: str, the model directory.
        model: the trained `Transformer`.
        tokenizer: its `SubwordTokenizer`.
        splits: dict from split name to `(source, target)` pairs (the corpus read).
        history: the `keras.callbacks.History` of `fit`.
        train_seconds: float, wall-clock seconds of `fit` (compilation included).
        steps: int, optimizer steps taken in this process.
        target_tokens_per_second: float, real target tokens (with EOS) per second of
            `fit`, estimated from the average tokens per batch; NaN if unknown.
        stopped_by_time_budget: bool.
        steps_per_epoch: int, optimizer steps in one epoch.
    """

    model_dir: str
    model: object
    tokenizer: object
    splits: dict
    history: object
    train_seconds: float
    steps: int
    target_tokens_per_second: float
    stopped_by_time_budget: bool
    steps_per_epoch: int = 0


def load_corpus(run_config):
    """The sentence pairs of each split named in `run_config`: `{split: [(src, tgt)]}`.

    Keys are `"train"`, `"validation"` and `"test"`; a split whose name is empty in the
    config is absent. `corpus="demo"` generates the built-in corpus (its own train /
    validation / test splits); `"files"` reads `data_dir/{split}.{lang}` line-aligned
    pairs; `"tsv"` reads `data_dir/{split}.tsv` (source, target columns); `"tfds"` loads
    `tfds_name` splits (prepared beforehand; nothing is downloaded).
    """
    from keras_transformer.data import readers

    names = {
        "train": run_config.train_split,
        "validation": run_config.validation_split,
        "test": run_config.test_split,
    }
    if run_config.corpus == "demo":
        from keras_transformer.data.demo_corpus import make_demo_corpus

        corpus = make_demo_corpus(seed=run_config.demo_seed, num_train=run_config.demo_num_train)
        splits = {key: corpus[key] for key, name in names.items() if name}
    else:
        splits = {}
        for key, name in names.items():
            if not name:
                continue
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
            splits[key] = pairs
    if run_config.max_train_pairs:
        splits["train"] = splits["train"][: run_config.max_train_pairs]
    return splits


@contextlib.contextmanager
def distribution_scope(strategy, config):
    """Builds inside `keras_transformer.distribute.distribution_scope(strategy)`.

    Yields the number of data-parallel replicas. An empty `strategy` means "auto" (one
    device unless several are there).
    """
    from keras_transformer import distribute

    with distribute.distribution_scope(strategy or None, config=config) as engine:
        yield distribute.num_replicas(engine)


def prepare_tokenizer(run_config, train_pairs, model_dir, resuming):
    """Trains the joint tokenizer on both sides of `train_pairs` and saves it.

    When resuming an interrupted run, the tokenizer it saved is reloaded instead, so the
    restored weights keep meaning the same ids.
    """
    from keras_transformer.data.tokenizer import SubwordTokenizer, train_tokenizer

    path = os.path.join(model_dir, model_directory.TOKENIZER_FILE)
    if resuming and os.path.isfile(path):
        return SubwordTokenizer.load(path)
    pairs = train_pairs[: max(1, run_config.tokenizer_max_sentences // 2)]
    options = {"split_digits": True} if run_config.tokenizer_split_digits else {}
    tokenizer = train_tokenizer(
        [sentence for pair in pairs for sentence in pair],
        run_config.vocab_size,
        model_type=run_config.tokenizer_model_type,
        seed=run_config.seed,
        **options,
    )
    tokenizer.save(model_dir)
    return tokenizer


def run_training(run_config, *, print_fn=print):
    """Runs the training described by `run_config`; returns a `TrainingResult`.

    Writes into `run_config.model_dir`: `tokenizer.model` (before training),
    checkpoints, CSV and TensorBoard logs (during), and `model.keras`, `config.toml` and
    `training_curves.png` (after). If the directory holds the backup of an interrupted
    run (`backup/`), that run is resumed at the epoch after its last finished one, with
    its tokenizer; otherwise earlier checkpoints in the directory are removed and
    training starts afresh.

    Args:
        run_config: `RunConfig`.
        print_fn: callable for the summary lines; default `print`.
    """
    if not isinstance(run_config, RunConfig):
        raise ValueError(f"`run_config` must be a RunConfig. Received: {type(run_config).__name__}")

    from keras_transformer import distribute

    if keras.backend.backend() == "tensorflow":
        # MultiWorkerMirroredStrategy must exist before TensorFlow runs any op (tokenizer,
        # tf.data below); the scope around fit reuses this cached strategy.
        distribute.select_strategy(run_config.strategy or None)
    model_dir = run_config.model_dir
    if not distribute.is_chief():
        # Every worker runs the same callbacks, but only the chief's files are kept.
        model_dir = tempfile.mkdtemp(prefix="keras_transformer_worker_")
    os.makedirs(model_dir, exist_ok=True)
    resuming = os.path.isdir(os.path.join(model_dir, model_directory.BACKUP_DIR))
    if not resuming:
        shutil.rmtree(os.path.join(model_dir, model_directory.CHECKPOINT_DIR), ignore_errors=True)
    keras.utils.set_random_seed(run_config.seed)

    started = time.monotonic()
    splits = load_corpus(run_config)
    sizes = ", ".join(f"{len(pairs)} {split}" for split, pairs in splits.items())
    print_fn(f"Run {run_config.name!r} -> {model_dir}{' (resuming)' if resuming else ''}")
    print_fn(f"corpus: {run_config.corpus}, {sizes} pairs ({time.monotonic() - started:.1f} s)")

    started = time.monotonic()
    tokenizer = prepare_tokenizer(run_config, splits["train"], model_dir, resuming)
    print_fn(
        f"tokenizer: {run_config.tokenizer_model_type}, {tokenizer.vocab_size} pieces "
        f"({time.monotonic() - started:.1f} s)"
    )
    config = run_config.model_config(tokenizer.vocab_size)
    with open(os.path.join(model_dir, model_directory.CONFIG_FILE), "w", encoding="utf-8") as file:
        file.write(run_config.to_toml(config))

    train_data, validation_data, train_stats = _datasets(run_config, config, splits, tokenizer)
    counter = _StepCounter()
    callbacks = default_callbacks(
        model_dir,
        keep_checkpoints=run_config.keep_checkpoints,
        validation_pairs=splits.get("validation") or None,
        tokenizer=tokenizer,
        bleu_every_epochs=run_config.bleu_every_epochs,
        bleu_samples=run_config.bleu_samples,
        sample_translations=run_config.sample_translations,
        max_train_seconds=run_config.max_train_seconds or None,
        jit_compile=run_config.jit_compile is not False,
    )
    # Build, compile and fit in the scope: tf.distribute places variables as they are
    # made, and keras.distribution (JAX) is set for the scope's duration only.
    with distribution_scope(run_config.strategy, config) as replicas:
        if replicas > 1 and keras.backend.backend() == "jax":
            # JAX shards each batch evenly; token-budget batches vary in size.
            from keras_transformer.distribute import pad_batches_for_replicas

            train_data = pad_batches_for_replicas(train_data, replicas)
            if validation_data is not None:
                validation_data = pad_batches_for_replicas(validation_data, replicas)
        model = build_transformer(config)
        compile_transformer(
            model,
            config,
            jit_compile=run_config.jit_compile,
            steps_per_execution=run_config.steps_per_execution,
        )
        tokens_per_step = _target_tokens(tokenizer, splits["train"]) / max(train_stats.num_batches, 1)
        _print_summary(print_fn, run_config, config, model, replicas, train_stats, tokens_per_step)
        started = time.monotonic()
        history = model.fit(
            train_data,
            validation_data=validation_data,
            epochs=run_config.epochs,
            steps_per_epoch=run_config.steps_per_epoch or None,
            callbacks=callbacks + [counter],  # after BackupAndRestore: counts from the restored step
            verbose=run_config.verbose,
            shuffle=False,  # the dataset shuffles itself, seeded
        )
    train_seconds = time.monotonic() - started
    tokens_per_second = counter.steps * tokens_per_step / train_seconds if train_seconds else float("nan")
    stopped = any(isinstance(c, TimeBudget) and c.stopped_early for c in callbacks)

    # Renamed into place: a crash while saving leaves an earlier model.keras whole. After
    # a NaN stop the weights are the newest (finite) checkpoint's, never the NaN ones.
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
    print_fn(
        f"trained {counter.steps} steps in {train_seconds:.0f} s "
        f"({counter.steps / max(train_seconds, 1e-9):.2f} steps/s, ~{tokens_per_second:,.0f} "
        "target tokens/s)" + ("; stopped by the time budget" if stopped else "")
    )
    print_fn(
        f"saved {model_directory.MODEL_FILE}, {model_directory.TOKENIZER_FILE}, "
        f"{model_directory.CONFIG_FILE} and logs in {model_dir}"
    )
    return TrainingResult(
        model_dir=model_dir,
        model=model,
        tokenizer=tokenizer,
        splits=splits,
        history=history,
        train_seconds=train_seconds,
        steps=counter.steps,
        target_tokens_per_second=tokens_per_second,
        stopped_by_time_budget=stopped,
        steps_per_epoch=run_config.steps_per_epoch or train_stats.num_batches,
    )


def train(run_config, *, print_fn=print):
    """Runs the training described by `run_config` and returns its model directory.

    See `run_training` for what is written; this is the same, returning only the path.

    Example:
    >>> model_dir = train(RunConfig.from_toml("training/configs/demo.toml"))
    >>> model_dir
    'saved_models/demo'
    """
    return run_training(run_config, print_fn=print_fn).model_dir


def write_metrics(model_dir, metrics):
    """Writes `metrics` (a dict of numbers) as `model_dir/metrics.json`; returns the path."""
    path = os.path.join(os.fspath(model_dir), model_directory.METRICS_FILE)
    with open(path, "w", encoding="utf-8") as file:
        json.dump(metrics, file, indent=2, sort_keys=True)
        file.write("\n")
    return path


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


def _datasets(run_config, config, splits, tokenizer):
    """Training and validation batches (token budget, padded to buckets); train stats."""
    from keras_transformer.data.pipeline import evenly_spaced_boundaries, make_dataset

    boundaries = evenly_spaced_boundaries(run_config.bucket_width, config.max_length)
    train_data, train_stats = make_dataset(
        splits["train"],
        tokenizer,
        max_length=config.max_length,
        tokens_per_batch=config.tokens_per_batch,
        bucket_boundaries=boundaries,
        seed=run_config.seed,
        repeat=bool(run_config.steps_per_epoch),
    )
    validation_data = None
    if splits.get("validation"):
        validation_data, _ = make_dataset(
            splits["validation"],
            tokenizer,
            max_length=config.max_length,
            tokens_per_batch=config.tokens_per_batch,
            bucket_boundaries=boundaries,
            shuffle=False,
        )
    return train_data, validation_data, train_stats


def _print_summary(print_fn, run_config, config, model, replicas, train_stats, tokens_per_step):
    steps_per_epoch = run_config.steps_per_epoch or train_stats.num_batches
    print_fn(
        f"model: {model.count_params():,} parameters (d_model {config.d_model}, "
        f"{config.num_encoder_layers}+{config.num_decoder_layers} layers, {config.num_heads} "
        f"heads, d_ff {config.d_ff}, dropout {config.dropout}) on {replicas} replica(s)"
    )
    print_fn(
        f"batches: <= {config.tokens_per_batch} padded tokens a side, ~{tokens_per_step:.0f} "
        f"real target tokens per batch; {steps_per_epoch} steps per epoch; {train_stats}"
    )
    budget = f", at most {run_config.max_train_seconds:g} s" if run_config.max_train_seconds else ""
    print_fn(
        f"training: up to {run_config.epochs} epochs{budget}; peak learning rate "
        f"{_peak_learning_rate(config):.2e} at step {config.warmup_steps}"
    )


def _target_tokens(tokenizer, pairs, sample_size=100_000):
    """Real target tokens (with EOS) in `pairs`, estimated from a sample of a big corpus."""
    sample = pairs[:sample_size]
    tokens = sum(len(ids) + 1 for ids in tokenizer.encode([target for _, target in sample]))
    return tokens * len(pairs) / max(len(sample), 1)


def _peak_learning_rate(config):
    from keras_transformer.train.compile import make_schedule

    return make_schedule(config).peak_learning_rate


__all__ = ["TrainingResult", "run_training", "train", "load_corpus", "write_metrics", "distribution_scope"]

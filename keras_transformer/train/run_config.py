"""`RunConfig`: everything a training run needs besides the model, read from TOML.

A run is a model (a `TransformerConfig` preset plus overrides, in the `[model]` table),
a training recipe (`TrainingConfig` fields in the `[training]` table), a corpus, a
tokenizer, batching, and how long and where to train. Configs live in
`training/configs/*.toml` and are read with the standard library's `tomllib`; the
command line changes single values with `--set key=value` (`--set model.d_model=256`,
`--set training.warmup_steps=400`),
each parsed by the type of the field it sets. An unknown key is an error naming it, so
a typo never silently trains the default.
"""

import dataclasses
import json
import os
import tomllib
import types
import typing
import warnings

from keras_transformer import checks
from keras_transformer.data.settings import (
    TOKENIZER_MODEL_TYPES,
    check_batching_arguments,
    default_bucket_boundaries,
    evenly_spaced_boundaries,
)
from keras_transformer.inference.decoding import BEAM_SIZE, DECODE_METHODS, LENGTH_PENALTY
from keras_transformer.model.config import LEGACY_FIELDS, TransformerConfig
from keras_transformer.train.callbacks import EARLY_STOPPING_MONITORS
from keras_transformer.train.compile import JIT_COMPILE_VALUES
from keras_transformer.train.config import TrainingConfig
from keras_transformer.train.removed_keys import check_not_removed, drop_removed_keys

CORPORA = ("demo", "files", "tsv", "tfds")
# Settings that say how a run is carried out, not what it trains: an interrupted run
# resumes under new values of these (more epochs, a new time budget, quieter logs,
# another device strategy). A change of any other setting is another run.
RESUMABLE_CHANGES = frozenset({
    "name", "output_dir", "binarized_dir", "overwrite", "epochs", "max_train_seconds", "strategy",
    "jit_compile", "steps_per_execution", "verbose", "keep_checkpoints",
    "bleu_every_epochs", "bleu_samples", "sample_translations", "eval_decode",
    "eval_beam_size", "eval_length_penalty", "eval_batch_size", "early_stopping_patience",
    "early_stopping_monitor", "early_stopping_min_delta",
})
# The key of a TOML run config that names the file it builds on (RunConfig.from_toml).
EXTENDS_KEY = "extends"
# The sub-configs of a run: TOML table name -> the dataclass its keys are fields of.
_TABLES = {"model": TransformerConfig, "training": TrainingConfig}


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """One training run: model, recipe, data, tokenizer, budget and outputs.

    Frozen: make variants with `replace(**changes)` or `with_overrides(["key=value"])`.
    Validated on construction (the model and training configs are built once, so a bad
    `[model]` or `[training]` value fails here, not after the corpus is read); a bad
    value raises `ValueError` naming the field. Zero means "no limit" for
    `max_train_seconds`, `steps_per_epoch` and `max_train_pairs`, because TOML has no null.

    Example:
    >>> config = RunConfig.from_toml("training/configs/demo.toml", ["epochs=2"])
    >>> config.model_config().d_model, config.training_config().warmup_steps
    (128, 300)
    """

    name: str = "run"  # the model directory is output_dir/name

    # Model: a preset of keras_transformer.model.PRESETS plus overrides ([model] table).
    preset: str = "tiny"
    model: dict = dataclasses.field(default_factory=dict, hash=False)
    # Optimizer, schedule and loss: TrainingConfig fields ([training] table).
    training: dict = dataclasses.field(default_factory=dict, hash=False)

    # Data. corpus "demo": the built-in generated corpus; "files": data_dir/{split}.{lang};
    # "tsv": data_dir/{split}.tsv (source, target columns); "tfds": tfds_name splits.
    corpus: str = "demo"
    data_dir: str = ""
    source_lang: str = "en"
    target_lang: str = "de"
    train_split: str = "train"
    validation_split: str = "validation"
    test_split: str = "test"  # "" when the corpus has none
    tfds_name: str = ""
    demo_num_train: int = 50_000
    demo_seed: int = 0
    max_train_pairs: int = 0  # keep the first N training pairs; 0 keeps all
    skip_malformed: bool = False  # count and skip a bad training line instead of stopping at it
    # Where the training split of a files/tsv/tfds corpus is binarized once (memory-mapped
    # token ids, data.binarized) for every later run to open at once; "": the user cache,
    # $KERAS_TRANSFORMER_CACHE/binarized or ~/.cache/keras_transformer/binarized.
    binarized_dir: str = ""
    # Padded tokens per batch and side. The paper's ~25k (5.1) is a GPU's batch: on a
    # CPU a 25k-token base-model step takes tens of seconds and ~10 GB, so the default
    # fits a laptop; base.toml and big.toml set the paper's value.
    tokens_per_batch: int = 4096
    # Padded lengths of the length buckets: 0 gives the default boundaries (multiples of 8
    # growing ~1.5x); N > 0 gives N, 2N, 3N, ... up to max_length: less padding, more
    # batch shapes (each one an XLA compilation when jit_compile is on).
    bucket_width: int = 0
    # Subword regularization of the training pairs: each epoch cuts every sentence of a
    # side anew with a segmentation drawn at random (make_dataset(subword_sampling=...);
    # with a BPE tokenizer, BPE-dropout with this probability, Provilkov et al. 2020:
    # 0.1). 0: the usual segmentation. An epoch is then one unsampled pass's batches.
    subword_sampling_source: float = 0.0
    subword_sampling_target: float = 0.0

    # Tokenizer: one sentencepiece vocabulary for both languages (section 5.1).
    vocab_size: int = 8000
    tokenizer_model_type: str = "bpe"  # the paper's byte-pair encoding
    tokenizer_split_digits: bool = False  # one piece per digit: numbers are copied digit by digit
    tokenizer_max_sentences: int = 2_000_000  # cap on sentences fed to sentencepiece

    # Training.
    epochs: int = 10
    max_train_seconds: float = 0.0  # wall-clock budget of model.fit; 0: none
    steps_per_epoch: int = 0  # 0: one pass over the training data
    seed: int = 0
    strategy: str = ""  # keras_transformer.distribute strategy name; "": the default
    jit_compile: typing.Union[str, bool] = "auto"
    steps_per_execution: int = 1
    verbose: int = 1  # Keras' progress bar (1), one line per epoch (2), silent (0)

    # Outputs and callbacks.
    output_dir: str = "saved_models"
    # A model directory that holds a finished run is refused unless this is true; then
    # the new run replaces it whole once it is complete (until then the earlier run
    # stays as it was). An interrupted run of the same trained settings resumes.
    overwrite: bool = False
    keep_checkpoints: int = 5  # the paper averages the last 5 checkpoints (6.1)
    # Optimizer updates between checkpoints (checkpoints/step_NNNNNNN.weights.h5); 0: one
    # per epoch (epoch_NNN.weights.h5). The paper's were 10 minutes apart, so with a few
    # long epochs the last keep_checkpoints span the last minutes, not half the run. Not
    # changed on resuming: the checkpoints of one run are named one way.
    checkpoint_every_steps: int = 0
    bleu_every_epochs: int = 1  # 0 disables the validation BLEU callback
    bleu_samples: int = 200
    sample_translations: int = 3  # sentences printed every bleu_every_epochs; 0: none
    # Early stopping (not in the paper, which trained a fixed number of steps): stop after
    # this many epochs without improvement of the monitor and keep the best epoch's
    # weights in model.keras; 0 trains every epoch. The monitor is "val_loss" or
    # "val_bleu" (the BLEU callback's, so bleu_every_epochs must be > 0).
    early_stopping_patience: int = 0
    early_stopping_monitor: str = "val_loss"
    early_stopping_min_delta: float = 0.0  # the least change that counts as an improvement

    # Evaluation after training (kt-demo, bench/multi30k.py): greedy, or the beam search below.
    eval_decode: str = "beam"
    # The run's beam search (section 6.1: beam 4, alpha 0.6), best chosen on the validation
    # split, never the test set. It is saved with the model (config.toml), and a
    # `Translator`, kt-translate, kt-evaluate and kt-export given the model directory use
    # it unless told otherwise, as a Hugging Face model's generation_config.json is used.
    eval_beam_size: int = BEAM_SIZE
    eval_length_penalty: float = LENGTH_PENALTY
    eval_batch_size: int = 128

    def __post_init__(self):
        for field in dataclasses.fields(self):
            if field.name != "jit_compile":
                checks.check_type(field.name, getattr(self, field.name), field.type)
        checks.check_choice("jit_compile", self.jit_compile, JIT_COMPILE_VALUES)
        object.__setattr__(self, "model", dict(self.model))
        object.__setattr__(self, "training", dict(self.training))
        checks.check_choice("corpus", self.corpus, CORPORA)
        checks.check_choice("tokenizer_model_type", self.tokenizer_model_type, TOKENIZER_MODEL_TYPES)
        checks.check_choice("eval_decode", self.eval_decode, DECODE_METHODS)
        checks.check_choice("verbose", self.verbose, (0, 1, 2))
        for name in ("epochs", "vocab_size", "steps_per_execution", "bleu_samples",
                     "eval_beam_size", "eval_batch_size", "tokens_per_batch"):
            checks.check_positive_int(name, getattr(self, name))
        for name in ("steps_per_epoch", "keep_checkpoints", "checkpoint_every_steps", "bleu_every_epochs",
                     "sample_translations", "max_train_pairs", "bucket_width",
                     "tokenizer_max_sentences", "demo_num_train"):
            checks.check_non_negative_int(name, getattr(self, name))
        checks.check_non_negative_number("max_train_seconds", self.max_train_seconds)
        for name in ("subword_sampling_source", "subword_sampling_target"):
            checks.check_rate(name, getattr(self, name))
        checks.check_non_negative_number("eval_length_penalty", self.eval_length_penalty)
        self._check_early_stopping()
        separators = [sep for sep in ("/", os.sep, os.altsep) if sep]
        if not self.name or self.name.startswith(".") or "\0" in self.name or any(
            sep in self.name for sep in separators
        ):
            # The model directory is output_dir/name: "..", "a/b" or "/abs" would write
            # elsewhere, and hidden names are the staging directories of runs.
            raise ValueError(
                "`name` must be a plain directory name: not empty, no path separator, not "
                f"starting with '.'. Received: name={self.name!r}"
            )
        if self.corpus in ("files", "tsv") and not self.data_dir:
            raise ValueError(f"`data_dir` is required when corpus={self.corpus!r}. Received: data_dir=''")
        if self.corpus == "tfds" and not self.tfds_name:
            raise ValueError("`tfds_name` is required when corpus='tfds'. Received: tfds_name=''")
        if "vocab_size" in self.model:
            raise ValueError(
                "Set the vocabulary size with the top-level `vocab_size` (the tokenizer's), "
                f"not in [model]. Received: model.vocab_size={self.model['vocab_size']!r}"
            )
        model_config = self.model_config()  # validates the preset and the [model] overrides now
        training = self.training_config()  # and the [training] table
        if training.decay != "rsqrt" and training.total_steps is None and not self.max_train_seconds:
            raise ValueError(
                f"[training] decay={training.decay!r} brings the learning rate to its floor at the "
                "end of the budget: set `[training] total_steps` (updates), or `max_train_seconds` "
                "(the updates that fit are then estimated from the measured step time). "
                f"Received: total_steps=None, max_train_seconds={self.max_train_seconds:g}"
            )
        # The pipeline's own check, now: make_dataset runs it only after the corpus is read.
        max_length = model_config.max_length
        check_batching_arguments(max_length, self.tokens_per_batch, self.bucket_boundaries(max_length))

    def _check_early_stopping(self):
        checks.check_non_negative_int("early_stopping_patience", self.early_stopping_patience)
        checks.check_choice("early_stopping_monitor", self.early_stopping_monitor, EARLY_STOPPING_MONITORS)
        checks.check_non_negative_number("early_stopping_min_delta", self.early_stopping_min_delta)
        if not self.early_stopping_patience:
            return
        if not self.validation_split:
            raise ValueError(
                "Early stopping watches the validation split: set `validation_split`, or "
                f"early_stopping_patience = 0. Received: early_stopping_patience="
                f"{self.early_stopping_patience}, validation_split=''"
            )
        if self.early_stopping_monitor == "val_bleu" and not self.bleu_every_epochs:
            raise ValueError(
                "early_stopping_monitor='val_bleu' reads the BLEU callback's score: set "
                "bleu_every_epochs > 0 (1 checks every epoch). Received: bleu_every_epochs=0"
            )

    # -------------------------------------------------------------- derived
    @property
    def model_dir(self):
        """Where the run writes everything: `output_dir/name`."""
        return os.path.join(self.output_dir, self.name)

    def search_settings(self):
        """The `Translator` arguments of the run's evaluation search, as `eval_decode` says.

        Example:
        >>> RunConfig(eval_beam_size=6, eval_length_penalty=1.0).search_settings()
        {'beam_size': 6, 'length_penalty': 1.0}
        >>> RunConfig(eval_decode="greedy").search_settings()
        {'beam_size': 1, 'length_penalty': 0.6}
        """
        beam_size = 1 if self.eval_decode == "greedy" else self.eval_beam_size
        return {"beam_size": beam_size, "length_penalty": float(self.eval_length_penalty)}

    def model_config(self, vocab_size=None):
        """The `TransformerConfig` of the run: preset, `[model]` overrides, vocabulary size.

        Args:
            vocab_size: int, the trained tokenizer's size; defaults to `self.vocab_size`.
        """
        try:
            return TransformerConfig.from_preset(
                self.preset, **self.model, vocab_size=vocab_size or self.vocab_size
            )
        except ValueError as error:
            raise ValueError(f"[model]: {error}") from None

    @property
    def estimates_total_steps(self):
        """Whether the run estimates `[training] total_steps` from `max_train_seconds`.

        True for a budgeted decay (`"cosine"`, `"linear"`, `"rsqrt_cooldown"`) without
        `total_steps`: `run_training` compiles the schedule with a provisional total and
        adds a `StepBudgetEstimator` that sets it from the measured step time.
        """
        training = self.training_config()
        return training.decay != "rsqrt" and training.total_steps is None and bool(self.max_train_seconds)

    def bucket_boundaries(self, max_length=None):
        """The padded lengths of the length buckets that `make_dataset` batches by.

        `bucket_width` N > 0 gives N, 2N, ... up to `max_length`; 0 gives the pipeline's
        default boundaries. The last is always `max_length`.

        Args:
            max_length: int, the model's; defaults to `model_config().max_length`.
        """
        max_length = max_length or self.model_config().max_length
        return evenly_spaced_boundaries(self.bucket_width, max_length) or default_bucket_boundaries(max_length)

    def trained_settings(self):
        """What this run trains, as `{key: value}`: a resumed run must agree on all of it.

        Every setting but `RESUMABLE_CHANGES`, with the `[model]` and `[training]` tables
        resolved to every field (`"model.d_model"`, `"training.warmup_steps"`), so a
        config that spells out a preset's default equals one that leaves it out.
        """
        values = {k: v for k, v in self.to_dict().items() if k not in _TABLES and k not in RESUMABLE_CHANGES}
        model = self.model_config().to_dict()
        del model["vocab_size"]  # the top-level vocab_size, compared above
        values.update({f"model.{k}": v for k, v in model.items()})
        values.update({f"training.{k}": v for k, v in self.training_config().to_dict().items()})
        return values

    def differences(self, other):
        """The trained settings where `other` differs: `[(key, self's value, other's)]`."""
        mine, theirs = self.trained_settings(), other.trained_settings()
        return [(key, mine.get(key), theirs.get(key)) for key in sorted(set(mine) | set(theirs))
                if mine.get(key) != theirs.get(key)]

    def training_config(self):
        """The `TrainingConfig` of the run: the paper's recipe with `[training]` overrides."""
        try:
            return TrainingConfig.from_dict(self.training)
        except ValueError as error:
            raise ValueError(f"[training]: {error}") from None

    # ---------------------------------------------------------------- reading
    def replace(self, **changes):
        """A copy with `changes` applied and validated; unknown names raise `ValueError`."""
        checks.check_known_keys("run config key", changes, RunConfig)
        return dataclasses.replace(self, **changes)

    def with_overrides(self, assignments):
        """A copy with `["key=value", "model.d_model=256", "training.warmup_steps=400"]` applied.

        Each value is parsed by the type of the field it sets: ints, floats, booleans
        (`true` / `false`), strings as written. `model.<field>` sets a `TransformerConfig`
        field in the `[model]` table, `training.<field>` a `TrainingConfig` field.
        """
        changes = {}
        tables = {name: dict(getattr(self, name)) for name in _TABLES}
        for assignment in assignments:
            if "=" not in assignment:
                raise ValueError(f"An override must look like key=value. Received: {assignment!r}")
            key, text = (part.strip() for part in assignment.split("=", 1))
            check_not_removed(key, text)
            table, _, field = key.rpartition(".")
            if table:
                if table not in _TABLES:
                    raise ValueError(f"Unknown table in {key!r}. Expected one of {sorted(_TABLES)}.")
                types_by_name = _field_types(_TABLES[table])
                if field not in types_by_name:
                    raise ValueError(
                        f"Unknown key {key!r}: {field!r} is not a {_TABLES[table].__name__} field. "
                        f"Expected one of: {sorted(types_by_name)}"
                    )
                tables[table][field] = parse_value(key, text, types_by_name[field])
            else:
                if key in _TABLES:
                    raise ValueError(f"Set {key} fields one by one: --set {key}.<field>=<value>.")
                checks.check_known_keys("run config key", {key: None}, RunConfig)
                changes[key] = parse_value(key, text, _field_types(RunConfig)[key])
        return self.replace(**changes, **tables)

    @classmethod
    def from_dict(cls, values):
        """Builds a config from a dict (TOML's), refusing unknown keys with `ValueError`.

        A key that 0.4 removed gets its own `ValueError`, saying so and why; at its 0.3
        default it is dropped with a warning (`keras_transformer.train.removed_keys`).
        """
        if not isinstance(values, dict):
            raise ValueError(f"Expected a table of run settings. Received: {type(values).__name__}")
        values = dict(values)
        for table in _TABLES:
            if table in values and not isinstance(values[table], dict):
                raise ValueError(f"`{table}` must be a table. Received: {table}={values[table]!r}")
            if table in values:
                values[table] = dict(values[table])  # drop_removed_keys changes it
        _move_legacy_model_keys(values)
        drop_removed_keys(values)
        checks.check_known_keys("run config key", values, RunConfig)
        return cls(**values)

    @classmethod
    def from_toml(cls, path, overrides=()):
        """Reads a TOML file (with `tomllib`) and applies `--set` style `overrides`.

        A file may build on another: `extends = "multi30k.toml"` (a path relative to the
        file) reads that one first, then this file's keys replace its keys, the `[model]`
        and `[training]` tables key by key. So a second direction of a recipe says only
        what differs, and a change to the recipe reaches both.
        """
        values = _read_toml_values(path)
        try:
            config = cls.from_dict(values)
        except ValueError as error:
            raise ValueError(f"{path}: {error}") from error
        return config.with_overrides(overrides)

    # ---------------------------------------------------------------- writing
    def to_dict(self):
        return dataclasses.asdict(self)

    def to_toml(self, model_config=None):
        """The run as TOML text that `from_toml` reads back to an equal config.

        With `model_config`, the `[model]` table holds every field of that resolved
        `TransformerConfig` (bar `vocab_size`, which is the top-level one), and the
        `[training]` table every field of the resolved `TrainingConfig`, so the file
        says exactly what was trained even if presets or defaults change later.
        """
        values = self.to_dict()
        tables = {name: dict(values.pop(name)) for name in _TABLES}
        if model_config is not None:
            tables["model"] = {k: v for k, v in model_config.to_dict().items() if k != "vocab_size"}
            tables["training"] = self.training_config().to_dict()
            values["vocab_size"] = model_config.vocab_size
        lines = [f"{key} = {_toml_value(value)}" for key, value in values.items()]
        for name, table in tables.items():
            lines += ["", f"[{name}]"]
            # TOML has no null: None (clipnorm, dtype_policy) is the default, so it is omitted.
            lines += [f"{k} = {_toml_value(v)}" for k, v in table.items() if v is not None]
        return "\n".join(lines) + "\n"


def _read_toml_values(path, extended_by=()):
    """The table of a TOML run config with its `extends` chain resolved (see `from_toml`)."""
    path = os.path.abspath(os.fspath(path))
    if path in extended_by:
        chain = " -> ".join(extended_by + (path,))
        raise ValueError(f"`extends` goes round in a circle: {chain}. Expected a chain that ends.")
    with open(path, "rb") as file:
        try:
            values = tomllib.load(file)
        except tomllib.TOMLDecodeError as error:
            raise ValueError(f"{path} is not valid TOML: {error}") from error
    if EXTENDS_KEY not in values:
        return values
    parent = values.pop(EXTENDS_KEY)
    if not isinstance(parent, str) or not parent:
        raise ValueError(
            f"{path}: `{EXTENDS_KEY}` must be the path of another run config, relative to this "
            f"file. Received: {EXTENDS_KEY}={parent!r}"
        )
    parent_path = os.path.join(os.path.dirname(path), parent)
    if not os.path.isfile(parent_path):
        raise FileNotFoundError(
            f"{path}: {EXTENDS_KEY}={parent!r} names {parent_path}, which is not a file. "
            "Expected a path relative to the file that extends it."
        )
    base = _read_toml_values(parent_path, extended_by + (path,))
    for table in _TABLES:
        if isinstance(base.get(table), dict) and isinstance(values.get(table), dict):
            values[table] = {**base[table], **values[table]}
    return {**base, **values}


def _field_types(cls):
    return {field.name: field.type for field in dataclasses.fields(cls)}


def _move_legacy_model_keys(values):
    """Reads a 0.1 run config, whose [model] table also held training and decoding keys.

    Training keys move to [training], `tokens_per_batch` to the top level; decoding keys
    (`beam_size`, `length_penalty`, `max_decode_extra`) are dropped: they are the
    Translator's arguments now. A `UserWarning` names what moved.
    """
    model = dict(values.get("model", {}))
    legacy = sorted(set(model) & LEGACY_FIELDS)
    if not legacy:
        return
    training = dict(values.get("training", {}))
    training_fields = _field_types(TrainingConfig)
    for key in legacy:
        value = model.pop(key)
        if key in training_fields:
            training.setdefault(key, value)
        elif key == "tokens_per_batch":
            values.setdefault("tokens_per_batch", value)
    values["model"], values["training"] = model, training
    warnings.warn(
        f"[model] holds {legacy}, which are not architecture settings (a 0.1 run config): "
        "training keys were read as [training], tokens_per_batch as a top-level key, and "
        "decoding keys were dropped (they are Translator arguments). Move them to silence this.",
        UserWarning,
        stacklevel=4,
    )


def parse_value(key, text, field_type):
    """Parses the text of `--set key=text` as `field_type` (int, float, bool, str, Optional).

    Raises:
        ValueError: naming the key, the text and the expected type.
    """
    origin = typing.get_origin(field_type)
    if origin in (typing.Union, types.UnionType):
        options = [t for t in typing.get_args(field_type) if t is not type(None)]
        if type(None) in typing.get_args(field_type) and text.lower() in ("none", "null", ""):
            return None
        for option in (bool, int, float, str):  # most specific first
            if option in options:
                try:
                    return parse_value(key, text, option)
                except ValueError:
                    continue
        raise ValueError(f"`{key}` got {text!r}, which is none of {options}.")
    if field_type is bool:
        lowered = text.lower()
        if lowered in ("true", "1", "yes", "on"):
            return True
        if lowered in ("false", "0", "no", "off"):
            return False
        raise ValueError(f"`{key}` must be true or false. Received: {text!r}")
    if field_type is int:
        try:
            return int(text.replace("_", ""))
        except ValueError:
            raise ValueError(f"`{key}` must be an integer. Received: {text!r}") from None
    if field_type is float:
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"`{key}` must be a number. Received: {text!r}") from None
    if field_type is str:
        # A quoted TOML string is unquoted, so `--set name="a b"` and `--set name=a` both work.
        if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
            return text[1:-1]
        return text
    raise ValueError(f"`{key}` cannot be set from the command line (type {field_type}).")


def _toml_value(value):
    """One TOML scalar. Written by hand because the standard library only reads TOML."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # JSON strings are TOML basic strings
    raise ValueError(f"Cannot write {value!r} (type {type(value).__name__}) as a TOML scalar.")


__all__ = ["RunConfig", "parse_value", "CORPORA", "RESUMABLE_CHANGES"]

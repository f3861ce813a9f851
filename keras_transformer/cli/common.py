"""What several `kt-*` commands share.

- `setup_environment()`: quiets TensorFlow's C++ logging. Each command's `main` calls it
  first; to take effect it must run before Keras is imported (Keras imports TensorFlow
  on its backend, and JAX, which sets its own default level), so the package's
  `__init__` calls it first where `is_command_process()`.
- `add_config_arguments` / `read_run_config`: `--config FILE` and `--set KEY=VALUE`
  (kt-train, kt-demo).
- `add_model_arguments` / `translator_source`: `--model-dir DIR` (repeatable), a model
  or an ensemble (kt-translate, kt-evaluate).
- `add_decoding_arguments` / `decoding_settings`: `--beam-size`, `--greedy`,
  `--length-penalty`, `--early-stopping`, `--max-extra` (kt-translate, kt-evaluate,
  kt-export), with the paper's defaults defined once in `inference.decoding`;
  `--batch-size` and sampling (`--sample`, `--temperature`, `--top-k`, `--top-p`,
  `--seed`) for the commands that translate in Python (kt-translate, kt-evaluate).
- `write_metrics`: scores as `MODEL_DIR/metrics.json` (kt-evaluate, kt-demo).
- `fail` / `COMMAND_ERRORS`: a missing file, a bad value or a corrupt model directory
  ends a command with one line, `kt-xxx: error: ...`, and exit status 2 (argparse's),
  never a traceback.

This module imports only the standard library at its top, so that the package can
import it before Keras.
"""

import contextlib
import json
import os
import re
import sys
import tempfile
import zipfile

# The commands, by their module in this package; `kt-<name>` runs `<module>.main`.
COMMANDS = (
    "train", "translate", "evaluate", "export", "visualize", "average_checkpoints", "demo", "import_marian",
)

# TensorFlow's C++ log level, read once when TensorFlow is loaded: 3 drops its INFO,
# WARNING and ERROR lines, among them the CUDA probes a machine without a GPU prints
# ("failed call to cuInit: ... (303)", "Unable to register cuDNN factory"), which are
# ERRORs and so survive level 2. Python exceptions and warnings are not affected.
TF_CPP_MIN_LOG_LEVEL = "3"

# A C++ log line's severity letter, in absl's format ("I0000 00:00:1795.1  123 port.cc:153] ")
# and in the older tsl one ("2025-09-17 14:44:05.157831: I external/.../cudart_stub.cc:32] ").
_LOG_LINE = re.compile(
    r"^(?:([IWE])\d{4} [\d:.]+\s+\d+ |\d{4}-\d\d-\d\d [\d:.]+: ([IWE]) )[^\s\]]+:\d+\] "
)
_ABSL_PREAMBLE = "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR"
_SEVERITY = {"I": 0, "W": 1, "E": 2}  # a level of N drops the severities below N

# What a command reports in one line instead of a traceback: missing or unreadable
# files (OSError), bad values and corrupt files (ValueError; the package names the
# file), a file holding the wrong kind of object (TypeError), and a damaged zip that a
# library let through (BadZipFile, which is none of these).
COMMAND_ERRORS = (OSError, ValueError, TypeError, zipfile.BadZipFile)
# kt-train and kt-demo: what run_training raises for bad input (a TypeError there is a bug).
TRAINING_ERRORS = (OSError, ValueError)


def is_command_process():
    """Whether this process runs a `kt-*` command.

    True for the console scripts (`.venv/bin/kt-translate`) and for
    `python -m training.translate` from a clone: what `sys.argv[0]` names.
    """
    argv = getattr(sys, "argv", None) or [""]
    program = os.path.normpath(str(argv[0]))
    stem = os.path.splitext(os.path.basename(program))[0]
    in_training = os.path.basename(os.path.dirname(program)) == "training"
    return stem.startswith("kt-") or (in_training and stem in COMMANDS)


def setup_environment():
    """Sets TensorFlow's C++ log level unless the user set one (their value wins).

    TensorFlow reads the variable when it loads, so this also imports TensorFlow (every
    command needs it, if only for the tokenizer), through `tensorflow_log_filter`:
    the lines its libraries log while loading, before they read the level ("All log
    messages before absl::InitializeLog() ...", "Could not find cuda drivers ...";
    tensorflow/tensorflow#100442), are dropped as the level says. Where TensorFlow is
    already imported, this only sets the variable, which then changes nothing; where
    JAX is, the variable holds the "1" JAX sets, so ERRORs such as the cuInit probe stay.
    """
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", TF_CPP_MIN_LOG_LEVEL)
    if "tensorflow" not in sys.modules:
        with tensorflow_log_filter():
            import tensorflow  # noqa: F401


@contextlib.contextmanager
def tensorflow_log_filter():
    """Drops the C++ log lines that `TF_CPP_MIN_LOG_LEVEL` says to drop from stderr.

    Everything written to file descriptor 2 inside the block (by C++ or Python) is held
    in a temporary file and written back when the block ends, whether it raised or not,
    minus the lines in TensorFlow's log format whose severity is below the level
    (1 drops INFO, 2 also WARNING, 3 also ERROR; FATAL is always kept). Any other line,
    a Python traceback or warning among them, is written back unchanged and in order.
    A level of 0 or unset, or no stderr to redirect, makes this a no-op.
    """
    level, saved = _log_level(), None
    if level > 0 and sys.stderr is not None:
        sys.stderr.flush()
        with contextlib.suppress(OSError):  # no file descriptor 2: nothing to filter
            saved = os.dup(2)
    if saved is None:
        yield
        return
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            lines = held.read().decode("utf-8", "replace").splitlines(keepends=True)
            sys.stderr.write("".join(line for line in lines if not _below_level(line, level)))
            sys.stderr.flush()


def _log_level():
    """`TF_CPP_MIN_LOG_LEVEL` as an int; 0 (drop nothing) when unset or not a number."""
    try:
        return int(os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0"))
    except ValueError:
        return 0


def _below_level(line, level):
    """Whether `line` is a TensorFlow C++ log line that `level` drops."""
    if line.rstrip("\r\n") == _ABSL_PREAMBLE:
        return _SEVERITY["W"] < level
    match = _LOG_LINE.match(line)
    return bool(match) and _SEVERITY[match.group(1) or match.group(2)] < level


# ------------------------------------------------------------------------ run config
def add_config_arguments(parser, *, default_config=None):
    """Adds `--config FILE` (required unless `default_config`) and `--set KEY=VALUE`."""
    if default_config is None:
        parser.add_argument("--config", required=True, help="TOML run config, e.g. training/configs/demo.toml")
    else:
        parser.add_argument("--config", default=default_config, help=f"TOML run config (default: {default_config})")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config value, e.g. --set epochs=3 --set model.d_model=256 "
        "--set training.warmup_steps=400 (repeatable)",
    )


def read_run_config(parser, args):
    """The `RunConfig` of `args.config` with `args.overrides`; a bad one ends the command (`fail`)."""
    from keras_transformer.train.run_config import RunConfig

    try:
        return RunConfig.from_toml(args.config, args.overrides)
    except (OSError, ValueError) as error:
        fail(parser, error)


def overrides_set(args, key):
    """Whether one of the `--set` overrides assigns `key` (e.g. "overwrite")."""
    return any(assignment.partition("=")[0].strip() == key for assignment in args.overrides)


def fail(parser, error):
    """Ends the command: `<prog>: error: <message>` on one line of stderr, exit status 2.

    Like `parser.error`, less the usage text, which is no help when the arguments were
    right and a file was not. A message over several lines is joined into one.
    """
    message = " ".join(str(error).split()) or type(error).__name__
    if isinstance(error, zipfile.BadZipFile):
        message = f"a corrupt zip archive (.keras file): {message}"
    parser.exit(2, f"{parser.prog}: error: {message}\n")


# ------------------------------------------------------------------------- decoding
def add_model_arguments(parser):
    """Adds `--model-dir DIR`, repeatable (kt-translate, kt-evaluate).

    Several directories (`--model-dir A --model-dir B`: repeated, so that sentences
    given as arguments after it are not read as directories) decode as an ensemble of
    their models (`keras_transformer.inference.ensemble`).
    """
    parser.add_argument(
        "--model-dir",
        required=True,
        action="append",
        metavar="DIR",
        help="directory with model.keras and tokenizer.model; repeated (directories trained with "
        "one tokenizer), an ensemble: their next-token probabilities averaged",
    )


def translator_source(args):
    """What `Translator` takes first, from `add_model_arguments`': a directory, or a list (an ensemble)."""
    return list(args.model_dir) if len(args.model_dir) > 1 else args.model_dir[0]


def add_decoding_arguments(parser, *, batch_size=True, sampling=None):
    """Adds the search arguments.

    `batch_size=False` leaves `--batch-size` out (kt-export). `sampling` (default: as
    `batch_size`) adds `--sample` and its settings, which a `Translator` takes and an
    export does not.
    """
    from keras_transformer.inference.decoding import BEAM_SIZE, LENGTH_PENALTY, MAX_DECODE_EXTRA

    if sampling is None:
        sampling = batch_size
    group = parser.add_argument_group("decoding (Vaswani et al., 2017, section 6.1)")
    search = group.add_mutually_exclusive_group()
    search.add_argument(
        "--beam-size",
        type=int,
        help=f"beams per sentence (default: the model directory's search, saved by its run; else {BEAM_SIZE})",
    )
    search.add_argument("--greedy", action="store_true", help="greedy search (the same as --beam-size 1)")
    if sampling:
        search.add_argument(
            "--sample", action="store_true", help="draw each next token at random (see --temperature, --top-k, --top-p, --seed)"
        )
        group.add_argument("--temperature", type=float, help="sampling: divide log-probabilities by this (default 1)")
        group.add_argument("--top-k", type=int, help="sampling: draw among the K most probable tokens (default: all)")
        group.add_argument("--top-p", type=float, help="sampling: draw from the nucleus of this probability mass (default 1)")
        group.add_argument("--seed", type=int, help="sampling: the seed, for outputs that repeat (default: random)")
    group.add_argument(
        "--length-penalty",
        type=float,
        help=f"alpha of the beam search length penalty (default: the model directory's; else {LENGTH_PENALTY})",
    )
    group.add_argument(
        "--early-stopping",
        action="store_true",
        help="beam search: stop a sentence once --beam-size hypotheses have finished after its most probable "
        "extension ended, as OpenNMT and CTranslate2 do (faster with a large --length-penalty; default: when "
        "no alive hypothesis can still win)",
    )
    group.add_argument(
        "--max-extra",
        type=int,
        default=MAX_DECODE_EXTRA,
        help=f"output tokens allowed beyond the source length (default {MAX_DECODE_EXTRA})",
    )
    if batch_size:
        from keras_transformer.inference.translator import BATCH_HYPOTHESES

        group.add_argument(
            "--batch-size",
            type=int,
            default=None,
            help=f"most sentences decoded together (default: {BATCH_HYPOTHESES} hypotheses, 8 sentences at beam 4)",
        )


def decoding_settings(args):
    """The `Translator` (or, without `--batch-size`, `export_saved_model`) keyword arguments.

    `--beam-size` and `--length-penalty` left out are the search saved in `--model-dir`
    (`keras_transformer.model.directory.resolve_search`), else the paper's. The sampling
    settings given on the command line are passed as they are, with or without
    `--sample`: the `Translator` refuses them for a search, naming them.
    """
    from keras_transformer.model.directory import resolve_search

    beam_size, length_penalty = resolve_search(
        getattr(args, "model_dir", None), 1 if args.greedy else args.beam_size, args.length_penalty
    )
    settings = {"beam_size": beam_size, "length_penalty": length_penalty, "max_extra": args.max_extra}
    if args.early_stopping:
        settings["early_stopping"] = True
    if hasattr(args, "batch_size"):
        settings["batch_size"] = args.batch_size
    if getattr(args, "sample", False):
        settings["decoding"] = "sample"
    for name in ("temperature", "top_k", "top_p", "seed"):
        if getattr(args, name, None) is not None:
            settings[name] = getattr(args, name)
    return settings


# -------------------------------------------------------------------------- metrics
def write_metrics(model_dir, metrics):
    """Writes `metrics` (a dict of numbers) as `model_dir/metrics.json`; returns the path.

    Written atomically: a reader sees the previous file or the new one, never half.
    """
    from keras_transformer.atomic import write_bytes_atomically
    from keras_transformer.model.directory import METRICS_FILE

    text = json.dumps(metrics, indent=2, sort_keys=True) + "\n"
    return write_bytes_atomically(os.path.join(os.fspath(model_dir), METRICS_FILE), text.encode("utf-8"))


__all__ = [
    "COMMANDS",
    "is_command_process",
    "setup_environment",
    "tensorflow_log_filter",
    "add_config_arguments",
    "read_run_config",
    "overrides_set",
    "add_decoding_arguments",
    "decoding_settings",
    "write_metrics",
    "fail",
    "COMMAND_ERRORS",
    "TRAINING_ERRORS",
]

"""The `kt-*` commands: installed, documented, quiet, and doing what they say.

Each command is a `main(argv)` in `keras_transformer.cli`; most tests call it in-process.
Two run as a user would, in a subprocess: the `kt-translate` console script and
`python -m training.translate` from a clone. The model is tiny_reliability's tiny
model directory, decoded greedily (the cheapest search to compile).
"""

import importlib
import importlib.metadata
import os
import shutil
import subprocess
import sys

import pytest
from conftest import once_on
from tiny_reliability import greedy_translator, tiny_dir  # noqa: F401  (session fixtures)
from tiny_translation import pick_sentences

import keras_transformer as kt
from keras_transformer.cli import common
from keras_transformer.model.directory import load_model_and_tokenizer

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV_BIN = os.path.dirname(sys.executable)
DISTRIBUTION = "keras-transformer"
COMMANDS = {  # console script -> module of keras_transformer.cli
    "kt-train": "train",
    "kt-translate": "translate",
    "kt-evaluate": "evaluate",
    "kt-export": "export",
    "kt-visualize": "visualize",
    "kt-average-checkpoints": "average_checkpoints",
    "kt-demo": "demo",
    "kt-import-marian": "import_marian",
}


def _environment_without_log_level():
    """The test environment, less conftest's TF_CPP_MIN_LOG_LEVEL: what a user's shell has."""
    return {key: value for key, value in os.environ.items() if key != "TF_CPP_MIN_LOG_LEVEL"}


def _installed_distributions():
    """The installed `keras-transformer` (its dist-info has a RECORD).

    An in-tree egg-info, on sys.path when the tests run from the clone, lists the
    sdist's files instead, which include training/ for `python -m training.<command>`.
    """
    return [
        distribution
        for distribution in importlib.metadata.distributions(name=DISTRIBUTION)
        if distribution.read_text("RECORD") is not None
    ]


def _package_quiets_commands():
    """Whether `keras_transformer/__init__.py` sets the commands' environment before Keras."""
    with open(os.path.join(REPO_ROOT, "keras_transformer", "__init__.py"), encoding="utf-8") as file:
        return "is_command_process" in file.read()


# ------------------------------------------------------------------ installation
def test_each_command_is_a_console_script_of_the_distribution():
    (distribution,) = _installed_distributions()
    entry_points = {
        entry.name: entry.value for entry in distribution.entry_points if entry.group == "console_scripts"
    }
    assert entry_points == {name: f"keras_transformer.cli.{module}:main" for name, module in COMMANDS.items()}
    assert set(common.COMMANDS) == set(COMMANDS.values())
    for name in COMMANDS:
        assert shutil.which(name, path=VENV_BIN), f"{name} is not installed in {VENV_BIN}"


def test_the_distribution_ships_no_top_level_training_package():
    installed = _installed_distributions()
    assert installed, f"{DISTRIBUTION} is not installed"
    for distribution in installed:
        assert distribution.read_text("top_level.txt").split() == ["keras_transformer"]
        shipped = [str(path) for path in distribution.files]
        assert not [path for path in shipped if path.split("/")[0] == "training"]


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_of_each_command_names_its_console_script(name, capsys):
    module = importlib.import_module(f"keras_transformer.cli.{COMMANDS[name]}")
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--help"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.startswith(f"usage: {name} ")


def test_console_script_and_clone_entry_point_show_help_quietly():
    # Both at once: each subprocess spends its few seconds importing TensorFlow.
    runs = {
        "kt-translate": [shutil.which("kt-translate", path=VENV_BIN), "--help"],
        "python -m training.translate": [sys.executable, "-m", "training.translate", "--help"],
    }
    processes = {
        label: subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            env=_environment_without_log_level(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for label, command in runs.items()
    }
    for label, process in processes.items():
        stdout, stderr = process.communicate(timeout=120)
        assert process.returncode == 0, f"{label}: {stderr[-2000:]}"
        assert stdout.startswith("usage: kt-translate "), label
        assert "--beam-size" in stdout and "--greedy" in stdout and "--max-extra" in stdout
        if _package_quiets_commands():
            assert stderr == "", f"{label} wrote to stderr:\n{stderr}"


# ------------------------------------------------------------------ environment
def test_tensorflow_log_filter_drops_only_log_lines_below_the_level(capfd, monkeypatch):
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "2")
    lines = [
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        "I0000 00:00:1795406589.589705   14564 cudart_stub.cc:31] Could not find cuda drivers",
        "2025-09-17 14:44:05.157831: W external/local_xla/xla/tsl/cuda/cudart_stub.cc:32] old format",
        "E0000 00:00:1795406244.828735   10428 cuda_platform.cc:52] failed call to cuInit",
        "F0000 00:00:1795406244.828735   10428 fatal.cc:1] a fatal line is always kept",
        "Traceback (most recent call last): a Python line is kept",
    ]
    capfd.readouterr()
    with pytest.raises(RuntimeError, match="raised inside"):
        with common.tensorflow_log_filter():
            os.write(2, ("\n".join(lines) + "\n").encode())
            raise RuntimeError("raised inside")
    assert capfd.readouterr().err.splitlines() == lines[3:]  # level 2 keeps ERROR and up


def test_a_log_level_the_user_set_wins(monkeypatch):
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
    common.setup_environment()
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "0"
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL")
    common.setup_environment()
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == common.TF_CPP_MIN_LOG_LEVEL


@pytest.mark.parametrize(
    "program, expected",
    [
        ("/home/me/.venv/bin/kt-translate", True),
        ("/home/me/clone/training/translate.py", True),
        ("/home/me/clone/training/notes.py", False),
        ("/usr/bin/pytest", False),
        ("-c", False),
    ],
)
def test_a_command_process_is_told_by_the_program_it_runs(program, expected, monkeypatch):
    monkeypatch.setattr(sys, "argv", [program])
    assert common.is_command_process() is expected


# ------------------------------------------------------------------- arguments
def test_decoding_arguments_give_translator_settings():
    import argparse

    parser = argparse.ArgumentParser()
    common.add_decoding_arguments(parser)
    defaults = common.decoding_settings(parser.parse_args([]))
    assert defaults == {"beam_size": 4, "length_penalty": 0.6, "max_extra": 50, "batch_size": None}  # None: 32 hypotheses
    greedy = common.decoding_settings(parser.parse_args(["--greedy", "--max-extra", "3", "--batch-size", "8"]))
    assert greedy == {"beam_size": 1, "length_penalty": 0.6, "max_extra": 3, "batch_size": 8}
    with pytest.raises(SystemExit):  # one search or the other
        parser.parse_args(["--greedy", "--beam-size", "2"])
    # Only given, so CTranslate2Translator (whose only rule it is) takes the same settings.
    early = common.decoding_settings(parser.parse_args(["--early-stopping"]))
    assert early == {**defaults, "early_stopping": True}
    export_parser = argparse.ArgumentParser()
    common.add_decoding_arguments(export_parser, batch_size=False)
    assert "batch_size" not in common.decoding_settings(export_parser.parse_args([]))
    assert common.decoding_settings(export_parser.parse_args(["--early-stopping"]))["early_stopping"] is True


def test_sampling_arguments_give_translator_settings_and_only_where_a_translator_runs():
    import argparse

    parser = argparse.ArgumentParser()
    common.add_decoding_arguments(parser)
    argv = ["--sample", "--temperature", "0.7", "--top-k", "5", "--top-p", "0.9", "--seed", "3"]
    assert common.decoding_settings(parser.parse_args(argv)) == {
        "beam_size": 4, "length_penalty": 0.6, "max_extra": 50, "batch_size": None,
        "decoding": "sample", "temperature": 0.7, "top_k": 5, "top_p": 0.9, "seed": 3,
    }
    # A sampling setting without --sample is passed on, for the Translator to refuse by name.
    assert common.decoding_settings(parser.parse_args(["--temperature", "0.5"]))["temperature"] == 0.5
    with pytest.raises(SystemExit):  # one search or the other
        parser.parse_args(["--sample", "--greedy"])
    export_parser = argparse.ArgumentParser()
    common.add_decoding_arguments(export_parser, batch_size=False)  # kt-export: no sampling
    with pytest.raises(SystemExit):
        export_parser.parse_args(["--sample"])


def test_overrides_set_reads_keys_of_set_arguments():
    import argparse

    args = argparse.Namespace(overrides=["epochs=2", " overwrite = false", "model.d_model=8"])
    assert common.overrides_set(args, "overwrite")
    assert common.overrides_set(args, "model.d_model")
    assert not common.overrides_set(args, "name")


def test_metrics_are_written_as_sorted_json(tmp_path):
    path = common.write_metrics(tmp_path, {"chrf": 50.0, "bleu": 12.5})
    assert path == os.path.join(str(tmp_path), "metrics.json")
    assert open(path, encoding="utf-8").read() == '{\n  "bleu": 12.5,\n  "chrf": 50.0\n}\n'


# ------------------------------------------------------------------ real runs
# What kt-translate prints is Python; the translations are the translator's, tested on every backend.
PRINTING = once_on("torch", "kt-translate's lines are formatted in Python, the same on every backend")


@PRINTING
def test_translate_prints_one_line_per_input_line(tiny_dir, greedy_translator, tmp_path, capsys):
    from keras_transformer.cli.translate import main

    sentences = pick_sentences(greedy_translator.tokenizer, count=4)
    lines = sentences[:2] + [""] + sentences[2:]
    source = tmp_path / "source.txt"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert main(["--model-dir", str(tiny_dir), "--greedy", "--input", str(source)]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed == greedy_translator.translate(lines)
    assert len(printed) == len(lines) and printed[2] == ""


@PRINTING
def test_translate_prints_n_best_lists_in_moses_format_from_prefixes(tiny_dir, greedy_translator, tmp_path, capsys):
    from keras_transformer.cli.translate import main

    sentences = pick_sentences(greedy_translator.tokenizer, count=2)
    prefixes = tmp_path / "prefixes.txt"
    prefixes.write_text("cats\n\n", encoding="utf-8")
    argv = ["--model-dir", str(tiny_dir), "--greedy", "--n-best", "1", "--prefixes", str(prefixes), *sentences]
    assert main(argv) == 0
    expected = greedy_translator.translate(sentences, prefixes=["cats", ""], n_best=1)
    assert capsys.readouterr().out.splitlines() == [
        f"{index} ||| {text} ||| {score:.4f}" for index, ((text, score),) in enumerate(expected)
    ]
    assert expected[0][0].text.startswith("cats")
    # More hypotheses than the search keeps: one line naming both, exit status 2.
    with pytest.raises(SystemExit) as stop:
        main(["--model-dir", str(tiny_dir), "--greedy", "--n-best", "2", *sentences])
    error = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and error.startswith("kt-translate: error: nothing was translated: `n_best`")
    assert "n_best=2, beam_size=1" in error


def test_translate_reports_a_missing_model_directory_as_a_usage_error(tmp_path, capsys):
    from keras_transformer.cli.translate import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--model-dir", str(tmp_path / "nowhere"), "a sentence"])
    assert exit_info.value.code == 2
    assert "No model.keras in the model directory" in capsys.readouterr().err


def test_averaged_model_directory_translates_like_its_checkpoints(tiny_dir, greedy_translator, tmp_path):
    from keras_transformer.cli.average_checkpoints import main

    run = tmp_path / "run"
    os.makedirs(run / "checkpoints")
    for name in ("model.keras", "tokenizer.model"):
        shutil.copy(tiny_dir / name, run / name)
    model, _ = load_model_and_tokenizer(run)
    for epoch in (1, 2):  # the same weights twice: their mean is those weights
        model.save_weights(str(run / "checkpoints" / f"epoch_{epoch:03d}.weights.h5"))
    assert main(["--model-dir", str(run), "--last", "2"]) == 0
    averaged = tmp_path / "run_averaged"
    translator = kt.Translator(averaged, beam_size=1, batch_size=4, jit_compile=False)
    sentences = pick_sentences(greedy_translator.tokenizer, count=4)
    assert translator.translate(sentences) == greedy_translator.translate(sentences)
    with pytest.raises(SystemExit) as exit_info:  # an existing directory needs --overwrite
        main(["--model-dir", str(run), "--last", "2"])
    assert exit_info.value.code == 2
    assert main(["--model-dir", str(run), "--last", "1", "--overwrite"]) == 0


# ------------------------------------------------------------------ errors: one line each
def _one_error_line(capsys, prog):
    """The command's stderr: exactly one line, `prog: error: ...`, and no traceback."""
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"{prog}: error: "), lines
    return lines[0]


def _damaged_model_dir(tiny_dir, directory):
    shutil.copytree(tiny_dir, directory)
    data = (directory / "model.keras").read_bytes()
    (directory / "model.keras").write_bytes(data[: len(data) // 2])  # a copy cut short
    os.makedirs(directory / "checkpoints")
    shutil.copy(tiny_dir / "model.keras", directory / "checkpoints" / "epoch_001.weights.h5")
    return directory


@pytest.mark.parametrize("command", ["evaluate", "export", "visualize", "average_checkpoints"])
def test_each_command_names_a_truncated_model_in_one_line(command, tiny_dir, tmp_path, capsys):
    import keras

    if command == "export" and keras.backend.backend() != "tensorflow":
        pytest.skip("kt-export runs itself again in a TensorFlow process here; the TensorFlow session checks it")
    module = importlib.import_module(f"keras_transformer.cli.{command}")
    model_dir = str(_damaged_model_dir(tiny_dir, tmp_path / "model"))
    (tmp_path / "source.txt").write_text("cats see cars\n")
    argv = {
        "evaluate": ["--source", str(tmp_path / "source.txt"), "--reference", str(tmp_path / "source.txt")],
        "export": ["--base-dir", str(tmp_path / "exports")],
        "visualize": ["--source", "cats see cars", "--output", str(tmp_path / "a.png")],
        "average_checkpoints": ["--last", "1"],
    }[command]
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--model-dir", model_dir, *argv])
    assert exit_info.value.code == 2
    line = _one_error_line(capsys, "kt-" + command.replace("_", "-"))
    assert "model.keras is corrupt or truncated" in line
    assert not os.path.exists(tmp_path / "exports") and not os.path.exists(tmp_path / "model_averaged")


@pytest.mark.parametrize("command", ["evaluate", "visualize", "average_checkpoints"])
def test_each_command_names_a_missing_model_directory_in_one_line(command, tmp_path, capsys):
    module = importlib.import_module(f"keras_transformer.cli.{command}")
    (tmp_path / "source.txt").write_text("cats see cars\n")
    argv = {
        "evaluate": ["--source", str(tmp_path / "source.txt"), "--reference", str(tmp_path / "source.txt")],
        "visualize": ["--source", "cats see cars"],
        "average_checkpoints": [],
    }[command]
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--model-dir", str(tmp_path / "nowhere"), *argv])
    assert exit_info.value.code == 2
    assert "No model.keras in the model directory" in _one_error_line(capsys, "kt-" + command.replace("_", "-"))


def test_train_refuses_a_bad_name_and_a_finished_run_in_one_line(tmp_path, capsys):
    from keras_transformer.cli.train import main

    config = os.path.join(REPO_ROOT, "training", "configs", "demo.toml")
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", config, "--set", f"output_dir={tmp_path}", "--set", "name=.."])
    assert exit_info.value.code == 2
    assert "`name` must be a plain directory name" in _one_error_line(capsys, "kt-train")
    (tmp_path / "demo").mkdir()
    (tmp_path / "demo" / "model.keras").write_text("a finished run")
    with pytest.raises(SystemExit) as exit_info:
        main(["--config", config, "--set", f"output_dir={tmp_path}", "--set", "overwrite=false"])
    assert exit_info.value.code == 2
    assert "already holds a finished run (model.keras)" in _one_error_line(capsys, "kt-train")
    assert os.listdir(tmp_path) == ["demo"] and os.listdir(tmp_path / "demo") == ["model.keras"]

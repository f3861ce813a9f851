"""A run's beam search travels with its model directory.

`eval_beam_size` and `eval_length_penalty` of a `RunConfig` (chosen on the validation
split) are saved in the directory's `config.toml`; a `Translator`, `export_saved_model`
and the `kt-*` commands given the directory use them unless told otherwise, and a
model object (which saves no search) gets the paper's beam 4, alpha 0.6.
"""

import argparse
import os
import shutil

import keras
import pytest
from tiny_translation import MAX_EXTRA, model_dir  # noqa: F401  (session fixture)

from keras_transformer.cli import common
from keras_transformer.inference.translator import Translator
from keras_transformer.model.directory import (
    CONFIG_FILE,
    read_search_settings,
    resolve_search,
    write_search_settings,
)
from keras_transformer.train.run_config import RunConfig

ON_TENSORFLOW = keras.backend.backend() == "tensorflow"


@pytest.fixture
def searched_dir(model_dir, tmp_path):  # noqa: F811
    """A copy of the tiny model directory whose run chose beam 3, alpha 1.5."""
    directory = tmp_path / "searched"
    shutil.copytree(model_dir, directory)
    config = RunConfig(eval_beam_size=3, eval_length_penalty=1.5)
    (directory / CONFIG_FILE).write_text(config.to_toml())
    return directory


def test_the_run_config_saves_its_search_in_config_toml(tmp_path):
    config = RunConfig(eval_beam_size=6, eval_length_penalty=1.0)
    (tmp_path / CONFIG_FILE).write_text(config.to_toml())
    assert read_search_settings(tmp_path) == {"beam_size": 6, "length_penalty": 1.0}
    assert RunConfig.from_toml(tmp_path / CONFIG_FILE) == config
    # Without a config.toml (an import, a directory made by hand) nothing is saved.
    assert read_search_settings(tmp_path / "elsewhere") == {}


def test_the_evaluation_search_follows_eval_decode():
    config = RunConfig(eval_beam_size=6, eval_length_penalty=1.4)
    assert config.search_settings() == {"beam_size": 6, "length_penalty": 1.4}
    assert config.replace(eval_decode="greedy").search_settings() == {"beam_size": 1, "length_penalty": 1.4}
    assert RunConfig().search_settings() == {"beam_size": 4, "length_penalty": 0.6}  # the paper's


def test_bad_search_values_are_refused_naming_them(tmp_path):
    with pytest.raises(ValueError, match=r"`eval_beam_size` must be a positive integer. Received: eval_beam_size=0"):
        RunConfig(eval_beam_size=0)
    with pytest.raises(ValueError, match=r"`eval_length_penalty` must be a finite number >= 0.*=-0.5"):
        RunConfig(eval_length_penalty=-0.5)
    path = tmp_path / CONFIG_FILE
    path.write_text('eval_beam_size = "six"\n')
    with pytest.raises(ValueError, match=r"config.toml: `eval_beam_size` must be a positive integer.*'six'"):
        read_search_settings(tmp_path)
    path.write_text("eval_beam_size = [\n")
    with pytest.raises(ValueError, match=r"config.toml is not valid TOML"):
        read_search_settings(tmp_path)


def test_a_search_chosen_after_training_is_written_keeping_the_rest(tmp_path):
    config = RunConfig(name="run", eval_batch_size=32, model={"d_model": 64, "num_heads": 2})
    path = tmp_path / CONFIG_FILE
    path.write_text("# chosen by hand\n" + config.to_toml())
    assert write_search_settings(tmp_path, 5, 1.2) == str(path)
    again = RunConfig.from_toml(path)
    assert again == config.replace(eval_beam_size=5, eval_length_penalty=1.2)
    assert path.read_text().startswith("# chosen by hand\n")
    assert path.read_text().count("eval_beam_size") == 1
    # A file without the keys gets them among its top-level keys, before its tables.
    path.write_text('name = "run"\n\n[model]\nd_model = 64\nnum_heads = 2\n')
    write_search_settings(tmp_path, 2, 0.0)
    assert path.read_text() == (
        'name = "run"\neval_beam_size = 2\neval_length_penalty = 0.0\n\n[model]\nd_model = 64\nnum_heads = 2\n'
    )
    assert read_search_settings(tmp_path) == {"beam_size": 2, "length_penalty": 0.0}
    with pytest.raises(ValueError, match=r"`beam_size` must be a positive integer. Received: beam_size=0"):
        write_search_settings(tmp_path, 0, 1.0)
    with pytest.raises(FileNotFoundError, match=r"No config.toml in the model directory"):
        write_search_settings(tmp_path / "elsewhere", 4, 0.6)


def test_given_settings_win_over_the_saved_search(searched_dir):
    assert resolve_search(searched_dir) == (3, 1.5)
    assert resolve_search(str(searched_dir), beam_size=5) == (5, 1.5)
    assert resolve_search(searched_dir, length_penalty=0.0) == (3, 0.0)
    assert resolve_search(object()) == (4, 0.6)  # a model object saves no search: the paper's


def test_a_translator_of_the_directory_decodes_with_its_saved_search(searched_dir):
    translator = Translator(searched_dir, max_extra=MAX_EXTRA, jit_compile=False)
    assert (translator.decoding, translator.beam_size, translator.length_penalty) == ("beam", 3, 1.5)
    same = Translator(
        translator.model, translator.tokenizer, beam_size=3, length_penalty=1.5, max_extra=MAX_EXTRA,
        jit_compile=False,
    )
    sentences = ["cats see houses", "dogs like bread"]
    assert translator.translate(sentences, n_best=3) == same.translate(sentences, n_best=3)
    # A model object has no directory: the paper's search.
    paper = Translator(translator.model, translator.tokenizer, max_extra=MAX_EXTRA, jit_compile=False)
    assert (paper.beam_size, paper.length_penalty) == (4, 0.6)
    greedy = Translator(searched_dir, beam_size=1, max_extra=MAX_EXTRA, jit_compile=False)
    assert (greedy.decoding, greedy.beam_size, greedy.length_penalty) == ("greedy", 1, 1.5)


def test_commands_default_to_the_saved_search_and_flags_win(searched_dir):
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-dir")
    common.add_decoding_arguments(parser)

    def settings(*argv):
        chosen = common.decoding_settings(parser.parse_args(["--model-dir", str(searched_dir), *argv]))
        return chosen["beam_size"], chosen["length_penalty"]

    assert settings() == (3, 1.5)
    assert settings("--beam-size", "6") == (6, 1.5)
    assert settings("--length-penalty", "0.6") == (3, 0.6)
    assert settings("--greedy") == (1, 1.5)
    os.remove(searched_dir / CONFIG_FILE)
    assert settings() == (4, 0.6)


def test_translate_command_uses_the_saved_search(searched_dir, capsys):
    from keras_transformer.cli.translate import main

    # More hypotheses than the search keeps: refused before decoding, naming the beam of 3.
    with pytest.raises(SystemExit) as stop:
        main(["--model-dir", str(searched_dir), "--n-best", "4", "cats see houses"])
    error = capsys.readouterr().err
    assert stop.value.code == 2 and "n_best=4, beam_size=3" in error


def test_export_uses_the_saved_search(searched_dir, tmp_path):
    if not ON_TENSORFLOW:
        pytest.skip("SavedModel export needs the TensorFlow backend")
    from keras_transformer.inference import export

    # Refused before anything is traced, naming the directory's beam of 3.
    with pytest.raises(ValueError, match=r"Received: n_best=4, beam_size=3"):
        export.export_saved_model(searched_dir, base_dir=str(tmp_path / "served"), n_best=4)
    assert not (tmp_path / "served").exists()

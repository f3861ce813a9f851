"""Tests of RunConfig: TOML parsing, --set overrides by type, unknown keys, round trip."""

import os
import subprocess
import sys

import keras
import pytest

from keras_transformer.train.run_config import RunConfig

CONFIG_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "training", "configs")

TOML = """
name = "toy"
preset = "tiny"
corpus = "files"
data_dir = "data"
source_lang = "de"
target_lang = "en"
vocab_size = 500
epochs = 3
max_train_seconds = 120

[model]
d_model = 32
num_heads = 2
dropout = 0.0
"""


@pytest.fixture
def toml_path(tmp_path):
    path = tmp_path / "toy.toml"
    path.write_text(TOML)
    return path


def test_from_toml_reads_run_and_model_fields(toml_path):
    config = RunConfig.from_toml(toml_path)
    assert (config.name, config.corpus, config.data_dir) == ("toy", "files", "data")
    assert (config.source_lang, config.target_lang, config.epochs) == ("de", "en", 3)
    assert config.max_train_seconds == 120
    model = config.model_config()
    assert (model.d_model, model.num_heads, model.dropout, model.vocab_size) == (32, 2, 0.0, 500)
    assert model.d_ff == 256  # from the tiny preset
    assert config.model_dir == os.path.join("saved_models", "toy")


def test_set_overrides_are_parsed_by_field_type(toml_path):
    config = RunConfig.from_toml(
        toml_path,
        [
            "epochs=7",
            "max_train_seconds=1.5",
            "tokenizer_split_digits=true",
            "name=other",
            "data_dir=\"a b\"",
            "jit_compile=false",
            "model.d_model=64",
            "training.clipnorm=1.0",
            "training.warmup_steps=40",
            "model.share_embeddings=no",
        ],
    )
    assert config.epochs == 7 and isinstance(config.epochs, int)
    assert config.max_train_seconds == 1.5
    assert config.tokenizer_split_digits is True
    assert (config.name, config.data_dir) == ("other", "a b")
    assert config.jit_compile is False
    model, training = config.model_config(), config.training_config()
    assert (model.d_model, model.share_embeddings) == (64, False)
    assert (training.clipnorm, training.warmup_steps) == (1.0, 40)
    assert training.adam_beta_2 == 0.98  # untouched fields keep the paper's defaults
    assert model.num_heads == 2  # untouched fields of [model] stay
    assert RunConfig.from_toml(toml_path, ["jit_compile=auto"]).jit_compile == "auto"
    assert RunConfig.from_toml(toml_path, ["training.clipnorm=none"]).training_config().clipnorm is None


def test_training_table_and_model_table_hold_their_own_fields(toml_path, tmp_path):
    path = tmp_path / "recipe.toml"
    path.write_text(TOML + "\n[training]\nwarmup_steps = 400\nlabel_smoothing = 0.2\n")
    config = RunConfig.from_toml(path)
    assert (config.training_config().warmup_steps, config.training_config().label_smoothing) == (400, 0.2)
    assert "warmup_steps" not in config.model_config().to_dict()
    with pytest.raises(ValueError, match="Unknown key 'training.d_model': 'd_model' is not a TrainingConfig field"):
        RunConfig.from_toml(path, ["training.d_model=3"])
    path.write_text(TOML + "\n[training]\nd_model = 3\n")
    with pytest.raises(ValueError, match=r"recipe.toml: \[training\]: Unknown TrainingConfig field\(s\): \['d_model'\]"):
        RunConfig.from_toml(path)
    with pytest.raises(ValueError, match=r"\['warmup_steps'\] are not architecture settings"):
        RunConfig(model={"warmup_steps": 4})
    with pytest.raises(ValueError, match="Unknown table in 'optimizer.lr'"):
        RunConfig.from_toml(toml_path, ["optimizer.lr=3"])


def test_a_0_1_run_config_with_training_keys_in_model_still_reads(tmp_path):
    path = tmp_path / "old.toml"
    path.write_text(TOML + "warmup_steps = 300\ntokens_per_batch = 1024\nbeam_size = 4\n")
    with pytest.warns(UserWarning, match=r"\[model\] holds \['beam_size', 'tokens_per_batch', 'warmup_steps'\]"):
        config = RunConfig.from_toml(path)
    assert config.training_config().warmup_steps == 300
    assert config.tokens_per_batch == 1024
    assert config.model_config().d_model == 32


def test_unknown_keys_are_errors_naming_the_key(toml_path, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(TOML.replace("epochs = 3", "epoch = 3"))
    with pytest.raises(ValueError, match=r"bad.toml: Unknown run config key\(s\): \['epoch'\]"):
        RunConfig.from_toml(bad)
    bad.write_text(TOML + "d_modle = 3\n")  # lands in [model]
    with pytest.raises(ValueError, match=r"Unknown TransformerConfig field\(s\): \['d_modle'\]"):
        RunConfig.from_toml(bad)
    with pytest.raises(ValueError, match=r"Unknown run config key\(s\): \['epoch'\]"):
        RunConfig.from_toml(toml_path, ["epoch=3"])
    with pytest.raises(ValueError, match="Unknown key 'model.width'"):
        RunConfig.from_toml(toml_path, ["model.width=3"])


def test_bad_values_are_errors_naming_the_field(toml_path):
    with pytest.raises(ValueError, match="`epochs` must be an integer. Received: 'three'"):
        RunConfig.from_toml(toml_path, ["epochs=three"])
    with pytest.raises(ValueError, match="`tokenizer_split_digits` must be true or false. Received: 'maybe'"):
        RunConfig.from_toml(toml_path, ["tokenizer_split_digits=maybe"])
    with pytest.raises(ValueError, match="must look like key=value. Received: 'epochs'"):
        RunConfig.from_toml(toml_path, ["epochs"])
    with pytest.raises(ValueError, match="`corpus` must be one of .*Received: corpus='web'"):
        RunConfig.from_toml(toml_path, ["corpus=web"])
    with pytest.raises(ValueError, match="`epochs` must be a positive integer. Received: epochs=0"):
        RunConfig.from_toml(toml_path, ["epochs=0"])
    with pytest.raises(ValueError, match="`d_model` must be divisible by `num_heads`"):
        RunConfig.from_toml(toml_path, ["model.d_model=33"])
    with pytest.raises(ValueError, match="top-level `vocab_size`.*model.vocab_size=100"):
        RunConfig(model={"vocab_size": 100})
    with pytest.raises(ValueError, match="`data_dir` is required when corpus='files'"):
        RunConfig(corpus="files")
    with pytest.raises(ValueError, match="`epochs` must be of type int. Received: epochs=2.5"):
        RunConfig(epochs=2.5)
    message = "`checkpoint_every_steps` must be an integer >= 0. Received: checkpoint_every_steps=-1"
    with pytest.raises(ValueError, match=message):
        RunConfig.from_toml(toml_path, ["checkpoint_every_steps=-1"])


def test_to_toml_round_trips_with_the_resolved_model(toml_path, tmp_path):
    config = RunConfig.from_toml(toml_path, ["training.clipnorm=2.0"])
    written = tmp_path / "config.toml"
    written.write_text(config.to_toml(config.model_config()))
    again = RunConfig.from_toml(written)
    assert again.model_config() == config.model_config()
    assert again.training_config() == config.training_config()
    tables = ("model", "training")
    assert {k: v for k, v in again.to_dict().items() if k not in tables} == {
        k: v for k, v in config.to_dict().items() if k not in tables
    }
    # Without a resolved config, [model] holds just the overrides.
    written.write_text(config.to_toml())
    assert RunConfig.from_toml(written) == config


@pytest.mark.parametrize("name", ["demo", "multi30k", "multi30k_en_de", "base", "big"])
def test_shipped_configs_parse(name):
    config = RunConfig.from_toml(os.path.join(CONFIG_DIR, f"{name}.toml"))
    assert config.name == name
    model = config.model_config()
    if name == "multi30k":
        assert (config.source_lang, config.target_lang) == ("de", "en")
        assert (config.train_split, config.validation_split, config.test_split) == (
            "train", "val", "test_2016_flickr",
        )
        # off for de->en: they lost on a slower machine (the config's comment)
        assert (model.attention_dropout, model.activation_dropout) == (0.0, 0.0)
        # AdamW: +0.77 val on a slower machine; en->de inherits it (the config's comment)
        assert config.training_config().weight_decay == 0.1
    if name == "multi30k_en_de":
        # the de->en recipe reversed, with its own search, dropouts, normalization (pre-norm,
        # ScaleNorm, FixNorm), 2.9x its peak learning rate and weight decay re-chosen at that rate
        recipe = RunConfig.from_toml(os.path.join(CONFIG_DIR, "multi30k.toml"))
        reversed_recipe = recipe.replace(
            name=name, source_lang="en", target_lang="de", eval_beam_size=4, eval_length_penalty=1.4,
            model={**recipe.model, "attention_dropout": 0.1, "activation_dropout": 0.1,
                   "norm_first": True, "normalization": "scale", "fix_norm": True},
            training={**recipe.training, "learning_rate_scale": 1.0, "weight_decay": 0.4},
        )
        assert config == reversed_recipe
        # its own weight decay (0.4 at 2.9x the rate); inherited: de->en's batch (1,024 tokens,
        # 800 warmup steps)
        assert config.training_config().weight_decay == 0.4
        assert (model.norm_first, model.normalization, model.fix_norm) == (True, "scale", True)
        assert config.training_config().learning_rate_scale == 1.0
        assert (config.tokens_per_batch, config.training_config().warmup_steps) == (1024, 800)
    if name == "base":
        assert (model.d_model, model.num_encoder_layers, model.vocab_size) == (512, 6, 37000)
        assert config.keep_checkpoints == 5
    if name == "big":
        assert (model.d_model, model.dropout) == (1024, 0.3)
        assert config.keep_checkpoints == 20


def test_reading_a_run_config_does_not_load_tensorflow():
    # Keras on the TensorFlow backend loads TensorFlow itself: that case reads under JAX.
    backend = "jax" if keras.backend.backend() == "tensorflow" else keras.backend.backend()
    path = os.path.join(CONFIG_DIR, "multi30k.toml")
    script = (
        "import sys\n"
        "import keras_transformer.train.run_config as run_config\n"
        f"config = run_config.RunConfig.from_toml({path!r})\n"
        "print(config.bucket_boundaries()[-1], 'tensorflow' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], env={**os.environ, "KERAS_BACKEND": backend},
        capture_output=True, text=True, timeout=300, check=True,
    )
    assert result.stdout.split() == ["64", "False"]


def test_bucket_width_gives_evenly_spaced_boundaries():
    from keras_transformer.data.pipeline import evenly_spaced_boundaries as reexported
    from keras_transformer.data.settings import evenly_spaced_boundaries

    assert reexported is evenly_spaced_boundaries  # the pipeline's name, defined without TensorFlow
    assert evenly_spaced_boundaries(4, 14) == [4, 8, 12, 14]
    assert evenly_spaced_boundaries(8, 16) == [8, 16]
    assert evenly_spaced_boundaries(0, 64) is None  # the pipeline's default boundaries
    assert RunConfig().with_overrides(["bucket_width=4"]).bucket_width == 4


def test_negative_bucket_width_is_refused():
    with pytest.raises(ValueError, match=r"`bucket_width` must be an integer >= 0. Received: bucket_width=-4"):
        RunConfig(bucket_width=-4)


# ------------------------------------------------------------------ extends
def test_a_config_extends_another_replacing_keys_and_merging_tables(tmp_path):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "base.toml").write_text(
        'name = "base"\nepochs = 3\nsource_lang = "de"\n\n[model]\nd_model = 64\nnum_heads = 2\n'
        "\n[training]\nwarmup_steps = 100\n"
    )
    (tmp_path / "child.toml").write_text(
        'extends = "recipes/base.toml"\nname = "child"\n\n[model]\nnum_heads = 4\n'
    )
    (tmp_path / "grandchild.toml").write_text('extends = "child.toml"\nepochs = 7\n')
    child = RunConfig.from_toml(tmp_path / "child.toml")
    assert (child.name, child.epochs, child.source_lang) == ("child", 3, "de")
    assert child.model == {"d_model": 64, "num_heads": 4}  # merged key by key
    assert child.training == {"warmup_steps": 100}
    grandchild = RunConfig.from_toml(tmp_path / "grandchild.toml", ["training.warmup_steps=50"])
    assert grandchild == child.replace(epochs=7, training={"warmup_steps": 50})


def test_extends_that_cannot_be_followed_is_refused_naming_it(tmp_path):
    (tmp_path / "a.toml").write_text('extends = "b.toml"\n')
    (tmp_path / "b.toml").write_text('extends = "a.toml"\n')
    with pytest.raises(ValueError, match=r"`extends` goes round in a circle: .*a.toml -> .*b.toml -> .*a.toml"):
        RunConfig.from_toml(tmp_path / "a.toml")
    (tmp_path / "c.toml").write_text('extends = "missing.toml"\n')
    with pytest.raises(FileNotFoundError, match=r"c.toml: extends='missing.toml' names .*missing.toml, which is not a file"):
        RunConfig.from_toml(tmp_path / "c.toml")
    (tmp_path / "d.toml").write_text("extends = 3\n")
    with pytest.raises(ValueError, match=r"`extends` must be the path of another run config.*Received: extends=3"):
        RunConfig.from_toml(tmp_path / "d.toml")
    with pytest.raises(ValueError, match=r"Unknown run config key\(s\): \['extends'\]"):
        RunConfig.from_dict({"extends": "a.toml"})  # only a file has a place to be relative to

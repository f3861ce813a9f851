"""A 0.3 run config that names an option 0.4 removed is told so, with the reason."""

import re

import pytest

from keras_transformer.train.removed_keys import REMOVED_KEYS
from keras_transformer.train.run_config import RunConfig

TOML = """
name = "old"
{top}
[training]
warmup_steps = 100
{training}
"""


def write_config(tmp_path, top="", training=""):
    path = tmp_path / "old.toml"
    path.write_text(TOML.format(top=top, training=training))
    return path


def test_a_removed_training_key_is_an_error_saying_it_was_removed(tmp_path):
    path = write_config(tmp_path, training="rdrop_alpha = 5.0")
    message = (
        f"{path}: `training.rdrop_alpha` was removed in keras-transformer 0.4 (R-Drop lost 5.1 BLEU "
        "at twice the step time); delete it from the config. Received: training.rdrop_alpha=5.0"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        RunConfig.from_toml(path)
    message = (
        "`training.rdrop_alpha` was removed in keras-transformer 0.4 (R-Drop lost 5.1 BLEU at twice "
        "the step time); delete it from the config. Received: training.rdrop_alpha='5'"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        RunConfig().with_overrides(["training.rdrop_alpha=5"])


def test_a_removed_key_at_its_0_3_default_is_dropped_with_a_warning(tmp_path):
    # Every 0.3 model directory's config.toml lists every key, the removed ones at their defaults.
    defaults = {key.partition(".")[2] or key: default for key, (default, _) in REMOVED_KEYS.items()}
    training = "\n".join(f"{name} = {defaults[name]!r}".replace("'", '"') for name in defaults
                         if f"training.{name}" in REMOVED_KEYS)
    top = "\n".join(f"{name} = {defaults[name]!r}" for name in defaults if name in REMOVED_KEYS)
    path = write_config(tmp_path, top=top, training=training)
    with pytest.warns(UserWarning) as caught:
        config = RunConfig.from_toml(path)
    assert config == RunConfig(name="old", training={"warmup_steps": 100})
    assert sorted(re.match(r"`(\S+)` was removed in keras-transformer 0.4; its 0.3 default", str(w.message)).group(1)
                  for w in caught) == sorted(REMOVED_KEYS)

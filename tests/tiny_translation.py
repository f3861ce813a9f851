"""A tiny tokenizer and model directory shared by the translation, export and plot tests.

The tokenizer is trained on 100 made-up sentences (vocabulary 40); the model is the
test-sized tiny preset with random weights. Its translations are nonsense, but they are
deterministic, which is what these tests compare: the same decoding through different
paths (batches, threads, the SavedModel) must give the same strings.
"""

import itertools
import os

from conftest import tiny_config

import keras_transformer as kt

VOCAB_SIZE = 40
MAX_LENGTH = 16  # short outputs: fast compiles and decodes

_SUBJECTS = ("the cat", "a dog", "my friend", "the old man", "her sister")
_VERBS = ("sees", "likes", "finds", "paints")
_OBJECTS = ("the house", "a red car", "two birds", "the garden", "some bread")


def tiny_sentences():
    """100 made-up English sentences: every subject, verb and object combination."""
    return [" ".join(words) for words in itertools.product(_SUBJECTS, _VERBS, _OBJECTS)]


def make_tiny_model_dir(directory, max_extra=4):
    """Writes `model.keras` and `tokenizer.model` to `directory`; returns (model, tokenizer)."""
    tokenizer = kt.train_tokenizer(tiny_sentences(), vocab_size=VOCAB_SIZE)
    config = tiny_config(
        vocab_size=tokenizer.vocab_size, max_length=MAX_LENGTH, max_decode_extra=max_extra
    )
    model = kt.Transformer(config)
    os.makedirs(directory, exist_ok=True)
    model.save(os.path.join(directory, "model.keras"))
    tokenizer.save(directory)
    return model, tokenizer

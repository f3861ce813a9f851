"""A tiny tokenizer, model directory and translator shared by the translation tests.

The tokenizer is a BPE model of vocabulary 48 trained on 100 made-up sentences; the
model is the test-sized tiny preset with random weights. Its translations are
nonsense, but deterministic, which is what the tests compare: one decoding reached
through different paths (batches, threads, the SavedModel) must give the same strings.

Compiling beam search costs seconds per input shape on TensorFlow and JAX, so the
fixtures are session-scoped (test files import them) and the test sentences are chosen
to reach the compiled decoder in few shapes: every sentence below tokenizes to 8-15
pieces, so with its EOS it pads to the one length bucket of 16 (`MAX_LENGTH`).
"""

import itertools

import keras
import pytest
from conftest import tiny_config

import keras_transformer as kt

VOCAB_SIZE = 48
MAX_LENGTH = 16  # one length bucket (16) for every test sentence
MAX_EXTRA = 4  # outputs of at most 15 tokens: fast decodes
BEAM_SIZE = 2
BATCH_SIZE = 4

_SUBJECTS = ("cats", "dogs", "birds", "horses", "people")
_VERBS = ("see", "like", "find", "paint")
_OBJECTS = ("houses", "cars", "trees", "gardens", "bread")


def tiny_sentences():
    """100 made-up English sentences: every subject, verb and object combination."""
    return [" ".join(words) for words in itertools.product(_SUBJECTS, _VERBS, _OBJECTS)]


def pick_sentences(tokenizer, count=8):
    """`count` distinct corpus sentences of 8 to 15 pieces (16 with EOS), varied lengths."""
    lengths = {s: len(ids) for s, ids in zip(tiny_sentences(), tokenizer.encode(tiny_sentences()))}
    chosen = [s for s, n in lengths.items() if 8 <= n <= 15]
    # Every third one, for a mix of subjects, verbs and lengths.
    return chosen[::3][:count]


def make_tiny_model_dir(directory):
    """Writes `model.keras` and `tokenizer.model` to `directory`; returns (model, tokenizer)."""
    tokenizer = kt.train_tokenizer(tiny_sentences(), vocab_size=VOCAB_SIZE, model_type="bpe")
    keras.utils.set_random_seed(0)  # the same weights whichever test builds it first
    config = tiny_config(vocab_size=tokenizer.vocab_size, max_length=MAX_LENGTH)
    model = kt.Transformer(config)
    model.save(str(directory / "model.keras"))
    tokenizer.save(str(directory))
    return model, tokenizer


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    directory = tmp_path_factory.mktemp("tiny_model")
    make_tiny_model_dir(directory)
    return directory


@pytest.fixture(scope="session")
def translator(model_dir):
    """The beam-2 `Translator` of the tiny model directory, traced once per session."""
    from keras_transformer.inference.translator import Translator

    # A plain tf.function graph on TensorFlow (an XLA compile costs ~10 s per shape;
    # test_translator checks once that XLA gives the same); jit-compiled on JAX.
    return Translator(
        model_dir, beam_size=BEAM_SIZE, max_extra=MAX_EXTRA, batch_size=BATCH_SIZE, jit_compile=False
    )


@pytest.fixture(scope="session")
def sentences(translator):
    return pick_sentences(translator.tokenizer)

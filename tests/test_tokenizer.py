"""Tests of the joint subword tokenizer: training, ids, TF ops, save and load."""

import io
import os

import numpy as np
import pytest
import sentencepiece
import tensorflow as tf

from keras_transformer import special_tokens
from keras_transformer.data.tokenizer import (
    MODEL_FILENAME,
    SubwordTokenizer,
    train_tokenizer,
)

SOURCE_WORDS = "red blue green black white small big old new one two three".split()
TARGET_WORDS = "rot blau gruen schwarz weiss klein gross alt neu eins zwei drei".split()
VOCAB_SIZE = 40


def make_sentences(count=200):
    """Both sides of `count` toy pairs of 1 to 12 words: one text for one vocabulary."""
    sentences = []
    for i in range(count):
        words = [(7 * i + 5 * j) % 12 for j in range(1 + i % 12)]
        sentences.append(" ".join(SOURCE_WORDS[w] for w in words))
        sentences.append(" ".join(TARGET_WORDS[w] for w in reversed(words)))
    return sentences


@pytest.fixture(scope="module")
def sentences():
    return make_sentences()


@pytest.fixture(scope="module")
def tokenizer(sentences):
    return train_tokenizer(sentences, VOCAB_SIZE)


def test_vocabulary_has_the_requested_size_and_the_special_tokens(tokenizer):
    assert tokenizer.vocab_size == VOCAB_SIZE
    assert [tokenizer.id_to_piece(i) for i in range(4)] == [
        special_tokens.PAD_PIECE,
        special_tokens.UNK_PIECE,
        special_tokens.BOS_PIECE,
        special_tokens.EOS_PIECE,
    ]
    assert tokenizer.piece_to_id("</s>") == special_tokens.EOS_ID == 3
    assert tokenizer.piece_to_id("<s>") == special_tokens.BOS_ID == 2
    assert tokenizer.piece_to_id("<pad>") == special_tokens.PAD_ID == 0
    with pytest.raises(ValueError, match=r"\[0, 40\). Received: 40"):
        tokenizer.id_to_piece(VOCAB_SIZE)


def test_encode_decode_round_trip_is_exact(tokenizer, sentences):
    ids = tokenizer.encode(sentences)
    assert tokenizer.decode(ids) == sentences
    # Ordinary pieces only: no BOS / EOS / PAD added by encode, no UNK in-vocab.
    assert all(min(sequence) >= 4 for sequence in ids)


def test_decode_stops_at_eos_and_drops_pad_and_bos(tokenizer):
    ids = tokenizer.encode(["red blue", "rot"])
    padded = [
        [special_tokens.BOS_ID] + ids[0] + [special_tokens.EOS_ID, ids[1][0], 0],
        ids[1] + [special_tokens.PAD_ID, special_tokens.PAD_ID],
    ]
    assert tokenizer.decode(padded) == ["red blue", "rot"]


def test_unseen_character_is_unk(tokenizer):
    assert special_tokens.UNK_ID in tokenizer.encode(["red \u00e6"])[0]


def test_tf_tokenize_gives_the_python_ids(tokenizer):
    texts = ["red blue green", "rot", "three two one new"]
    ragged = tokenizer.tokenize(tf.constant(texts))
    assert isinstance(ragged, tf.RaggedTensor)
    assert ragged.dtype == tf.int32
    assert ragged.to_list() == tokenizer.encode(texts)
    single = tokenizer.tokenize(tf.constant("red blue green"))
    assert single.numpy().tolist() == tokenizer.encode(["red blue green"])[0]


def test_tf_tokenize_survives_a_seed_reset(sentences):
    # tf.random.set_seed clears the eager kernel cache, which deleted tf-text's
    # kernel-private model resource (tensorflow/text#570).
    fresh = train_tokenizer(sentences, VOCAB_SIZE)
    before = fresh.tokenize(tf.constant(["red blue"])).to_list()
    tf.random.set_seed(7)
    assert fresh.tokenize(tf.constant(["red blue"])).to_list() == before
    text = fresh.detokenize(tf.ragged.constant(before))
    assert text.numpy().tolist() == [b"red blue"]


def test_tf_detokenize_strips_bos_pad_and_what_follows_eos(tokenizer):
    ids = tokenizer.encode(["red blue", "rot alt"])
    bos, eos = special_tokens.BOS_ID, special_tokens.EOS_ID
    width = max(len(s) for s in ids) + 3
    dense = np.zeros([2, width], np.int64)
    dense[0, : len(ids[0]) + 3] = [bos] + ids[0] + [eos, ids[1][0]]
    dense[1, : len(ids[1])] = ids[1]
    expected = [b"red blue", b"rot alt"]
    assert tokenizer.detokenize(tf.constant(dense)).numpy().tolist() == expected
    assert tokenizer.detokenize(tf.ragged.constant(ids)).numpy().tolist() == expected
    assert tokenizer.detokenize(tf.constant(ids[0])).numpy() == b"red blue"
    with pytest.raises(TypeError, match="must be integers"):
        tokenizer.detokenize(tf.constant([[1.0]]))


def test_tokenizer_runs_in_a_saved_tf_graph(tokenizer, tmp_path):
    module = tf.Module()
    module.tokenizer = tokenizer
    module.round_trip = tf.function(
        lambda text: tokenizer.detokenize(tokenizer.tokenize(text)),
        input_signature=[tf.TensorSpec([None], tf.string)],
    )
    tf.saved_model.save(module, str(tmp_path / "graph"))
    reloaded = tf.saved_model.load(str(tmp_path / "graph"))
    out = reloaded.round_trip(tf.constant(["red blue", "neu alt"]))
    assert out.numpy().tolist() == [b"red blue", b"neu alt"]


def test_training_is_deterministic(tokenizer, sentences):
    assert train_tokenizer(sentences, VOCAB_SIZE).model_proto == tokenizer.model_proto


def test_bpe_model_type(sentences):
    bpe = train_tokenizer(sentences, 48, model_type="bpe")
    assert bpe.vocab_size == 48
    assert bpe.id_to_piece(special_tokens.EOS_ID) == special_tokens.EOS_PIECE
    assert bpe.decode(bpe.encode(sentences[:10])) == sentences[:10]


def test_training_errors(sentences):
    with pytest.raises(ValueError, match=r"=500 is more pieces.*at most \d+"):
        train_tokenizer(sentences, 500)
    with pytest.raises(ValueError, match="`model_type` must be one of .* 'wordpiece'"):
        train_tokenizer(sentences, VOCAB_SIZE, model_type="wordpiece")
    with pytest.raises(ValueError, match=r"integer > 4 .* vocab_size=4"):
        train_tokenizer(sentences, 4)
    with pytest.raises(TypeError, match=r"Received: 7 \(type int\) at index 1"):
        train_tokenizer(["red", 7], VOCAB_SIZE)
    with pytest.raises(ValueError, match="`sentences` is empty"):
        train_tokenizer([], VOCAB_SIZE)
    with pytest.raises(TypeError, match="not one string"):
        train_tokenizer("red blue", VOCAB_SIZE)


def test_save_and_load_give_identical_ids(tokenizer, sentences, tmp_path):
    path = tokenizer.save(str(tmp_path / "model_dir"))
    assert path == os.path.join(str(tmp_path / "model_dir"), "tokenizer.model")  # the model directory's name
    from_directory = SubwordTokenizer.load(tmp_path / "model_dir")
    from_file = SubwordTokenizer.load(path)
    for loaded in (from_directory, from_file):
        assert loaded.vocab_size == VOCAB_SIZE
        assert loaded.encode(sentences) == tokenizer.encode(sentences)
        assert loaded.model_proto == tokenizer.model_proto
    # The file is a plain sentencepiece model.
    processor = sentencepiece.SentencePieceProcessor(model_file=path)
    assert processor.encode(sentences[:5]) == tokenizer.encode(sentences[:5])


def test_load_missing_file_names_the_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        SubwordTokenizer.load(tmp_path / "nowhere" / MODEL_FILENAME)
    with pytest.raises(FileNotFoundError, match=f"empty_dir.{MODEL_FILENAME}"):
        os.makedirs(tmp_path / "empty_dir")
        SubwordTokenizer.load(tmp_path / "empty_dir")


def test_load_corrupt_file_names_the_path(tmp_path):
    path = tmp_path / "broken.model"
    path.write_bytes(b"this is not a sentencepiece model")
    with pytest.raises(ValueError, match="broken.model is not a valid sentencepiece"):
        SubwordTokenizer.load(path)
    with pytest.raises(TypeError, match="must be the bytes"):
        SubwordTokenizer("not bytes")


def _train_raw_model(sentences, **options):
    """A sentencepiece model trained without train_tokenizer's special ids."""
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences), model_writer=model, vocab_size=VOCAB_SIZE,
        minloglevel=2, **options,
    )
    return model.getvalue()


def test_load_refuses_other_special_ids(sentences, tmp_path):
    # sentencepiece's own defaults: unk=0, bos=1, eos=2, no pad.
    path = tmp_path / "defaults.model"
    path.write_bytes(_train_raw_model(sentences))
    with pytest.raises(ValueError, match=r"defaults.model has pad_id=-1, .*pad_id=0"):
        SubwordTokenizer.load(path)
    other_piece = _train_raw_model(
        sentences, pad_id=0, unk_id=1, bos_id=2, eos_id=3, bos_piece="[BOS]"
    )
    with pytest.raises(ValueError, match=r"piece '\[BOS\]' at id 2, .* expects '<s>'"):
        SubwordTokenizer(other_piece)


def test_to_keras_hub_gives_the_same_ids(tokenizer):
    hub_tokenizer = tokenizer.to_keras_hub()
    ids = hub_tokenizer(["red blue green"])
    assert np.asarray(ids[0]).tolist() == tokenizer.encode(["red blue green"])[0]
    assert hub_tokenizer.vocabulary_size() == VOCAB_SIZE


def test_to_keras_hub_names_the_tokenizer_the_same_every_time(tokenizer):
    """Keras' automatic names count earlier tokenizers; a saved config must not depend on that."""
    first, second = tokenizer.to_keras_hub(), tokenizer.to_keras_hub()
    assert first.name == second.name == "sentence_piece_tokenizer"
    assert tokenizer.to_keras_hub(name="source_pieces").name == "source_pieces"

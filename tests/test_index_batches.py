"""Binarized corpora and their index-planned batches, on small corpora written here.

The batches must be those of `make_dataset` (same rows, same statistics), every pair in
exactly one batch of each epoch, a resumed stream the same batches as an unbroken one,
and the workers' shares of each batch disjoint and whole.
"""

import gzip
import json
import re

import numpy as np
import pytest

from keras_transformer.data.binarized import open_binarized, write_binarized
from keras_transformer.data.in_memory_corpus import IN_MEMORY, in_memory_corpus
from keras_transformer.data.index_batches import IndexBatches, Shard
from keras_transformer.data.pipeline import make_dataset
from keras_transformer.data.text_corpus import TextCorpus, binarized_corpus
from keras_transformer.data.tokenizer import train_tokenizer
from keras_transformer.special_tokens import PAD_ID

WORDS = "ein zwei drei vier haus katze hund baum auto rot blau".split()


def _pairs(count=120, seed=0):
    rng = np.random.default_rng(seed)
    return [
        (" ".join(rng.choice(WORDS, rng.integers(1, 10))), " ".join(rng.choice(WORDS, rng.integers(1, 10))))
        for _ in range(count)
    ]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer([side for pair in _pairs(300) for side in pair], 32)


@pytest.fixture(scope="module")
def corpus(tokenizer, tmp_path_factory):
    return write_binarized(_pairs(), tokenizer, str(tmp_path_factory.mktemp("bin") / "train"), progress=False)


def _rows(batches):
    """Every non-padding row of `batches` as a tuple of its three vectors."""
    rows = []
    for inputs, labels in batches:
        arrays = [np.asarray(inputs["encoder_inputs"]), np.asarray(inputs["decoder_inputs"]), np.asarray(labels)]
        rows += [tuple(map(tuple, row)) for row in zip(*arrays) if any(row[0])]
    return rows


def _pair_ids(batches, step):
    return set(batches.batch_pairs(step)[0].tolist())


def test_binarized_ids_are_the_tokenizers(corpus, tokenizer):
    pairs = _pairs()
    assert corpus.num_pairs == len(pairs) == corpus.meta["pairs"]
    for index in (0, 7, len(pairs) - 1):
        source, target = corpus.pair_ids(index)
        assert source.tolist() == tokenizer.encode([pairs[index][0]])[0]
        assert target.tolist() == tokenizer.encode([pairs[index][1]])[0]
    assert corpus.lengths[7] == max(len(corpus.pair_ids(7)[0]), len(corpus.pair_ids(7)[1])) + 1
    assert corpus.source_ids.dtype == np.uint16  # 32 pieces fit in two bytes


@pytest.mark.parametrize("overlong", ["drop", "truncate"])
def test_batches_hold_the_rows_and_statistics_of_make_dataset(corpus, tokenizer, overlong):
    settings = dict(max_length=10, tokens_per_batch=40, overlong=overlong)
    batches = IndexBatches(corpus, shuffle=False, **settings)
    reference = make_dataset(_pairs(), tokenizer, shuffle=False, **settings)
    assert batches.stats == reference.stats
    assert sorted(_rows(batches.batches(0, batches.num_batches))) == sorted(_rows(reference.dataset.as_numpy_iterator()))
    # Every batch is padded to its bucket's boundary and holds at most its bucket's size.
    for step in range(batches.num_batches):
        pairs, length = batches.batch_pairs(step)
        inputs, labels = batches.batch(step)
        assert inputs["encoder_inputs"].shape == labels.shape == (len(pairs), length)
        assert len(pairs) <= 40 // length


def test_every_pair_once_per_epoch_in_a_new_order(corpus):
    batches = IndexBatches(corpus, max_length=12, tokens_per_batch=48, seed=3)
    epochs = []
    for epoch in range(2):
        seen = [pair for step in range(epoch * batches.num_batches, (epoch + 1) * batches.num_batches)
                for pair in batches.batch_pairs(step)[0].tolist()]
        assert sorted(seen) == np.flatnonzero(np.asarray(corpus.lengths) <= 12).tolist()
        epochs.append(seen)
    assert epochs[0] != epochs[1]


def test_a_resumed_stream_gives_the_batches_of_an_unbroken_one(corpus):
    settings = dict(max_length=12, tokens_per_batch=48, seed=5)
    unbroken = list(IndexBatches(corpus, **settings).batches(0, 30))
    # A new object, as in a new process: the stream starts at batch 17, across an epoch's end.
    resumed = list(IndexBatches(corpus, **settings).batches(17, 30))
    assert IndexBatches(corpus, **settings).num_batches < 30
    for (inputs, labels), (inputs_again, labels_again) in zip(unbroken[17:], resumed):
        np.testing.assert_array_equal(labels, labels_again)
        np.testing.assert_array_equal(inputs["encoder_inputs"], inputs_again["encoder_inputs"])


def test_two_workers_read_disjoint_shares_that_cover_each_batch(corpus):
    settings = dict(max_length=12, tokens_per_batch=48, seed=1)
    whole = IndexBatches(corpus, **settings)
    workers = [IndexBatches(corpus, shard=Shard(index, 2), **settings) for index in range(2)]
    for step in range(whole.num_batches + 3):
        shares = [worker.batch(step) for worker in workers]
        assert shares[0][1].shape == shares[1][1].shape  # the workers step together
        rows = [_rows([share]) for share in shares]
        assert not set(rows[0]) & set(rows[1])
        assert sorted(rows[0] + rows[1]) == sorted(_rows([whole.batch(step)]))
        # Top-up rows are padding everywhere, labels included: the loss ignores them.
        for inputs, labels in shares:
            empty = ~inputs["encoder_inputs"].any(axis=1)
            assert (labels[empty] == PAD_ID).all() and (inputs["decoder_inputs"][empty] == PAD_ID).all()


def test_a_workers_devices_get_its_rows_in_parts(corpus):
    """A worker of two with two devices hands each device a quarter of the rows, in order."""
    settings = dict(max_length=12, tokens_per_batch=48, seed=1)
    worker = IndexBatches(corpus, shard=Shard(1, 2), **settings)
    parts = list(worker.batches(0, 2, replicas=2))
    assert len(parts) == 4  # two steps, two devices each
    for step in range(2):
        for replica in range(2):
            expected = IndexBatches(corpus, shard=Shard(2 + replica, 4), **settings).batch(step)
            np.testing.assert_array_equal(parts[2 * step + replica][1], expected[1])


def test_shard_refuses_an_index_outside_its_count():
    with pytest.raises(ValueError, match=re.escape("Received: index=2, count=2")):
        Shard(2, 2)


def test_dataset_streams_the_batches_endlessly(corpus):
    batches = IndexBatches(corpus, max_length=12, tokens_per_batch=48)
    dataset = batches.dataset(start=4)
    streamed = [batch for _, batch in zip(range(batches.num_batches + 2), dataset.as_numpy_iterator())]
    for step, (inputs, labels) in enumerate(streamed, start=4):
        np.testing.assert_array_equal(labels, batches.batch(step)[1])


def _write(path, lines, compress=False):
    data = "".join(f"{line}\n" for line in lines).encode()
    path.write_bytes(gzip.compress(data) if compress else data)
    return str(path)


def test_binarized_once_then_opened_from_the_cache_gzip_included(tmp_path, tokenizer):
    pairs = _pairs(50)
    text = TextCorpus(
        "files",
        paths=(_write(tmp_path / "train.de.gz", [s for s, _ in pairs], True), _write(tmp_path / "train.en", [t for _, t in pairs])),
        split="train",
    )
    printed = []
    first = binarized_corpus(text, tokenizer, str(tmp_path / "cache"), print_fn=printed.append, progress=False)
    again = binarized_corpus(text, tokenizer, str(tmp_path / "cache"), print_fn=printed.append, progress=False)
    assert first.directory == again.directory and again.num_pairs == 50
    assert "written to" in printed[0] and "opened from" in printed[1]
    assert again.pair_ids(3)[1].tolist() == tokenizer.encode([pairs[3][1]])[0]


def test_a_bad_line_is_named_or_counted_and_skipped(tmp_path, tokenizer):
    source = _write(tmp_path / "train.de", ["ein haus", "", "zwei"])
    target = _write(tmp_path / "train.en", ["a house", "nothing", "two"])
    with pytest.raises(ValueError, match=re.escape(f"{source}, line 2: empty line")):
        binarized_corpus(TextCorpus("files", paths=(source, target)), tokenizer, str(tmp_path / "a"), progress=False)
    assert not list((tmp_path / "a").iterdir())  # nothing half-written is left to open
    skipping = TextCorpus("files", paths=(source, target), skip_malformed=True)
    printed = []
    binarized = binarized_corpus(skipping, tokenizer, str(tmp_path / "b"), print_fn=printed.append, progress=False)
    assert binarized.num_pairs == 2
    assert binarized.meta["skipped"] == 1 and binarized.meta["skipped_reasons"] == {"empty line": 1}
    assert "1 malformed pairs skipped" in printed[0]
    with open(f"{binarized.directory}/meta.json", encoding="utf-8") as file:
        assert json.load(file)["pairs"] == 2


def test_an_all_malformed_corpus_is_refused(tmp_path, tokenizer):
    source = _write(tmp_path / "train.de", [""])
    target = _write(tmp_path / "train.en", ["x"])
    with pytest.raises(ValueError, match="all 1 were malformed and skipped"):
        binarized_corpus(TextCorpus("files", paths=(source, target), skip_malformed=True), tokenizer,
                         str(tmp_path / "c"), progress=False)


def test_open_binarized_refuses_a_directory_without_a_corpus(tmp_path):
    with pytest.raises(FileNotFoundError, match="meta.json is missing"):
        open_binarized(str(tmp_path))



def test_a_corpus_of_several_chunks_is_written_whole(tmp_path, tokenizer, monkeypatch):
    from keras_transformer.data import binarized

    monkeypatch.setattr(binarized, "_CHUNK_PAIRS", 16)  # 120 pairs: 8 chunks, the last one short
    chunked = write_binarized(_pairs(), tokenizer, str(tmp_path / "chunked"), progress=False)
    assert chunked.num_pairs == 120
    for index in (15, 16, 119):
        assert chunked.pair_ids(index)[0].tolist() == tokenizer.encode([_pairs()[index][0]])[0]


def test_a_killed_binarizing_leaves_nothing_that_a_later_one_keeps(tmp_path, tokenizer):
    from keras_transformer.data.cache_staging import host_name

    abandoned = tmp_path / f"train.tmp-{host_name()}-999999999-0a1b2c3d"  # this machine's, no such process
    abandoned.mkdir()
    (abandoned / "source.bin").write_bytes(b"half")
    write_binarized(_pairs(10), tokenizer, str(tmp_path / "train"), progress=False)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["train"]


def test_bucket_members_read_in_blocks_are_those_read_whole(corpus):
    from keras_transformer.data.index_batches import _bucket_members

    whole = _bucket_members(corpus.lengths, [4, 8, 12], 12, "drop")
    blocks = _bucket_members(corpus.lengths, [4, 8, 12], 12, "drop", block=7)
    assert whole[1] == blocks[1] and all(np.array_equal(a, b) for a, b in zip(whole[0], blocks[0]))


# ---------------------------------------------------------------- a list of pairs, in memory
def test_an_in_memory_corpus_holds_the_arrays_of_the_files(corpus, tokenizer):
    in_memory = in_memory_corpus(_pairs(), tokenizer)
    assert in_memory.directory == IN_MEMORY
    for name in ("source_ids", "target_ids", "source_offsets", "target_offsets", "lengths"):
        on_disk, held = np.asarray(getattr(corpus, name)), getattr(in_memory, name)
        assert held.dtype == on_disk.dtype, name
        np.testing.assert_array_equal(held, on_disk, err_msg=name)
    for key in ("format", "dtype", "pairs", "source_tokens", "target_tokens", "tokenizer_sha256", "vocab_size"):
        assert in_memory.meta[key] == corpus.meta[key], key


def test_an_in_memory_corpus_gives_the_batches_of_the_files(corpus, tokenizer):
    settings = dict(max_length=12, tokens_per_batch=48, seed=4)
    from_files, from_memory = IndexBatches(corpus, **settings), IndexBatches(in_memory_corpus(_pairs(), tokenizer), **settings)
    assert from_memory.stats == from_files.stats
    for step in range(from_files.num_batches + 2):  # into the second epoch
        (inputs, labels), (inputs_again, labels_again) = from_files.batch(step), from_memory.batch(step)
        np.testing.assert_array_equal(labels_again, labels)
        for key in inputs:
            np.testing.assert_array_equal(inputs_again[key], inputs[key])


def test_an_in_memory_corpus_refuses_what_it_cannot_batch(tokenizer):
    with pytest.raises(ValueError, match=r"`pairs` is empty"):
        in_memory_corpus([], tokenizer)
    with pytest.raises(ValueError, match=re.escape("Received: ('ein', 3) at index 1")):
        in_memory_corpus([("ein", "a"), ("ein", 3)], tokenizer)
    with pytest.raises(ValueError, match=r"The target of the pair at index 0 is not valid Unicode.*'\\ud800' at character 1"):
        in_memory_corpus([("ein", "a\ud800")], tokenizer)
    with pytest.raises(ValueError, match=r"token ids outside \[0, vocab_size=8\) \(from \d+ to \d+\)"):
        in_memory_corpus(_pairs(4), tokenizer, vocab_size=8)


def test_a_side_of_empty_sentences_is_batched_as_eos_alone(tokenizer):
    batches = IndexBatches(in_memory_corpus([("", "ein haus")] * 2, tokenizer), max_length=12, tokens_per_batch=48)
    inputs, labels = batches.batch(0)
    assert inputs["encoder_inputs"][:, 0].tolist() == [3, 3] and not inputs["encoder_inputs"][:, 1:].any()
    assert labels[0, :2].tolist() == tokenizer.encode(["ein haus"])[0][:2]

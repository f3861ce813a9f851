"""The binarized corpus and tokenizer caches are never trusted blindly.

Each fault a user can meet (a data file zero-filled, overwritten or cut at a page
boundary, an index file cut, `meta.json` edited, the corpus edited in place with its
size and modification time kept, another machine's staging directory, two runs
binarizing the same corpus at once) is made here on a small corpus. Each test checks
the one line that names the file and what is wrong, and that the corpus then used
holds the ids a fresh binarize makes.
"""

import hashlib
import json
import os
import re
import time

import numpy as np
import pytest
from conftest import once_on

from keras_transformer.data import binarized_checks, cache_staging, content_key, digests
from keras_transformer.data.binarized import BinarizedCorpusError, open_binarized, write_binarized
from keras_transformer.data.text_corpus import TextCorpus, binarized_corpus, cached_tokenizer
from keras_transformer.data.tokenizer import train_tokenizer

pytestmark = once_on("torch", "the cache is numpy and files, the same on every backend")

WORDS = "ein zwei drei vier haus katze hund baum auto rot blau".split()
PAIRS = 3000  # source.bin ~20 kB: several pages, so a cut at a page boundary keeps some


def _pairs(count=PAIRS, seed=0):
    rng = np.random.default_rng(seed)
    return [
        (" ".join(rng.choice(WORDS, rng.integers(1, 10))), " ".join(rng.choice(WORDS, rng.integers(1, 10))))
        for _ in range(count)
    ]


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer([side for pair in _pairs(300) for side in pair], 32)


def _text_corpus(directory, pairs=None):
    pairs = _pairs() if pairs is None else pairs
    directory.mkdir(exist_ok=True)
    for index, name in enumerate(("train.de", "train.en")):
        (directory / name).write_text("".join(pair[index] + "\n" for pair in pairs))
    return TextCorpus("files", paths=(str(directory / "train.de"), str(directory / "train.en")), split="train")


def _arrays(corpus):
    return [np.asarray(array) for array in (corpus.source_ids, corpus.target_ids, corpus.source_offsets,
                                             corpus.target_offsets, corpus.lengths)]


def _assert_same_ids(corpus, fresh):
    for array, expected in zip(_arrays(corpus), _arrays(fresh)):
        np.testing.assert_array_equal(array, expected)


@pytest.fixture
def cached(tmp_path, tokenizer):
    """A file corpus binarized once into a cache; returns (text corpus, cache dir, corpus directory, fresh copy)."""
    text = _text_corpus(tmp_path / "text")
    cache = str(tmp_path / "cache")
    first = binarized_corpus(text, tokenizer, cache, print_fn=lambda line: None, progress=False)
    fresh = write_binarized(text, tokenizer, str(tmp_path / "fresh"), progress=False)
    return text, cache, first.directory, fresh


def _open_again(text, tokenizer, cache):
    printed = []
    corpus = binarized_corpus(text, tokenizer, cache, print_fn=printed.append, progress=False)
    return corpus, printed


def _assert_rebuilt(corpus, printed, directory, fresh, problem):
    assert printed[0] == f"binarized corpus: {directory}/{problem}; binarizing it again"
    assert len(printed) == 2 and re.fullmatch(
        rf"binarized corpus: {PAIRS:,} pairs in \d+ s, written to {re.escape(directory)} \(later runs open it at once\)", printed[1]
    )
    assert corpus.directory == directory
    _assert_same_ids(corpus, fresh)
    # The damaged copy was moved aside and deleted; no staging is left beside the corpus.
    assert set(os.listdir(os.path.dirname(directory))) - {content_key.RECORD_FILE} == {os.path.basename(directory)}


def test_an_intact_copy_is_opened_and_verified(cached, tokenizer):
    text, cache, directory, fresh = cached
    corpus, printed = _open_again(text, tokenizer, cache)
    assert printed == [f"binarized corpus: {PAIRS:,} pairs, opened from {directory}"]
    _assert_same_ids(corpus, fresh)
    meta = corpus.meta
    for name in binarized_checks.FILES:  # the sizes and checksums were recorded while writing
        path = os.path.join(directory, name)
        assert meta["files"][name] == {"bytes": os.path.getsize(path), "blake2b": digests.file_digest(path)}
    assert meta["source_max_id"] == int(np.max(fresh.source_ids)) and meta["target_max_id"] == int(np.max(fresh.target_ids))


def test_a_zero_filled_data_file_is_named_and_binarized_again(cached, tokenizer):
    text, cache, directory, fresh = cached
    path = os.path.join(directory, "source.bin")
    size = os.path.getsize(path)
    with open(path, "r+b") as file:
        file.write(bytes(size))
    corpus, printed = _open_again(text, tokenizer, cache)
    _assert_rebuilt(corpus, printed, directory, fresh,
                    "source.bin: its content differs from the checksum meta.json recorded (changed after it was written)")


def test_a_data_file_overwritten_with_other_bytes_of_its_size_is_named(cached, tokenizer):
    text, cache, directory, fresh = cached
    path = os.path.join(directory, "target.bin")
    data = open(path, "rb").read()
    with open(path, "r+b") as file:
        file.write(data[::-1])  # the same ids, in another order: every id still below the vocabulary
    corpus, printed = _open_again(text, tokenizer, cache)
    _assert_rebuilt(corpus, printed, directory, fresh,
                    "target.bin: its content differs from the checksum meta.json recorded (changed after it was written)")


def test_a_data_file_cut_at_a_page_boundary_is_named(cached, tokenizer):
    text, cache, directory, fresh = cached
    path = os.path.join(directory, "source.bin")
    size = os.path.getsize(path)
    assert size > 8192
    os.truncate(path, 8192)
    corpus, printed = _open_again(text, tokenizer, cache)
    _assert_rebuilt(corpus, printed, directory, fresh, f"source.bin: 8,192 bytes, meta.json says {size:,}")


def test_a_cut_index_file_is_named_not_an_mmap_error(cached, tokenizer):
    text, cache, directory, fresh = cached
    path = os.path.join(directory, "source_offsets.npy")
    size = os.path.getsize(path)
    os.truncate(path, 4096)
    with pytest.raises(BinarizedCorpusError, match=re.escape(f"{path}: 4,096 bytes, meta.json says {size:,}")):
        open_binarized(directory)
    corpus, printed = _open_again(text, tokenizer, cache)
    _assert_rebuilt(corpus, printed, directory, fresh, f"source_offsets.npy: 4,096 bytes, meta.json says {size:,}")


def test_an_edited_meta_json_is_named(cached, tokenizer):
    text, cache, directory, fresh = cached
    path = os.path.join(directory, "meta.json")
    meta = json.load(open(path))
    meta["pairs"] -= 1
    with open(path, "w") as file:
        json.dump(meta, file)
    corpus, printed = _open_again(text, tokenizer, cache)
    _assert_rebuilt(corpus, printed, directory, fresh, "meta.json: its entries do not match the checksum written with them")


def test_a_missing_meta_json_or_data_file_is_named(cached, tokenizer):
    text, cache, directory, fresh = cached
    os.remove(os.path.join(directory, "lengths.npy"))
    corpus, printed = _open_again(text, tokenizer, cache)
    _assert_rebuilt(corpus, printed, directory, fresh, "lengths.npy: missing")
    os.remove(os.path.join(directory, "meta.json"))
    corpus, printed = _open_again(text, tokenizer, cache)
    _assert_rebuilt(corpus, printed, directory, fresh, "meta.json: missing")


def _resign(directory, meta):
    """Rewrites `meta.json` with the files' present sizes and checksums: a copy whose meta agrees with damage."""
    for name in binarized_checks.FILES:
        path = os.path.join(directory, name)
        meta["files"][name] = {"bytes": os.path.getsize(path), "blake2b": digests.file_digest(path)}
    meta[binarized_checks.META_CHECKSUM] = binarized_checks.meta_checksum(meta)
    with open(os.path.join(directory, "meta.json"), "w") as file:
        json.dump(meta, file)


@pytest.mark.parametrize("fault, problem", [
    ("decreasing", "source_offsets.npy: decreases at pair 5"),
    ("short_end", "target_offsets.npy: runs from 0 to {end:,}, not from 0 to target.bin's {tokens:,} ids"),
    ("lengths", "lengths.npy: pair 7 has length 99, its offsets say {length}"),
    ("max_id", "source.bin: holds id 32, not below vocab_size=32"),
])
def test_structure_is_checked_even_when_the_checksums_agree(cached, fault, problem):
    _, _, directory, fresh = cached
    meta = json.load(open(os.path.join(directory, "meta.json")))
    if fault == "decreasing":
        offsets = np.load(os.path.join(directory, "source_offsets.npy"), mmap_mode="r+")
        offsets[5] = offsets[6] + 1
        offsets.flush()
    elif fault == "short_end":
        offsets = np.load(os.path.join(directory, "target_offsets.npy"), mmap_mode="r+")
        offsets[-1] -= 1
        offsets.flush()
    elif fault == "lengths":
        lengths = np.load(os.path.join(directory, "lengths.npy"), mmap_mode="r+")
        lengths[7] = 99
        lengths.flush()
    else:
        meta["source_max_id"] = 32
    _resign(directory, meta)
    tokens = meta["target_tokens"]
    expected = problem.format(end=tokens - 1, tokens=tokens, length=int(fresh.lengths[7]))
    with pytest.raises(BinarizedCorpusError) as raised:
        open_binarized(directory)
    assert str(raised.value) == f"{directory}/{expected}"


def test_a_copy_of_an_earlier_format_is_named(cached):
    _, _, directory, _ = cached
    meta = json.load(open(os.path.join(directory, "meta.json")))
    meta["format"] = 1
    _resign(directory, meta)
    with pytest.raises(BinarizedCorpusError, match=re.escape(f"{directory}/meta.json: format 1; this version reads format 2")):
        open_binarized(directory)


def test_a_corpus_edited_in_place_with_its_size_and_mtime_kept_is_binarized_again(tmp_path, tokenizer, monkeypatch):
    monkeypatch.setattr(content_key, "RACY_SECONDS", 0)  # record digests of files written moments ago
    text = _text_corpus(tmp_path / "text")
    cache = str(tmp_path / "cache")
    trained = []

    def train():
        trained.append(1)
        return tokenizer

    cached_tokenizer(text, {"vocab_size": 32}, cache, train, print_fn=lambda line: None)
    first = binarized_corpus(text, tokenizer, cache, print_fn=lambda line: None, progress=False)
    record = json.load(open(os.path.join(cache, content_key.RECORD_FILE)))
    assert len(record) == 2  # both files' digests remembered

    path = text.paths[0]
    before = os.stat(path)
    content = open(path).read()
    edited = content.replace("haus", "hund", 1)  # same length
    assert edited != content and len(edited) == len(content)
    time.sleep(0.05)  # a tick of the coarse clock the kernel stamps ctime with
    with open(path, "r+") as file:  # in place: same inode
        file.write(edited)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # what rsync -t or a restore does
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns, after.st_ino) == (before.st_size, before.st_mtime_ns, before.st_ino)
    assert after.st_ctime_ns != before.st_ctime_ns

    printed = []
    cached_tokenizer(text, {"vocab_size": 32}, cache, train, print_fn=printed.append)
    assert trained == [1, 1] and printed == []  # trained again, not "reused"
    again = binarized_corpus(text, tokenizer, cache, print_fn=printed.append, progress=False)
    assert again.directory != first.directory and "written to" in printed[0]
    fresh = write_binarized(text, tokenizer, str(tmp_path / "fresh"), progress=False)
    _assert_same_ids(again, fresh)
    assert not np.array_equal(np.asarray(again.source_ids), np.asarray(first.source_ids))


def test_an_unchanged_file_is_hashed_once_and_a_just_written_one_every_time(tmp_path, monkeypatch):
    path = tmp_path / "train.de"
    path.write_text("ein haus\n")
    reads = []
    real = digests.file_digest
    monkeypatch.setattr(digests, "file_digest", lambda name: reads.append(name) or real(name))
    expected = "blake2b:" + hashlib.blake2b(b"ein haus\n", digest_size=16).hexdigest()
    # Changed less than RACY_SECONDS ago: a change within the clock's tick could go unseen, so not remembered.
    assert content_key.file_digest(str(path), str(tmp_path)) == expected
    assert content_key.file_digest(str(path), str(tmp_path)) == expected
    assert len(reads) == 2 and not (tmp_path / content_key.RECORD_FILE).exists()
    monkeypatch.setattr(content_key, "RACY_SECONDS", 0)
    content_key.file_digest(str(path), str(tmp_path))
    assert content_key.file_digest(str(path), str(tmp_path)) == expected
    assert len(reads) == 3  # remembered once settled


def test_a_damaged_kept_tokenizer_is_named_and_trained_again(tmp_path, tokenizer):
    text = _text_corpus(tmp_path / "text", _pairs(20))
    cache = str(tmp_path / "cache")
    trained = []

    def train():
        trained.append(1)
        return tokenizer

    cached_tokenizer(text, {"vocab_size": 32}, cache, train, print_fn=lambda line: None)
    (directory,) = [entry for entry in os.listdir(cache) if entry.startswith("tokenizer-")]
    model = os.path.join(cache, directory, "tokenizer.model")
    with open(model, "r+b") as file:
        file.write(b"\0" * 64)
    printed = []
    again = cached_tokenizer(text, {"vocab_size": 32}, cache, train, print_fn=printed.append)
    assert printed == [f"tokenizer: {model}: its content differs from the checksum meta.json recorded; training it again"]
    assert trained == [1, 1] and again.fingerprint == tokenizer.fingerprint
    printed.clear()
    cached_tokenizer(text, {"vocab_size": 32}, cache, train, print_fn=printed.append)
    assert printed == [f"tokenizer: reused from {os.path.join(cache, directory)} (trained before on this corpus with these settings)"]


def _staging(directory, host, pid, age_seconds=0):
    path = f"{directory}.tmp-{host}-{pid}-0a1b2c3d"
    os.makedirs(path)
    with open(os.path.join(path, "source.bin"), "wb") as file:
        file.write(b"half")
    if age_seconds:
        stamp = time.time() - age_seconds
        os.utime(path, (stamp, stamp))
    return os.path.basename(path)


def test_other_runs_staging_is_removed_only_when_abandoned(tmp_path, tokenizer):
    directory = str(tmp_path / "train")
    here = cache_staging.host_name()
    fresh_elsewhere = _staging(directory, "other-host.example", os.getpid())  # pid means nothing there
    stale_elsewhere = _staging(directory, "other-host.example", 1, cache_staging.STALE_SECONDS + 3600)
    dead_here = _staging(directory, here, 999999999)
    alive_here = _staging(directory, here, os.getpid())
    corpus = write_binarized(_pairs(50), tokenizer, directory, progress=False)
    assert sorted(os.listdir(tmp_path)) == sorted(["train", fresh_elsewhere, alive_here])
    assert stale_elsewhere not in os.listdir(tmp_path) and dead_here not in os.listdir(tmp_path)
    _assert_same_ids(corpus, write_binarized(_pairs(50), tokenizer, str(tmp_path / "fresh"), progress=False))


def test_two_runs_binarizing_the_same_corpus_both_finish_on_one_copy(tmp_path, tokenizer):
    directory = str(tmp_path / "train")
    printed = []
    finished_first = []

    def pairs_with_another_run_in_the_middle():
        for index, pair in enumerate(_pairs(50)):
            if index == 25:  # the other run starts and finishes while this one is half way
                finished_first.append(write_binarized(_pairs(50), tokenizer, directory, progress=False, print_fn=printed.append))
                assert len([entry for entry in os.listdir(tmp_path) if ".tmp-" in entry]) == 1  # this run's, kept
            yield pair

    second = write_binarized(pairs_with_another_run_in_the_middle(), tokenizer, directory, progress=False,
                             print_fn=printed.append)
    assert printed == [f"binarized corpus: another run finished {directory} first; its copy is used (verified)"]
    assert second.meta == finished_first[0].meta  # the first copy, kept
    assert os.listdir(tmp_path) == ["train"]  # this run's staging dropped
    _assert_same_ids(second, write_binarized(_pairs(50), tokenizer, str(tmp_path / "fresh"), progress=False))


def test_a_damaged_copy_found_at_the_rename_is_replaced_after_the_new_one_is_whole(tmp_path, tokenizer):
    directory = str(tmp_path / "train")

    def pairs_then_damage():
        yield from _pairs(50)
        # Another run's copy appears, then is damaged, before this run renames its own.
        write_binarized(_pairs(50), tokenizer, directory, progress=False)
        os.truncate(os.path.join(directory, "target.bin"), 10)

    printed = []
    corpus = write_binarized(pairs_then_damage(), tokenizer, directory, progress=False, print_fn=printed.append)
    assert printed == [] and os.listdir(tmp_path) == ["train"]  # the damaged one moved aside, then deleted
    open_binarized(directory)  # whole
    _assert_same_ids(corpus, write_binarized(_pairs(50), tokenizer, str(tmp_path / "fresh"), progress=False))

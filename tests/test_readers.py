"""Corpus readers on small files written here: pairs, stats, and every malformed case."""

import collections
import gzip
import re

import pytest

from keras_transformer.data import readers
from keras_transformer.data.readers import ReadStats, load_tfds, read_parallel_files, read_tsv

PAIRS = [("on May 29, 2048", "am 29. Mai 2048"), ("I have two apples", "ich habe zwei Äpfel")]


def _write(path, data):
    """Write bytes, or str as UTF-8, gzip-compressed when the name ends in .gz."""
    data = data.encode("utf-8") if isinstance(data, str) else data
    if str(path).endswith(".gz"):
        data = gzip.compress(data)
    path.write_bytes(data)
    return path


def _parallel(tmp_path, source, target, suffix=""):
    return (
        _write(tmp_path / f"train.en{suffix}", source),
        _write(tmp_path / f"train.de{suffix}", target),
    )


def _at(path, line):
    return re.escape(f"{path}, line {line}: ")


# --- parallel files ---------------------------------------------------------------


def test_parallel_files_read_pairs_and_stats(tmp_path):
    # CRLF endings, a byte-order mark and surrounding spaces are not part of a sentence.
    source, target = _parallel(
        tmp_path,
        "\ufeffon May 29, 2048\r\n  I have two apples \n",
        "am 29. Mai 2048\nich habe zwei Äpfel",
    )
    pairs, stats = read_parallel_files(source, target)
    assert pairs == PAIRS
    assert stats == ReadStats(
        pairs_read=2, skipped=0, skipped_reasons=collections.Counter(),
        paths=(str(source), str(target)),
    )


@pytest.mark.parametrize("source_suffix,target_suffix", [(".gz", ".gz"), ("", ".gz")])
def test_parallel_files_read_gzip(tmp_path, source_suffix, target_suffix):
    source = _write(tmp_path / f"a.en{source_suffix}", "on May 29, 2048\nI have two apples\n")
    target = _write(tmp_path / f"a.de{target_suffix}", "am 29. Mai 2048\nich habe zwei Äpfel\n")
    pairs, stats = read_parallel_files(source, target)
    assert pairs == PAIRS
    assert stats.pairs_read == 2


def test_parallel_files_refuse_gz_that_is_not_gzip(tmp_path):
    source = _write(tmp_path / "a.en.gz", "compressed\n")
    target = tmp_path / "a.de.gz"
    target.write_bytes(b"not compressed\n")
    with pytest.raises(ValueError, match=re.escape(f"{target}: could not read the file")):
        read_parallel_files(source, target)


@pytest.mark.parametrize("skip_malformed", [False, True])
def test_parallel_files_refuse_unequal_line_counts(tmp_path, skip_malformed):
    source, target = _parallel(tmp_path, "a\nb\nc\n", "x\ny\n")
    message = re.escape(
        f"{target} ends after line 2 but {source} has a line 3. Expected the same "
        "number of lines in both files"
    )
    with pytest.raises(ValueError, match=message):
        read_parallel_files(source, target, skip_malformed=skip_malformed)
    # The other way round names the other file.
    source, target = _parallel(tmp_path, "a\n", "x\ny\n")
    with pytest.raises(ValueError, match=re.escape(f"{source} ends after line 1 but {target}")):
        read_parallel_files(source, target, skip_malformed=skip_malformed)


def test_parallel_files_refuse_invalid_utf8(tmp_path):
    source, target = _parallel(tmp_path, b"ok\ncaf\xe9\n", b"gut\nCaf\xc3\xa9\n")
    message = _at(source, 2) + re.escape("invalid UTF-8 at byte 3 (b'\\xe9'). Expected UTF-8")
    with pytest.raises(ValueError, match=message):
        read_parallel_files(source, target)


@pytest.mark.parametrize("blank", ["", "   ", "\t"])
def test_parallel_files_refuse_empty_lines(tmp_path, blank):
    source, target = _parallel(tmp_path, "a\nb\nc\n", f"x\ny\n{blank}\n")
    message = _at(target, 3) + "empty line. Expected one non-empty sentence"
    with pytest.raises(ValueError, match=message):
        read_parallel_files(source, target)


def test_parallel_files_skip_and_count_malformed_pairs(tmp_path):
    source, target = _parallel(
        tmp_path,
        b"one\n\ntwo\nthree\nfour\n\xff\n",
        b"eins\nleer\n\nzwei\xfe\nvier\nfunf\n",
    )
    pairs, stats = read_parallel_files(source, target, skip_malformed=True)
    assert pairs == [("one", "eins"), ("four", "vier")]
    assert stats.pairs_read == 2
    assert stats.skipped == 4
    assert stats.skipped_reasons == collections.Counter(
        {readers.EMPTY_LINE: 2, readers.INVALID_UTF8: 2}
    )


def test_parallel_files_refuse_missing_file(tmp_path):
    source = _write(tmp_path / "train.en", "a\n")
    missing = tmp_path / "nope.de"
    with pytest.raises(FileNotFoundError, match=re.escape(f"Corpus file not found: {missing}")):
        read_parallel_files(source, missing)
    with pytest.raises(FileNotFoundError, match=re.escape(str(missing))):
        read_parallel_files(missing, source, skip_malformed=True)


def test_parallel_files_refuse_empty_corpus(tmp_path):
    source, target = _parallel(tmp_path, "", "")
    with pytest.raises(ValueError, match=re.escape(
        f"No sentence pairs in {source}, {target}. Expected at least one pair."
    )):
        read_parallel_files(source, target)
    # Everything skipped is an empty corpus too, and the message says why.
    source, target = _parallel(tmp_path, "\na\n", "x\n \n")
    with pytest.raises(ValueError, match="; all 2 were malformed and skipped"):
        read_parallel_files(source, target, skip_malformed=True)


# --- tab-separated -----------------------------------------------------------------


def test_tsv_reads_pairs_from_chosen_columns(tmp_path):
    path = _write(
        tmp_path / "pairs.tsv",
        "on May 29, 2048\tam 29. Mai 2048\tsource-1\n"
        "I have two apples\tich habe zwei Äpfel\tsource-2\n",
    )
    pairs, stats = read_tsv(path)
    assert pairs == PAIRS
    assert stats == ReadStats(pairs_read=2, paths=(str(path),))
    swapped, _ = read_tsv(path, source_column=1, target_column=0)
    assert swapped == [(german, english) for english, german in PAIRS]
    ids, _ = read_tsv(path, source_column=2, target_column=0)
    assert ids == [("source-1", "on May 29, 2048"), ("source-2", "I have two apples")]


def test_tsv_reads_gzip(tmp_path):
    path = _write(tmp_path / "pairs.tsv.gz", "on May 29, 2048\tam 29. Mai 2048\n")
    pairs, _ = read_tsv(path)
    assert pairs == PAIRS[:1]


def test_tsv_refuses_missing_tab(tmp_path):
    path = _write(tmp_path / "pairs.tsv", "a\tx\nb with no tab\nc\ty\n")
    message = _at(path, 2) + re.escape(
        "found 1 tab-separated column(s). Expected at least 2 (source in column 0, "
        "target in column 1); is a tab missing?"
    )
    with pytest.raises(ValueError, match=message):
        read_tsv(path)
    with pytest.raises(ValueError, match=_at(path, 1) + re.escape("found 2 tab-separated")):
        read_tsv(path, target_column=2)


def test_tsv_refuses_empty_field_and_invalid_utf8(tmp_path):
    path = _write(tmp_path / "pairs.tsv", b"a\tx\nb\t \n")
    with pytest.raises(ValueError, match=_at(path, 2) + re.escape("empty target (column 1)")):
        read_tsv(path)
    path = _write(tmp_path / "pairs.tsv", b"a\tx\n\t \nb\t\x80\n")
    with pytest.raises(ValueError, match=_at(path, 2) + "empty line"):
        read_tsv(path)
    path = _write(tmp_path / "pairs.tsv", b"a\tx\nb\t\x80\n")
    with pytest.raises(ValueError, match=_at(path, 2) + "invalid UTF-8 at byte 2"):
        read_tsv(path)


def test_tsv_skips_and_counts_malformed_lines(tmp_path):
    path = _write(tmp_path / "pairs.tsv", b"a\tx\nno tab\n\tx\nb\t\x80\nc\ty\n")
    pairs, stats = read_tsv(path, skip_malformed=True)
    assert pairs == [("a", "x"), ("c", "y")]
    assert stats.skipped == 3
    assert stats.skipped_reasons == collections.Counter(
        {readers.MISSING_COLUMN: 1, readers.EMPTY_LINE: 1, readers.INVALID_UTF8: 1}
    )


def test_tsv_refuses_missing_file_and_empty_corpus(tmp_path):
    with pytest.raises(FileNotFoundError, match=re.escape(str(tmp_path / "none.tsv"))):
        read_tsv(tmp_path / "none.tsv")
    path = _write(tmp_path / "empty.tsv", "")
    with pytest.raises(ValueError, match=re.escape(f"No sentence pairs in {path}.")):
        read_tsv(path)


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"source_column": -1}, "`source_column` must be an integer >= 0. Received: source_column=-1"),
        ({"target_column": "1"}, "`target_column` must be an integer >= 0. Received: target_column='1'"),
        ({"target_column": 0}, "`source_column` and `target_column` must differ. Received: source_column=0, target_column=0"),
    ],
)
def test_tsv_refuses_bad_columns(tmp_path, kwargs, message):
    path = _write(tmp_path / "pairs.tsv", "a\tx\n")
    with pytest.raises(ValueError, match=re.escape(message)):
        read_tsv(path, **kwargs)


# --- TFDS --------------------------------------------------------------------------

TFDS_EXAMPLES = [
    {"en": "on May 29, 2048", "de": "am 29. Mai 2048"},
    {"en": "I have two apples", "de": "ich habe zwei Äpfel"},
    {"en": "a blank target", "de": "  "},
    {"en": b"not UTF-8: \xe9", "de": "kein UTF-8"},
]


@pytest.fixture(scope="module")
def tfds_data_dir(tmp_path_factory):
    """A tiny TFDS translation dataset prepared locally; nothing is downloaded."""
    tfds = pytest.importorskip("tensorflow_datasets", reason="tensorflow_datasets is not installed")

    class KerasTransformerTinyTranslation(tfds.core.GeneratorBasedBuilder):
        """Three English-German pairs in a `train` split, in the order written."""

        VERSION = tfds.core.Version("1.0.0")

        def _info(self):
            return tfds.core.DatasetInfo(
                builder=self,
                features=tfds.features.Translation(languages=("de", "en")),
                disable_shuffling=True,
            )

        def _split_generators(self, dl_manager):
            return {"train": self._generate_examples()}

        def _generate_examples(self):
            for key, example in enumerate(TFDS_EXAMPLES):
                yield key, example

    data_dir = tmp_path_factory.mktemp("tfds")
    KerasTransformerTinyTranslation(data_dir=data_dir).download_and_prepare()
    return data_dir


def _load_tiny(data_dir, **kwargs):
    kwargs = {"split": "train", "source_lang": "en", "target_lang": "de", **kwargs}
    return load_tfds("keras_transformer_tiny_translation", data_dir=data_dir, **kwargs)


def test_tfds_loads_pairs_by_language(tfds_data_dir):
    pairs, stats = _load_tiny(tfds_data_dir, split="train[:2]")
    assert pairs == PAIRS
    assert stats == ReadStats(pairs_read=2, paths=("keras_transformer_tiny_translation/train[:2]",))
    reversed_pairs, _ = _load_tiny(tfds_data_dir, split="train[:2]", source_lang="de", target_lang="en")
    assert reversed_pairs == [(german, english) for english, german in PAIRS]


def test_tfds_refuses_or_skips_malformed_examples(tfds_data_dir):
    message = re.escape(
        "keras_transformer_tiny_translation/train[:3], example 3: empty 'de' sentence. "
        "Expected one non-empty sentence."
    )
    with pytest.raises(ValueError, match=message):
        _load_tiny(tfds_data_dir, split="train[:3]")
    message = re.escape(
        "keras_transformer_tiny_translation/train[3:], example 1: invalid UTF-8 at byte 11"
    )
    with pytest.raises(ValueError, match=message):
        _load_tiny(tfds_data_dir, split="train[3:]")
    pairs, stats = _load_tiny(tfds_data_dir, skip_malformed=True)
    assert pairs == PAIRS
    assert (stats.pairs_read, stats.skipped) == (2, 2)
    assert stats.skipped_reasons == collections.Counter(
        {readers.EMPTY_LINE: 1, readers.INVALID_UTF8: 1}
    )


def test_tfds_refuses_unknown_language(tfds_data_dir):
    message = re.escape(
        "`target_lang` must be a language of keras_transformer_tiny_translation, one of "
        "['de', 'en']. Received: target_lang='fr'"
    )
    with pytest.raises(ValueError, match=message):
        _load_tiny(tfds_data_dir, target_lang="fr")


def test_tfds_streams_and_binarizes_through_text_corpus(tfds_data_dir, tmp_path):
    from keras_transformer.data.text_corpus import TextCorpus, binarized_corpus
    from keras_transformer.data.tokenizer import train_tokenizer

    corpus = TextCorpus(
        "tfds", tfds_name="keras_transformer_tiny_translation", split="train", source_lang="en",
        target_lang="de", data_dir=str(tfds_data_dir), skip_malformed=True,
    )
    stats = ReadStats()
    stream = corpus.read(stats)
    assert next(stream) == PAIRS[0] and stats.pairs_read == 1  # read one example at a time
    assert list(stream) == PAIRS[1:] and (stats.pairs_read, stats.skipped) == (2, 2)
    tokenizer = train_tokenizer([side for pair in PAIRS for side in pair] * 10, 36)
    binarized = binarized_corpus(corpus, tokenizer, str(tmp_path), print_fn=lambda line: None, progress=False)
    assert binarized.num_pairs == 2 and binarized.meta["skipped"] == 2
    assert binarized.pair_ids(1)[1].tolist() == tokenizer.encode([PAIRS[1][1]])[0]


def test_streaming_readers_yield_one_pair_at_a_time(tmp_path):
    source, target = _parallel(tmp_path, "a\nb\n", "x\n\n")
    stats = ReadStats()
    stream = readers.iter_parallel_files(source, target, stats=stats)
    assert next(stream) == ("a", "x") and stats.pairs_read == 1
    with pytest.raises(ValueError, match=_at(target, 2)):  # the bad line is named when it is reached
        next(stream)
    tsv = _write(tmp_path / "a.tsv", "a\tx\nb\n")
    stats = ReadStats()
    assert list(readers.iter_tsv(tsv, skip_malformed=True, stats=stats)) == [("a", "x")]
    assert stats.skipped_reasons == collections.Counter({readers.MISSING_COLUMN: 1})

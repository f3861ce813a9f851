"""Corpus readers: parallel text files, tab-separated pairs and TFDS translation sets.

Each corpus has two readers. `iter_*` streams the `(source, target)` string pairs one
at a time, in bounded memory whatever the corpus size (what binarizing a big corpus
reads), filling in a `ReadStats` as it goes. `read_*` / `load_tfds` return the same
pairs as a list with the `ReadStats` saying how many were read, skipped and why.
Malformed input (a missing tab, unequal line counts, invalid UTF-8, an empty line)
raises `ValueError` naming the file, the 1-based line number and what was expected.
With `skip_malformed=True` a bad pair is skipped and counted instead, except where
skipping cannot repair the input: parallel files of unequal length have lost their
alignment, so that stays an error. A corpus with no pairs at all is an error too.
"""

import collections
import dataclasses
import gzip
import itertools
import os

from keras_transformer import checks
from collections.abc import Iterator

# Reasons counted in `ReadStats.skipped_reasons`, one per kind of malformed pair.
EMPTY_LINE = "empty line"
INVALID_UTF8 = "invalid UTF-8"
MISSING_COLUMN = "missing tab-separated column"


@dataclasses.dataclass
class ReadStats:
    """What a reader read: pairs kept, pairs skipped and why, and from where.

    Args:
        pairs_read: int. Number of pairs returned.
        skipped: int. Number of malformed pairs dropped (only with `skip_malformed`).
        skipped_reasons: `collections.Counter` from reason (`EMPTY_LINE`,
            `INVALID_UTF8`, `MISSING_COLUMN`) to count; sums to `skipped`.
        paths: tuple of str. The files (or the TFDS `name/split`) read.

    Example:
        >>> stats = ReadStats(pairs_read=2, paths=("train.en", "train.de"))
        >>> stats.skipped
        0
    """

    pairs_read: int = 0
    skipped: int = 0
    skipped_reasons: collections.Counter = dataclasses.field(
        default_factory=collections.Counter
    )
    paths: tuple = ()


class _Malformed(Exception):
    """A malformed pair: its location and reason, raised or counted by the caller."""

    def __init__(self, reason, message):
        super().__init__(message)
        self.reason = reason


def _open_binary(path):
    """Open `path` for reading bytes, through gzip when its name ends in `.gz`."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"Corpus file not found: {path}")
    if str(path).endswith(".gz"):
        return gzip.open(path, "rb")
    return open(path, "rb")


def _numbered_lines(path) -> Iterator[tuple[int, bytes]]:
    """Yield `(line_number, raw_line)` from `path`, 1-based, line ending removed."""
    with _open_binary(path) as handle:
        try:
            for number, line in enumerate(handle, start=1):
                yield number, line.rstrip(b"\r\n")
        except (OSError, EOFError) as error:  # gzip.BadGzipFile is an OSError
            raise ValueError(
                f"{path}: could not read the file: {error}. Expected plain text, "
                "or gzip-compressed text when the name ends in .gz."
            ) from error


def _decode(raw, where, first_line=False) -> str:
    """Decode one line as UTF-8; a byte-order mark opening a file is dropped."""
    try:
        return raw.decode("utf-8-sig" if first_line else "utf-8")
    except UnicodeDecodeError as error:
        raise _Malformed(
            INVALID_UTF8,
            f"{where}: invalid UTF-8 at byte {error.start} "
            f"({raw[error.start:error.start + 1]!r}). Expected UTF-8 text.",
        ) from None


def _sentence(text, where, what="line") -> str:
    """Return `text` stripped, or raise when nothing but whitespace is left."""
    sentence = text.strip()
    if not sentence:
        raise _Malformed(
            EMPTY_LINE,
            f"{where}: empty {what}. Expected one non-empty sentence.",
        )
    return sentence


def refuse_empty(stats):
    """Raise `ValueError` when a finished read kept no pair (saying how many were skipped)."""
    if not stats.pairs_read:
        skipped = (
            f"; all {stats.skipped} were malformed and skipped "
            f"({dict(stats.skipped_reasons)})"
            if stats.skipped
            else ""
        )
        raise ValueError(
            f"No sentence pairs in {', '.join(map(str, stats.paths))}{skipped}. "
            "Expected at least one pair."
        )


def _finish(pairs, stats) -> tuple[list, ReadStats]:
    """`(pairs, stats)` of a whole read; an empty corpus is refused."""
    refuse_empty(stats)
    return pairs, stats


def _kept(pair, stats):
    """Count a pair as read and return it."""
    stats.pairs_read += 1
    return pair


def _keep_or_raise(error, stats, skip_malformed):
    """Count a malformed pair when skipping is allowed, else raise its message."""
    if not skip_malformed:
        raise ValueError(str(error)) from None
    stats.skipped += 1
    stats.skipped_reasons[error.reason] += 1


def read_parallel_files(
    source_path, target_path, *, skip_malformed=False
) -> tuple[list[tuple[str, str]], ReadStats]:
    """Read sentence pairs from two aligned files, one sentence per line.

    Line i of `source_path` translates to line i of `target_path`. Files whose
    name ends in `.gz` are read through gzip. Sentences are stripped of
    surrounding whitespace. An empty or whitespace-only line, or a line that is
    not UTF-8, raises `ValueError` naming the file and line, or with
    `skip_malformed=True` drops that pair and counts it in the stats. Files with
    different numbers of lines always raise, since the alignment is lost.

    Args:
        source_path: str or path-like. Source-language file.
        target_path: str or path-like. Target-language file, same line count.
        skip_malformed: bool, default False. Skip and count malformed pairs
            instead of raising.

    Returns:
        `(pairs, stats)`: a list of `(source, target)` str tuples and a
        `ReadStats`.

    Example:

        ```python
        pairs, stats = read_parallel_files("train.en", "train.de.gz")
        pairs[0]
        # ('on May 29, 2048', 'am 29. Mai 2048')
        ```
    """
    source_path, target_path = os.fspath(source_path), os.fspath(target_path)
    stats = ReadStats(paths=(source_path, target_path))
    pairs = list(iter_parallel_files(source_path, target_path, skip_malformed=skip_malformed, stats=stats))
    return _finish(pairs, stats)


def iter_parallel_files(source_path, target_path, *, skip_malformed=False, stats=None) -> Iterator[tuple[str, str]]:
    """`read_parallel_files`'s pairs one at a time, in bounded memory.

    The same checks and messages; `stats` (a `ReadStats`, optional) is filled in as the
    pairs are read. An empty corpus is not refused here: call `refuse_empty(stats)` at
    the end.
    """
    source_path, target_path = os.fspath(source_path), os.fspath(target_path)
    stats = stats if stats is not None else ReadStats(paths=(source_path, target_path))
    last = 0
    lines = itertools.zip_longest(
        _numbered_lines(source_path), _numbered_lines(target_path)
    )
    for source_line, target_line in lines:
        if source_line is None or target_line is None:
            shorter, longer = (
                (source_path, target_path)
                if source_line is None
                else (target_path, source_path)
            )
            raise ValueError(
                f"{shorter} ends after line {last} but {longer} has a line "
                f"{last + 1}. Expected the same number of lines in both files "
                "(one sentence per line, aligned)."
            )
        last = source_line[0]
        try:
            source = _line_sentence(source_path, *source_line)
            target = _line_sentence(target_path, *target_line)
        except _Malformed as error:
            _keep_or_raise(error, stats, skip_malformed)
            continue
        yield _kept((source, target), stats)


def _line_sentence(path, number, raw) -> str:
    """The sentence on line `number` of a one-sentence-per-line file."""
    where = f"{path}, line {number}"
    return _sentence(_decode(raw, where, first_line=number == 1), where)


def read_tsv(
    path, *, source_column=0, target_column=1, skip_malformed=False
) -> tuple[list[tuple[str, str]], ReadStats]:
    """Read sentence pairs from a tab-separated file, one pair per line.

    Each line is split on tabs and the pair is taken from columns
    `source_column` and `target_column` (0-based); other columns are ignored.
    A `.gz` file is read through gzip. A line with too few columns (a missing
    tab), an empty sentence or invalid UTF-8 raises `ValueError` naming the file
    and line, or with `skip_malformed=True` is skipped and counted.

    Args:
        path: str or path-like. The tab-separated file.
        source_column: int, default 0. Column of the source sentence.
        target_column: int, default 1. Column of the target sentence.
        skip_malformed: bool, default False. Skip and count malformed lines
            instead of raising.

    Returns:
        `(pairs, stats)`: a list of `(source, target)` str tuples and a
        `ReadStats`.

    Example:

        ```python
        pairs, stats = read_tsv("train.tsv")  # "on May 29, 2048\\tam 29. Mai 2048"
        pairs[0]
        # ('on May 29, 2048', 'am 29. Mai 2048')
        ```
    """
    path = os.fspath(path)
    stats = ReadStats(paths=(path,))
    pairs = list(
        iter_tsv(path, source_column=source_column, target_column=target_column,
                 skip_malformed=skip_malformed, stats=stats)
    )
    return _finish(pairs, stats)


def iter_tsv(path, *, source_column=0, target_column=1, skip_malformed=False, stats=None) -> Iterator[tuple[str, str]]:
    """`read_tsv`'s pairs one at a time, in bounded memory, filling in `stats` as it goes."""
    checks.check_non_negative_int("source_column", source_column)
    checks.check_non_negative_int("target_column", target_column)
    if source_column == target_column:
        raise ValueError(
            "`source_column` and `target_column` must differ. Received: "
            f"source_column={source_column}, target_column={target_column}"
        )
    path = os.fspath(path)
    stats = stats if stats is not None else ReadStats(paths=(path,))
    for number, raw in _numbered_lines(path):
        try:
            pair = _tsv_pair(f"{path}, line {number}", raw, number, source_column, target_column)
        except _Malformed as error:
            _keep_or_raise(error, stats, skip_malformed)
            continue
        yield _kept(pair, stats)


def _tsv_pair(where, raw, number, source_column, target_column) -> tuple[str, str]:
    """The `(source, target)` of one tab-separated line, or `_Malformed`."""
    needed = max(source_column, target_column) + 1
    line = _decode(raw, where, first_line=number == 1)
    _sentence(line, where)  # a blank line is empty, not a missing tab
    fields = line.split("\t")
    if len(fields) < needed:
        raise _Malformed(
            MISSING_COLUMN,
            f"{where}: found {len(fields)} tab-separated "
            f"column(s). Expected at least {needed} (source in column "
            f"{source_column}, target in column {target_column}); is a tab "
            "missing?",
        )
    source = _sentence(fields[source_column], where, f"source (column {source_column})")
    target = _sentence(fields[target_column], where, f"target (column {target_column})")
    return source, target


def load_tfds(
    name,
    *,
    split,
    source_lang,
    target_lang,
    data_dir=None,
    download=False,
    skip_malformed=False,
) -> tuple[list[tuple[str, str]], ReadStats]:
    """Read sentence pairs from a TFDS translation dataset, such as `wmt14_translate/de-en`.

    TFDS translation datasets yield one dict per example keyed by language code
    (`{"de": b"...", "en": b"..."}`). This loads `split` with `tfds.load` and
    returns the `source_lang` and `target_lang` entries as str pairs. Nothing is
    downloaded unless `download=True`; by default the data must already be
    prepared under `data_dir` (TFDS's default directory when None). Invalid
    UTF-8 or an empty sentence raises `ValueError` naming the example (1-based),
    or with `skip_malformed=True` is skipped and counted.

    Args:
        name: str. TFDS dataset name, with config if any (`"wmt14_translate/de-en"`).
        split: str. TFDS split, e.g. `"train"`, `"validation"`, `"test[:1000]"`.
        source_lang: str. Key of the source sentence in each example, e.g. `"en"`.
        target_lang: str. Key of the target sentence, e.g. `"de"`.
        data_dir: str, optional. Where the prepared dataset lives.
        download: bool, default False. Let TFDS download and prepare the data.
        skip_malformed: bool, default False. Skip and count malformed examples
            instead of raising.

    Returns:
        `(pairs, stats)`: a list of `(source, target)` str tuples and a
        `ReadStats` whose `paths` is `("name/split",)`.

    Example:

        ```python
        pairs, stats = load_tfds("wmt14_translate/de-en", split="test",
                                 source_lang="en", target_lang="de")
        ```
    """
    stats = ReadStats(paths=(f"{name}/{split}",))
    pairs = list(
        iter_tfds(name, split=split, source_lang=source_lang, target_lang=target_lang,
                  data_dir=data_dir, download=download, skip_malformed=skip_malformed, stats=stats)
    )
    return _finish(pairs, stats)


def iter_tfds(
    name, *, split, source_lang, target_lang, data_dir=None, download=False, skip_malformed=False, stats=None
) -> Iterator[tuple[str, str]]:
    """`load_tfds`'s pairs one at a time, in bounded memory, filling in `stats` as it goes.

    TFDS reads its record files lazily, so a split of any size streams through.
    """
    # Imported here because it is an optional dependency (the `tfds` extra) and
    # slow to import; the file readers above do not need it.
    import tensorflow_datasets as tfds

    dataset_split = f"{name}/{split}"
    dataset = tfds.load(name, split=split, data_dir=data_dir, download=download)
    keys = dataset.element_spec.keys() if isinstance(dataset.element_spec, dict) else ()
    for lang_name, lang in (("source_lang", source_lang), ("target_lang", target_lang)):
        if lang not in keys:
            raise ValueError(
                f"`{lang_name}` must be a language of {name}, one of "
                f"{sorted(keys)}. Received: {lang_name}={lang!r}"
            )
    stats = stats if stats is not None else ReadStats(paths=(dataset_split,))
    for number, example in enumerate(tfds.as_numpy(dataset), start=1):
        where = f"{dataset_split}, example {number}"
        try:
            source, target = (
                _sentence(_decode(example[lang], where), where, f"{lang!r} sentence")
                for lang in (source_lang, target_lang)
            )
        except _Malformed as error:
            _keep_or_raise(error, stats, skip_malformed)
            continue
        yield _kept((source, target), stats)

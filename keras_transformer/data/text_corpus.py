"""A training split streamed from its files (or TFDS), and its binarized copy, cached by a key.

A corpus of millions of pairs is never a Python list here: `TextCorpus` iterates its
pairs through the streaming readers (`data.readers.iter_*`), and `binarized_corpus`
tokenizes them once into memory-mapped arrays (`data.binarized`) under a directory
named by a hash of what made them: the files (path, size, modification time) or the
TFDS split, the pair limit, `skip_malformed`, and the tokenizer's fingerprint. A later
run with the same corpus and tokenizer opens that directory at once; `cached_tokenizer`
keeps the tokenizer trained on the corpus beside it, so that run trains none either.
"""

import dataclasses
import hashlib
import itertools
import json
import os

from keras_transformer.data import readers
from keras_transformer.data.binarized import META_FILE, FORMAT_VERSION, open_binarized, write_binarized

CORPUS_KINDS = ("files", "tsv", "tfds")


@dataclasses.dataclass(frozen=True)
class TextCorpus:
    """The pairs of one split, read on demand; iterating it streams them.

    Args:
        kind: `"files"` (`paths` = source and target file), `"tsv"` (`paths` = one file)
            or `"tfds"` (`tfds_name`, `split`, `source_lang`, `target_lang`, `data_dir`).
        paths: tuple of str.
        tfds_name, split, source_lang, target_lang, data_dir: the TFDS split's.
        skip_malformed: bool, skip and count malformed pairs instead of raising.
        max_pairs: int, keep the first N pairs; 0 keeps all.
    """

    kind: str
    paths: tuple = ()
    tfds_name: str = ""
    split: str = ""
    source_lang: str = ""
    target_lang: str = ""
    data_dir: str = ""
    skip_malformed: bool = False
    max_pairs: int = 0

    def __post_init__(self):
        if self.kind not in CORPUS_KINDS:
            raise ValueError(f"`kind` must be one of {CORPUS_KINDS}. Received: kind={self.kind!r}")

    def read(self, stats=None):
        """The pairs, one at a time; `stats` (a `readers.ReadStats`) is filled in as they come."""
        if self.kind == "files":
            pairs = readers.iter_parallel_files(*self.paths, skip_malformed=self.skip_malformed, stats=stats)
        elif self.kind == "tsv":
            pairs = readers.iter_tsv(self.paths[0], skip_malformed=self.skip_malformed, stats=stats)
        else:
            pairs = readers.iter_tfds(
                self.tfds_name, split=self.split, source_lang=self.source_lang, target_lang=self.target_lang,
                data_dir=self.data_dir or None, skip_malformed=self.skip_malformed, stats=stats,
            )
        return itertools.islice(pairs, self.max_pairs or None)

    def __iter__(self):
        return self.read()

    def describe(self):
        """What names this corpus's content: files with their size and modification time, or the TFDS split."""
        if self.kind == "tfds":
            sources = [f"tfds:{self.tfds_name}/{self.split}:{self.source_lang}-{self.target_lang}:{self.data_dir}"]
        else:
            sources = []
            for path in self.paths:
                status = os.stat(path)  # FileNotFoundError names a missing file
                sources.append(f"{os.path.abspath(path)}:{status.st_size}:{status.st_mtime_ns}")
        return {"sources": sources, "skip_malformed": self.skip_malformed, "max_pairs": self.max_pairs}


def binarized_corpus(corpus, tokenizer, cache_dir, *, vocab_size=None, print_fn=print, progress=True):
    """The binarized copy of `corpus` cut by `tokenizer`: opened from `cache_dir` if made before, else made.

    Args:
        corpus: a `TextCorpus`.
        tokenizer: the run's `SubwordTokenizer`.
        cache_dir: str, the directory of binarized corpora; each gets a subdirectory named by its key.
        vocab_size: int, the model's vocabulary (ids are checked against it).
        print_fn: callable for one line saying what was made or opened.
        progress: bool, a progress bar while binarizing.

    Returns:
        The opened `BinarizedCorpus`.

    Raises:
        ValueError: a malformed pair (without `skip_malformed`), or no pairs at all; as the
            readers raise, naming the file and line.
    """
    description = {**corpus.describe(), "tokenizer_sha256": tokenizer.fingerprint, "vocab_size": vocab_size,
                   "format": FORMAT_VERSION}
    key = hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:16]
    directory = os.path.join(cache_dir, f"{corpus.split or corpus.kind}-{key}")
    if os.path.isfile(os.path.join(directory, META_FILE)):
        binarized = open_binarized(directory)
        print_fn(f"binarized corpus: {binarized.num_pairs:,} pairs, opened from {directory}")
        return binarized
    os.makedirs(cache_dir, exist_ok=True)
    stats = readers.ReadStats(paths=tuple(corpus.paths) or (f"{corpus.tfds_name}/{corpus.split}",))
    binarized = write_binarized(
        _refusing_empty(corpus.read(stats), stats), tokenizer, directory, vocab_size=vocab_size, progress=progress,
        extra_meta=lambda: {"read": description, "skipped": stats.skipped, "skipped_reasons": dict(stats.skipped_reasons)},
    )
    skipped = f"; {stats.skipped} malformed pairs skipped ({dict(stats.skipped_reasons)})" if stats.skipped else ""
    print_fn(
        f"binarized corpus: {binarized.num_pairs:,} pairs in {binarized.meta['seconds']:.0f} s, "
        f"written to {directory} (later runs open it at once){skipped}"
    )
    return binarized


def cached_tokenizer(corpus, settings, cache_dir, train, print_fn=print):
    """The tokenizer `train()` makes from `corpus` with `settings`: loaded from `cache_dir` if made before.

    Training is deterministic (the same sentences and options give the same bytes,
    `train_tokenizer`), so a tokenizer kept under a key of the corpus and the settings is
    the one training would make again; a later run skips reading and training.

    Args:
        corpus: a `TextCorpus`.
        settings: dict of everything else that shapes the tokenizer (vocabulary size,
            model type, sentence cap, seed, options).
        cache_dir: str, the directory of binarized corpora.
        train: callable returning a new `SubwordTokenizer`.
        print_fn: callable for the line saying it was reused.
    """
    from keras_transformer.data.tokenizer import SubwordTokenizer

    description = {**corpus.describe(), "tokenizer": settings}
    key = hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:16]
    directory = os.path.join(cache_dir, f"tokenizer-{key}")
    if os.path.isdir(directory):
        print_fn(f"tokenizer: reused from {directory} (trained before on this corpus with these settings)")
        return SubwordTokenizer.load(directory)
    tokenizer = train()
    tokenizer.save(directory)
    return tokenizer


def _refusing_empty(pairs, stats):
    """`pairs`, then `readers.refuse_empty(stats)` once they are exhausted."""
    yield from pairs
    readers.refuse_empty(stats)


__all__ = ["CORPUS_KINDS", "TextCorpus", "binarized_corpus", "cached_tokenizer"]

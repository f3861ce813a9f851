"""A training split streamed from its files (or TFDS), and its binarized copy, cached by a key of its content.

A corpus of millions of pairs is never a Python list here: `TextCorpus` iterates its
pairs through the streaming readers (`data.readers.iter_*`), and `binarized_corpus`
tokenizes them once into memory-mapped arrays (`data.binarized`) under a directory
named by a hash of what made them: the blake2b of each input file's content
(`data.content_key`) or the TFDS split's name, the pair limit, `skip_malformed`, and
the tokenizer's fingerprint. A later run with the same corpus and tokenizer opens that
directory at once; `cached_tokenizer` keeps the tokenizer trained on the corpus beside
it, under the same content key, so that run trains none either. Neither cache is
trusted blindly: the binarized copy is verified at every open (`open_binarized`), the
tokenizer against the checksum recorded beside it, and one that fails is made again,
with one line saying which file and what was wrong.
"""

import dataclasses
import hashlib
import itertools
import json
import os

from keras_transformer import interrupts
from keras_transformer.atomic import write_text_atomically
from keras_transformer.data import content_key, readers
from keras_transformer.data.binarized import FORMAT_VERSION, META_FILE, BinarizedCorpusError, open_binarized, write_binarized

CORPUS_KINDS = ("files", "tsv", "tfds")
TOKENIZER_META = "meta.json"  # beside a kept tokenizer: its sha256 and what it was trained on


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
        # Checked every few thousand pairs: an interrupt a gc callback swallowed stops the reading.
        return interrupts.checked(itertools.islice(pairs, self.max_pairs or None))

    def __iter__(self):
        return self.read()

    def describe(self, record_dir=None):
        """What names this corpus's content: its files' blake2b digests, or the TFDS split.

        Args:
            record_dir: str or None, where the digests of unchanged files are remembered
                (`data.content_key`): a file is read again only once it has changed.
        """
        if self.kind == "tfds":
            # A TFDS split is named by its name: its prepared files are TFDS's to keep.
            sources = [f"tfds:{self.tfds_name}/{self.split}:{self.source_lang}-{self.target_lang}:{self.data_dir}"]
        else:
            sources = [content_key.file_digest(path, record_dir) for path in self.paths]  # names a missing file
        return {"kind": self.kind, "sources": sources, "skip_malformed": self.skip_malformed, "max_pairs": self.max_pairs}


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
    description = {**corpus.describe(cache_dir), "tokenizer_sha256": tokenizer.fingerprint, "vocab_size": vocab_size,
                   "format": FORMAT_VERSION}
    key = hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:16]
    directory = os.path.join(cache_dir, f"{corpus.split or corpus.kind}-{key}")
    if os.path.lexists(directory):
        try:
            binarized = open_binarized(directory)  # verified: sizes, offsets, checksums
        except (BinarizedCorpusError, FileNotFoundError) as error:
            # Kept until the new copy replaces it (write_binarized): a cache is never left empty.
            print_fn(f"binarized corpus: {_problem(error, directory)}; binarizing it again")
        else:
            print_fn(f"binarized corpus: {binarized.num_pairs:,} pairs, opened from {directory}")
            return binarized
    os.makedirs(cache_dir, exist_ok=True)
    stats = readers.ReadStats(paths=tuple(corpus.paths) or (f"{corpus.tfds_name}/{corpus.split}",))
    binarized = write_binarized(
        _refusing_empty(corpus.read(stats), stats), tokenizer, directory, vocab_size=vocab_size, progress=progress,
        print_fn=print_fn,
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
    `train_tokenizer`), so a tokenizer kept under a key of the corpus's content (the
    same key as its binarized copy's) and the settings is the one training would make
    again; a later run skips reading and training. The kept model is used only when its
    bytes are those recorded beside it (`meta.json`'s sha256, the tokenizer's
    fingerprint); otherwise it is trained again, with one line saying why.

    Args:
        corpus: a `TextCorpus`.
        settings: dict of everything else that shapes the tokenizer (vocabulary size,
            model type, sentence cap, seed, options).
        cache_dir: str, the directory of binarized corpora.
        train: callable returning a new `SubwordTokenizer`.
        print_fn: callable for the line saying it was reused, or why it was not.
    """
    description = {**corpus.describe(cache_dir), "tokenizer": settings}
    key = hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:16]
    directory = os.path.join(cache_dir, f"tokenizer-{key}")
    if os.path.lexists(directory):
        tokenizer, problem = _kept_tokenizer(directory)
        if tokenizer is not None:
            print_fn(f"tokenizer: reused from {directory} (trained before on this corpus with these settings)")
            return tokenizer
        print_fn(f"tokenizer: {problem}; training it again")
    tokenizer = train()
    tokenizer.save(directory)  # each file written beside its name and renamed onto it
    write_text_atomically(
        os.path.join(directory, TOKENIZER_META),
        json.dumps({"tokenizer_sha256": tokenizer.fingerprint, "read": description}, indent=1),
    )
    return tokenizer


def _kept_tokenizer(directory):
    """`(tokenizer, None)` if `directory` holds the tokenizer its `meta.json` recorded, else `(None, problem)`."""
    from keras_transformer.data.tokenizer import MODEL_FILENAME, SubwordTokenizer

    meta_path, model_path = os.path.join(directory, TOKENIZER_META), os.path.join(directory, MODEL_FILENAME)
    try:
        with open(meta_path, encoding="utf-8") as file:
            expected = json.load(file)["tokenizer_sha256"]
    except FileNotFoundError:
        return None, f"{meta_path}: missing"
    except (ValueError, KeyError, TypeError) as error:
        return None, f"{meta_path}: unreadable ({error!r})"
    try:
        with open(model_path, "rb") as file:
            model_proto = file.read()
    except FileNotFoundError:
        return None, f"{model_path}: missing"
    if hashlib.sha256(model_proto).hexdigest() != expected:  # what SubwordTokenizer.fingerprint is
        return None, f"{model_path}: its content differs from the checksum {TOKENIZER_META} recorded"
    try:
        return SubwordTokenizer(model_proto, source=model_path), None
    except ValueError as error:
        return None, f"{model_path}: {error}"


def _problem(error, directory):
    """What is wrong with a binarized copy, as `PATH: what`."""
    if isinstance(error, BinarizedCorpusError):
        return str(error)
    return f"{os.path.join(directory, META_FILE)}: missing"


def _refusing_empty(pairs, stats):
    """`pairs`, then `readers.refuse_empty(stats)` once they are exhausted."""
    yield from pairs
    readers.refuse_empty(stats)


__all__ = ["CORPUS_KINDS", "TextCorpus", "binarized_corpus", "cached_tokenizer"]

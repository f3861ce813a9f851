"""What `open_binarized` checks before a binarized corpus is used, each failure naming its file.

A binarized copy is a cache: anything may have happened to it since it was written (a
disk that filled up, a copy cut short, a file zero-filled by a crash after the rename,
another tool's edit). It is used only if it is what its writer wrote:

- `meta.json` parses, has this version's format, and matches the checksum written with it;
- every file is present, with the byte size `meta.json` recorded;
- the `.npy` arrays have the recorded dtype and shape (their headers, read as mapped);
- every file's content has the blake2b `meta.json` recorded (one read of the files);
- the offsets start at 0, never decrease and end at the ids' length; `lengths.npy` is
  `max(source, target) + 1` of the offsets' differences; the ids' largest value, recorded
  while writing, is below the vocabulary size (vectorized, a block at a time).

The content checksum is verified at every open, not once per change of the files'
modification times: a damaged disk or a copy made with its times kept changes content
without them, and verifying costs one read of the files, small beside a run that reads
them for hours. A failure raises `BinarizedCorpusError` naming the file and what is
wrong, e.g. `.../source.bin: 1,048,576 bytes, meta.json says 2,097,152`.
"""

import concurrent.futures
import json
import os

import numpy as np

from keras_transformer import interrupts
from keras_transformer.data import digests

META_FILE = "meta.json"
FORMAT_VERSION = 2  # 2: sizes, checksums and the largest ids recorded in meta.json
ID_FILES = ("source.bin", "target.bin")
INDEX_FILES = ("source_offsets.npy", "target_offsets.npy", "lengths.npy")
FILES = ID_FILES + INDEX_FILES
META_CHECKSUM = "meta_blake2b"  # meta.json's checksum of its other entries

_REQUIRED = ("files", "dtype", "pairs", "source_tokens", "target_tokens", "source_max_id", "target_max_id", "vocab_size")
_BLOCK = 1 << 20  # entries per vectorized check: a few MB whatever the corpus size


class BinarizedCorpusError(ValueError):
    """A binarized corpus that is not what was written: `file` (a name in `directory`) and what is wrong."""

    def __init__(self, directory, file, problem):
        self.directory, self.file, self.problem = directory, file, problem
        super().__init__(f"{os.path.join(directory, file)}: {problem}")


def meta_checksum(meta):
    """The blake2b of `meta`'s entries but its own checksum, in a canonical JSON form."""
    digest = digests.new_digest()
    entries = {key: value for key, value in meta.items() if key != META_CHECKSUM}
    digest.update(json.dumps(entries, sort_keys=True).encode())
    return digest.hexdigest()


def read_meta(directory):
    """`meta.json` of `directory`, checked: it parses, has this format and its own checksum.

    Raises:
        FileNotFoundError: no `meta.json` (no binarized corpus there).
        BinarizedCorpusError: anything else wrong with it.
    """
    path = os.path.join(directory, META_FILE)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"No binarized corpus in {directory}: {META_FILE} is missing.")
    try:
        with open(path, encoding="utf-8") as file:
            meta = json.load(file)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise BinarizedCorpusError(directory, META_FILE, f"not JSON ({error})") from None
    if not isinstance(meta, dict):
        raise BinarizedCorpusError(directory, META_FILE, f"a JSON {type(meta).__name__}, not an object")
    if meta.get("format") != FORMAT_VERSION:
        raise BinarizedCorpusError(
            directory, META_FILE, f"format {meta.get('format')!r}; this version reads format {FORMAT_VERSION}"
        )
    if meta.get(META_CHECKSUM) != meta_checksum(meta):
        raise BinarizedCorpusError(directory, META_FILE, "its entries do not match the checksum written with them")
    missing = [key for key in _REQUIRED if key not in meta] or \
        [f"files.{name}" for name in FILES if not {"bytes", digests.NAME} <= set(meta["files"].get(name, {}))]
    if missing:
        raise BinarizedCorpusError(directory, META_FILE, f"lacks {', '.join(missing)}")
    return meta


def check_sizes(directory, meta):
    """Every file present with the byte size `meta.json` recorded (a stat each)."""
    for name in FILES:
        try:
            size = os.path.getsize(os.path.join(directory, name))
        except FileNotFoundError:
            raise BinarizedCorpusError(directory, name, "missing") from None
        expected = meta["files"][name]["bytes"]
        if size != expected:
            raise BinarizedCorpusError(directory, name, f"{size:,} bytes, {META_FILE} says {expected:,}")


def check_shapes(corpus):
    """The mapped arrays' dtypes and lengths are those `meta.json` implies."""
    meta, pairs = corpus.meta, corpus.meta["pairs"]
    expected = {
        "source.bin": (corpus.source_ids, meta["dtype"], meta["source_tokens"]),
        "target.bin": (corpus.target_ids, meta["dtype"], meta["target_tokens"]),
        "source_offsets.npy": (corpus.source_offsets, "int64", pairs + 1),
        "target_offsets.npy": (corpus.target_offsets, "int64", pairs + 1),
        "lengths.npy": (corpus.lengths, "int32", pairs),
    }
    for name, (array, dtype, length) in expected.items():
        if array.dtype != np.dtype(dtype) or array.shape != (length,):
            raise BinarizedCorpusError(
                corpus.directory, name,
                f"{array.dtype} {list(array.shape)}, {META_FILE} implies {np.dtype(dtype)} [{length}]",
            )


def check_checksums(directory, meta):
    """Every file's blake2b is the one `meta.json` recorded: one read of the files.

    The files are hashed side by side, a thread each (hashlib lets go of the GIL while it
    hashes), so the two id files, nearly all the bytes, take the time of one where
    there are cores to spare.
    """
    with concurrent.futures.ThreadPoolExecutor(min(len(FILES), os.cpu_count() or 1)) as pool:
        found = dict(zip(FILES, pool.map(digests.file_digest, [os.path.join(directory, name) for name in FILES])))
    for name in FILES:  # the first damaged file in a fixed order, whichever thread finished first
        if found[name] != meta["files"][name][digests.NAME]:
            raise BinarizedCorpusError(
                directory, name, f"its content differs from the checksum {META_FILE} recorded (changed after it was written)"
            )


def check_structure(corpus):
    """Offsets from 0 to the ids' length, never decreasing; lengths from the offsets; ids below the vocabulary."""
    directory, meta = corpus.directory, corpus.meta
    for side in ("source", "target"):
        largest = meta[f"{side}_max_id"]
        if largest >= meta["vocab_size"]:
            raise BinarizedCorpusError(
                directory, f"{side}.bin", f"holds id {largest:,}, not below vocab_size={meta['vocab_size']:,}"
            )
        offsets, name = getattr(corpus, f"{side}_offsets"), f"{side}_offsets.npy"
        if offsets[0] != 0 or offsets[-1] != len(getattr(corpus, f"{side}_ids")):
            raise BinarizedCorpusError(
                directory, name,
                f"runs from {int(offsets[0]):,} to {int(offsets[-1]):,}, not from 0 to {side}.bin's "
                f"{len(getattr(corpus, f'{side}_ids')):,} ids",
            )
    for start in range(0, corpus.num_pairs, _BLOCK):
        interrupts.raise_if_interrupted()
        stop = min(start + _BLOCK, corpus.num_pairs)
        sides = []
        for side in ("source", "target"):
            counts = np.diff(getattr(corpus, f"{side}_offsets")[start:stop + 1])
            if (counts < 0).any():
                pair = start + int(np.argmax(counts < 0))
                raise BinarizedCorpusError(directory, f"{side}_offsets.npy", f"decreases at pair {pair:,}")
            sides.append(counts)
        wrong = corpus.lengths[start:stop] != np.maximum(*sides) + 1
        if wrong.any():
            pair = start + int(np.argmax(wrong))
            raise BinarizedCorpusError(
                directory, "lengths.npy",
                f"pair {pair:,} has length {int(corpus.lengths[pair]):,}, its offsets say {int(np.maximum(*sides)[pair - start]) + 1:,}",
            )


__all__ = ["META_FILE", "FORMAT_VERSION", "FILES", "BinarizedCorpusError", "meta_checksum", "read_meta",
           "check_sizes", "check_shapes", "check_checksums", "check_structure"]

"""A corpus binarized once: its token ids in memory-mapped arrays that later runs open at once.

fairseq's answer to corpora of millions of pairs (`fairseq-preprocess`): tokenize every
pair once, write the ids back to back in one flat file per side, and keep an offset per
pair. Opening it verifies the files (one read of them, in blocks) and maps them (no
tokenizing, nothing held), so a run's memory does not grow with the corpus; a batch
gathers its pairs' ids from the pages it touches. The directory holds:

    source.bin, target.bin      every pair's ids, back to back (uint16, or int32 for a
                                vocabulary over 65,536 pieces); no BOS or EOS
    source_offsets.npy,         int64 [pairs + 1]: pair i is ids[offsets[i]:offsets[i+1]]
    target_offsets.npy
    lengths.npy                 int32 [pairs]: max(source, target) + 1, the length the
                                batches bucket by (what `data.pipeline` counts, with EOS/BOS)
    meta.json                   pairs, tokens, the tokenizer's fingerprint, what was read
                                and skipped; each file's byte size and blake2b, the
                                largest id of each side, and a checksum of itself

`write_binarized` writes it in a staging directory beside its final place
(`data.cache_staging`: named by host and process, so a cache folder shared by several
machines works) and renames it there, so a directory that exists was whole once. The
checksums are computed as the files are written: no second pass. `open_binarized`
verifies the whole copy at every open (`data.binarized_checks`: sizes, shapes, offsets,
and the checksums, one read of the files) and names the file and what is wrong when it
is not what was written; `text_corpus.binarized_corpus` then binarizes the corpus again.
"""

import dataclasses
import errno
import itertools
import json
import mmap
import os
import shutil
import time

import numpy as np

from keras_transformer import interrupts
from keras_transformer.data import binarized_checks, cache_staging, digests
from keras_transformer.data.binarized_checks import FORMAT_VERSION, META_FILE, BinarizedCorpusError

# Pairs tokenized at a time: sentencepiece's batch call amortizes the Python overhead,
# and a chunk of ~50k pairs stays a few MB whatever the corpus size.
_CHUNK_PAIRS = 50_000


@dataclasses.dataclass(frozen=True)
class BinarizedCorpus:
    """An opened binarized corpus: memory-mapped ids, offsets and lengths, and its meta.

    Attributes:
        directory: str, where it lives.
        source_ids, target_ids: 1-D memory-mapped arrays of every pair's ids.
        source_offsets, target_offsets: int64 [pairs + 1] (memory-mapped).
        lengths: int32 [pairs], `max(source, target) + 1` per pair (memory-mapped).
        meta: dict, `meta.json`.
    """

    directory: str
    source_ids: np.ndarray
    target_ids: np.ndarray
    source_offsets: np.ndarray
    target_offsets: np.ndarray
    lengths: np.ndarray
    meta: dict

    @property
    def num_pairs(self):
        return len(self.lengths)

    def release_pages(self):
        """Unmaps the pages read so far from this process (the kernel's page cache keeps them).

        Without it, every page a batch has read stays counted in the process's resident
        memory, which then grows towards the size of the files over an epoch.
        """
        for array in (self.source_ids, self.target_ids, self.source_offsets, self.target_offsets):
            _advise(array, "MADV_DONTNEED")

    def pair_ids(self, index):
        """`(source_ids, target_ids)` of pair `index`, as int32 arrays (for tests and checks)."""
        source = self.source_ids[self.source_offsets[index]:self.source_offsets[index + 1]]
        target = self.target_ids[self.target_offsets[index]:self.target_offsets[index + 1]]
        return source.astype(np.int32), target.astype(np.int32)


def open_binarized(directory):
    """Maps the arrays of a binarized corpus, once they are verified to be what was written.

    Verifying reads every file once (`data.binarized_checks`); the arrays are then mapped,
    not read.

    Raises:
        FileNotFoundError: no binarized corpus in `directory` (no `meta.json`).
        BinarizedCorpusError (a ValueError): a file missing, cut, changed or inconsistent,
            or a format this version does not read; the message names the file.
    """
    meta = binarized_checks.read_meta(directory)
    binarized_checks.check_sizes(directory, meta)
    corpus = _mapped(directory, meta)
    binarized_checks.check_shapes(corpus)
    binarized_checks.check_checksums(directory, meta)
    binarized_checks.check_structure(corpus)
    return corpus


def _mapped(directory, meta):
    """The `BinarizedCorpus` of `directory`'s files, mapped (its files' sizes already checked)."""
    dtype = np.dtype(meta["dtype"])

    def ids(name):
        path = os.path.join(directory, name)
        # np.memmap refuses an empty file; a side with no tokens cannot happen (EOS-less
        # ids of non-empty sentences), but an empty array keeps the type honest anyway.
        return np.memmap(path, dtype=dtype, mode="r") if os.path.getsize(path) else np.zeros(0, dtype)

    def array(name):
        try:
            return np.load(os.path.join(directory, name), mmap_mode="r")
        except (ValueError, OSError, EOFError) as error:  # numpy's own messages name no file
            raise BinarizedCorpusError(directory, name, f"not a readable .npy array ({error})") from None

    corpus = BinarizedCorpus(
        directory=directory,
        source_ids=ids("source.bin"),
        target_ids=ids("target.bin"),
        source_offsets=array("source_offsets.npy"),
        target_offsets=array("target_offsets.npy"),
        lengths=array("lengths.npy"),
        meta=meta,
    )
    for random_access in (corpus.source_ids, corpus.target_ids, corpus.source_offsets, corpus.target_offsets):
        # Batches read a few ids here and there: the kernel's read-ahead (128 kB a page
        # fault) would map ~30 pages for each one read.
        _advise(random_access, "MADV_RANDOM")
    return corpus


def _advise(array, advice):
    """`madvise` on the mapping behind a memory-mapped array, where the platform has it."""
    mapping = getattr(array, "_mmap", None)  # np.memmap's mmap object
    if mapping is not None and hasattr(mmap, advice):
        mapping.madvise(getattr(mmap, advice))


def write_binarized(pairs, tokenizer, directory, *, vocab_size=None, extra_meta=None, progress=True, print_fn=print):
    """Tokenizes `pairs` once and writes them to `directory` as a binarized corpus.

    Streams: `pairs` is read one chunk at a time, so memory stays bounded (the offsets,
    8 bytes a pair a side, are the only thing that grows). Written in a staging directory
    beside `directory` and renamed onto it. If `directory` is there by then, it is
    verified: another run's finished copy is used and this one dropped; a copy that fails
    (`open_binarized`) is moved aside, replaced by this one, then deleted, so the cache
    never goes without a copy while one is written. Ctrl-C is checked at every chunk
    (`interrupts`); an interrupted or failed write leaves no staging directory behind.

    Args:
        pairs: iterable of `(source, target)` str pairs (`data.readers.iter_*`).
        tokenizer: a `SubwordTokenizer` (its `encode` cuts both sides).
        directory: str, where the corpus goes.
        vocab_size: int, the model's vocabulary: every id is checked to be below it.
            Defaults to the tokenizer's.
        extra_meta: dict, more entries for `meta.json`, or a callable returning it,
            called once every pair is read (for counts the reading fills in).
        progress: bool, a tqdm progress bar on stderr.
        print_fn: callable for one line when another run's copy is used instead, or None.

    Returns:
        The opened `BinarizedCorpus`.

    Raises:
        ValueError: an id outside `[0, vocab_size)`, or no pairs at all.
    """
    vocab_size = vocab_size or tokenizer.vocab_size
    dtype = np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
    cache_staging.remove_abandoned(directory)
    staging = cache_staging.new_path(directory)
    os.makedirs(staging)
    started = time.monotonic()
    try:
        counts = _write_ids(pairs, tokenizer, staging, dtype, vocab_size, progress)
        meta = {
            "format": FORMAT_VERSION,
            "dtype": np.dtype(dtype).name,
            "pairs": counts["pairs"],
            "source_tokens": counts["source_tokens"],
            "target_tokens": counts["target_tokens"],
            "source_max_id": counts["source_max_id"],
            "target_max_id": counts["target_max_id"],
            "tokenizer_sha256": tokenizer.fingerprint,
            "vocab_size": vocab_size,
            "files": counts["files"],
            "seconds": round(time.monotonic() - started, 1),
            **((extra_meta() if callable(extra_meta) else extra_meta) or {}),
        }
        meta[binarized_checks.META_CHECKSUM] = binarized_checks.meta_checksum(meta)
        with open(os.path.join(staging, META_FILE), "w", encoding="utf-8") as file:
            json.dump(meta, file, indent=1)
        return _publish(staging, directory, meta, print_fn)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _publish(staging, directory, meta, print_fn, attempts=5):
    """Renames the finished `staging` onto `directory`; returns the corpus now there.

    A `directory` already there (another run finished the same corpus first, or a copy
    found damaged) is verified: kept if whole, else moved aside, replaced, and deleted.
    """
    asides = []
    try:
        for _ in range(attempts):
            try:
                os.rename(staging, directory)
                return _mapped(directory, meta)
            except OSError as error:
                if error.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
            try:
                present = open_binarized(directory)
            except (BinarizedCorpusError, FileNotFoundError):
                aside = cache_staging.new_path(directory, "old")
                try:
                    os.rename(directory, aside)
                    asides.append(aside)
                except FileNotFoundError:
                    pass  # another run moved it first
                continue
            if print_fn is not None:
                print_fn(f"binarized corpus: another run finished {directory} first; its copy is used (verified)")
            return present
        raise OSError(f"Could not rename {staging} onto {directory}: other runs kept replacing it.")
    finally:
        for aside in asides:
            shutil.rmtree(aside, ignore_errors=True)


def _write_ids(pairs, tokenizer, staging, dtype, vocab_size, progress):
    """Writes the id files and the offsets / lengths arrays; returns the counts and each file's size and digest.

    The per-pair lengths go to scratch files as they come, and the offsets are summed
    from them block by block: nothing held in memory grows with the corpus. Each file
    is hashed as it is written.
    """
    import tqdm

    sides = ("source", "target")
    files = {name: open(os.path.join(staging, name), "wb") for name in
             ("source.bin", "target.bin", "source_lengths.tmp", "target_lengths.tmp")}
    hashes = {side: digests.new_digest() for side in sides}
    pairs_written, tokens, largest = 0, {side: 0 for side in sides}, {side: 0 for side in sides}
    bar = tqdm.tqdm(unit=" pairs", unit_scale=True, desc="binarizing", disable=not progress, mininterval=2)
    try:
        for encoded in _encoded_chunks(pairs, tokenizer):
            interrupts.raise_if_interrupted()  # an interrupt a gc callback swallowed stops here
            cache_staging.heartbeat(staging)
            for side, (side_lengths, flat) in zip(sides, encoded):
                _check_ids(flat, vocab_size)
                ids = flat.astype(dtype)
                ids.tofile(files[f"{side}.bin"])
                hashes[side].update(ids)
                side_lengths.astype(np.int32).tofile(files[f"{side}_lengths.tmp"])
                tokens[side] += len(flat)
                largest[side] = max(largest[side], int(flat.max()) if flat.size else 0)
            pairs_written += len(encoded[0][0])
            bar.update(len(encoded[0][0]))
    finally:
        bar.close()
        for file in files.values():
            file.close()
    if not pairs_written:
        raise ValueError("No sentence pairs to binarize. Expected at least one pair.")
    index_hashes = _write_offsets_and_lengths(staging, pairs_written)
    files = {f"{side}.bin": hashes[side] for side in sides} | index_hashes
    return {
        "pairs": pairs_written,
        "source_tokens": tokens["source"], "target_tokens": tokens["target"],
        "source_max_id": largest["source"], "target_max_id": largest["target"],
        "files": {name: {"bytes": os.path.getsize(os.path.join(staging, name)), digests.NAME: digest.hexdigest()}
                  for name, digest in files.items()},
    }


def _write_offsets_and_lengths(staging, count, block=1 << 20):
    """`{side}_offsets.npy` and `lengths.npy` from the scratch length files, a block at a time.

    Returns:
        {file name: its digest}, each fed the file's bytes as they are written.
    """
    side_lengths = {side: np.memmap(os.path.join(staging, f"{side}_lengths.tmp"), np.int32, mode="r")
                    for side in ("source", "target")}
    offsets = {side: np.lib.format.open_memmap(os.path.join(staging, f"{side}_offsets.npy"), "w+", np.int64, (count + 1,))
               for side in side_lengths}
    lengths = np.lib.format.open_memmap(os.path.join(staging, "lengths.npy"), "w+", np.int32, (count,))
    hashes = {}
    for name, array in [*((f"{side}_offsets.npy", offsets[side]) for side in offsets), ("lengths.npy", lengths)]:
        hashes[name] = digests.new_digest()
        with open(os.path.join(staging, name), "rb") as file:
            hashes[name].update(file.read(array.offset))  # the .npy header, written by open_memmap
    for start in range(0, count, block):
        interrupts.raise_if_interrupted()
        stop = min(start + block, count)
        for side, values in side_lengths.items():
            np.cumsum(values[start:stop], dtype=np.int64, out=offsets[side][start + 1:stop + 1])
            offsets[side][start + 1:stop + 1] += offsets[side][start]
            # offsets[0] (zero) goes with the first block; each block adds its own entries.
            hashes[f"{side}_offsets.npy"].update(offsets[side][start + (start > 0):stop + 1])
        lengths[start:stop] = np.maximum(side_lengths["source"][start:stop], side_lengths["target"][start:stop]) + 1
        hashes["lengths.npy"].update(lengths[start:stop])
    for array in (*offsets.values(), lengths):
        array.flush()
    del side_lengths, offsets, lengths  # unmapped before the scratch files go
    for side in ("source", "target"):
        os.remove(os.path.join(staging, f"{side}_lengths.tmp"))
    return hashes


def _encoded_chunks(pairs, tokenizer):
    """`((source_lengths, source_ids), (target_lengths, target_ids))` per chunk of pairs, in order.

    One process: sentencepiece cuts a list of sentences on several threads by itself, and
    worker processes (fairseq-preprocess's --workers) would have to be forked from a
    process whose TensorFlow or JAX threads make forking unsafe, or spawned, which runs
    the caller's script again unless it guards its `__main__`.
    """
    pairs = iter(pairs)
    for chunk in iter(lambda: list(itertools.islice(pairs, _CHUNK_PAIRS)), []):
        encoded = []
        for sentences in ([source for source, _ in chunk], [target for _, target in chunk]):
            ids = tokenizer.encode(sentences)
            side_lengths = np.fromiter(map(len, ids), np.int64, count=len(ids))
            flat = np.fromiter(itertools.chain.from_iterable(ids), np.int64, count=int(side_lengths.sum()))
            encoded.append((side_lengths, flat))
        yield tuple(encoded)


def _check_ids(flat, vocab_size):
    """Refuses ids outside `[0, vocab_size)`, as `data.pipeline.make_dataset` does."""
    if flat.size and (flat.min() < 0 or flat.max() >= vocab_size):
        raise ValueError(
            f"The tokenizer made token ids outside [0, vocab_size={vocab_size}) (from "
            f"{int(flat.min())} to {int(flat.max())}); nothing was binarized. Were the "
            "tokenizer and the model trained together?"
        )


__all__ = ["BinarizedCorpus", "BinarizedCorpusError", "open_binarized", "write_binarized"]

"""A list of sentence pairs as a `BinarizedCorpus` held in memory, without files.

The demo corpus and lists of pairs given in memory train through the same batcher as a
binarized corpus on disk (`data.index_batches.IndexBatches`), so every run resumes by
batch number and splits its batches over workers the same way. `in_memory_corpus`
tokenizes the pairs once into the arrays `data.binarized` writes (flat ids in the same
dtype, int64 offsets, int32 lengths `max(source, target) + 1`, the same meta keys),
and builds the `BinarizedCorpus` from them with `directory` `"<memory>"`: the batches
are those of the same pairs binarized to files, id for id.
"""

import time

import numpy as np

from keras_transformer.data.binarized import FORMAT_VERSION, BinarizedCorpus, _encoded_chunks
from keras_transformer.data.tokenizer import check_encodable

IN_MEMORY = "<memory>"
"""The `directory` of a corpus that has none."""


def in_memory_corpus(pairs, tokenizer, *, vocab_size=None):
    """Tokenizes `pairs` into a `BinarizedCorpus` of numpy arrays (no file is written).

    Args:
        pairs: a list (or iterable) of `(source, target)` str pairs.
        tokenizer: a `SubwordTokenizer` (its `encode` cuts both sides).
        vocab_size: int, the model's vocabulary: every id is checked to be below it.
            Defaults to the tokenizer's.

    Returns:
        A `BinarizedCorpus` whose `directory` is `IN_MEMORY`.

    Raises:
        ValueError: a pair that is not two str (or holds a lone surrogate), no pairs at
            all, or an id outside `[0, vocab_size)`.
    """
    pairs = _checked_pairs(pairs)
    vocab_size = vocab_size or tokenizer.vocab_size
    # The dtype binarized.write_binarized picks, so the arrays equal the files' id for id.
    dtype = np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32
    started = time.monotonic()
    sides = {"source": ([], []), "target": ([], [])}  # per side: chunk lengths, chunk ids
    for encoded in _encoded_chunks(pairs, tokenizer):
        for (lengths, ids), (side_lengths, flat) in zip(sides.values(), encoded):
            _check_ids(flat, vocab_size)
            lengths.append(side_lengths)
            ids.append(flat.astype(dtype))
    arrays = {}
    for side, (lengths, ids) in sides.items():
        lengths = np.concatenate(lengths)
        arrays[f"{side}_lengths"] = lengths
        arrays[f"{side}_ids"] = np.concatenate(ids)
        arrays[f"{side}_offsets"] = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    meta = {
        "format": FORMAT_VERSION,
        "dtype": np.dtype(dtype).name,
        "pairs": len(pairs),
        "source_tokens": int(len(arrays["source_ids"])),
        "target_tokens": int(len(arrays["target_ids"])),
        "tokenizer_sha256": tokenizer.fingerprint,
        "vocab_size": vocab_size,
        "seconds": round(time.monotonic() - started, 1),
    }
    return BinarizedCorpus(
        directory=IN_MEMORY,
        source_ids=arrays["source_ids"],
        target_ids=arrays["target_ids"],
        source_offsets=arrays["source_offsets"],
        target_offsets=arrays["target_offsets"],
        lengths=(np.maximum(arrays["source_lengths"], arrays["target_lengths"]) + 1).astype(np.int32),
        meta=meta,
    )


def _checked_pairs(pairs):
    """`pairs` as a list, each checked to be two str that UTF-8 can encode."""
    pairs = list(pairs)
    if not pairs:
        raise ValueError("`pairs` is empty: there are no sentence pairs to batch. Expected at least one pair.")
    for index, pair in enumerate(pairs):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and all(isinstance(side, str) for side in pair)):
            raise ValueError(f"`pairs` must be (source, target) pairs of str. Received: {pair!r} at index {index}")
        for side, text in zip(("source", "target"), pair):
            check_encodable(text, f"The {side} of the pair at index {index}")
    return pairs


def _check_ids(flat, vocab_size):
    """Refuses ids outside `[0, vocab_size)`, as the binarized corpus and `make_dataset` do."""
    if flat.size and (flat.min() < 0 or flat.max() >= vocab_size):
        raise ValueError(
            f"The tokenizer made token ids outside [0, vocab_size={vocab_size}) (from "
            f"{int(flat.min())} to {int(flat.max())}); no batch was made. Were the "
            "tokenizer and the model trained together?"
        )


__all__ = ["IN_MEMORY", "in_memory_corpus"]

"""Marian's token ids mapped onto ours by permuting rows, never by special-casing ids.

A Marian / OPUS-MT vocabulary (`vocab.json`) has EOS at 0, UNK at 1 and PAD at its end,
and no BOS: its decoder starts from the PAD row (`decoder_start_token_id`). This package
has PAD 0, UNK 1, BOS 2 and EOS 3 (`keras_transformer.special_tokens`). So our ids are
a permutation of Marian's rows, with one row used twice:

    our id  0 PAD  <- Marian's pad row   (padding: masked, never generated)
            1 UNK  <- Marian's unk row
            2 BOS  <- Marian's decoder-start row (its pad row in every OPUS-MT model)
            3 EOS  <- Marian's eos row
            4...   <- every other Marian row, in Marian's order

When the decoder starts from its pad row, that row is both our PAD and our BOS, and our
vocabulary is one row longer than Marian's. Embedding rows and the logits bias are
gathered with `marian_rows`, so the model computes Marian's logits in our order; our
decoding never generates PAD or BOS, as Marian's generation never generates its pad.
"""

import numpy as np

from keras_transformer import checks
from keras_transformer.special_tokens import (
    BOS_ID,
    BOS_PIECE,
    EOS_ID,
    EOS_PIECE,
    PAD_ID,
    PAD_PIECE,
    UNK_ID,
    UNK_PIECE,
)


class MarianVocabulary:
    """The row permutation between a Marian vocabulary and ours.

    Args:
        pieces: dict of piece -> Marian id (the content of `vocab.json`).
        size: int, Marian's number of embedding rows (`config.vocab_size`); ids of
            `pieces` must lie below it. Rows without a piece are kept, unnamed.
        pad_id, eos_id, unk_id: Marian's special ids.
        decoder_start_id: the Marian row the decoder starts from. Defaults to `pad_id`.

    Example:
    >>> vocab = MarianVocabulary({"</s>": 0, "<unk>": 1, "▁a": 2, "<pad>": 3}, 4, pad_id=3, eos_id=0, unk_id=1)
    >>> vocab.marian_rows.tolist()  # our PAD, UNK, BOS, EOS, then "▁a"
    [3, 1, 3, 0, 2]
    >>> vocab.piece_to_id("▁a"), vocab.vocab_size
    (4, 5)
    """

    def __init__(self, pieces, size, *, pad_id, eos_id, unk_id, decoder_start_id=None):
        if not isinstance(pieces, dict):
            raise TypeError(f"`pieces` must be a dict of piece -> id. Received: {type(pieces).__name__}")
        checks.check_positive_int("size", size)
        decoder_start_id = pad_id if decoder_start_id is None else decoder_start_id
        for name, value in (
            ("pad_id", pad_id),
            ("eos_id", eos_id),
            ("unk_id", unk_id),
            ("decoder_start_id", decoder_start_id),
        ):
            if not checks.is_int(value) or not 0 <= value < size:
                raise ValueError(
                    f"Marian's `{name}` must be a row of its vocabulary, in [0, {size}). "
                    f"Received: {name}={value!r}"
                )
        if len({pad_id, eos_id, unk_id}) < 3 or decoder_start_id in (eos_id, unk_id):
            raise ValueError(
                "Marian's pad, eos and unk ids must differ, and the decoder must not start "
                f"from eos or unk. Received: pad_id={pad_id}, eos_id={eos_id}, "
                f"unk_id={unk_id}, decoder_start_id={decoder_start_id}"
            )
        for piece, marian_id in pieces.items():
            if not checks.is_int(marian_id) or not 0 <= marian_id < size:
                raise ValueError(
                    f"vocab.json gives {piece!r} the id {marian_id!r}, outside the model's "
                    f"[0, vocab_size={size})."
                )
        self.pieces = dict(pieces)
        self.size = size
        self.pad_id, self.eos_id, self.unk_id = pad_id, eos_id, unk_id
        self.decoder_start_id = decoder_start_id
        specials = [pad_id, unk_id, decoder_start_id, eos_id]  # in the order of our ids 0-3
        others = [row for row in range(size) if row not in set(specials)]
        # int32 [our vocab_size]: the Marian row of each of our ids.
        self.marian_rows = np.array(specials + others, dtype="int32")
        # Our id of each Marian row, the lowest where a row is used twice: the pad row
        # reads as our PAD (padding in a batch).
        self.our_ids = np.empty(size, dtype="int32")
        for our_id, row in reversed(list(enumerate(self.marian_rows))):
            self.our_ids[row] = our_id
        names = {marian_id: piece for piece, marian_id in pieces.items()}
        ours = [names.get(int(row), "") for row in self.marian_rows]
        ours[PAD_ID], ours[UNK_ID], ours[BOS_ID], ours[EOS_ID] = PAD_PIECE, UNK_PIECE, BOS_PIECE, EOS_PIECE
        self._our_pieces = ours  # our id -> piece ("" for a row vocab.json does not name)
        self._ids = {piece: int(self.our_ids[marian_id]) for piece, marian_id in pieces.items()}

    @property
    def vocab_size(self):
        """Our number of ids: Marian's rows, plus one when PAD and BOS share a row."""
        return len(self.marian_rows)

    @property
    def our_pieces(self):
        """The piece of each of our ids, as a list (`""` for an unnamed row)."""
        return list(self._our_pieces)

    def piece_to_id(self, piece):
        """Our id of `piece`, as vocab.json gives it; `UNK_ID` for a piece it lacks."""
        return self._ids.get(piece, UNK_ID)

    def id_to_piece(self, token_id):
        """The piece of our id `token_id`."""
        if not checks.is_int(token_id) or not 0 <= token_id < self.vocab_size:
            raise ValueError(f"`token_id` must be in [0, {self.vocab_size}). Received: {token_id!r}")
        return self._our_pieces[token_id]

    def to_ours(self, marian_ids):
        """Our ids of an array of Marian ids (its pad id becomes PAD)."""
        return self.our_ids[np.asarray(marian_ids, dtype="int64")]

    def to_marian(self, our_ids):
        """Marian's ids of an array of our ids (PAD and BOS become its pad / start id)."""
        return self.marian_rows[np.asarray(our_ids, dtype="int64")]


__all__ = ["MarianVocabulary"]

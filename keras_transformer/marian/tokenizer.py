"""`MarianTokenizer`: the tokenizer of a Marian / OPUS-MT model, in Python and in TF graphs.

A Marian model has two sentencepiece models and one vocabulary: source text is cut into
pieces by `source.spm`, target text by `target.spm`, and both sides' pieces take their
ids from the shared `vocab.json` (a piece it lacks is UNK). Output ids become pieces
through `vocab.json` and text through `target.spm`'s rules for each piece. This is
what Hugging Face's `MarianTokenizer` does; here it is also made of TF ops
(tensorflow-text's sentencepiece op, a lookup table, string ops; no Python function),
so the same object tokenizes inside `tf.data` and inside an exported SavedModel.

It offers the interface of `keras_transformer.data.SubwordTokenizer` (`tokenize`,
`detokenize`, `encode`, `decode`, `vocab_size`, `fingerprint`, `save`, `load`,
`id_to_piece`, `piece_to_id`), so `Translator`, `export_saved_model`, `evaluate` and
`make_dataset` take it unchanged; ids are ours (PAD 0, UNK 1, BOS 2, EOS 3; see
`keras_transformer.marian.vocabulary`). Target text for training labels is cut by
`target.spm`: `tokenize_target` / `encode_target`.

Details kept from Hugging Face's tokenizer: a language code at the start of the text
(`">>fra<< ..."`, multilingual models) is one token, looked up whole; decoding drops the
special tokens (PAD, BOS, EOS, UNK: `skip_special_tokens=True`), keeps a piece that
`target.spm` lacks as it is written, turns byte pieces (`<0xE2>`) into their bytes, and
strips surrounding whitespace. Not kept: its optional Moses punctuation normalizer,
which its `__call__` does not apply either, and its splitting of text that spells a
special token (`"</s>"`) into that token.
"""

import hashlib
import json
import os

import sentencepiece
import tensorflow as tf

from keras_transformer.atomic import write_bytes_atomically, write_text_atomically
from keras_transformer.data.tokenizer import _SharedSentencepieceTokenizer, check_encodable, ids_before_eos
from keras_transformer.marian.vocabulary import MarianVocabulary
from keras_transformer import file_names
from keras_transformer.special_tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

TOKENIZER_FORMAT = 1  # the layout of marian_tokenizer.json
# A language code opening the text: group 1 is the code (">>fra<<") or empty.
_LANGUAGE_CODE = r"(?s)^(>>.*?<<)?.*$"
_SPACE_PIECE = "\u2581"  # sentencepiece's "▁", a space in decoded text
_ASCII_WHITESPACE = " \t\n\r\f\v"  # what tf.strings.strip strips


class MarianTokenizer(tf.Module):
    """Source pieces from `source.spm`, ids through `vocab.json`, text from `target.spm`.

    Args:
        source_spm: bytes of the source sentencepiece model.
        target_spm: bytes of the target sentencepiece model.
        vocabulary: the `MarianVocabulary` (vocab.json and Marian's special ids).
        source: str, where the files came from; only used in error messages.

    Example:

    ```python
    tokenizer = MarianTokenizer.load("saved_models/opus-mt-de-en")
    ids = tokenizer.encode(["Guten Morgen!"])    # our ids, without EOS
    tokenizer.decode(ids)                        # target.spm's text of these ids
    ```
    """

    kind = "marian"  # what manifest.json records, so the directory loads this class

    def __init__(self, source_spm, target_spm, vocabulary, *, source="the Marian tokenizer"):
        super().__init__(name="marian_tokenizer")
        if not isinstance(vocabulary, MarianVocabulary):
            raise TypeError(
                f"`vocabulary` must be a MarianVocabulary. Received: {type(vocabulary).__name__}"
            )
        self._source_spm = bytes(_check_bytes("source_spm", source_spm))
        self._target_spm = bytes(_check_bytes("target_spm", target_spm))
        self._source_processor = _processor(self._source_spm, f"{source}: source.spm")
        self._target_processor = _processor(self._target_spm, f"{source}: target.spm")
        self.vocabulary = vocabulary
        # Our id -> the bytes target.spm decodes it to; b"" for the special tokens.
        self._surfaces = [_surface(piece, self._target_processor) for piece in vocabulary.our_pieces]
        for token_id in (PAD_ID, UNK_ID, BOS_ID, EOS_ID):
            self._surfaces[token_id] = b""
        # TF side: a tf.Module tracks these, so an exported graph holds them.
        self._source_pieces = _SharedSentencepieceTokenizer(self._source_spm, out_type=tf.string)
        self._target_pieces = _SharedSentencepieceTokenizer(self._target_spm, out_type=tf.string)
        pieces = sorted(vocabulary.pieces)
        self._piece_ids = tf.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(
                tf.constant(pieces, tf.string),
                tf.constant([vocabulary.piece_to_id(piece) for piece in pieces], tf.int64),
            ),
            default_value=UNK_ID,
        )
        self._surface_table = tf.constant(self._surfaces, tf.string)

    # ----------------------------------------------------------------- identity
    @property
    def vocab_size(self):
        """Our number of ids: the model's `vocab_size` (see `MarianVocabulary`)."""
        return self.vocabulary.vocab_size

    @property
    def fingerprint(self):
        """sha256 (hex) of both sentencepiece models, vocab.json and the special ids."""
        digest = hashlib.sha256()
        for part in (self._source_spm, self._target_spm, self._settings_text().encode("utf-8")):
            digest.update(hashlib.sha256(part).digest())
        return digest.hexdigest()

    def id_to_piece(self, token_id):
        """The vocab.json piece of our id `token_id` (`"</s>"` for EOS)."""
        return self.vocabulary.id_to_piece(int(token_id))

    def piece_to_id(self, piece):
        """Our id of `piece`; `UNK_ID` for a piece vocab.json lacks."""
        return self.vocabulary.piece_to_id(piece)

    # ------------------------------------------------------------------- Python
    def encode(self, sentences):
        """Our ids of each source sentence, without EOS (Python lists)."""
        return self._encode(sentences, self._source_processor)

    def encode_target(self, sentences):
        """Our ids of each target sentence (cut by target.spm), without BOS or EOS."""
        return self._encode(sentences, self._target_processor)

    def decode(self, ids):
        """Text of each id sequence, cut at the first EOS, without special tokens."""
        texts = []
        for sequence in ids:
            sequence = [int(i) for i in sequence]
            if EOS_ID in sequence:
                sequence = sequence[: sequence.index(EOS_ID)]
            text = b"".join(self._surfaces[i] for i in sequence).decode("utf-8", "replace")
            texts.append(text.replace(_SPACE_PIECE, " ").strip(_ASCII_WHITESPACE))
        return texts

    def _encode(self, sentences, processor):
        if isinstance(sentences, str):
            raise TypeError(
                f"`sentences` must be a list of strings, not one string. Received: {sentences!r}"
            )
        sentences = list(sentences)
        for index, sentence in enumerate(sentences):
            if not isinstance(sentence, str):
                raise TypeError(
                    f"Every sentence must be a str. Received: {type(sentence).__name__} at index {index}"
                )
            check_encodable(sentence, f"Sentence {index}")
        split = [_split_language_code(sentence) for sentence in sentences]
        pieces = processor.Encode([rest for _, rest in split], out_type=str)
        return [
            [self.piece_to_id(piece) for piece in ([code] if code else []) + sentence_pieces]
            for (code, _), sentence_pieces in zip(split, pieces)
        ]

    # ----------------------------------------------------------------- TF graph
    def tokenize(self, text):
        """Our ids of source strings, without EOS, as TF ops.

        Args:
            text: tf.string tensor (or str / list of str), shape [B] or [].

        Returns:
            int32 `tf.RaggedTensor` [B, None]; an int32 `tf.Tensor` [None] for a scalar.
        """
        return self._tokenize(text, self._source_pieces)

    def tokenize_target(self, text):
        """Our ids of target strings (cut by target.spm), as TF ops; see `tokenize`."""
        return self._tokenize(text, self._target_pieces)

    def detokenize(self, ids):
        """Strings of our ids, as TF ops, cut at the first EOS, without special tokens.

        Args:
            ids: integer ids, dense [B, T] or [T], or ragged [B, None].

        Returns:
            tf.string tensor [B] (a scalar for 1-D dense input).
        """
        ids, before_eos, single = ids_before_eos(ids)
        ids = tf.where(before_eos, ids, PAD_ID)  # PAD's surface is empty
        pieces = tf.gather(self._surface_table, ids)
        text = tf.strings.reduce_join(pieces, axis=-1)
        # Byte pieces may make invalid UTF-8: U+FFFD instead, as Python's "replace".
        text = tf.strings.unicode_transcode(
            text, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD
        )
        text = tf.strings.strip(tf.strings.regex_replace(text, _SPACE_PIECE, " "))
        return text[0] if single else text

    def _tokenize(self, text, pieces_tokenizer):
        text = tf.convert_to_tensor(text, tf.string)
        single = text.shape.rank == 0
        if single:
            text = text[tf.newaxis]
        code = tf.strings.regex_replace(text, _LANGUAGE_CODE, r"\1")
        rest = tf.strings.substr(text, tf.strings.length(code), tf.strings.length(text))
        piece_ids = self._piece_ids.lookup(pieces_tokenizer.tokenize(rest))
        has_code = tf.strings.length(code) > 0
        code_ids = tf.RaggedTensor.from_row_lengths(
            tf.boolean_mask(self._piece_ids.lookup(code), has_code),
            tf.cast(has_code, tf.int64),
        )
        ids = tf.cast(tf.concat([code_ids, piece_ids], axis=1), tf.int32)
        return ids[0] if single else ids

    # ------------------------------------------------------------------- files
    def save(self, directory):
        """Writes source.spm, target.spm, vocab.json and marian_tokenizer.json; returns `directory`.

        Each file is written beside its final name and renamed onto it
        (`keras_transformer.atomic`).
        """
        directory = os.fspath(directory)
        os.makedirs(directory, exist_ok=True)
        vocab = dict(sorted(self.vocabulary.pieces.items(), key=lambda item: (item[1], item[0])))
        write_bytes_atomically(os.path.join(directory, file_names.MARIAN_SOURCE_SPM_FILE), self._source_spm)
        write_bytes_atomically(os.path.join(directory, file_names.MARIAN_TARGET_SPM_FILE), self._target_spm)
        write_text_atomically(
            os.path.join(directory, file_names.MARIAN_VOCAB_FILE),
            json.dumps(vocab, ensure_ascii=False, indent=2) + "\n",
        )
        write_text_atomically(
            os.path.join(directory, file_names.MARIAN_TOKENIZER_FILE),
            json.dumps(self._settings(), indent=2, sort_keys=True) + "\n",
        )
        return directory

    @classmethod
    def load(cls, directory):
        """The tokenizer `save` wrote to `directory`.

        Raises:
            FileNotFoundError: one of its four files is missing (named).
            ValueError: a file is corrupt (named), or its ids do not fit together.
        """
        directory = os.fspath(directory)
        settings_path = os.path.join(directory, file_names.MARIAN_TOKENIZER_FILE)
        settings = _read_json(settings_path)
        try:
            layout = settings["format"]
            if not isinstance(layout, int) or layout > TOKENIZER_FORMAT:
                raise ValueError(f"format={layout!r}: this package reads format {TOKENIZER_FORMAT}")
            ids = {key: settings[key] for key in ("pad_id", "eos_id", "unk_id", "decoder_start_id")}
            size = settings["marian_vocab_size"]
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"{settings_path} is corrupt: {type(error).__name__}: {error}") from None
        vocab_path = os.path.join(directory, file_names.MARIAN_VOCAB_FILE)
        vocabulary = MarianVocabulary(_read_json(vocab_path), size, **ids)
        return cls(
            _read_bytes(os.path.join(directory, file_names.MARIAN_SOURCE_SPM_FILE)),
            _read_bytes(os.path.join(directory, file_names.MARIAN_TARGET_SPM_FILE)),
            vocabulary,
            source=directory,
        )

    def _settings(self):
        vocabulary = self.vocabulary
        return {
            "format": TOKENIZER_FORMAT,
            "pad_id": vocabulary.pad_id,
            "eos_id": vocabulary.eos_id,
            "unk_id": vocabulary.unk_id,
            "decoder_start_id": vocabulary.decoder_start_id,
            "marian_vocab_size": vocabulary.size,
        }

    def _settings_text(self):
        """The settings and vocab.json as one canonical text, for the fingerprint."""
        return json.dumps(
            {"settings": self._settings(), "vocab": self.vocabulary.pieces}, sort_keys=True
        )


def _split_language_code(text):
    """`(code, rest)`: a leading `>>xx<<` language code, as Hugging Face's Marian splits it."""
    if text.startswith(">>"):
        end = text.find("<<")
        if end != -1:
            return text[: end + 2], text[end + 2 :]
    return "", text


def _surface(piece, processor):
    """The bytes `processor` (target.spm) decodes `piece` to; `piece` itself if it lacks it."""
    if not piece:
        return b""
    piece_id = processor.PieceToId(piece)
    if processor.IdToPiece(piece_id) != piece:  # not a piece of this model: kept as written
        return piece.encode("utf-8")
    if processor.IsByte(piece_id):  # "<0xE2>"
        return bytes([int(piece[3:5], 16)])
    if processor.IsControl(piece_id):  # "<s>", "</s>": invisible
        return b""
    return piece.encode("utf-8")


def _check_bytes(name, value):
    if not isinstance(value, (bytes, bytearray)):
        raise TypeError(
            f"`{name}` must be the bytes of a sentencepiece model. Received: type {type(value).__name__}"
        )
    return value


def _processor(model_proto, source):
    processor = sentencepiece.SentencePieceProcessor()
    try:
        processor.LoadFromSerializedProto(model_proto)
    except (RuntimeError, OSError) as error:
        raise ValueError(f"{source} is not a valid sentencepiece model ({error})") from error
    return processor


def _read_bytes(path):
    if not os.path.isfile(path):
        raise FileNotFoundError(f"No Marian tokenizer file at {path}")
    with open(path, "rb") as file:
        return file.read()


def _read_json(path):
    if not os.path.isfile(path):
        raise FileNotFoundError(f"No Marian tokenizer file at {path}")
    try:
        with open(path, encoding="utf-8") as file:
            return json.load(file)
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{path} is corrupt: {type(error).__name__}: {error}") from None


__all__ = ["MarianTokenizer"]

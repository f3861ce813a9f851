"""The joint subword vocabulary: train it with sentencepiece, run it with tf-text.

The paper encodes source and target with one shared vocabulary ("sentences were
encoded using byte-pair encoding, which has a shared source-target vocabulary of
about 37000 tokens", Vaswani et al., 2017, section 5.1), so one `SubwordTokenizer`
serves both sides. It is trained by the `sentencepiece` library (unigram by default,
BPE on request) and run by `tensorflow_text.SentencepieceTokenizer`, which is made of
TF ops: the same object tokenizes inside `tf.data` and inside an exported SavedModel,
with no `py_function`. The special ids are those of `keras_transformer.special_tokens`;
a model file with other ids is refused when it is loaded.
"""

import hashlib
import io
import os
import re

import sentencepiece
import tensorflow as tf
import tensorflow_text
from tensorflow_text.python.ops.sentencepiece_tokenizer import (
    gen_sentencepiece_tokenizer,
)

from keras_transformer import checks, internals
from keras_transformer.atomic import write_bytes_atomically
from keras_transformer.data.settings import TOKENIZER_MODEL_TYPES
from keras_transformer.file_names import TOKENIZER_FILE
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

# The sentencepiece model file that `save` writes and `load` looks for: the model
# directory's `tokenizer.model`, named once in `keras_transformer.file_names`.
MODEL_FILENAME = TOKENIZER_FILE

MODEL_TYPES = TOKENIZER_MODEL_TYPES  # defined without TensorFlow in data.settings, for RunConfig

# `tokenize_sampled`'s tf-text tokenizers, one per (model digest, alpha).
_SAMPLING_TOKENIZERS = {}

# (id, piece, sentencepiece accessor) for every special token, checked on load.
_SPECIAL_TOKENS = (
    (PAD_ID, PAD_PIECE, "pad_id"),
    (UNK_ID, UNK_PIECE, "unk_id"),
    (BOS_ID, BOS_PIECE, "bos_id"),
    (EOS_ID, EOS_PIECE, "eos_id"),
)


def ids_before_eos(ids):
    """`(ids [B, T] int32, before_eos [B, T] bool, single)` of ids to detokenize.

    Ragged ids are padded with PAD, a 1-D vector becomes one row (`single` says so), and
    `before_eos` marks the positions before each row's first EOS: what detokenizing
    keeps. Shared by every tokenizer's graph-side `detokenize`.
    """
    if isinstance(ids, tf.RaggedTensor):
        ids = ids.to_tensor(default_value=PAD_ID)
    ids = tf.convert_to_tensor(ids)
    if not ids.dtype.is_integer:
        raise TypeError(f"`ids` must be integers. Received: dtype {ids.dtype}")
    ids = tf.cast(ids, tf.int32)
    single = ids.shape.rank == 1
    if single:
        ids = ids[tf.newaxis]
    before_eos = tf.cumsum(tf.cast(ids == EOS_ID, tf.int32), axis=-1) == 0
    return ids, before_eos, single


class SubwordTokenizer(tf.Module):
    """A trained sentencepiece model, usable from Python, `tf.data` and TF graphs.

    `tokenize` and `detokenize` are TF ops (tf-text), so they run inside
    `Dataset.map` and inside a `tf.function` that is exported; this object is a
    `tf.Module`, so assigning it to an attribute of an exported module tracks the
    sentencepiece resource it holds. `encode` and `decode` are Python conveniences
    over the same model and give the same ids. Neither side adds BOS or EOS when
    tokenizing; the data pipeline and the decoder add them where they belong.
    Decoding stops at the first EOS and drops padding and BOS, so the output of a
    padded batch or of a finished beam can be decoded as it is.

    Args:
        model_proto: bytes, a serialized sentencepiece `ModelProto` (the content of
            a `tokenizer.model` file).
        source: str, where the bytes came from; only used in error messages.

    Example:

    >>> tokenizer = train_tokenizer(["a cat sat", "a dog ran"] * 20, vocab_size=16)
    >>> ids = tokenizer.encode(["a cat ran"])
    >>> tokenizer.decode(ids)
    ['a cat ran']
    """

    def __init__(self, model_proto, *, source="model_proto"):
        super().__init__(name="subword_tokenizer")
        if not isinstance(model_proto, bytes):
            raise TypeError(
                "`model_proto` must be the bytes of a sentencepiece model. "
                f"Received: type {type(model_proto).__name__}"
            )
        processor = sentencepiece.SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(model_proto)
        except (RuntimeError, OSError) as error:
            raise ValueError(
                f"{source} is not a valid sentencepiece model ({error})"
            ) from error
        _check_special_tokens(processor, source)
        self._model_proto = model_proto
        self._processor = processor
        self._tf_tokenizer = _SharedSentencepieceTokenizer(model_proto)

    @property
    def model_proto(self):
        """The serialized sentencepiece model, as bytes."""
        return self._model_proto

    @property
    def fingerprint(self):
        """The sha256 of the model bytes, as hex: what a model directory records of its tokenizer.

        Two tokenizers with the same vocabulary size but trained on other text have
        different fingerprints, so `load_model_and_tokenizer` can tell them apart.
        """
        return hashlib.sha256(self._model_proto).hexdigest()

    @property
    def vocab_size(self):
        """Number of pieces, special tokens included: the model's vocabulary size."""
        return self._processor.GetPieceSize()

    def id_to_piece(self, token_id):
        """The piece (subword string) of `token_id`, e.g. `"</s>"` for EOS."""
        if not 0 <= int(token_id) < self.vocab_size:
            raise ValueError(
                f"`token_id` must be in [0, {self.vocab_size}). Received: {token_id}"
            )
        return self._processor.IdToPiece(int(token_id))

    def piece_to_id(self, piece):
        """The id of `piece`; `UNK_ID` for a piece not in the vocabulary."""
        return self._processor.PieceToId(piece)

    def tokenize(self, text):
        """Token ids of strings, without BOS or EOS, as TF ops.

        Args:
            text: tf.string tensor (or Python str / list of str), shape [B] or [].

        Returns:
            int32 `tf.RaggedTensor` of shape [B, None] for a batch; an int32
            `tf.Tensor` of shape [None] for a scalar string.
        """
        return self._tf_tokenizer.tokenize(text)

    def tokenize_sampled(self, text, alpha):
        """Token ids of strings with a segmentation drawn at random, as TF ops.

        Subword regularization: training on a different segmentation of the same text
        each epoch regularizes a model trained on a small corpus. For a BPE model `alpha`
        is the probability of skipping each merge (BPE-dropout, Provilkov et al., 2020,
        who use 0.1); for a unigram model it is the smoothing of the sampling over all
        segmentations (Kudo, 2018). Every segmentation detokenizes to the same text.
        The draws come from sentencepiece's own random generator, which TensorFlow's
        seeds do not reach: they differ from call to call and from run to run.

        Args:
            text: as for `tokenize`.
            alpha: float in [0, 1); 0 gives `tokenize`'s segmentation.

        Returns:
            As `tokenize`.
        """
        checks.check_rate("alpha", alpha)
        if alpha == 0:
            return self.tokenize(text)
        # The resource's name already holds the model's digest: no re-hashing per call.
        key = (self._tf_tokenizer.resource_name, float(alpha))
        if key not in _SAMPLING_TOKENIZERS:
            # Kept outside the module, so that an exported SavedModel never tracks it,
            # and made eagerly (init_scope), though first asked for inside a tf.data map.
            with tf.init_scope():
                _SAMPLING_TOKENIZERS[key] = _SharedSentencepieceTokenizer(
                    self._model_proto, nbest_size=-1, alpha=float(alpha)
                )
        return _SAMPLING_TOKENIZERS[key].tokenize(text)

    def detokenize(self, ids):
        """Strings of token ids, as TF ops, cut at the first EOS.

        Everything from the first EOS on is dropped, and so are PAD and BOS, so
        a zero-padded batch or a decoder output that starts with BOS can be given
        as it is.

        Args:
            ids: integer ids, a dense tensor [B, T] or [T], or a ragged tensor
                [B, None].

        Returns:
            tf.string tensor of shape [B] (or a scalar for 1-D dense input).
        """
        ids, before_eos, single = ids_before_eos(ids)
        keep = before_eos & (ids != PAD_ID) & (ids != BOS_ID)
        text = self._tf_tokenizer.detokenize(tf.ragged.boolean_mask(ids, keep))
        return text[0] if single else text

    def encode(self, sentences):
        """Token ids of each sentence, without BOS or EOS (Python lists).

        Raises:
            ValueError: a sentence holds a lone surrogate (U+D800-U+DFFF), which
                UTF-8 cannot encode; the message names the sentence's index and the
                character's position (`replace_lone_surrogates` makes it encodable).
        """
        if isinstance(sentences, str):
            raise TypeError(
                "`sentences` must be a list of strings, not one string. "
                f"Received: {sentences!r}"
            )
        sentences = list(sentences)
        for index, sentence in enumerate(sentences):
            check_encodable(sentence, f"Sentence {index}")
        return self._processor.Encode(sentences, out_type=int)

    def decode(self, ids):
        """Text of each id sequence, cut at the first EOS, without PAD or BOS."""
        stripped = []
        for sequence in ids:
            sequence = [int(i) for i in sequence]
            if EOS_ID in sequence:
                sequence = sequence[: sequence.index(EOS_ID)]
            stripped.append([i for i in sequence if i not in (PAD_ID, BOS_ID)])
        return self._processor.Decode(stripped)

    def save(self, directory):
        """Write the model to `directory/tokenizer.model` and return that path.

        The file is the plain sentencepiece model, readable by any sentencepiece
        tool, by `load`, and by `keras_hub.tokenizers.SentencePieceTokenizer`.
        It is written beside its final name and renamed onto it, so a crash while
        writing leaves any earlier file whole (`keras_transformer.atomic`).
        """
        os.makedirs(directory, exist_ok=True)
        return write_bytes_atomically(os.path.join(directory, MODEL_FILENAME), self._model_proto)

    @classmethod
    def load(cls, path):
        """Read a tokenizer from a model file or from a directory holding one.

        Args:
            path: str or path-like, a `tokenizer.model` file or the directory
                `save` wrote it to.

        Raises:
            FileNotFoundError: no model file at `path`.
            ValueError: the file is not a sentencepiece model, or its special
                ids differ from `keras_transformer.special_tokens`.
        """
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, MODEL_FILENAME)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"No tokenizer model file at {path}")
        with open(path, "rb") as file:
            return cls(file.read(), source=path)

    def to_keras_hub(self, name="sentence_piece_tokenizer"):
        """The same model as a `keras_hub.tokenizers.SentencePieceTokenizer` named `name`.

        Named, not left to Keras' automatic names, which count the tokenizers made earlier
        in the process ("sentence_piece_tokenizer_1", ...): its saved config is then the
        same whenever it is made, and matches the one a preset directory holds.
        """
        try:
            import keras_hub  # Imported here: keras-hub is slow to import, rarely needed.
        except ImportError as error:
            raise ImportError(
                "`to_keras_hub()` needs keras-hub, an optional extra: "
                "pip install 'keras-transformer[hub]'"
            ) from error

        return keras_hub.tokenizers.SentencePieceTokenizer(proto=self._model_proto, name=name)


def lone_surrogate_position(text):
    """Index in `text` of its first lone surrogate, or None when UTF-8 can encode it all.

    A Python str can hold surrogate code points (U+D800-U+DFFF) that UTF-8 cannot
    encode: bytes decoded with "surrogateescape" (command-line arguments, file names),
    JSON "\\ud800" escapes, UTF-16 text cut in the middle of a pair.
    """
    if not isinstance(text, str):
        return None  # not text: the caller's type check names it
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        return error.start
    return None


def check_encodable(text, what):
    """Raises ValueError naming `what` and the position unless UTF-8 can encode `text`."""
    position = lone_surrogate_position(text)
    if position is not None:
        raise ValueError(
            f"{what} is not valid Unicode: it holds the lone surrogate "
            f"{text[position]!r} at character {position}, which UTF-8 cannot encode. "
            "Decode the text with errors='replace', or call replace_lone_surrogates."
        )


def replace_lone_surrogates(text):
    """`text` with each lone surrogate replaced by U+FFFD; a surrogate pair is joined.

    Example:

    >>> replace_lone_surrogates("a\\ud800b") == "a\\ufffdb"
    True
    >>> replace_lone_surrogates("\\ud83d\\ude00") == "\\U0001f600"  # a pair: one emoji
    True
    """
    return text.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


class _SharedModelResource(tf.saved_model.experimental.TrackableResource):
    """A sentencepiece model resource registered under a name derived from the model.

    tf-text creates its resource private to an eager kernel, and `tf.random.set_seed`
    (so also `keras.utils.set_random_seed`) clears the eager kernel cache, which
    deletes it: every later tokenize fails with "Resource ... SentencepieceOp ...
    does not exist" (tensorflow/text#570). A shared name keeps the resource in the
    resource manager instead. Equal models get the same name, and may share it.
    """

    def __init__(self, model_proto):
        super().__init__()
        self._model_proto = model_proto
        digest = hashlib.sha256(model_proto).hexdigest()[:24]
        self.shared_name = f"keras_transformer_sentencepiece_{digest}"
        _ = self.resource_handle  # Creates the resource now, in the current context.

    def _create_resource(self):
        return gen_sentencepiece_tokenizer.sentencepiece_op(
            model=self._model_proto, shared_name=self.shared_name
        )


class _SharedSentencepieceTokenizer(tensorflow_text.SentencepieceTokenizer):
    """tf-text's tokenizer on a `_SharedModelResource`: seed resets can't break it.

    `out_type=tf.string` gives pieces instead of ids (the Marian tokenizer looks them
    up in its own vocabulary).
    """

    def __init__(self, model_proto, out_type=tf.int32, nbest_size=0, alpha=1.0):
        super().__init__(
            model=model_proto, out_type=out_type, add_bos=False, add_eos=False,
            nbest_size=nbest_size, alpha=alpha,
        )
        resource = _SharedModelResource(model_proto)
        internals.replace_sentencepiece_resource(self, resource)
        self.resource_name = resource.shared_name


def train_tokenizer(
    sentences,
    vocab_size,
    *,
    model_type="unigram",
    character_coverage=1.0,
    normalization_rule_name="nmt_nfkc",
    byte_fallback=False,
    seed=0,
    **sentencepiece_options,
):
    """Train one subword vocabulary on source and target text together.

    Give it the sentences of both languages (the paper's vocabulary is shared).
    Training is deterministic: every sentence is used (no sampling of the input),
    and the same sentences and options give the same model bytes. The vocabulary
    has exactly `vocab_size` pieces, special tokens included: if the corpus is too
    small to make that many, this raises instead of returning a smaller vocabulary,
    because the model's embedding size is set from `vocab_size`.

    Args:
        sentences: iterable of str, the training text (both languages).
        vocab_size: int, number of pieces including PAD, UNK, BOS and EOS.
        model_type: str, `"unigram"` (default) or `"bpe"` (the paper's choice).
        character_coverage: float, share of characters covered by single-character
            pieces; 1.0 keeps every character seen, which suits small alphabets.
        normalization_rule_name: str, sentencepiece's text normalization
            (`"nmt_nfkc"` default; `"identity"` keeps the text byte for byte).
        byte_fallback: bool, encode unseen characters as bytes instead of UNK
            (adds 256 pieces to the vocabulary).
        seed: int, seed of sentencepiece's random generator, which is only used
            if `sentencepiece_options` ask it to sample the input.
        **sentencepiece_options: passed to `SentencePieceTrainer.train`.

    Returns:
        A `SubwordTokenizer`.

    Example:

    >>> tokenizer = train_tokenizer(["ein Haus", "a house"] * 10, vocab_size=16)
    >>> tokenizer.vocab_size
    16
    """
    if isinstance(sentences, str):
        raise TypeError(
            "`sentences` must be an iterable of strings, not one string. "
            f"Received: {sentences[:50]!r}"
        )
    if not isinstance(vocab_size, int) or vocab_size <= len(_SPECIAL_TOKENS):
        raise ValueError(
            f"`vocab_size` must be an integer > {len(_SPECIAL_TOKENS)} "
            f"(the special tokens). Received: vocab_size={vocab_size!r}"
        )
    if model_type not in MODEL_TYPES:
        raise ValueError(
            f"`model_type` must be one of {MODEL_TYPES}. Received: {model_type!r}"
        )
    sentencepiece.set_random_generator_seed(seed)
    options = dict(
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=character_coverage,
        normalization_rule_name=normalization_rule_name,
        byte_fallback=byte_fallback,
        pad_id=PAD_ID,
        unk_id=UNK_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        pad_piece=PAD_PIECE,
        unk_piece=UNK_PIECE,
        bos_piece=BOS_PIECE,
        eos_piece=EOS_PIECE,
        # Use every sentence, in order: no sampling, so training is reproducible.
        input_sentence_size=0,
        shuffle_input_sentence=False,
        minloglevel=2,
    )
    options.update(sentencepiece_options)
    return SubwordTokenizer(_trained_model_proto(sentences, options), source="the trained model")


def _trained_model_proto(sentences, options):
    """The bytes of a sentencepiece model trained on `sentences`, its errors made plain.

    Raises:
        the feed's own error for a sentence it refused (`_SentenceFeed`), or ValueError
        when sentencepiece refused, naming `vocab_size` when it was too large.
    """
    model = io.BytesIO()
    feed = _SentenceFeed(sentences)
    try:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(feed), model_writer=model, **options
        )
    except RuntimeError as error:
        if feed.error is not None:
            # sentencepiece wraps errors of the iterator in a RuntimeError.
            raise feed.error from None
        limit = re.search(r"value <= (\d+)", str(error))
        if limit:
            raise ValueError(
                f"`vocab_size`={options['vocab_size']} is more pieces than sentencepiece can "
                f"make from this text (at most {limit.group(1)}). Use a smaller "
                "vocab_size or more text."
            ) from error
        raise ValueError(f"sentencepiece training failed: {error}") from error
    return model.getvalue()


class _SentenceFeed:
    """Iterates over the sentences, refusing non-strings; keeps the error it raised."""

    def __init__(self, sentences):
        self._sentences = sentences
        self.error = None

    def __iter__(self):
        count = 0
        for sentence in self._sentences:
            if not isinstance(sentence, str):
                self.error = TypeError(
                    f"Every sentence must be a str. Received: {sentence!r} "
                    f"(type {type(sentence).__name__}) at index {count}"
                )
                raise self.error
            count += 1
            yield sentence
        if count == 0:
            self.error = ValueError(
                "`sentences` is empty; the tokenizer needs text to train on."
            )
            raise self.error


def _check_special_tokens(processor, source):
    """Raise if the model's special ids or pieces are not those of special_tokens."""
    for token_id, piece, accessor in _SPECIAL_TOKENS:
        model_id = getattr(processor, accessor)()
        if model_id != token_id:
            raise ValueError(
                f"{source} has {accessor}={model_id}, but keras_transformer "
                f"expects {accessor}={token_id} (see keras_transformer.special_tokens)"
            )
        if processor.IdToPiece(token_id) != piece:
            raise ValueError(
                f"{source} has piece {processor.IdToPiece(token_id)!r} at id "
                f"{token_id}, but keras_transformer expects {piece!r}"
            )

"""`Translator`: text in, text out, through a trained model's compiled beam search.

The object user scripts hold: it loads a model directory (`model.keras` and
`tokenizer.model`) or takes a model and its tokenizer, and translates lists of
strings on any Keras backend. Sentences are tokenized with the sentencepiece model
in Python, sorted by length, batched, padded to a few shapes (the training
pipeline's length buckets, and batch sizes rounded up to powers of two), decoded,
detokenized and put back in the caller's order. The compiled decoder of
`keras_transformer.inference.compiled` traces (and on TensorFlow and JAX compiles) once per
shape, so a long stream of sentences costs a handful of compilations, not one per batch.
"""

import math
import threading
import warnings

import keras
import numpy as np

from keras_transformer import checks
from keras_transformer.data.pipeline import default_bucket_boundaries
from keras_transformer.data.tokenizer import lone_surrogate_position, replace_lone_surrogates
from keras_transformer.inference.compiled import CompiledDecoder
from keras_transformer.inference.decoding import BEAM_SIZE, LENGTH_PENALTY, MAX_DECODE_EXTRA
from keras_transformer.model.directory import load_model_and_tokenizer
from keras_transformer.special_tokens import EOS_ID, PAD_ID

DEFAULT_BATCH_SIZE = 64


class Translator:
    """Translates lists of sentences with a trained Transformer and its tokenizer.

    Decoding is beam search with the GNMT length penalty (the paper's beam of 4 and
    alpha of 0.6, section 6.1) or, with `beam_size=1`, greedy search, each sentence
    through the key/value cache (`keras_transformer.inference.decoding`), compiled for the
    backend (`keras_transformer.inference.compiled`). A sentence's output may be at most its
    length + `max_extra` tokens (the paper's "input length + 50"). The decoding
    settings are the translator's own arguments: the model's config holds only its
    architecture.

    Inputs are checked one by one: `translate` takes a list (or other iterable) of
    `str`, and refuses a lone `str` (it would otherwise be read as a list of
    characters) and any non-string item with a `TypeError` that names the item's type
    and index. A sentence that is empty or whitespace only (nothing to tokenize)
    translates to `""` without being decoded. A sentence longer than the model's
    `max_length` (counting its EOS) is cut to fit, with a `UserWarning` naming its index
    and both lengths. A sentence holding a lone surrogate (U+D800-U+DFFF, which UTF-8
    cannot encode: bytes decoded with "surrogateescape", a JSON "\\ud800" escape) is
    translated with U+FFFD in place of each one, with a `UserWarning` naming its index
    and the position; the other sentences of the call are not affected.

    One `Translator` may be shared by threads: calls into the compiled decoder are
    serialized by a lock (the decoder is one compiled program, so this costs no
    parallelism the backend would have given), and results do not depend on which
    other sentences share a batch.

    Args:
        model_dir_or_model: a model directory (str or path-like) holding
            `model.keras` and `tokenizer.model`, or a `keras_transformer.Transformer`.
        tokenizer: a `SubwordTokenizer` or a path to a `tokenizer.model` file (or its
            directory). Defaults to the tokenizer of the model directory; required
            when a model object is given.
        beam_size: int, beams per sentence; 1 is greedy search. Defaults to 4 (6.1).
        length_penalty: float >= 0, alpha of the length penalty (ignored by greedy
            search). Defaults to 0.6 (6.1).
        max_extra: int >= 0, extra output tokens allowed over the source length.
            Defaults to 50 (6.1).
        batch_size: int, the most sentences decoded together.
        jit_compile: bool, compile with XLA on TensorFlow (default True).

    Raises:
        ValueError: the tokenizer's vocabulary size differs from the model's, or an
            argument is out of range.
        FileNotFoundError: the model directory lacks `model.keras` or
            `tokenizer.model`.

    Example:

    ```python
    translator = Translator("saved_models/demo")
    translator.translate(["on May 29, 2048", ""])
    # ['am 29. Mai 2048', '']
    ```
    """

    def __init__(
        self,
        model_dir_or_model,
        tokenizer=None,
        *,
        beam_size=BEAM_SIZE,
        length_penalty=LENGTH_PENALTY,
        max_extra=MAX_DECODE_EXTRA,
        batch_size=DEFAULT_BATCH_SIZE,
        jit_compile=True,
    ):
        checks.check_positive_int("beam_size", beam_size)
        checks.check_non_negative_number("length_penalty", length_penalty)
        checks.check_non_negative_int("max_extra", max_extra)
        checks.check_positive_int("batch_size", batch_size)
        checks.check_bool("jit_compile", jit_compile)
        model, tokenizer = load_model_and_tokenizer(model_dir_or_model, tokenizer)
        self.model = model
        self.tokenizer = tokenizer
        self.beam_size = beam_size
        self.length_penalty = float(length_penalty)
        self.max_extra = max_extra
        self.batch_size = batch_size
        # The source with its EOS must fit the model's positions.
        self.max_source_tokens = model.config.max_length - 1
        if beam_size == 1:
            self.decoder = CompiledDecoder(model, "greedy", jit_compile=jit_compile, max_extra=max_extra)
        else:
            self.decoder = CompiledDecoder(
                model,
                "beam",
                jit_compile=jit_compile,
                beam_size=beam_size,
                alpha=self.length_penalty,
                max_extra=max_extra,
            )
        self._lock = threading.Lock()

    def translate(self, sentences, *, return_scores=False, progress=False):
        """Translations of `sentences`, in their order.

        Args:
            sentences: list (or other iterable, not a lone str) of str.
            return_scores: bool. Also return each translation's score: the
                length-penalised log-probability for beam search, the summed
                log-probability for greedy search; 0.0 for an empty input.
            progress: bool, show a tqdm progress bar over the sentences.

        Returns:
            list of str; with `return_scores`, `(translations, scores)`.

        Raises:
            TypeError: `sentences` is a str, or one of its items is not a str.
        """
        sentences = _checked_sentences(sentences)
        ids = self._source_ids(sentences)
        translations = [""] * len(sentences)
        scores = [0.0] * len(sentences)
        # Longest first, so the first batches show the worst case (and compile first).
        order = sorted((i for i in range(len(ids)) if ids[i]), key=lambda i: -len(ids[i]))
        bar = _progress_bar(len(sentences), progress)
        try:
            if bar is not None:
                bar.update(len(sentences) - len(order))  # empty inputs: done already
            for start in range(0, len(order), self.batch_size):
                batch = order[start : start + self.batch_size]
                tokens, batch_scores = self._decode([ids[i] for i in batch])
                texts = self.tokenizer.decode(tokens[: len(batch)])
                for row, index in enumerate(batch):
                    translations[index] = texts[row]
                    scores[index] = float(batch_scores[row])
                if bar is not None:
                    bar.update(len(batch))
        finally:
            if bar is not None:
                bar.close()
        return (translations, scores) if return_scores else translations

    def __call__(self, sentences, **kwargs):
        return self.translate(sentences, **kwargs)

    # ------------------------------------------------------------------ internals
    def _source_ids(self, sentences):
        """Encoder input ids of each sentence (with EOS), or [] where there is no text."""
        texts = []
        for index, text in enumerate(sentences):  # a loop: `_encodable` warns at stacklevel 4
            texts.append(_encodable(text, index))
        encoded = self.tokenizer.encode(texts)
        result = []
        for index, ids in enumerate(encoded):
            if not ids:
                result.append([])
                continue
            if len(ids) > self.max_source_tokens:
                warnings.warn(
                    f"Input {index} has {len(ids)} tokens, more than the model's maximum "
                    f"source length of {self.max_source_tokens} tokens (max_length="
                    f"{self.model.config.max_length} with EOS); it is truncated to its "
                    f"first {self.max_source_tokens} tokens.",
                    UserWarning,
                    stacklevel=3,
                )
                ids = ids[: self.max_source_tokens]
            result.append(list(ids) + [EOS_ID])
        return result

    def _decode(self, batch_ids):
        """Pads `batch_ids` to a bucketed shape and decodes it: numpy tokens, scores."""
        encoder_inputs = pad_batch(batch_ids, self.model.config.max_length, self.batch_size)
        with self._lock:
            tokens, scores = self.decoder(encoder_inputs)
            tokens = keras.ops.convert_to_numpy(tokens)
            scores = keras.ops.convert_to_numpy(scores)
        return tokens, scores


def pad_batch(batch_ids, max_length, batch_size):
    """int32 `[B', S']` encoder inputs: `batch_ids` padded with PAD rows and columns.

    S' is the smallest of the training pipeline's bucket boundaries that holds the
    longest sequence (`data.pipeline.default_bucket_boundaries(max_length)`: multiples
    of 8 growing by ~1.5x, 9 shapes up to 256); B' is `len(batch_ids)` rounded up to a
    power of two, at most `batch_size`. So a model sees at most 9 x 7 shapes at the
    default batch size of 64. Extra rows hold a lone EOS: an empty sentence that stops
    at once and changes no other row's result.

    Example:
    >>> pad_batch([[5, 3], [6, 7, 3]], max_length=64, batch_size=64).shape
    (2, 8)
    """
    longest = max(len(ids) for ids in batch_ids)
    length = next(
        (boundary for boundary in default_bucket_boundaries(max_length) if boundary >= longest),
        longest,
    )
    rows = max(len(batch_ids), min(batch_size, 2 ** math.ceil(math.log2(len(batch_ids)))))
    padded = np.full((rows, length), PAD_ID, dtype="int32")
    padded[len(batch_ids) :, 0] = EOS_ID
    for row, ids in enumerate(batch_ids):
        padded[row, : len(ids)] = ids
    return padded


def _checked_sentences(sentences):
    if isinstance(sentences, (str, bytes)):
        raise TypeError(
            "`sentences` must be a list of str, not a single "
            f"{type(sentences).__name__}; wrap it in a list: [text]. Received: {sentences!r:.80}"
        )
    try:
        sentences = list(sentences)
    except TypeError:
        raise TypeError(
            f"`sentences` must be a list of str. Received: {type(sentences).__name__}"
        ) from None
    for index, sentence in enumerate(sentences):
        if not isinstance(sentence, str):
            raise TypeError(
                f"Every sentence must be a str. Received: {type(sentence).__name__} "
                f"({sentence!r:.80}) at index {index}"
            )
    return sentences


def _encodable(text, index):
    """`text`, or a copy with U+FFFD for each lone surrogate (with a warning naming it)."""
    position = lone_surrogate_position(text)
    if position is None:
        return text
    warnings.warn(
        f"Input {index} is not valid Unicode: it holds the lone surrogate {text[position]!r} "
        f"at character {position}, which UTF-8 cannot encode; it is translated with "
        "U+FFFD in place of each lone surrogate.",
        UserWarning,
        stacklevel=4,
    )
    return replace_lone_surrogates(text)


def _progress_bar(total, enabled):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="sentence", desc="translating")


__all__ = ["Translator", "pad_batch"]

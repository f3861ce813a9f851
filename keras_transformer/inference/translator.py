"""`Translator`: text in, text out, through a trained model's compiled beam search.

The object user scripts hold: it loads a model directory (`model.keras` and
`tokenizer.model`), a preset (`Translator.from_preset`), or takes a model and its
tokenizer, and translates lists of strings on any Keras backend: by beam search (with
n-best lists), greedy search or sampling, optionally from forced target prefixes. Sentences are tokenized with the sentencepiece model
in Python, sorted by length (longest first), batched, padded to a few shapes (the training
pipeline's length buckets, and batch sizes rounded up to powers of two), decoded,
detokenized and put back in the caller's order. The compiled decoder of
`keras_transformer.inference.compiled` traces (and on TensorFlow and JAX compiles) once per
shape, so a long stream of sentences costs a handful of compilations, not one per batch;
on JAX, its persistent compilation cache keeps them for the next process.
"""

import importlib
import math
import random
import threading
import typing
import warnings

import keras
import numpy as np

from keras_transformer import checks
from keras_transformer.data.pipeline import default_bucket_boundaries
from keras_transformer.inference import ensemble, sampling
from keras_transformer.inference.compiled import CompiledDecoder, use_jax_compilation_cache
from keras_transformer.inference.text_inputs import checked_strings, encodable, progress_bar
from keras_transformer.inference.decoding import DECODE_METHODS, MAX_DECODE_EXTRA
from keras_transformer.model.directory import load_model_and_tokenizer, resolve_search
from keras_transformer.special_tokens import EOS_ID, PAD_ID

DEFAULT_BATCH_SIZE = None  # None: as many sentences as make BATCH_HYPOTHESES hypotheses
# Hypotheses (sentences x beams) decoded together by default: a batch runs until its last
# sentence stops, so fewer sentences waste fewer rows on finished ones, while a decoding
# step of fewer rows runs its matrix products less efficiently. Multi30k test2016 (beam 4,
# JAX) decoded in 0.69x the CPU time at 8 sentences a batch as at 64, the same translations
# (docs/fast_inference.md).
BATCH_HYPOTHESES = 32
# The searches of `decoding` and sampling: what `Translator(decoding=...)` accepts.
DECODINGS = (*DECODE_METHODS, "sample")
_SAMPLING_ARGUMENTS = ("temperature", "top_k", "top_p", "seed")


class Hypothesis(typing.NamedTuple):
    """One entry of an n-best list (`Translator.translate(..., n_best=k)`).

    Attributes:
        text: str, the translation.
        score: float, what the search ranks by: the length-penalised log-probability
            for beam search, the summed log-probability for greedy search and sampling;
            0.0 for an empty input.
    """

    text: str
    score: float


class Translator:
    """Translates lists of sentences with a trained Transformer and its tokenizer.

    Decoding is beam search with the GNMT length penalty (the paper's beam of 4 and
    alpha of 0.6, section 6.1), greedy search (`beam_size=1` or `decoding="greedy"`),
    or sampling (`decoding="sample"`, `keras_transformer.inference.sampling`), each
    sentence through the key/value cache (`keras_transformer.inference.decoding`),
    compiled for the backend (`keras_transformer.inference.compiled`). A sentence's
    output may be at most its length + `max_extra` tokens (the paper's "input length +
    50"). The decoding settings are the translator's own arguments: the model's config
    holds only its architecture. A model directory also holds its run's beam search
    (beam size and length penalty, chosen on the validation split:
    `keras_transformer.model.directory.resolve_search`), the defaults of the
    arguments left out; `translator.beam_size` and `translator.length_penalty` say what
    is used.

    `translate(..., n_best=k)` returns the k best hypotheses of beam search, and
    `translate(..., prefixes=[...])` continues each translation from a given start
    (`keras_transformer.inference.prefixes`).

    Sampling draws from a seeded generator: batch `i` of the translator's life is drawn
    with a seed made from `(seed, i)`, so a new `Translator` with the same seed, given
    the same calls, repeats every output exactly (on one backend, and on TensorFlow
    with the same `jit_compile`), while later calls of one translator draw afresh. A
    sampled sentence depends on the sentences it is batched with (their positions in
    the batch pick its random numbers); the searches do not.

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
            `model.keras` and `tokenizer.model`, or a `keras_transformer.Transformer`;
            or, to decode with an ensemble (`keras_transformer.inference.ensemble`:
            the members' next-token probabilities averaged at every step), a list of
            model directories (or models) trained with one tokenizer, or an
            `Ensemble`. A list takes its search defaults from its first directory.
        tokenizer: a `SubwordTokenizer` or a path to a `tokenizer.model` file (or its
            directory). Defaults to the tokenizer of the model directory; required
            when a model object is given.
        decoding: "beam", "greedy" or "sample" (`DECODINGS`). Defaults to "beam", or
            "greedy" when `beam_size` is 1.
        beam_size: int, beams per sentence; 1 is greedy search unless `decoding="beam"`.
            Defaults to the model directory's (its run's `eval_beam_size`, saved in
            `config.toml`), else 4 (6.1). Greedy search and sampling keep one hypothesis.
        length_penalty: float >= 0, alpha of the length penalty (beam search only).
            Defaults to the model directory's (`eval_length_penalty`), else 0.6 (6.1).
        max_extra: int >= 0, extra output tokens allowed over the source length.
            Defaults to 50 (6.1).
        early_stopping: bool, beam search only. True stops a sentence once
            `beam_size` of its hypotheses have finished and, at some step, its most
            probable extension was EOS, as OpenNMT and CTranslate2 do: fewer decoding
            steps, at the risk of missing a longer hypothesis that would score better.
            Defaults to False: a sentence stops when no alive hypothesis can still beat
            its finished ones (tensor2tensor's rule; `inference.decoding.beam_search`).
        batch_size: int, the most sentences decoded together. Defaults to None: as many
            as make `BATCH_HYPOTHESES` (32) hypotheses, 8 sentences at beam 4, 32 for
            greedy search and sampling (`translator.batch_size` holds the number).
        jit_compile: bool, compile with XLA on TensorFlow (default True).
        temperature: float > 0, sampling only. Defaults to 1 (the model's distribution).
        top_k: int >= 1, sampling only: draw among the k most probable tokens.
            Defaults to None (all).
        top_p: float in (0, 1], sampling only: draw from the nucleus of this mass.
            Defaults to 1 (all).
        seed: int, sampling only. Defaults to None: a seed from Python's `random`
            (so `keras.utils.set_random_seed` fixes it); `translator.seed` holds it.
        compilation_cache: bool, on JAX, keep the compiled searches in JAX's persistent
            compilation cache (`compiled.use_jax_compilation_cache`: the user cache
            directory, `$KERAS_TRANSFORMER_CACHE` or `~/.cache/keras_transformer`), so a
            later process skips their compilation. Defaults to True; ignored elsewhere,
            and where the process set JAX's cache directory itself.

    Raises:
        ValueError: the tokenizer's vocabulary size differs from the model's, an
            argument is out of range, or a sampling argument is given for a search.
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
        decoding=None,
        beam_size=None,
        length_penalty=None,
        max_extra=MAX_DECODE_EXTRA,
        early_stopping=False,
        batch_size=DEFAULT_BATCH_SIZE,
        jit_compile=True,
        temperature=None,
        top_k=None,
        top_p=None,
        seed=None,
        compilation_cache=True,
    ):
        beam_size, length_penalty = resolve_search(model_dir_or_model, beam_size, length_penalty)
        checks.check_positive_int("beam_size", beam_size)
        if decoding is None:
            decoding = "greedy" if beam_size == 1 else "beam"
        checks.check_choice("decoding", decoding, DECODINGS)
        checks.check_non_negative_number("length_penalty", length_penalty)
        checks.check_non_negative_int("max_extra", max_extra)
        checks.check_bool("early_stopping", early_stopping)
        if batch_size is not None:
            checks.check_positive_int("batch_size", batch_size)
        checks.check_bool("jit_compile", jit_compile)
        checks.check_bool("compilation_cache", compilation_cache)
        sampling_settings = _sampling_settings(decoding, temperature, top_k, top_p, seed)
        model, tokenizer = _load_model(model_dir_or_model, tokenizer)
        self.model = model
        self.tokenizer = tokenizer
        self.decoding = decoding
        self.beam_size = beam_size if decoding == "beam" else 1  # hypotheses kept per sentence
        self.length_penalty = float(length_penalty)
        self.max_extra = max_extra
        self.early_stopping = early_stopping
        self.batch_size = batch_size if batch_size is not None else max(1, BATCH_HYPOTHESES // self.beam_size)
        self.jit_compile = jit_compile
        self.seed = sampling_settings.pop("seed", None)
        self.sampling = sampling_settings  # temperature, top_k, top_p; {} for the searches
        # The source with its EOS must fit the model's positions.
        self.max_source_tokens = model.config.max_length - 1
        if compilation_cache:
            use_jax_compilation_cache()
        self.decoder = self._make_decoder()
        self._n_best_decoder = None  # beam search returning every beam, made when first asked
        self._batches_sampled = 0  # the sampling seed of batch i is made from (seed, i)
        self._lock = threading.Lock()

    @classmethod
    def from_preset(cls, handle, **translator_kwargs):
        """A `Translator` of the model and tokenizer of a preset.

        Loads `handle` with `keras_transformer.presets.load_preset` (a local preset
        directory, or a `kaggle://` / `hf://` handle through keras-hub's loader) and
        passes the rest to the constructor.

        Args:
            handle: str or path-like, what `load_preset` takes.
            **translator_kwargs: the constructor's keyword arguments (`beam_size`,
                `decoding`, ...).

        Example:

        ```python
        translator = Translator.from_preset("presets/demo", beam_size=2)
        ```
        """
        presets = importlib.import_module("keras_transformer.presets")
        model, tokenizer = presets.load_preset(handle)
        return cls(model, tokenizer=tokenizer, **translator_kwargs)

    def _make_decoder(self, return_all_beams=False):
        settings = dict(jit_compile=self.jit_compile, max_extra=self.max_extra)
        if self.decoding == "beam":
            settings.update(beam_size=self.beam_size, alpha=self.length_penalty, early_stopping=self.early_stopping)
            if return_all_beams:
                settings["return_all_beams"] = True
        return CompiledDecoder(self.model, self.decoding, **settings, **self.sampling)

    def translate(self, sentences, *, return_scores=False, progress=False, n_best=None, prefixes=None):
        """Translations of `sentences`, in their order.

        Args:
            sentences: list (or other iterable, not a lone str) of str.
            return_scores: bool. Also return each translation's score: the
                length-penalised log-probability for beam search, the summed
                log-probability for greedy search and sampling; 0.0 for an empty input.
            progress: bool, show a tqdm progress bar over the sentences.
            n_best: optional int, 1 <= n_best <= the beam size: return for each sentence
                its `n_best` best hypotheses, best first, as lists of `Hypothesis(text,
                score)`. The first is what `translate` returns without `n_best`. A
                sentence has fewer only where the search finished fewer (a one-token
                limit); an empty input has `[Hypothesis("", 0.0)]`.
            prefixes: optional list of str, one per sentence (`""` for none): each
                translation starts with its prefix, tokenized on its own (so it should end
                at a word boundary), and the search continues from it. The prefix counts
                in the score and in the output limit, which must leave room for EOS.

        Returns:
            list of str; with `return_scores`, `(translations, scores)`; with `n_best`,
            a list of lists of `Hypothesis`.

        Raises:
            TypeError: `sentences` (or `prefixes`) is a str, or one of its items is not a str.
            ValueError: `n_best` above the beam size (or not a positive int), or with
                `return_scores`; `prefixes` not one per sentence; a prefix with more
                tokens than its sentence's output limit leaves room for.
        """
        sentences = checked_strings("sentences", sentences)
        self._check_n_best(n_best, return_scores)
        if prefixes is not None:
            prefixes = checked_strings("prefixes", prefixes)
            if len(prefixes) != len(sentences):
                raise ValueError(
                    f"`prefixes` must hold one prefix per sentence (\"\" for none): "
                    f"{len(sentences)} sentences, but received {len(prefixes)} prefixes."
                )
        ids = self._source_ids(sentences)
        prefix_ids = None if prefixes is None else self._prefix_ids(prefixes, ids)
        results = [([""], [0.0]) for _ in sentences]  # (texts, scores) of each sentence, best first
        # Longest first, so the first batches show the worst case (and compile first).
        order = sorted((i for i in range(len(ids)) if ids[i]), key=lambda i: -len(ids[i]))
        bar = progress_bar(len(sentences), progress)
        try:
            if bar is not None:
                bar.update(len(sentences) - len(order))  # empty inputs: done already
            for start in range(0, len(order), self.batch_size):
                batch = order[start : start + self.batch_size]
                batch_prefixes = None if prefix_ids is None else [prefix_ids[i] for i in batch]
                texts, scores = self._decode([ids[i] for i in batch], batch_prefixes, n_best)
                for row, index in enumerate(batch):
                    results[index] = (texts[row], scores[row])
                if bar is not None:
                    bar.update(len(batch))
        finally:
            if bar is not None:
                bar.close()
        if n_best is not None:
            return [
                [Hypothesis(text, score) for text, score in zip(texts, scores)][:n_best]
                for texts, scores in results
            ]
        translations = [texts[0] for texts, _ in results]
        scores = [scores[0] for _, scores in results]
        return (translations, scores) if return_scores else translations

    def __call__(self, sentences, **kwargs):
        return self.translate(sentences, **kwargs)

    # ------------------------------------------------------------------ internals
    def _check_n_best(self, n_best, return_scores):
        if n_best is None:
            return
        checks.check_positive_int("n_best", n_best)
        if n_best > self.beam_size:
            kept = {"greedy": " (greedy search keeps one)", "sample": " (sampling keeps one)"}
            raise ValueError(
                f"`n_best` must be at most the beam size: a search returns no more hypotheses "
                f"than it keeps. Received: n_best={n_best}, beam_size={self.beam_size}"
                f"{kept.get(self.decoding, '')}"
            )
        if return_scores:
            raise ValueError(
                "`return_scores` and `n_best` do not go together: each `Hypothesis` of an "
                "n-best list holds its score."
            )

    def _source_ids(self, sentences):
        """Encoder input ids of each sentence (with EOS), or [] where there is no text."""
        texts = []
        for index, text in enumerate(sentences):  # a loop: `encodable` warns at stacklevel 4
            texts.append(encodable(text, index))
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

    def _prefix_ids(self, prefixes, source_ids):
        """Token ids of each prefix, checked to fit its sentence's output limit.

        A sentence without text but with a prefix is decoded from a lone EOS (`source_ids`
        is updated in place), so that its output starts with the prefix too.
        """
        texts = []
        for index, text in enumerate(prefixes):
            texts.append(encodable(text, index, what="Prefix"))
        result = [list(ids) for ids in self.tokenizer.encode(texts)]
        cap = self.model.config.max_length - 1
        for index, ids in enumerate(result):
            if ids and not source_ids[index]:
                source_ids[index] = [EOS_ID]
            if not ids:
                continue
            limit = min(len(source_ids[index]) + self.max_extra, cap)
            if len(ids) >= limit:
                raise ValueError(
                    f"Prefix {index} has {len(ids)} tokens, but sentence {index}'s output limit "
                    f"is {limit} tokens (its {len(source_ids[index])} source tokens with EOS + "
                    f"max_extra={self.max_extra}, at most max_length - 1 = {cap}), EOS "
                    f"included: a prefix may have at most {limit - 1} tokens."
                )
        return result

    def _decode(self, batch_ids, batch_prefix_ids, n_best):
        """Decodes one batch: for each sentence, its hypotheses' texts and scores, best first."""
        max_length = self.model.config.max_length
        encoder_inputs = pad_batch(batch_ids, max_length, self.batch_size)
        inputs = {}
        if batch_prefix_ids is not None:
            inputs["prefix_ids"] = pad_prefixes(batch_prefix_ids, len(encoder_inputs), max_length)
        with self._lock:
            decoder = self.decoder
            if n_best is not None and self.decoding == "beam":
                if self._n_best_decoder is None:
                    self._n_best_decoder = self._make_decoder(return_all_beams=True)
                decoder = self._n_best_decoder
            if self.decoding == "sample":
                inputs["seed"] = self._next_seed()
            tokens, scores = decoder(encoder_inputs, **inputs)
            tokens = keras.ops.convert_to_numpy(tokens)[: len(batch_ids)]
            scores = keras.ops.convert_to_numpy(scores)[: len(batch_ids)]
        if tokens.ndim == 2:  # one hypothesis per sentence
            tokens, scores = tokens[:, None], scores[:, None]
        reached = np.isfinite(scores)  # beam slots no hypothesis reached are -inf
        texts = self.tokenizer.decode(tokens.reshape(-1, tokens.shape[-1]))
        texts = [texts[row * tokens.shape[1] : (row + 1) * tokens.shape[1]] for row in range(len(tokens))]
        return (
            [[text for text, ok in zip(row, kept) if ok] for row, kept in zip(texts, reached)],
            [[float(score) for score in row[kept]] for row, kept in zip(scores, reached)],
        )

    def _next_seed(self):
        """int32 `[2]`: the sampling seed of the next batch, from `(seed, batches so far)`."""
        sequence = np.random.SeedSequence([self.seed % 2**63, self._batches_sampled])
        self._batches_sampled += 1
        # Below 2**30: the step counter added in the loop keeps it a positive int32.
        return (sequence.generate_state(2) % 2**30).astype("int32")


def pad_batch(batch_ids, max_length, batch_size):
    """int32 `[B', S']` encoder inputs: `batch_ids` padded with PAD rows and columns.

    S' is the smallest of the training pipeline's bucket boundaries that holds the
    longest sequence (`data.pipeline.default_bucket_boundaries(max_length)`: multiples
    of 8 growing by ~1.5x, 9 shapes up to 256); B' is `len(batch_ids)` rounded up to a
    power of two, at most `batch_size`. So a model sees at most 9 x 7 shapes at a batch
    size of 64 (9 x 4 at beam 4's default of 8). Extra rows hold a lone EOS: an empty sentence that stops
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


def pad_prefixes(prefix_ids, rows, max_length):
    """int32 `[rows, P']` prefix ids: `prefix_ids` padded with 0 (nothing forced).

    P' is the smallest bucket boundary (as in `pad_batch`) that holds the longest
    prefix, and at least 1, so prefixes reach the compiled decoder in a few shapes.

    Example:
    >>> pad_prefixes([[7, 8], []], rows=4, max_length=64).tolist()[:2]
    [[7, 8, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 0]]
    """
    longest = max([len(ids) for ids in prefix_ids] + [1])
    width = next(
        (boundary for boundary in default_bucket_boundaries(max_length) if boundary >= longest),
        longest,
    )
    padded = np.full((rows, width), PAD_ID, dtype="int32")
    for row, ids in enumerate(prefix_ids):
        padded[row, : len(ids)] = ids
    return padded


def _load_model(source, tokenizer):
    """`(model, tokenizer)`: one model, or an `Ensemble` of a list, or given."""
    if isinstance(source, (list, tuple)):
        return ensemble.load_ensemble(source, tokenizer)
    if isinstance(source, ensemble.Ensemble):
        if tokenizer is None:
            raise ValueError(
                "An Ensemble needs its tokenizer: pass `tokenizer=` (a SubwordTokenizer or "
                "the path of its tokenizer.model), or give the list of model directories."
            )
        # Each member as load_model_and_tokenizer checks one model and its tokenizer.
        for member in source.models:
            _, tokenizer = load_model_and_tokenizer(member, tokenizer)
        return source, tokenizer
    return load_model_and_tokenizer(source, tokenizer)


def _sampling_settings(decoding, temperature, top_k, top_p, seed):
    """The sampling arguments with their defaults; ValueError if given to a search."""
    given = {
        name: value
        for name, value in zip(_SAMPLING_ARGUMENTS, (temperature, top_k, top_p, seed))
        if value is not None
    }
    if decoding != "sample":
        if given:
            listed = ", ".join(f"{name}={value!r}" for name, value in given.items())
            raise ValueError(
                f"{listed}: `temperature`, `top_k`, `top_p` and `seed` apply to "
                f"decoding=\"sample\". Received: decoding={decoding!r}"
            )
        return {}
    settings = {
        "temperature": sampling.TEMPERATURE if temperature is None else temperature,
        "top_k": top_k,
        "top_p": sampling.TOP_P if top_p is None else top_p,
        "seed": random.randrange(2**31) if seed is None else seed,
    }
    sampling.check_sampling_arguments(**settings)
    return settings


__all__ = ["BATCH_HYPOTHESES", "DECODINGS", "Hypothesis", "Translator", "pad_batch", "pad_prefixes"]

"""`CTranslate2Translator`: `Translator`'s contract, decoded by the CTranslate2 engine.

Text in, text out, like `keras_transformer.Translator`: the same input checks, the same
tokenizer, the same source truncation and per-sentence length limit, the same beam
search settings, mapped onto CTranslate2's options:

- `beam_size` is CTranslate2's `beam_size` (1: greedy search).
- The length penalty. CTranslate2 divides a hypothesis' log-probability by
  `length ** length_penalty` (length without EOS), not by the GNMT
  `((5 + length) / 6) ** alpha` this package uses (Wu et al., 2016; the paper's
  alpha = 0.6). So CTranslate2 is run with `length_penalty=0` (raw log-probabilities)
  and `num_hypotheses=beam_size`, and its finished hypotheses are re-ranked here
  with the GNMT penalty, the length counting EOS as in `decoding.length_penalty`.
- `max_extra`: a sentence may produce its source length (with EOS) + `max_extra`
  tokens, EOS included, at most `max_length - 1`. CTranslate2 takes one
  `max_decoding_length` per call (tokens without EOS): each batch is decoded with the
  largest of its sentences' limits, and a sentence whose hypotheses went past its own
  limit is decoded again alone with it.
- PAD and BOS are never generated (CTranslate2's `suppress_sequences`).

Differences that remain, by construction of the two engines: CTranslate2 stops a
sentence once `beam_size` hypotheses have finished after its most probable extension
ended (ours, by default, when no alive beam can beat the finished ones; with
`early_stopping=True`, by the same rule), renormalizes the log-probabilities after
removing PAD and BOS (ours does not), and at the length limit leaves a hypothesis
without EOS (ours forces EOS there and counts its log-probability). On a trained model these change the best
hypothesis rarely (tests/test_ctranslate2.py measures it).
"""

import json
import os
import shutil
import tempfile
import threading
import warnings

from keras_transformer import checks
from keras_transformer.inference.ctranslate2_export import (
    SETTINGS_FILE,
    export_ctranslate2,
    import_ctranslate2,
)
from keras_transformer.inference.decoding import BEAM_SIZE, LENGTH_PENALTY, MAX_DECODE_EXTRA
from keras_transformer.inference.text_inputs import checked_strings, encodable, progress_bar
from keras_transformer.model import directory as model_directory
from keras_transformer.special_tokens import BOS_PIECE, PAD_PIECE

DEFAULT_BATCH_SIZE = 32
COMPUTE_TYPES = ("default", "auto", "float32", "int8", "int8_float32", "int16", "float16", "int8_float16")


def _check_settings(
    beam_size, length_penalty, max_extra, early_stopping, batch_size, compute_type, inter_threads, intra_threads
):
    """Raises ValueError naming the first of `CTranslate2Translator`'s settings out of range."""
    checks.check_positive_int("beam_size", beam_size)
    checks.check_non_negative_number("length_penalty", length_penalty)
    checks.check_non_negative_int("max_extra", max_extra)
    checks.check_bool("early_stopping", early_stopping)
    if not early_stopping:
        raise ValueError(
            "CTranslate2 stops a sentence's beam search early (once `beam_size` hypotheses "
            "have finished after its most probable extension ended) and has no rule that "
            "searches on until no alive hypothesis can win: use keras_transformer.Translator "
            "for early_stopping=False. "
            f"Received: early_stopping={early_stopping!r}"
        )
    checks.check_positive_int("batch_size", batch_size)
    checks.check_choice("compute_type", compute_type, COMPUTE_TYPES)
    checks.check_positive_int("inter_threads", inter_threads)
    checks.check_non_negative_int("intra_threads", intra_threads)


class CTranslate2Translator:
    """Translates lists of sentences with CTranslate2, as `Translator` does with Keras.

    Given a CTranslate2 model directory written by `export_ctranslate2` (it holds
    `model.bin`, the tokenizer and `keras_transformer.json`), the translator loads it.
    Given a model directory (`model.keras` + `tokenizer.model`), it converts the model
    on the fly into a temporary directory (float32 weights; `compute_type` still
    quantizes at load time), removed by `close()` or when the translator is collected:
    convenient for a try, but each new translator pays the conversion; export once
    (`kt-export --format ctranslate2`) to serve.

    `translate` behaves as `Translator.translate` (see there): a list of str in, a list
    of str out in the same order, `""` for an empty sentence, a `TypeError` for a lone
    str or a non-str item, a `UserWarning` for a sentence cut to the model's length or
    holding a lone surrogate.

    Args:
        model_dir: a CTranslate2 model directory from `export_ctranslate2`, or a model
            directory.
        beam_size: int, beams per sentence; 1 is greedy search. Defaults to 4 (6.1).
        length_penalty: float >= 0, alpha of the GNMT length penalty. Defaults to 0.6.
        max_extra: int >= 0, extra output tokens allowed over the source length.
            Defaults to 50 (6.1).
        early_stopping: True, CTranslate2's only rule: a sentence stops once
            `beam_size` hypotheses have finished and its most probable extension has
            ended at some step (`Translator(early_stopping=True)`). False,
            `Translator`'s default, is refused: CTranslate2 has no exact rule.
        batch_size: int, the most sentences handed to CTranslate2 in one call.
        device: "cpu" (or "cuda" where CTranslate2 was built with it).
        compute_type: CTranslate2's compute type: "default" (the stored weights' type),
            "int8", "int8_float32", "float32", ...
        inter_threads: int, batches CTranslate2 decodes in parallel.
        intra_threads: int, threads per batch (0: CTranslate2's default, 4).

    Raises:
        ImportError: `ctranslate2` is not installed (the message names the extra).
        FileNotFoundError: `model_dir` is neither kind of directory.
        ValueError: an argument out of range.

    Example:

    ```python
    translator = CTranslate2Translator("saved_models/demo_ct2", intra_threads=2)
    translator.translate(["on May 29, 2048"])
    # ['am 29. Mai 2048']
    ```
    """

    def __init__(
        self,
        model_dir,
        *,
        beam_size=BEAM_SIZE,
        length_penalty=LENGTH_PENALTY,
        max_extra=MAX_DECODE_EXTRA,
        early_stopping=True,
        batch_size=DEFAULT_BATCH_SIZE,
        device="cpu",
        compute_type="default",
        inter_threads=1,
        intra_threads=0,
    ):
        _check_settings(
            beam_size, length_penalty, max_extra, early_stopping, batch_size, compute_type, inter_threads, intra_threads
        )
        ctranslate2 = import_ctranslate2()
        self._temporary = None
        model_dir = self._converted(os.fspath(model_dir))
        self.model_dir = model_dir
        self.settings = _read_settings(model_dir)
        from keras_transformer.data.tokenizer import SubwordTokenizer  # TensorFlow: load lazily

        self.tokenizer = SubwordTokenizer.load(model_dir)
        if self.tokenizer.fingerprint != self.settings["tokenizer_sha256"]:
            raise ValueError(
                f"The {model_directory.TOKENIZER_FILE} in {model_dir} is not the one it was "
                f"exported with ({SETTINGS_FILE} records another sha256): put back the export's own."
            )
        self.beam_size = beam_size
        self.length_penalty = float(length_penalty)
        self.max_extra = max_extra
        self.batch_size = batch_size
        self.max_length = int(self.settings["max_length"])
        self.max_source_tokens = self.max_length - 1  # with its EOS, the source fits the positions
        self.engine = ctranslate2.Translator(
            model_dir,
            device=device,
            compute_type=compute_type,
            inter_threads=inter_threads,
            intra_threads=intra_threads,
        )
        self._pieces = [self.tokenizer.id_to_piece(i) for i in range(self.tokenizer.vocab_size)]
        self._piece_ids = {piece: index for index, piece in enumerate(self._pieces)}
        self._lock = threading.Lock()

    def _converted(self, model_dir):
        """`model_dir` if it is a CTranslate2 model, else its conversion in a temporary directory."""
        if os.path.isfile(os.path.join(model_dir, "model.bin")):
            return model_dir
        if not os.path.isfile(os.path.join(model_dir, model_directory.MODEL_FILE)):
            raise FileNotFoundError(
                f"{model_dir!r} is neither a CTranslate2 model directory (model.bin, from "
                f"kt.export_ctranslate2) nor a model directory ({model_directory.MODEL_FILE})."
            )
        self._temporary = tempfile.mkdtemp(prefix="kt-ctranslate2-")
        return export_ctranslate2(model_dir, os.path.join(self._temporary, "model"))

    # ------------------------------------------------------------------ public
    def translate(self, sentences, *, return_scores=False, progress=False):
        """Translations of `sentences`, in their order (as `Translator.translate`).

        Returns:
            list of str; with `return_scores`, `(translations, scores)`: the
            GNMT-penalised log-probability for beam search, the summed
            log-probability for greedy search (EOS included where it was generated),
            0.0 for an empty input.
        """
        sentences = checked_strings("sentences", sentences)
        ids = self._source_ids(sentences)
        translations = [""] * len(sentences)
        scores = [0.0] * len(sentences)
        order = sorted((i for i in range(len(ids)) if ids[i]), key=lambda i: -len(ids[i]))
        bar = progress_bar(len(sentences), progress)
        try:
            if bar is not None:
                bar.update(len(sentences) - len(order))
            for start in range(0, len(order), self.batch_size):
                batch = order[start : start + self.batch_size]
                outputs = self._decode([ids[i] for i in batch])
                texts = self.tokenizer.decode([tokens for tokens, _ in outputs])
                for row, index in enumerate(batch):
                    translations[index] = texts[row]
                    scores[index] = outputs[row][1]
                if bar is not None:
                    bar.update(len(batch))
        finally:
            if bar is not None:
                bar.close()
        return (translations, scores) if return_scores else translations

    def __call__(self, sentences, **kwargs):
        return self.translate(sentences, **kwargs)

    def translate_ids(self, source_ids, max_decoding_length=None):
        """Output ids (without BOS and EOS) and scores of each source id list (without EOS).

        The decoding under `translate`, for callers that tokenize themselves;
        `max_decoding_length` (tokens before EOS) overrides each sentence's limit.
        """
        if max_decoding_length is not None:
            checks.check_positive_int("max_decoding_length", max_decoding_length)
            return [self._search([ids], max_decoding_length)[0] for ids in source_ids]
        return self._decode([list(ids) for ids in source_ids])

    def close(self):
        """Removes the temporary conversion of a model directory, if one was made."""
        if getattr(self, "_temporary", None) is not None:
            shutil.rmtree(self._temporary, ignore_errors=True)
            self._temporary = None

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def __del__(self):
        self.close()

    # ------------------------------------------------------------------ internals
    def _source_ids(self, sentences):
        """Source ids of each sentence, without EOS (CTranslate2 adds it), [] for no text."""
        texts = []
        for index, text in enumerate(sentences):  # a loop: `encodable` warns at stacklevel 4
            texts.append(encodable(text, index))
        result = []
        for index, ids in enumerate(self.tokenizer.encode(texts)):
            if len(ids) > self.max_source_tokens:
                warnings.warn(
                    f"Input {index} has {len(ids)} tokens, more than the model's maximum "
                    f"source length of {self.max_source_tokens} tokens (max_length="
                    f"{self.max_length} with EOS); it is truncated to its first "
                    f"{self.max_source_tokens} tokens.",
                    UserWarning,
                    stacklevel=3,
                )
                ids = ids[: self.max_source_tokens]
            result.append(list(ids))
        return result

    def _limit(self, ids):
        """Output tokens before EOS a sentence may have: `decoding.decode_lengths`' limit - 1."""
        limit = min(len(ids) + 1 + self.max_extra, self.max_length - 1)  # EOS included
        return max(limit - 1, 1)

    def _decode(self, batch_ids):
        """`[(output ids, score)]` of a batch, each sentence within its own length limit."""
        limits = [self._limit(ids) for ids in batch_ids]
        outputs = self._search(batch_ids, max(limits), keep_all=True)
        results = []
        for ids, limit, hypotheses in zip(batch_ids, limits, outputs):
            if any(len(tokens) > limit for tokens, _ in hypotheses):
                # Decoded with a longer limit than its own: decode it alone with its own.
                hypotheses = self._search([ids], limit, keep_all=True)[0]
            results.append(self._best(hypotheses, limit))
        return results

    def _search(self, batch_ids, max_decoding_length, keep_all=False):
        """CTranslate2's hypotheses `[(ids, summed log-probability)]` per sentence."""
        source = [[self._pieces[i] for i in ids] for ids in batch_ids]
        with self._lock:
            results = self.engine.translate_batch(
                source,
                beam_size=self.beam_size,
                num_hypotheses=self.beam_size,
                length_penalty=0.0,  # raw log-probabilities: re-ranked by `_best`
                max_decoding_length=max_decoding_length,
                max_input_length=0,  # sources are cut to the model's length by `_source_ids`
                suppress_sequences=[[PAD_PIECE], [BOS_PIECE]],
                return_scores=True,
            )
        hypotheses = [
            [
                ([self._piece_ids[piece] for piece in tokens], float(score))
                for tokens, score in zip(result.hypotheses, result.scores)
            ]
            for result in results
        ]
        if keep_all:
            return hypotheses
        return [self._best(h, max_decoding_length) for h in hypotheses]

    def _best(self, hypotheses, limit):
        """The best hypothesis by this package's score: `(ids, score)`."""
        if self.beam_size == 1:
            return hypotheses[0]

        def penalised(hypothesis):
            tokens, log_prob = hypothesis
            length = len(tokens) + 1  # with EOS (generated, or forced at the limit by ours)
            return log_prob / ((5.0 + length) / 6.0) ** self.length_penalty

        fitting = [h for h in hypotheses if len(h[0]) <= limit] or hypotheses
        best = max(fitting, key=penalised)
        return best[0], penalised(best)


def _read_settings(model_dir):
    """The export's `keras_transformer.json`, or a ValueError saying the directory lacks it."""
    path = os.path.join(model_dir, SETTINGS_FILE)
    try:
        with open(path, encoding="utf-8") as file:
            settings = json.load(file)
        int(settings["max_length"]), str(settings["tokenizer_sha256"])
    except FileNotFoundError:
        raise ValueError(
            f"{model_dir} has no {SETTINGS_FILE}: it was not written by "
            "kt.export_ctranslate2 (kt-export --format ctranslate2), which records the "
            "model's length and tokenizer there. Export the model directory with it."
        ) from None
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path} is corrupt: {type(error).__name__}: {error}") from None
    return settings


__all__ = ["CTranslate2Translator", "COMPUTE_TYPES"]

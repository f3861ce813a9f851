"""Scoring translations with sacreBLEU: corpus BLEU, chrF and exact match.

`score_translations` scores detokenized hypotheses against references (sacreBLEU's
defaults, so scores are comparable with published ones); `evaluate` translates a
source file's lines with a model (in compiled batches, through
`keras_transformer.translator.Translator`) and scores them. The validation-BLEU
callback, the demo and `python -m training.evaluate` all use these.
"""

import sacrebleu

from keras_transformer.inference.decoding import DEFAULT_ALPHA, DEFAULT_BEAM_SIZE

DECODE_METHODS = ("beam", "greedy")


def make_translator(
    model, tokenizer=None, decode="beam", *, batch_size=64, beam_size=None, alpha=None, jit_compile=True
):
    """A `Translator` decoding with beam search (the paper's 4 and 0.6) or greedily.

    Args:
        model: a model directory or a `keras_transformer.Transformer`.
        tokenizer: its `SubwordTokenizer` (None: the model directory's).
        decode: `"beam"` (default) or `"greedy"`.
        batch_size: int, sentences per decoder call.
        beam_size: int, defaults to the model config's `beam_size` (4, section 6.1).
        alpha: float, the length penalty, defaults to the config's (0.6).
        jit_compile: bool, compile the search with XLA on TensorFlow (default True).

    Example:
    >>> make_translator("saved_models/demo", decode="greedy").translate(["on May 29, 2048"])
    ['am 29. Mai 2048']
    """
    from keras_transformer.inference.translator import Translator, load_model_and_tokenizer

    if decode not in DECODE_METHODS:
        raise ValueError(f"`decode` must be one of {DECODE_METHODS}. Received: decode={decode!r}")
    model, tokenizer = load_model_and_tokenizer(model, tokenizer)
    config = model.config
    if decode == "greedy":
        beam_size = 1
    elif beam_size is None:
        beam_size = getattr(config, "beam_size", DEFAULT_BEAM_SIZE)
    if alpha is None:
        alpha = getattr(config, "length_penalty", DEFAULT_ALPHA)
    return Translator(
        model,
        tokenizer,
        beam_size=beam_size,
        length_penalty=alpha,
        batch_size=batch_size,
        jit_compile=jit_compile,
    )


def score_translations(hypotheses, references):
    """Corpus BLEU and chrF (sacreBLEU, default settings) and the exact-match rate.

    Args:
        hypotheses: list of str, detokenized system output.
        references: list of str, one reference per hypothesis.

    Returns:
        dict with `bleu` and `chrf` (0-100), `exact_match` (a fraction in [0, 1]: the
        share of hypotheses equal to their reference, whitespace at the ends ignored)
        and `test_pairs` (the number of pairs).

    Example:
    >>> score_translations(["am 29. Mai 2048"], ["am 29. Mai 2048"])["exact_match"]
    1.0
    """
    hypotheses, references = list(hypotheses), list(references)
    if len(hypotheses) != len(references):
        raise ValueError(
            f"Expected one reference per hypothesis. Received: {len(hypotheses)} "
            f"hypotheses and {len(references)} references"
        )
    if not references:
        raise ValueError("Expected at least one sentence pair to score. Received: none")
    exact = sum(h.strip() == r.strip() for h, r in zip(hypotheses, references))
    return {
        "bleu": float(sacrebleu.corpus_bleu(hypotheses, [references]).score),
        "chrf": float(sacrebleu.corpus_chrf(hypotheses, [references]).score),
        "exact_match": exact / len(references),
        "test_pairs": len(references),
    }


def evaluate(
    model,
    source_lines,
    reference_lines,
    *,
    decode="beam",
    batch_size=128,
    progress=True,
    return_translations=False,
    jit_compile=True,
):
    """Translates `source_lines` and scores them against `reference_lines`.

    Decoding runs in batches of `batch_size` sentences of similar length, padded to a
    few shapes so the compiled decoder is traced once per shape, with a tqdm progress
    bar; the output is detokenized before scoring.

    Args:
        model: a model directory (str or path-like) or a `(model, tokenizer)` pair.
        source_lines: list of str.
        reference_lines: list of str, as many as `source_lines`.
        decode: `"beam"` (default, beam 4 and alpha 0.6 from the model config) or
            `"greedy"`.
        batch_size: int, sentences per decoder call.
        progress: bool, show a progress bar.
        return_translations: bool, also return the hypotheses.
        jit_compile: bool, compile the search with XLA on TensorFlow (default True).

    Returns:
        dict `bleu`, `chrf`, `exact_match`, `test_pairs` (see `score_translations`);
        with `return_translations`, `(scores, translations)`.

    Example:
    >>> evaluate("saved_models/demo", ["on May 29, 2048"], ["am 29. Mai 2048"], decode="greedy")
    {'bleu': 100.0, 'chrf': 100.0, 'exact_match': 1.0, 'test_pairs': 1}
    """
    if isinstance(model, (tuple, list)):
        if len(model) != 2:
            raise ValueError(f"Expected a (model, tokenizer) pair. Received: {len(model)} items")
        model, tokenizer = model
    else:
        tokenizer = None
    source_lines, reference_lines = list(source_lines), list(reference_lines)
    if len(source_lines) != len(reference_lines):
        raise ValueError(
            f"Expected as many references as sources. Received: {len(source_lines)} "
            f"sources and {len(reference_lines)} references"
        )
    translator = make_translator(model, tokenizer, decode, batch_size=batch_size, jit_compile=jit_compile)
    translations = translator.translate(source_lines, progress=progress)
    scores = score_translations(translations, reference_lines)
    return (scores, translations) if return_translations else scores


def read_lines(path):
    """The lines of a UTF-8 text file, without line endings (one sentence per line)."""
    with open(path, encoding="utf-8") as file:
        return [line.rstrip("\r\n") for line in file]


__all__ = ["evaluate", "score_translations", "make_translator", "read_lines", "DECODE_METHODS"]

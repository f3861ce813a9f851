"""Scoring translations with sacreBLEU: corpus BLEU, chrF and exact match.

`score_translations` scores detokenized hypotheses against references (sacreBLEU's
defaults, so scores are comparable with published ones); `evaluate` translates source
lines with a `Translator` (compiled, bucketed batches) and scores them. The
validation-BLEU callback, the demo and `kt-evaluate` all use these.
"""

import sacrebleu


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


def evaluate(translator, source_lines, reference_lines, *, progress=True, return_translations=False):
    """Translates `source_lines` with `translator` and scores them against `reference_lines`.

    The translator decides the search (beam size, length penalty, batch size); its
    output is detokenized text, scored by `score_translations`.

    Args:
        translator: a `keras_transformer.Translator` (or anything with its
            `translate(sentences, progress=...)`).
        source_lines: list of str.
        reference_lines: list of str, as many as `source_lines`.
        progress: bool, show a progress bar.
        return_translations: bool, also return the hypotheses.

    Returns:
        dict `bleu`, `chrf`, `exact_match`, `test_pairs` (see `score_translations`);
        with `return_translations`, `(scores, translations)`.

    Example:

    ```python
    translator = kt.Translator("saved_models/demo", beam_size=1)
    evaluate(translator, ["on May 29, 2048"], ["am 29. Mai 2048"])
    # {'bleu': 100.0, 'chrf': 100.0, 'exact_match': 1.0, 'test_pairs': 1}
    ```
    """
    if not callable(getattr(translator, "translate", None)):
        raise TypeError(
            "`translator` must be a keras_transformer.Translator (make one with "
            f"kt.Translator(model_dir, beam_size=...)). Received: {type(translator).__name__}"
        )
    source_lines, reference_lines = list(source_lines), list(reference_lines)
    if len(source_lines) != len(reference_lines):
        raise ValueError(
            f"Expected as many references as sources. Received: {len(source_lines)} "
            f"sources and {len(reference_lines)} references"
        )
    translations = translator.translate(source_lines, progress=progress)
    scores = score_translations(translations, reference_lines)
    return (scores, translations) if return_translations else scores


def read_lines(path):
    """The lines of a UTF-8 text file, without line endings (one sentence per line)."""
    with open(path, encoding="utf-8") as file:
        return [line.rstrip("\r\n") for line in file]


__all__ = ["evaluate", "score_translations", "read_lines"]

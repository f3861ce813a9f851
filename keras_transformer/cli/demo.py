"""`kt-demo` (`make demo`): train on the built-in demo corpus, score its test split, export.

Trains with `training/configs/demo.toml` (English->German dates and numbers, a few
minutes on a CPU; the demo always starts afresh, so `overwrite` is on unless
`--set overwrite=false`), translates the corpus' held-out test split, prints a few
translations, BLEU, chrF and the exact-match rate, and writes them with the training
time into `saved_models/demo/metrics.json`. It ends by exporting the model for
TensorFlow Serving (`saved_models/demo/<version>/`) and translating a few sentences
through the reloaded SavedModel beside the in-process `Translator`.

Example:
    kt-demo --set max_train_seconds=60
"""

import argparse
import dataclasses
import os
import sys
import time

from keras_transformer.cli import common, interrupt

# The demo's config lives in the repository's training/configs/ (not installed by pip).
DEFAULT_CONFIG = os.path.normpath(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "training", "configs", "demo.toml")
)
SHOWN_TRANSLATIONS = 8
SHOWN_MISTAKES = 5
EXPORT_CHECK_SENTENCES = 4


@dataclasses.dataclass(frozen=True)
class ExportCheck:
    """What `export_and_check` did: where it exported, and what the export said.

    Args:
        export_dir: str, the version directory written.
        sentences: list of str, the sentences translated.
        translations: list of str, the SavedModel's translations.
        agrees: list of bool, whether each equals the in-process `Translator`'s.
    """

    export_dir: str
    sentences: list
    translations: list
    agrees: list

    def __str__(self):
        lines = [f"SavedModel {self.export_dir}:"]
        for source, target, agree in zip(self.sentences, self.translations, self.agrees):
            mark = "" if agree else "   (differs from the in-process Translator)"
            lines.append(f"  {source!r} -> {target!r}{mark}")
        return "\n".join(lines)


def export_and_check(model_dir, sentences, *, base_dir="saved_models", name="demo", jit_compile=True, **kwargs):
    """Exports `model_dir`, reloads the SavedModel and translates `sentences` with it.

    The end of the demo: the translations of the reloaded graph are compared with
    those of a `Translator` on the same model (same search settings).

    Args:
        model_dir: a model directory (`model.keras` + `tokenizer.model`).
        sentences: list of str to translate.
        base_dir, name: where to export (`base_dir/name/<next version>/`).
        jit_compile: bool, XLA-compile the in-process `Translator` it compares with.
        **kwargs: more `export_saved_model` arguments (`beam_size`, `version`, ...).

    Returns:
        An `ExportCheck`; `print` it to show the translations.

    Example:
    >>> print(export_and_check("saved_models/demo", ["on May 29, 2048"],
    ...                        base_dir="saved_models", name="demo"))
    SavedModel saved_models/demo/1:
      'on May 29, 2048' -> 'am 29. Mai 2048'
    """
    from keras_transformer.inference.decoding import MAX_DECODE_EXTRA
    from keras_transformer.inference.export import export_saved_model, translate_with_saved_model
    from keras_transformer.inference.translator import Translator
    from keras_transformer.model.directory import load_model_and_tokenizer, resolve_search

    model, tokenizer = load_model_and_tokenizer(model_dir)
    # The directory's saved search unless kwargs say otherwise, for both sides of the check.
    kwargs["beam_size"], kwargs["length_penalty"] = resolve_search(
        model_dir, kwargs.get("beam_size"), kwargs.get("length_penalty")
    )
    export_dir = export_saved_model(model, tokenizer, base_dir=base_dir, name=name, **kwargs)
    translations, _ = translate_with_saved_model(export_dir, sentences)
    translator = Translator(
        model,
        tokenizer,
        beam_size=kwargs["beam_size"],
        length_penalty=kwargs["length_penalty"],
        max_extra=kwargs.get("max_extra", MAX_DECODE_EXTRA),
        jit_compile=jit_compile,
    )
    expected = translator.translate(sentences)
    return ExportCheck(
        export_dir=export_dir,
        sentences=list(sentences),
        translations=translations,
        agrees=[a == b for a, b in zip(translations, expected)],
    )


@interrupt.exits_on_interrupt()
def main(argv=None):
    common.setup_environment()  # before anything imports TensorFlow
    parser = argparse.ArgumentParser(
        prog="kt-demo",
        description="Train on the built-in English->German demo corpus, evaluate on its "
        "held-out test split, print translations and scores, write metrics.json, and "
        "export the model as a SavedModel.",
    )
    common.add_config_arguments(parser, default_config=DEFAULT_CONFIG)
    args = parser.parse_args(argv)
    config = common.read_run_config(parser, args)
    if not common.overrides_set(args, "overwrite"):
        config = config.replace(overwrite=True)  # the demo always retrains
    if not config.test_split:
        parser.error("the demo scores the test split, but the config's test_split is empty")

    from keras_transformer.train.run import load_corpus, run_training

    try:
        result = run_training(config)
    except common.TRAINING_ERRORS as error:
        common.fail(parser, error)

    test_pairs = load_corpus(config)["test"]  # the demo corpus is generated again, seeded: the same pairs
    scores, eval_seconds = evaluate_test_pairs(result, config, test_pairs)
    metrics = {
        **scores,
        "train_seconds": round(result.train_seconds, 1),
        "eval_seconds": round(eval_seconds, 1),
        "decode": config.eval_decode,
        "train_steps": result.steps,
    }
    path = common.write_metrics(result.model_dir, metrics)
    print(
        f"\nBLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}  exact match "
        f"{scores['exact_match']:.1%} on {scores['test_pairs']} test pairs "
        f"(trained {result.train_seconds:.0f} s, evaluated {eval_seconds:.0f} s) -> {path}"
    )
    export_for_serving(result.model_dir, [source for source, _ in test_pairs[:EXPORT_CHECK_SENTENCES]])
    return 0


def evaluate_test_pairs(result, config, test_pairs):
    """Translates the test pairs as the config says, prints some; `(scores, seconds)`."""
    from keras_transformer.inference.evaluation import evaluate
    from keras_transformer.inference.translator import Translator

    sources = [source for source, _ in test_pairs]
    references = [reference for _, reference in test_pairs]
    started = time.monotonic()
    translator = Translator(
        result.model, result.tokenizer, **config.search_settings(), batch_size=config.eval_batch_size
    )
    scores, translations = evaluate(translator, sources, references, return_translations=True)
    seconds = time.monotonic() - started
    print(f"\nTest translations ({config.eval_decode} decoding):")
    for source, reference, output in list(zip(sources, references, translations))[:SHOWN_TRANSLATIONS]:
        mark = "=" if output.strip() == reference.strip() else "x"
        print(f"  {source}\n    reference: {reference}\n    output:  {mark} {output}")
    wrong = [(s, r, o) for s, r, o in zip(sources, references, translations) if o.strip() != r.strip()]
    if wrong:
        print(f"\nSome of the {len(wrong)} inexact translations:")
        for source, reference, output in wrong[:SHOWN_MISTAKES]:
            print(f"  {source}\n    reference: {reference}\n    output:    {output}")
    return scores, seconds


def export_for_serving(model_dir, sentences):
    """Exports beside the run (`saved_models/demo/<version>/`, the layout TF Serving
    watches) and translates `sentences` through the reloaded SavedModel."""
    import keras

    model_dir = os.path.normpath(model_dir)
    base_dir, name = os.path.dirname(model_dir) or ".", os.path.basename(model_dir)
    if keras.backend.backend() != "tensorflow":
        print(
            f"\nSavedModel export skipped: it traces the model on TensorFlow. Run "
            f"`kt-export --model-dir {model_dir} --base-dir {base_dir} --name {name}`."
        )
        return
    check = export_and_check(model_dir, sentences, base_dir=base_dir, name=name)
    print(f"\n{check}")


if __name__ == "__main__":
    sys.exit(main())

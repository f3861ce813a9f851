"""`make demo`: train on the built-in demo corpus, score the held-out test split.

Trains with `training/configs/demo.toml` (English->German dates and numbers, a few
minutes on a CPU), translates the corpus' test split, prints a few translations, BLEU,
chrF and the exact-match rate, and writes them with the training time into
`saved_models/demo/metrics.json`.

Example:
    python -m training.demo --set max_train_seconds=60
"""

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "configs", "demo.toml")
SHOWN_TRANSLATIONS = 8


def export_for_serving(result, sentences):
    """Exports the demo model for TF Serving into `saved_models/demo/<version>/`.

    Then reloads the SavedModel and translates `sentences` through it, next to the
    in-process `Translator`, so the demo ends by showing that both agree.
    """
    from keras_transformer.inference.export import export_and_check

    model_dir = os.path.normpath(result.model_dir)
    print(
        export_and_check(
            model_dir, sentences, base_dir=os.path.dirname(model_dir), name=os.path.basename(model_dir)
        )
    )


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m training.demo",
        description="Train on the built-in English->German demo corpus, evaluate on its "
        "held-out test split, print translations and scores, write metrics.json.",
    )
    parser.add_argument("--config", default=DEFAULT_CONFIG, help="TOML run config (default: the demo's)")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override one config value, e.g. --set max_train_seconds=60 (repeatable)",
    )
    args = parser.parse_args(argv)

    from keras_transformer.inference.evaluation import evaluate
    from keras_transformer.train.run import run_training, write_metrics
    from keras_transformer.train.run_config import RunConfig

    try:
        config = RunConfig.from_toml(args.config, args.overrides)
    except (OSError, ValueError) as error:
        parser.error(str(error))
    result = run_training(config)

    test_pairs = result.splits["test"]
    sources = [source for source, _ in test_pairs]
    references = [reference for _, reference in test_pairs]
    started = time.monotonic()
    scores, translations = evaluate(
        (result.model, result.tokenizer),
        sources,
        references,
        decode=config.eval_decode,
        batch_size=config.eval_batch_size,
        return_translations=True,
    )
    eval_seconds = time.monotonic() - started

    print(f"\nTest translations ({config.eval_decode} decoding):")
    for source, reference, output in list(zip(sources, references, translations))[:SHOWN_TRANSLATIONS]:
        mark = "=" if output.strip() == reference.strip() else "x"
        print(f"  {source}\n    reference: {reference}\n    output:  {mark} {output}")
    wrong = [(s, r, o) for s, r, o in zip(sources, references, translations) if o.strip() != r.strip()]
    if wrong:
        print(f"\nSome of the {len(wrong)} inexact translations:")
        for source, reference, output in wrong[:5]:
            print(f"  {source}\n    reference: {reference}\n    output:    {output}")

    metrics = {
        **scores,
        "train_seconds": round(result.train_seconds, 1),
        "eval_seconds": round(eval_seconds, 1),
        "decode": config.eval_decode,
        "train_steps": result.steps,
    }
    path = write_metrics(result.model_dir, metrics)
    print(
        f"\nBLEU {scores['bleu']:.2f}  chrF {scores['chrf']:.2f}  exact match "
        f"{scores['exact_match']:.1%} on {scores['test_pairs']} test pairs "
        f"(trained {result.train_seconds:.0f} s, evaluated {eval_seconds:.0f} s) -> {path}"
    )
    export_for_serving(result, sources[:4])
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`kt-evaluate`: score a model directory on a source/reference file pair.

Translates the source file with a `Translator` and prints corpus BLEU and chrF
(sacreBLEU) and the exact-match rate as JSON.

Example:
    kt-evaluate --model-dir saved_models/multi30k \
        --source ../shared/data/multi30k/test_2016_flickr.de \
        --reference ../shared/data/multi30k/test_2016_flickr.en
"""

import argparse
import json
import sys

from keras_transformer.cli import common, interrupt


@interrupt.exits_on_interrupt()
def main(argv=None):
    common.setup_environment()  # before anything imports TensorFlow
    parser = argparse.ArgumentParser(
        prog="kt-evaluate",
        description="Translate a source file (one sentence per line) with a trained model "
        "directory and print corpus BLEU, chrF (sacreBLEU) and the exact-match rate.",
    )
    common.add_model_arguments(parser)
    parser.add_argument("--source", required=True, help="source sentences, one per line")
    parser.add_argument("--reference", required=True, help="reference translations, one per line")
    parser.add_argument("--output", help="write the translations to this file, one per line")
    parser.add_argument(
        "--write-metrics", action="store_true", help="also write the scores to MODEL_DIR/metrics.json"
    )
    common.add_decoding_arguments(parser)
    args = parser.parse_args(argv)
    if args.write_metrics and len(args.model_dir) > 1:
        parser.error(
            "--write-metrics records one model's scores in its directory; an ensemble's "
            "belong to no one directory (they are printed)"
        )

    from keras_transformer.inference.evaluation import evaluate, read_lines
    from keras_transformer.inference.translator import Translator

    try:
        sources, references = read_lines(args.source), read_lines(args.reference)
        if len(sources) != len(references):  # checked before the model is loaded
            raise ValueError(
                f"{args.source} has {len(sources)} lines but {args.reference} has "
                f"{len(references)}: expected one reference per source line"
            )
        if not sources:
            raise ValueError(f"{args.source} is empty: there is nothing to score")
        translator = Translator(common.translator_source(args), **common.decoding_settings(args))
    except common.COMMAND_ERRORS as error:
        common.fail(parser, error)
    scores, translations = evaluate(translator, sources, references, return_translations=True)
    try:
        if args.output:
            with open(args.output, "w", encoding="utf-8") as file:
                file.writelines(line + "\n" for line in translations)
        if args.write_metrics:
            common.write_metrics(args.model_dir[0], scores)
    except OSError as error:
        common.fail(parser, error)
    print(json.dumps(scores, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

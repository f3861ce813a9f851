"""Score a model directory on a source/reference file pair with sacreBLEU and chrF.

Example:
    python -m training.evaluate --model-dir saved_models/multi30k \
        --source ../shared/data/multi30k/test_2016_flickr.de \
        --reference ../shared/data/multi30k/test_2016_flickr.en
"""

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m training.evaluate",
        description="Translate a source file (one sentence per line) with a trained model "
        "directory and print corpus BLEU, chrF (sacreBLEU) and the exact-match rate.",
    )
    parser.add_argument("--model-dir", required=True, help="directory with model.keras and tokenizer.model")
    parser.add_argument("--source", required=True, help="source sentences, one per line")
    parser.add_argument("--reference", required=True, help="reference translations, one per line")
    parser.add_argument(
        "--greedy", action="store_true", help="greedy decoding instead of beam search (beam 4)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=128, help="sentences per decoder call (default 128)"
    )
    parser.add_argument("--output", help="write the translations to this file, one per line")
    parser.add_argument(
        "--write-metrics", action="store_true", help="also write the scores to MODEL_DIR/metrics.json"
    )
    args = parser.parse_args(argv)

    from keras_transformer.inference.evaluation import evaluate, read_lines
    from keras_transformer.train.run import write_metrics

    try:
        sources, references = read_lines(args.source), read_lines(args.reference)
    except OSError as error:
        parser.error(str(error))
    scores, translations = evaluate(
        args.model_dir,
        sources,
        references,
        decode="greedy" if args.greedy else "beam",
        batch_size=args.batch_size,
        return_translations=True,
    )
    if args.output:
        with open(args.output, "w", encoding="utf-8") as file:
            file.writelines(line + "\n" for line in translations)
    if args.write_metrics:
        write_metrics(args.model_dir, scores)
    print(json.dumps(scores, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`kt-translate`: translate sentences with a trained model directory.

Sentences come from the command line, from a file (`--input`), or from standard input,
one per line; translations go to standard output (or `--output`), one per line, in the
same order. A progress bar is shown on standard error for files and standard input.

Example:
    kt-translate --model-dir saved_models/demo "on May 29, 2048"
    kt-translate --model-dir saved_models/demo --greedy < sentences.txt > out.txt
"""

import argparse
import sys

from keras_transformer.cli import common


def main(argv=None):
    common.setup_environment()  # before anything imports TensorFlow
    parser = argparse.ArgumentParser(
        prog="kt-translate",
        description="Translate sentences given as arguments, in a file, or on standard "
        "input (one per line) with a trained model directory.",
    )
    parser.add_argument("--model-dir", required=True, help="directory with model.keras and tokenizer.model")
    parser.add_argument("text", nargs="*", help="sentences to translate (default: read --input or stdin)")
    parser.add_argument("--input", help="file of sentences, one per line (default: stdin when no text)")
    parser.add_argument("--output", help="write translations here, one per line (default: stdout)")
    parser.add_argument("--scores", action="store_true", help="print each score before its translation, tab-separated")
    common.add_decoding_arguments(parser)
    args = parser.parse_args(argv)
    if args.text and args.input:
        parser.error("give sentences as arguments or with --input, not both")

    if args.text:
        sentences, progress = list(args.text), False
    elif args.input:
        try:
            with open(args.input, encoding="utf-8") as file:
                sentences = file.read().splitlines()
        except OSError as error:
            parser.error(str(error))
        progress = True
    else:
        sentences, progress = sys.stdin.read().splitlines(), True

    from keras_transformer.inference.translator import Translator

    try:
        translator = Translator(args.model_dir, **common.decoding_settings(args))
    except (OSError, ValueError) as error:
        parser.error(str(error))
    translations, scores = translator.translate(sentences, return_scores=True, progress=progress)
    lines = [f"{score:.4f}\t{text}" if args.scores else text for text, score in zip(translations, scores)]
    if args.output:
        with open(args.output, "w", encoding="utf-8") as file:
            file.writelines(line + "\n" for line in lines)
    else:
        sys.stdout.writelines(line + "\n" for line in lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())

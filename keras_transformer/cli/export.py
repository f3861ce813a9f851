"""`kt-export`: export a trained model directory for serving.

`--format savedmodel` (the default) writes a TensorFlow Serving SavedModel to
`BASE_DIR/NAME/VERSION/` (default `saved_models/transformer/<next version>/`) with the
tokenizer and the search in the graph; see `keras_transformer.inference.export`. The
export traces the model on the TensorFlow backend: under another `KERAS_BACKEND` this
command runs itself again in a TensorFlow process, since a `model.keras` trained under
JAX or PyTorch loads on any backend.

`--format ctranslate2` writes a CTranslate2 model directory to `--output-dir`, with
`--quantization` int8, int8_float32 or float16 if asked (any backend; see
`keras_transformer.inference.ctranslate2_export`).

Examples:
    kt-export --model-dir saved_models/demo --name demo --check "on May 29, 2048"
    kt-export --model-dir saved_models/demo --format ctranslate2 --quantization int8 --output-dir saved_models/demo_ct2
"""

import argparse
import os
import sys

from keras_transformer.cli import common, interrupt

FORMATS = ("savedmodel", "ctranslate2")
# The weight types of `--quantization` (keras_transformer.inference.ctranslate2_export,
# which imports Keras: named here so that --help stays fast).
QUANTIZATIONS = (None, "int8", "int8_float32", "float16")


@interrupt.exits_on_interrupt()
def main(argv=None):
    common.setup_environment()  # before anything imports TensorFlow
    parser = _parser()
    args = parser.parse_args(argv)
    if args.check and args.ids_only:
        parser.error("--check translates text, which an --ids-only export does not take")
    if args.format == "ctranslate2":
        return _export_ctranslate2(parser, args)
    if args.output_dir or args.quantization:
        parser.error("--output-dir and --quantization are options of --format ctranslate2")

    import keras

    backend = keras.backend.backend()
    if backend != "tensorflow":
        # Keras fixes its backend when it is imported, so trace in a fresh TensorFlow process.
        print(f"KERAS_BACKEND={backend}: exporting in a TensorFlow process.", file=sys.stderr)
        argv = sys.argv[1:] if argv is None else list(argv)
        command = [sys.executable, "-m", "keras_transformer.cli.export", *argv]
        return interrupt.call_in_foreground(command, env={**os.environ, "KERAS_BACKEND": "tensorflow"})
    return _export_saved_model(parser, args)


def _parser():
    parser = argparse.ArgumentParser(
        prog="kt-export",
        description="Export a model directory as a SavedModel for TensorFlow Serving: "
        "BASE_DIR/NAME/VERSION/ with signatures serving_default (text -> translation, "
        "score) and translate_ids (token ids -> token ids, score).",
    )
    parser.add_argument("--model-dir", required=True, help="directory with model.keras and tokenizer.model")
    parser.add_argument("--name", default="transformer", help="served model name (default: transformer)")
    parser.add_argument("--version", type=int, help="version number (default: 1 + the highest existing)")
    parser.add_argument("--base-dir", default="saved_models", help="TF Serving model root (default: saved_models)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing version directory")
    parser.add_argument(
        "--ids-only",
        action="store_true",
        help="leave the tokenizer out: token-id signatures only, for servers without tensorflow-text ops",
    )
    parser.add_argument("--check", nargs="*", metavar="TEXT", help="translate these sentences with the reloaded export")
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="savedmodel",
        help="savedmodel (TensorFlow Serving, the default) or ctranslate2 (a CTranslate2 model directory)",
    )
    parser.add_argument(
        "--output-dir", help="ctranslate2: the directory to write (required with --format ctranslate2)"
    )
    parser.add_argument(
        "--quantization",
        choices=[q for q in QUANTIZATIONS if q],
        help="ctranslate2: the stored weight type (default: float32)",
    )
    common.add_decoding_arguments(parser, batch_size=False)
    return parser


def _export_saved_model(parser, args):
    """`--format savedmodel` (TensorFlow backend): export_saved_model, then translate `--check` with it."""
    from keras_transformer.inference.export import export_saved_model, translate_with_saved_model

    try:
        path = export_saved_model(
            args.model_dir,
            base_dir=args.base_dir,
            name=args.name,
            version=args.version,
            overwrite=args.overwrite,
            ids_only=args.ids_only,
            **common.decoding_settings(args),
        )
    except common.COMMAND_ERRORS as error:
        common.fail(parser, error)
    print(f"SavedModel written to {path}")
    if args.check:
        translations, scores = translate_with_saved_model(path, args.check)
        for source, target, score in zip(args.check, translations, scores):
            print(f"  {source!r} -> {target!r} ({score:.3f})")
    return 0


def _export_ctranslate2(parser, args):
    """`--format ctranslate2`: export_ctranslate2, then translate `--check` with the result."""
    if not args.output_dir:
        parser.error("--format ctranslate2 needs --output-dir")
    if args.ids_only:
        parser.error("--ids-only is an option of --format savedmodel")
    from keras_transformer.inference.ctranslate2_export import export_ctranslate2

    try:
        path = export_ctranslate2(
            args.model_dir, args.output_dir, args.quantization, overwrite=args.overwrite
        )
    except (ImportError, *common.COMMAND_ERRORS) as error:
        common.fail(parser, error)
    print(f"CTranslate2 model written to {path}")
    if args.check:
        from keras_transformer.inference.ctranslate2_translator import CTranslate2Translator

        try:
            translator = CTranslate2Translator(path, **common.decoding_settings(args))
        except common.COMMAND_ERRORS as error:
            common.fail(parser, error)
        translations, scores = translator.translate(args.check, return_scores=True)
        for source, target, score in zip(args.check, translations, scores):
            print(f"  {source!r} -> {target!r} ({score:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

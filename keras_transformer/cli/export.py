"""`kt-export`: export a trained model directory as a TensorFlow Serving SavedModel.

Writes `BASE_DIR/NAME/VERSION/` (default `saved_models/transformer/<next version>/`)
with the tokenizer and the search in the graph; see `keras_transformer.inference.export`.
The export traces the model on the TensorFlow backend: under another `KERAS_BACKEND`
this command runs itself again in a TensorFlow process, since a `model.keras` trained
under JAX or PyTorch loads on any backend.

Example:
    kt-export --model-dir saved_models/demo --name demo --check "on May 29, 2048"
"""

import argparse
import os
import subprocess
import sys

from keras_transformer.cli import common


def main(argv=None):
    common.setup_environment()  # before anything imports TensorFlow
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
    common.add_decoding_arguments(parser, batch_size=False)
    args = parser.parse_args(argv)
    if args.check and args.ids_only:
        parser.error("--check translates text, which an --ids-only export does not take")

    import keras

    backend = keras.backend.backend()
    if backend != "tensorflow":
        # Keras fixes its backend when it is imported, so trace in a fresh TensorFlow process.
        print(f"KERAS_BACKEND={backend}: exporting in a TensorFlow process.", file=sys.stderr)
        argv = sys.argv[1:] if argv is None else list(argv)
        command = [sys.executable, "-m", "keras_transformer.cli.export", *argv]
        return subprocess.call(command, env={**os.environ, "KERAS_BACKEND": "tensorflow"})

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


if __name__ == "__main__":
    sys.exit(main())

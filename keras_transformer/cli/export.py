"""Export a trained model directory as a TensorFlow Serving SavedModel.

Writes `BASE_DIR/NAME/VERSION/` (default `saved_models/transformer/<next version>/`)
with the tokenizer and beam search in the graph; see `keras_transformer.inference.export`. The
export traces the model on the TensorFlow backend, so this command always runs with
`KERAS_BACKEND=tensorflow`: a model trained under JAX or PyTorch is exported by this
same command, since its `model.keras` loads on any backend.

Example:
    python -m training.export --model-dir saved_models/demo --name demo
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m training.export",
        description="Export a model directory as a SavedModel for TensorFlow Serving: "
        "BASE_DIR/NAME/VERSION/ with signatures serving_default (text -> translation, "
        "score) and translate_ids (token ids -> token ids, score).",
    )
    parser.add_argument("--model-dir", required=True, help="directory with model.keras and tokenizer.model")
    parser.add_argument("--name", default="transformer", help="served model name (default: transformer)")
    parser.add_argument("--version", type=int, help="version number (default: 1 + the highest existing)")
    parser.add_argument("--base-dir", default="saved_models", help="TF Serving model root (default: saved_models)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing version directory")
    parser.add_argument("--beam-size", type=int, default=4, help="beams per sentence; 1 = greedy (default 4)")
    parser.add_argument("--length-penalty", type=float, default=0.6, help="alpha (default 0.6)")
    parser.add_argument(
        "--ids-only", action="store_true",
        help="leave the tokenizer out: token-id signatures only, for servers without tensorflow-text ops",
    )
    parser.add_argument("--check", nargs="*", metavar="TEXT", help="translate these sentences with the reloaded export")
    args = parser.parse_args(argv)

    previous = os.environ.get("KERAS_BACKEND")
    if previous not in (None, "tensorflow"):
        print(f"KERAS_BACKEND={previous} ignored: the export runs on TensorFlow.", file=sys.stderr)
    # Set before Keras is imported: the backend is fixed at import.
    os.environ["KERAS_BACKEND"] = "tensorflow"

    from keras_transformer.inference.export import export_saved_model, translate_with_saved_model

    try:
        path = export_saved_model(
            args.model_dir,
            base_dir=args.base_dir,
            name=args.name,
            version=args.version,
            overwrite=args.overwrite,
            beam_size=args.beam_size,
            length_penalty=args.length_penalty,
            ids_only=args.ids_only,
        )
    except (OSError, ValueError) as error:
        parser.error(str(error))
    print(f"SavedModel written to {path}")
    if args.check and not args.ids_only:
        translations, scores = translate_with_saved_model(path, args.check)
        for source, target, score in zip(args.check, translations, scores):
            print(f"  {source!r} -> {target!r} ({score:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

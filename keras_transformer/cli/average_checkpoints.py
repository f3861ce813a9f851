"""`kt-average-checkpoints`: average the last K checkpoints of a run (Vaswani et al., 2017, 6.1).

Writes a complete model directory (default `<model-dir>_averaged`) that the other
commands take like any other.

Example:
    kt-average-checkpoints --model-dir saved_models/base --last 5
    kt-translate --model-dir saved_models/base_averaged "a sentence"
"""

import argparse
import sys

from keras_transformer.cli import common, interrupt


@interrupt.exits_on_interrupt()
def main(argv=None):
    common.setup_environment()  # before anything imports TensorFlow
    from keras_transformer.train.checkpoints import CHECKPOINTS_TO_AVERAGE, average_model_directory

    parser = argparse.ArgumentParser(
        prog="kt-average-checkpoints",
        description="Average the weights of the newest K checkpoints "
        "(MODEL_DIR/checkpoints/epoch_NNN.weights.h5, or step_NNNNNNN.weights.h5 with "
        "checkpoint_every_steps) into a new model directory "
        "(model.keras, tokenizer.model, config.toml), as the paper does with the last 5 "
        "(base) or 20 (big) checkpoints.",
    )
    parser.add_argument("--model-dir", required=True, help="a training run's model directory")
    parser.add_argument(
        "--last",
        type=int,
        default=CHECKPOINTS_TO_AVERAGE,
        help=f"how many of the newest checkpoints (default {CHECKPOINTS_TO_AVERAGE}, as for the "
        "paper's base model)",
    )
    parser.add_argument("--output-dir", help="model directory to write (default: MODEL_DIR_averaged)")
    parser.add_argument("--overwrite", action="store_true", help="replace a non-empty output directory")
    args = parser.parse_args(argv)

    try:
        output_dir, paths = average_model_directory(
            args.model_dir, args.last, args.output_dir, overwrite=args.overwrite
        )
    except common.COMMAND_ERRORS as error:
        common.fail(parser, error)
    print(f"Averaged {len(paths)} checkpoints:")
    for path in paths:
        print(f"  {path}")
    print(f"Model directory: {output_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

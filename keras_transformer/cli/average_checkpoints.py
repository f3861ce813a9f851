"""Average the last K checkpoints of a model directory (Vaswani et al., 2017, 6.1).

Example:
    python -m training.average_checkpoints --model-dir saved_models/base --last 5 \
        --output saved_models/base/model_averaged.keras
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from keras_transformer.train.checkpoints import CHECKPOINTS_TO_AVERAGE, average_model_directory  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m training.average_checkpoints",
        description="Average the weights of the newest K checkpoints "
        "(MODEL_DIR/checkpoints/epoch_NNN.weights.h5) into a new model file, as the paper "
        "does with the last 5 (base) or 20 (big) checkpoints.",
    )
    parser.add_argument("--model-dir", required=True, help="a training run's model directory")
    parser.add_argument(
        "--last",
        type=int,
        default=CHECKPOINTS_TO_AVERAGE,
        help=f"how many of the newest checkpoints (default {CHECKPOINTS_TO_AVERAGE}, as for the "
        "paper's base model)",
    )
    parser.add_argument(
        "--output",
        help="file to write: .keras (whole model) or .weights.h5; "
        "default MODEL_DIR/model_averaged.keras",
    )
    args = parser.parse_args(argv)

    try:
        output, paths = average_model_directory(args.model_dir, args.last, args.output)
    except (OSError, ValueError) as error:
        parser.error(str(error))
    print(f"averaged {len(paths)} checkpoints:")
    for path in paths:
        print(f"  {path}")
    print(f"wrote {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

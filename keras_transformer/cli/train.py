"""Train a Transformer from a TOML run config: `python -m training.train --config FILE`.

Example:
    python -m training.train --config training/configs/multi30k.toml \
        --set max_train_seconds=300 --set model.d_model=128
"""

import argparse
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m training.train",
        description="Train a Transformer as described by a TOML run config; writes the "
        "model, tokenizer, config, CSV/TensorBoard logs and a training-curve PNG into "
        "<output_dir>/<name>/. A killed run started again resumes where it stopped.",
    )
    parser.add_argument("--config", required=True, help="TOML run config, e.g. training/configs/demo.toml")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one config value, e.g. --set epochs=3 --set model.d_model=256 (repeatable)",
    )
    args = parser.parse_args(argv)

    from keras_transformer.train.run import train
    from keras_transformer.train.run_config import RunConfig

    try:
        config = RunConfig.from_toml(args.config, args.overrides)
    except (OSError, ValueError) as error:
        parser.error(str(error))
    train(config)
    return 0


if __name__ == "__main__":
    sys.exit(main())

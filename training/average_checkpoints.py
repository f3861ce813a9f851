"""`python -m training.average_checkpoints`: the `kt-average-checkpoints` command (see keras_transformer/cli/average_checkpoints.py)."""

import sys

from keras_transformer.cli.average_checkpoints import main

if __name__ == "__main__":
    sys.exit(main())

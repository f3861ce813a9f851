"""`python -m training.visualize`: the `kt-visualize` command (see keras_transformer/cli/visualize.py)."""

import sys

from keras_transformer.cli.visualize import main

if __name__ == "__main__":
    sys.exit(main())

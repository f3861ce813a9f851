"""`python -m training.export`: the `kt-export` command (see keras_transformer/cli/export.py)."""

import sys

from keras_transformer.cli.export import main

if __name__ == "__main__":
    sys.exit(main())

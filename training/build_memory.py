"""`python -m training.build_memory`: the `kt-build-memory` command (see keras_transformer/cli/build_memory.py)."""

import sys

from keras_transformer.cli.build_memory import main

if __name__ == "__main__":
    sys.exit(main())

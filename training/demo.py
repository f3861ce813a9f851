"""`python -m training.demo`: the `kt-demo` command (see keras_transformer/cli/demo.py)."""

import sys

from keras_transformer.cli.demo import main

if __name__ == "__main__":
    sys.exit(main())

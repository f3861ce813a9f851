"""The command line: one module per `kt-*` command, each a `main(argv)` that parses
arguments and calls library functions. `python -m training.<command>` from a clone runs
the same `main`.
"""

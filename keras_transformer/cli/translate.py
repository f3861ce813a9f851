"""`kt-translate`: translate sentences with a trained model directory.

Sentences come from the command line, from a file (`--input`), or from standard input,
one per line; translations go to standard output (or `--output`), one per line, in the
same order. A progress bar is shown on standard error for files and standard input.

Lines are what `split_lines` says: they end at "\\n" only (one "\\r" before it is
dropped), so the output has exactly one line per input line whatever characters a
line holds; bytes that are not UTF-8 are read as U+FFFD, with a warning naming their
lines. The exit status is 0 when every line was translated, 2 for a usage error (a
missing model or input file), 1 when translating or writing failed.

`--n-best K` writes the K best hypotheses of each sentence instead, best first, one per
line, in Moses' n-best format: `INDEX ||| TRANSLATION ||| SCORE`, INDEX counting input
lines from 0 (`n_best_lines`). `--prefix TEXT` (repeated, one per sentence) or
`--prefixes FILE` (one per input line) start each translation with a given text.
`--model-dir` repeated decodes with an ensemble of the directories' models
(`keras_transformer.inference.ensemble`).

Example:
    kt-translate --model-dir saved_models/demo "on May 29, 2048"
    kt-translate --model-dir saved_models/demo --greedy < sentences.txt > out.txt
    kt-translate --model-dir saved_models/demo --n-best 4 "on May 29, 2048"
"""

import argparse
import codecs
import sys

from keras_transformer.cli import common, interrupt

# Line numbers named in the warning about invalid UTF-8, at most.
_SHOWN_LINE_NUMBERS = 10


@interrupt.exits_on_interrupt()
def main(argv=None):
    common.setup_environment()  # before anything imports TensorFlow
    parser = _parser()
    args = parser.parse_args(argv)
    if args.text and args.input:
        parser.error("give sentences as arguments or with --input, not both")
    sentences, target_prefixes, progress = _read_inputs(parser, args)
    lines = _translated_lines(parser, args, sentences, target_prefixes, progress)
    _write_output(parser, args.output, "".join(line + "\n" for line in lines))
    return 0


def _parser():
    parser = argparse.ArgumentParser(
        prog="kt-translate",
        description="Translate sentences given as arguments, in a file, or on standard "
        "input (one per line) with a trained model directory.",
    )
    common.add_model_arguments(parser)
    parser.add_argument("text", nargs="*", help="sentences to translate (default: read --input or stdin)")
    parser.add_argument("--input", help="file of sentences, one per line (default: stdin when no text)")
    parser.add_argument("--output", help="write translations here, one per line (default: stdout)")
    output_format = parser.add_mutually_exclusive_group()
    output_format.add_argument(
        "--scores", action="store_true", help="print each score before its translation, tab-separated"
    )
    output_format.add_argument(
        "--n-best",
        type=int,
        metavar="K",
        help="print the K best translations of each sentence (K <= --beam-size), one per line: "
        "INDEX ||| TRANSLATION ||| SCORE, INDEX counting input lines from 0",
    )
    prefixes = parser.add_mutually_exclusive_group()
    prefixes.add_argument(
        "--prefix",
        action="append",
        metavar="TEXT",
        help="start the translation of the sentence with TEXT (repeat once per sentence, '' for none)",
    )
    prefixes.add_argument("--prefixes", metavar="FILE", help="file of target prefixes, one per input line")
    common.add_decoding_arguments(parser)
    return parser


def _read_inputs(parser, args):
    """`(sentences, prefixes or None, progress)`: from the arguments, the files or stdin."""
    if args.text:
        sentences, progress = list(args.text), False
    else:
        try:
            data = _read_bytes(args.input)
        except OSError as error:
            common.fail(parser, error)
        sentences, invalid = split_lines(data)
        if invalid:
            _warn_invalid_utf8(args.input or "standard input", invalid)
        progress = True

    target_prefixes = args.prefix
    if args.prefixes is not None:
        try:
            target_prefixes, _ = split_lines(_read_bytes(args.prefixes))
        except OSError as error:
            common.fail(parser, error)
    return sentences, target_prefixes, progress


def _translated_lines(parser, args, sentences, target_prefixes, progress):
    """The output lines: one translation (with its score) per sentence, or the n-best lines."""
    from keras_transformer.inference.translator import Translator

    try:
        translator = Translator(common.translator_source(args), **common.decoding_settings(args))
    except common.COMMAND_ERRORS as error:
        common.fail(parser, error)
    try:
        if args.n_best is not None:
            hypotheses = translator.translate(
                sentences, n_best=args.n_best, prefixes=target_prefixes, progress=progress
            )
        else:
            translations, scores = translator.translate(
                sentences, return_scores=True, prefixes=target_prefixes, progress=progress
            )
    except (TypeError, ValueError) as error:
        common.fail(parser, f"nothing was translated: {error}")
    if args.n_best is not None:
        return n_best_lines(hypotheses)
    return [
        f"{score:.4f}\t{one_line(text)}" if args.scores else one_line(text)
        for text, score in zip(translations, scores)
    ]


def _write_output(parser, output, text):
    """Writes `text` to the file `output` (atomically), or to stdout when None."""
    try:
        if output:
            from keras_transformer.atomic import write_text_atomically

            write_text_atomically(output, text)  # whole, or the old file kept
        else:
            sys.stdout.write(text)
            sys.stdout.flush()
    except OSError as error:
        common.fail(parser, f"could not write the translations: {error}")


def split_lines(data):
    """The lines of `data` (bytes) as `kt-translate` reads them, and those not UTF-8.

    A line ends at "\\n" only, and one "\\r" before it is dropped (Windows line ends);
    a last line without "\\n" counts, and a final "\\n" starts no new line. The other
    characters that `str.splitlines` breaks at ("\\x0b", "\\x0c", "\\x1c"-"\\x1e",
    "\\x85", "\\u2028", "\\u2029") and a "\\r" inside a line stay in their line, so that
    each input line gets exactly one output line. A UTF-8 byte order mark at the start
    is dropped. Bytes that are not UTF-8 are read as U+FFFD.

    Returns:
        `(lines, invalid)`: the lines as str, and the 1-based numbers of the lines that
        held bytes that are not UTF-8.

    Example:
    >>> split_lines(b"one\\r\\ntwo\\x0bstill two\\n\\nfour \\xff\\n")
    (['one', 'two\\x0bstill two', '', 'four �'], [4])
    """
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8) :]
    pieces = data.split(b"\n")
    if pieces[-1] == b"":
        pieces.pop()
    lines, invalid = [], []
    for number, piece in enumerate(pieces, start=1):
        if piece.endswith(b"\r"):
            piece = piece[:-1]
        try:
            lines.append(piece.decode("utf-8"))
        except UnicodeDecodeError:
            lines.append(piece.decode("utf-8", "replace"))
            invalid.append(number)
    return lines, invalid


def n_best_lines(hypotheses):
    """The lines `--n-best` prints: `INDEX ||| TRANSLATION ||| SCORE`, best first per sentence.

    `hypotheses` is what `Translator.translate(..., n_best=k)` returns; INDEX is the
    sentence's 0-based position, as in Moses' n-best lists.

    Example:
    >>> from keras_transformer.inference.translator import Hypothesis
    >>> n_best_lines([[Hypothesis("am 1. Mai", -0.25), Hypothesis("am 1 Mai", -1.5)], [Hypothesis("", 0.0)]])
    ['0 ||| am 1. Mai ||| -0.2500', '0 ||| am 1 Mai ||| -1.5000', '1 |||  ||| 0.0000']
    """
    return [
        f"{index} ||| {one_line(text)} ||| {score:.4f}"
        for index, sentence in enumerate(hypotheses)
        for text, score in sentence
    ]


def one_line(text):
    """`text` with its line breaks ("\\r\\n", "\\n", "\\r") made spaces: one output line.

    Example:
    >>> one_line("a\\nb\\r\\nc")
    'a b c'
    """
    return text.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")


def _read_bytes(path):
    """The bytes of the file at `path`, or of standard input when `path` is None."""
    if path is not None:
        with open(path, "rb") as file:
            return file.read()
    stdin = getattr(sys.stdin, "buffer", None)
    if stdin is not None:
        return stdin.read()
    # A text stream without bytes below it (a test's StringIO): its lone surrogates
    # become bytes that are not UTF-8, and are read as U+FFFD like any other.
    return sys.stdin.read().encode("utf-8", "surrogatepass")


def _warn_invalid_utf8(source, numbers):
    shown = ", ".join(str(number) for number in numbers[:_SHOWN_LINE_NUMBERS])
    more = f" and {len(numbers) - _SHOWN_LINE_NUMBERS} more" if len(numbers) > _SHOWN_LINE_NUMBERS else ""
    print(
        f"kt-translate: warning: {source}: line(s) {shown}{more} are not valid UTF-8; "
        "their invalid bytes were read as U+FFFD and translated as such.",
        file=sys.stderr,
    )


if __name__ == "__main__":
    sys.exit(main())

"""The input rules both translators share: lists of str, lone surrogates, a progress bar.

`Translator` and `CTranslate2Translator` promise the same `translate` contract, so the
checks live here once: a lone `str` is refused (it would be read as a list of
characters), every item must be a `str`, and a lone surrogate is replaced by U+FFFD
with a warning naming the input and the position.
"""

import warnings

from keras_transformer.data.tokenizer import lone_surrogate_position, replace_lone_surrogates

# The word for one item of each checked argument, used in the messages.
_ITEM_NAMES = {"sentences": "sentence", "prefixes": "prefix"}


def checked_strings(name, strings):
    """`strings` (`sentences` or `prefixes`) as a list, after checks that each item is a str.

    Raises:
        TypeError: `strings` is a lone `str`/`bytes` or not iterable, or an item is not a
            `str` (the message names its type and index).
    """
    if isinstance(strings, (str, bytes)):
        raise TypeError(
            f"`{name}` must be a list of str, not a single "
            f"{type(strings).__name__}; wrap it in a list: [text]. Received: {strings!r:.80}"
        )
    try:
        strings = list(strings)
    except TypeError:
        raise TypeError(f"`{name}` must be a list of str. Received: {type(strings).__name__}") from None
    item = _ITEM_NAMES.get(name, "item")
    for index, string in enumerate(strings):
        if not isinstance(string, str):
            raise TypeError(
                f"Every {item} must be a str. Received: {type(string).__name__} "
                f"({string!r:.80}) at index {index}"
            )
    return strings


def encodable(text, index, what="Input"):
    """`text`, or a copy with U+FFFD for each lone surrogate (with a warning naming it).

    The warning points at the caller's caller's caller (`stacklevel=4`): the user's
    call of `translate`, through the translator's own helper that loops over inputs.
    """
    position = lone_surrogate_position(text)
    if position is None:
        return text
    warnings.warn(
        f"{what} {index} is not valid Unicode: it holds the lone surrogate {text[position]!r} "
        f"at character {position}, which UTF-8 cannot encode; it is translated with "
        "U+FFFD in place of each lone surrogate.",
        UserWarning,
        stacklevel=4,
    )
    return replace_lone_surrogates(text)


def progress_bar(total, enabled):
    """A tqdm bar over `total` sentences, or None when `enabled` is false."""
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="sentence", desc="translating")


__all__ = ["checked_strings", "encodable", "progress_bar"]

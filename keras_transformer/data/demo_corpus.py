"""The built-in English->German demo corpus: dates and spelled-out numbers, no download.

Sentences come from a fixed set of templates filled with dates rendered by babel's
CLDR date formats and numbers spelled out by num2words, so the German side has what
makes translation more than a word lookup: words move ("I bought five books
yesterday" -> "ich habe gestern fünf Bücher gekauft"), numbers become compounds
("three hundred and twenty-four" -> "dreihundertvierundzwanzig", tens and units
swapped), and dates reorder ("May 29, 2048" -> "29. Mai 2048"). The templates are few,
the sentences short and every source has exactly one correct target, so that a
small Transformer can learn the task on a CPU in minutes: it is the default corpus
of `make demo`.
"""

import datetime
import functools
import os
import pathlib
import random

import babel

from keras_transformer import checks
from babel import dates as babel_dates
from num2words import num2words

SOURCE_LANG = "en"
TARGET_LANG = "de"
SPLITS = ("train", "validation", "test")

DEFAULT_SEED = 0
DEFAULT_NUM_TRAIN = 50_000
DEFAULT_NUM_VALIDATION = 500
DEFAULT_NUM_TEST = 1_000

# Four-digit years in a bounded range: a two-digit year ("5/29/48") would not say
# which century, and an unbounded range would make years an open vocabulary.
FIRST_DATE = datetime.date(1900, 1, 1)
LAST_DATE = datetime.date(2099, 12, 31)
MAX_NUMBER = 9999

# Date formats by CLDR name, each rendered in both languages. "numeric" is the CLDR
# skeleton yMd (year, month, day in the locale's order and separators), used instead
# of the "short" format because that one has a two-digit year.
DATE_FORMATS = ("full", "long", "medium", "numeric")
_NUMERIC_SKELETON = "yMd"

# (English, German) templates. German moves the participle or infinitive to the end
# and puts the verb second after a fronted phrase, so words reorder around the slot.
DATE_TEMPLATES = (
    ("{}", "{}"),
    ("on {}", "am {}"),
    ("I was born on {}", "ich wurde am {} geboren"),
    ("the meeting took place on {}", "das Treffen hat am {} stattgefunden"),
    ("on {} the shop was closed", "am {} war der Laden geschlossen"),
)
# Bare numbers run from 0; counted nouns from 2 so that every noun is plural.
NUMBER_TEMPLATES = (
    ("{}", "{}", 0),
    ("I have {} apples", "ich habe {} Äpfel", 2),
    ("I bought {} books yesterday", "ich habe gestern {} Bücher gekauft", 2),
    ("she has read {} pages", "sie hat {} Seiten gelesen", 2),
    ("there are {} cars in the city", "in der Stadt gibt es {} Autos", 2),
)
# Share of sentences built from a date template; the rest are number templates.
DATE_SHARE = 0.5
# Draws allowed per requested sentence before giving up: draws that repeat a source
# or hit an ambiguous one are discarded, and a request larger than the space of
# distinct sentences would otherwise loop for ever.
_MAX_DRAWS_PER_SENTENCE = 20


@functools.lru_cache(maxsize=None)
def _date_pattern(date_format, locale):
    # Resolved once per format and locale: babel's format_date looks the locale and
    # pattern up again on every call, which made generation several times slower.
    locale = babel.Locale.parse(locale)
    if date_format == "numeric":
        skeletons = locale.datetime_skeletons
        best = babel_dates.match_skeleton(_NUMERIC_SKELETON, skeletons)
        return babel_dates.parse_pattern(skeletons[best]), locale
    return babel_dates.get_date_format(date_format, locale=locale), locale


def _render_date(date, date_format, locale) -> str:
    pattern, locale = _date_pattern(date_format, locale)
    return pattern.apply(date, locale)


def date_renderings(date) -> dict[str, tuple[str, str]]:
    """Render `date` in every demo format: `{format: (english, german)}`.

    Args:
        date: `datetime.date`.

    Returns:
        dict from each name in `DATE_FORMATS` to the English and German strings.

    Example:
        >>> date_renderings(datetime.date(2048, 5, 29))["long"]
        ('May 29, 2048', '29. Mai 2048')
    """
    return {
        date_format: (
            _render_date(date, date_format, SOURCE_LANG),
            _render_date(date, date_format, TARGET_LANG),
        )
        for date_format in DATE_FORMATS
    }


def ambiguous_date_formats(date) -> set[str]:
    """Formats in which `date` has an English rendering with two German ones.

    English renders some dates the same in two formats while German does not:
    "May 29, 2048" is both the long format (German "29. Mai 2048") and the medium
    format ("29.05.2048"), because "May" is its own abbreviation. Such a source has
    two correct targets, so the demo corpus leaves it out.

    Args:
        date: `datetime.date`.

    Returns:
        set of format names from `DATE_FORMATS`; empty when every English
        rendering has one German translation.

    Example:
        >>> sorted(ambiguous_date_formats(datetime.date(2048, 5, 29)))
        ['long', 'medium']
    """
    english = {name: _render_date(date, name, SOURCE_LANG) for name in DATE_FORMATS}
    # German is rendered only for formats whose English is shared, which is rare;
    # this runs for every drawn date.
    shared = [name for name in DATE_FORMATS if list(english.values()).count(english[name]) > 1]
    german = {name: _render_date(date, name, TARGET_LANG) for name in shared}
    return {
        name
        for name in shared
        for other in shared
        if english[name] == english[other] and german[name] != german[other]
    }


@functools.lru_cache(maxsize=2 * (MAX_NUMBER + 1))
def _spell(number, lang) -> str:
    # Cached because numbers repeat across templates, and num2words spells each call afresh.
    return num2words(number, lang=lang)


def _draw_date_pair(rng) -> tuple[str, str] | None:
    """A random date sentence pair, or None when its English would be ambiguous."""
    english_template, german_template = rng.choice(DATE_TEMPLATES)
    days = (LAST_DATE - FIRST_DATE).days
    date = FIRST_DATE + datetime.timedelta(days=rng.randint(0, days))
    date_format = rng.choice(DATE_FORMATS)
    if date_format in ambiguous_date_formats(date):
        return None
    return (
        english_template.format(_render_date(date, date_format, SOURCE_LANG)),
        german_template.format(_render_date(date, date_format, TARGET_LANG)),
    )


def _draw_number_pair(rng) -> tuple[str, str]:
    english_template, german_template, smallest = rng.choice(NUMBER_TEMPLATES)
    number = rng.randint(smallest, MAX_NUMBER)
    return (
        english_template.format(_spell(number, SOURCE_LANG)),
        german_template.format(_spell(number, TARGET_LANG)),
    )


def make_demo_corpus(
    seed=DEFAULT_SEED,
    num_train=DEFAULT_NUM_TRAIN,
    num_validation=DEFAULT_NUM_VALIDATION,
    num_test=DEFAULT_NUM_TEST,
) -> dict[str, list[tuple[str, str]]]:
    """Generate the English->German demo corpus, split into train, validation, test.

    Draws sentences from `DATE_TEMPLATES` (dates from 1900 to 2099 in the CLDR
    full, long, medium and numeric formats) and `NUMBER_TEMPLATES` (0 to 9999
    spelled out), about half of each. Every source sentence appears once in the
    whole corpus, so the splits do not overlap, and has exactly one target: dates
    whose English rendering is shared by two formats with different German ones
    (see `ambiguous_date_formats`) are left out. The same seed and sizes always
    give the same corpus.

    Args:
        seed: int, default 0. Seed of the random draws.
        num_train: int, default 50000. Pairs in the train split.
        num_validation: int, default 500. Pairs in the validation split.
        num_test: int, default 1000. Pairs in the test split.

    Returns:
        dict from `"train"`, `"validation"`, `"test"` to lists of
        `(english, german)` pairs.

    Example:
        >>> corpus = make_demo_corpus(seed=0, num_train=4, num_validation=1, num_test=1)
        >>> [len(corpus[split]) for split in SPLITS]
        [4, 1, 1]
    """
    sizes = {"train": num_train, "validation": num_validation, "test": num_test}
    for split, size in sizes.items():
        checks.check_non_negative_int(f"num_{split}", size)
    total = sum(sizes.values())
    rng = random.Random(seed)
    targets = {}  # source -> target, in draw order; dicts keep insertion order
    draws = 0
    while len(targets) < total:
        draws += 1
        if draws > _MAX_DRAWS_PER_SENTENCE * total:
            raise ValueError(
                f"Could only draw {len(targets)} distinct demo sentences in {draws - 1} "
                f"tries. Expected {total} (num_train + num_validation + num_test); "
                "ask for fewer."
            )
        pair = _draw_date_pair(rng) if rng.random() < DATE_SHARE else _draw_number_pair(rng)
        if pair is None:
            continue
        source, target = pair
        if targets.setdefault(source, target) != target:
            # Unreachable with the templates above; kept so that a template added
            # later cannot give one source two targets without failing loudly.
            raise AssertionError(
                f"Demo source {source!r} has two targets: {targets[source]!r} and "
                f"{target!r}."
            )
    # Test and validation come first so that their sentences do not depend on the
    # train size: growing num_train only appends to train.
    pairs = list(targets.items())
    test = pairs[:num_test]
    validation = pairs[num_test:num_test + num_validation]
    train = pairs[num_test + num_validation:]
    return {"train": train, "validation": validation, "test": test}


def write_demo_corpus(
    directory, seed=DEFAULT_SEED, **sizes
) -> dict[str, tuple[pathlib.Path, pathlib.Path]]:
    """Write the demo corpus as parallel files, `{split}.en` and `{split}.de`.

    One sentence per line, UTF-8, the layout `read_parallel_files` reads. The
    directory is created if needed and existing files are overwritten.

    Args:
        directory: str or path-like. Where to write the six files.
        seed: int, default 0. Passed to `make_demo_corpus`.
        **sizes: `num_train`, `num_validation`, `num_test`, passed to
            `make_demo_corpus`.

    Returns:
        dict from split name to `(english_path, german_path)`.

    Example:

        ```python
        paths = write_demo_corpus("/tmp/demo", num_train=1000)
        pairs, stats = read_parallel_files(*paths["train"])
        ```
    """
    corpus = make_demo_corpus(seed=seed, **sizes)
    directory = pathlib.Path(directory)
    os.makedirs(directory, exist_ok=True)
    paths = {}
    for split, pairs in corpus.items():
        split_paths = []
        for lang, side in ((SOURCE_LANG, 0), (TARGET_LANG, 1)):
            path = directory / f"{split}.{lang}"
            text = "".join(pair[side] + "\n" for pair in pairs)
            path.write_text(text, encoding="utf-8")
            split_paths.append(path)
        paths[split] = tuple(split_paths)
    return paths

"""The built-in English->German demo corpus: determinism, disjoint splits, one target per source."""

import datetime
import re

import pytest
from num2words import num2words

from keras_transformer.data import demo_corpus
from keras_transformer.data import (
    ambiguous_date_formats,
    date_renderings,
    make_demo_corpus,
    read_parallel_files,
    write_demo_corpus,
)

SMALL = {"num_train": 300, "num_validation": 40, "num_test": 60}


@pytest.fixture(scope="module")
def corpus():
    # Large enough that every template and format shows up many times (about 100
    # ambiguous "May" dates would be drawn if they were not left out), small enough
    # to generate in a fraction of a second.
    return make_demo_corpus(seed=0, num_train=4000, num_validation=200, num_test=300)


def _all_pairs(corpus):
    return [pair for split in demo_corpus.SPLITS for pair in corpus[split]]


def test_sizes_are_as_asked():
    corpus = make_demo_corpus(seed=1, **SMALL)
    assert list(corpus) == ["train", "validation", "test"]
    assert [len(corpus[split]) for split in demo_corpus.SPLITS] == [300, 40, 60]
    empty = make_demo_corpus(seed=1, num_train=5, num_validation=0, num_test=0)
    assert (len(empty["train"]), empty["validation"], empty["test"]) == (5, [], [])


def test_deterministic_from_seed_and_different_across_seeds():
    assert make_demo_corpus(seed=7, **SMALL) == make_demo_corpus(seed=7, **SMALL)
    first, second = make_demo_corpus(seed=7, **SMALL), make_demo_corpus(seed=8, **SMALL)
    for split in demo_corpus.SPLITS:
        assert first[split] != second[split]


def test_held_out_splits_do_not_depend_on_train_size():
    small = make_demo_corpus(seed=3, num_train=50, num_validation=20, num_test=30)
    large = make_demo_corpus(seed=3, num_train=500, num_validation=20, num_test=30)
    assert small["test"] == large["test"]
    assert small["validation"] == large["validation"]
    assert large["train"][:50] == small["train"]


def test_splits_are_disjoint_and_each_source_has_one_target(corpus):
    sources = {split: {source for source, _ in corpus[split]} for split in demo_corpus.SPLITS}
    assert not sources["train"] & sources["validation"]
    assert not sources["train"] & sources["test"]
    assert not sources["validation"] & sources["test"]
    pairs = _all_pairs(corpus)
    # A source appears once in the whole corpus, so it cannot have two targets.
    assert len({source for source, _ in pairs}) == len(pairs) == 4500


def test_may_dates_shared_by_long_and_medium_formats_are_left_out(corpus):
    may_29 = datetime.date(2048, 5, 29)
    renderings = date_renderings(may_29)
    # The ambiguity itself, built directly from babel's CLDR formats.
    assert renderings["long"] == ("May 29, 2048", "29. Mai 2048")
    assert renderings["medium"] == ("May 29, 2048", "29.05.2048")
    assert renderings["full"] == ("Friday, May 29, 2048", "Freitag, 29. Mai 2048")
    assert renderings["numeric"] == ("5/29/2048", "29.5.2048")
    assert ambiguous_date_formats(may_29) == {"long", "medium"}
    # June's abbreviation "Jun" differs from "June": nothing ambiguous.
    assert date_renderings(datetime.date(2048, 6, 29))["medium"] == ("Jun 29, 2048", "29.06.2048")
    assert ambiguous_date_formats(datetime.date(2048, 6, 29)) == set()

    sources = [source for source, _ in _all_pairs(corpus)]
    # "May 29, 2048" without a weekday before it would need two targets.
    bare_may = [s for s in sources if re.search(r"(?<!day, )\bMay \d{1,2}, \d{4}", s)]
    assert bare_may == []
    # Positive controls: May in the full format, and other months in the long and
    # medium formats, are kept.
    assert any(re.search(r"day, May \d{1,2}, \d{4}", s) for s in sources)
    assert any(re.search(r"(?<!day, )\bJune \d{1,2}, \d{4}", s) for s in sources)
    assert any(re.search(r"\bJun \d{1,2}, \d{4}", s) for s in sources)


def test_translations_reorder_and_build_german_compounds(corpus):
    pairs = dict(_all_pairs(corpus))
    books = {
        source: target for source, target in pairs.items()
        if source.startswith("I bought ") and source.endswith(" books yesterday")
    }
    assert books
    for target in books.values():
        # German puts "gestern" before the number and the participle last, and
        # writes the number as one compound word.
        match = re.fullmatch(r"ich habe gestern (\S+) Bücher gekauft", target)
        assert match, target
    compounds = {
        target.split()[2]
        for source, target in pairs.items()
        if source.startswith("I have ") and source.endswith(" apples")
    }
    assert any("tausend" in word and "hundert" in word and "und" in word for word in compounds)
    # Every counted noun carries num2words' German for num2words' English, e.g.
    # "three hundred and twenty-four" -> "dreihundertvierundzwanzig" (units before tens).
    number_of = {num2words(n, lang="en"): n for n in range(demo_corpus.MAX_NUMBER + 1)}
    apples = re.compile(r"I have (.+) apples")
    counted = [(apples.fullmatch(s), t) for s, t in pairs.items() if apples.fullmatch(s)]
    assert len(counted) > 100
    for match, target in counted:
        german = num2words(number_of[match.group(1)], lang="de")
        assert target == f"ich habe {german} Äpfel"
    assert num2words(324, lang="de") == "dreihundertvierundzwanzig"
    # A long date reorders day and month: "on May 29, 2048" -> "am 29. Mai 2048".
    assert any(
        re.fullmatch(r"am \d{1,2}\. (Januar|Februar|März|April|Juni|Juli|August|"
                     r"September|Oktober|November|Dezember) \d{4}", target)
        for target in pairs.values()
    )


def test_sentences_are_short(corpus):
    for source, target in _all_pairs(corpus):
        assert len(source.split()) <= 12, source
        assert len(target.split()) <= 12, target


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"num_train": -1}, "`num_train` must be an integer >= 0. Received: num_train=-1"),
        ({"num_test": 2.5}, "`num_test` must be an integer >= 0. Received: num_test=2.5"),
    ],
)
def test_refuses_bad_sizes(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        make_demo_corpus(**kwargs)


def test_refuses_more_sentences_than_exist(monkeypatch):
    # Shrink the space to the six bare numbers 0..5; 20 draws are allowed per sentence.
    monkeypatch.setattr(demo_corpus, "DATE_SHARE", 0.0)
    monkeypatch.setattr(demo_corpus, "MAX_NUMBER", 5)
    monkeypatch.setattr(demo_corpus, "NUMBER_TEMPLATES", (("{}", "{}", 0),))
    assert len(make_demo_corpus(num_train=6, num_validation=0, num_test=0)["train"]) == 6
    with pytest.raises(ValueError, match=r"Could only draw 6 distinct demo sentences in 140 "
                                         r"tries\. Expected 7"):
        make_demo_corpus(num_train=5, num_validation=1, num_test=1)


def test_write_demo_corpus_round_trips_through_reader(tmp_path):
    paths = write_demo_corpus(tmp_path / "demo", seed=2, **SMALL)
    expected = make_demo_corpus(seed=2, **SMALL)
    assert set(paths) == set(demo_corpus.SPLITS)
    for split, (english, german) in paths.items():
        assert (english.name, german.name) == (f"{split}.en", f"{split}.de")
        pairs, stats = read_parallel_files(english, german)
        assert pairs == expected[split]
        assert stats.skipped == 0

"""bench/reference_shift.py counts what it says on hand-made splits: length ratios,
commas, final periods, the share of a word's occurrences after a comma, and BLEU with
commas removed."""

import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
import bench.reference_shift as shift  # noqa: E402


def test_split_stats_by_hand():
    sources = ["a b c", "d e"]
    targets = ["x, y z.", "y w"]
    stats = shift.split_stats(sources, targets, ["y", "w", "q"])
    assert stats["pairs"] == 2
    assert stats["target_words_per_sentence"] == 2.5  # "x," "y" "z." and "y" "w"
    assert stats["target_per_source_words"] == 1.0  # 5 words over 5
    assert stats["target_per_source_chars"] == 10 / 8  # 7 + 3 characters over 5 + 3
    assert stats["commas_per_sentence"] == 0.5
    assert stats["final_period"] == 0.5
    # "y" follows the comma in the first line; in the second it opens the sentence and
    # does not count. "w" follows "y"; "q" never occurs.
    assert stats["comma_before"] == {"y": 1.0, "w": 0.0, "q": None}


def test_comma_followers_most_frequent_first_and_words_only():
    lines = ["a, b c, b", "d, c e, b", "f, , g"]
    # "b" follows a comma 2 times, "c" once; the comma after a comma is not a word.
    assert shift.comma_followers(lines, 2) == ["b", "c"]
    assert shift.comma_followers(lines, 10) == ["b", "c", "g"]


def test_comma_rates_counts_hyphenated_words_whole():
    rates = shift.comma_rates(["Ein Mann, blau-gelb gekleidet", "Ein blau-gelb Mann"], ["blau-gelb", "blau"])
    assert rates == {"blau-gelb": 0.5, "blau": None}


def test_bleu_without_commas_removes_only_the_comma_difference():
    references = [
        "Ein Mann fährt Fahrrad, während eine Frau auf der Straße zuschaut.",
        "Zwei Hunde spielen im Schnee neben einem roten Haus am See.",
    ]
    hypotheses = [
        "Ein Mann fährt Fahrrad während eine Frau auf der Straße zuschaut.",
        "Zwei Hunde spielen im Schnee neben einem roten Haus am See.",
    ]
    stats = shift.hypothesis_stats(hypotheses, references)
    assert stats["bleu"] < 90
    assert stats["bleu_without_commas"] == pytest.approx(100.0)
    assert stats["commas_per_sentence"] == 0.0
    assert stats["words_per_reference_word"] == 1.0
    assert shift.without_commas(["a , b,c ,"]) == ["a b c"]
    with pytest.raises(ValueError, match="one hypothesis per reference \\(2\\); received 1"):
        shift.hypothesis_stats(hypotheses[:1], references)


def test_main_writes_json_and_chart(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    splits = {
        "train": (["a b", "c d"], ["x, y", "z, y"]),
        "test": (["a b c d"], ["x y"]),
    }
    for split, (sources, targets) in splits.items():
        (data / f"{split}.en").write_text("\n".join(sources) + "\n", encoding="utf-8")
        (data / f"{split}.de").write_text("\n".join(targets) + "\n", encoding="utf-8")
    hypotheses = tmp_path / "hyp.de"
    hypotheses.write_text("x, y\n", encoding="utf-8")
    results = tmp_path / "shift.json"
    shift.main([str(data), "--direction", "en-de", "--splits", "train,test", "--hypotheses", str(hypotheses),
                "--hypothesis-split", "test", "--results", str(results)])
    entry = json.loads(results.read_text())["corpora"][f"{data} en-de"]
    assert entry["words"] == ["y"]
    assert entry["splits"]["train"]["comma_before"] == {"y": 1.0}
    assert entry["splits"]["test"]["comma_before"] == {"y": 0.0}
    assert entry["splits"]["test"]["target_per_source_words"] == 0.5
    assert entry["hypotheses"][str(hypotheses)]["commas_per_sentence"] == 1.0
    assert results.with_suffix(".png").stat().st_size > 0


def test_main_refuses_missing_split_and_bad_direction(tmp_path):
    (tmp_path / "train.en").write_text("a\n")
    with pytest.raises(SystemExit, match="train.de"):
        shift.main([str(tmp_path), "--direction", "en-de", "--splits", "train", "--results", str(tmp_path / "r.json")])
    with pytest.raises(SystemExit, match="SOURCE-TARGET.*'ende'"):
        shift.main([str(tmp_path), "--direction", "ende", "--results", str(tmp_path / "r.json")])
    with pytest.raises(ValueError, match="as many source as target lines"):
        shift.split_stats(["a"], ["x", "y"], [])


def test_bench_scores_record_output_length_per_reference_length():
    from bench.multi30k import sacrebleu_scores

    # 13a splits the final period off: 4 + 2 output tokens against 5 + 5 reference tokens.
    scores = sacrebleu_scores(["Ein Hund rennt.", "Zwei Katzen"], ["Ein Hund rennt schnell.", "Zwei Katzen schlafen hier."])
    assert scores["length_ratio"] == 0.6

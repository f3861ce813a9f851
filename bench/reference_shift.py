"""How the reference translations of a corpus's splits differ in length and punctuation,
and what that does to BLEU.

A search tuned on `val` (beam size, length penalty) and a model trained on `train` both
learn those splits' references: how long a translation is for a source of a given
length, and where commas go. When the test split's references were written another
way, BLEU on it loses points that no model or search chosen on `val` can win back.
This measures that shift, per split, on the target side:

- target words (and characters) per source word,
- commas a sentence and the share of sentences ending in a period,
- for the words that follow a comma most often in the first split, the share of their
  occurrences (not sentence-initial) that a comma precedes,

and, for hypothesis files of one split (`--hypotheses`, e.g. the `test2016_*.de` files
`bench/multi30k.py` writes), BLEU as scored and BLEU with every comma removed from
hypotheses and references alike: the part of the score that is comma placement.

Usage:

    .venv/bin/python bench/reference_shift.py ../shared/data/multi30k --direction en-de \\
        --hypotheses saved_models/multi30k_en_de/test2016_last_beam.de

Adds one entry per corpus and direction to `bench/results/reference_shift.json`, draws
`bench/results/reference_shift.png` and prints markdown tables. Nothing is trained or
decoded; it reads text only.
"""

import argparse
import collections
import json
import os
import pathlib
import re
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # write_json imports the package, and with it TensorFlow
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench import machine  # noqa: E402
from bench.search_settings import read_split  # noqa: E402

# Words, hyphenated compounds kept whole, and each punctuation mark on its own: enough to
# see what follows a comma (sacrebleu's tokenizer is for scoring, not for this).
TOKEN = re.compile(r"\w+(?:-\w+)*|[^\w\s]")


def read_lines(path):
    with open(path, encoding="utf-8") as file:
        return file.read().splitlines()


def comma_followers(lines, top):
    """The `top` words that most often follow a comma in `lines`, most frequent first."""
    counts = collections.Counter()
    for line in lines:
        tokens = TOKEN.findall(line)
        counts.update(word for comma, word in zip(tokens, tokens[1:]) if comma == "," and word[0].isalnum())
    return [word for word, _ in counts.most_common(top)]


def comma_rates(lines, words):
    """For each word, the share of its non-initial occurrences that directly follow a comma
    (None where it does not occur past a sentence's first token)."""
    seen = collections.Counter()
    after_comma = collections.Counter()
    wanted = set(words)
    for line in lines:
        tokens = TOKEN.findall(line)
        for previous, word in zip(tokens, tokens[1:]):
            if word in wanted:
                seen[word] += 1
                after_comma[word] += previous == ","
    return {word: (after_comma[word] / seen[word] if seen[word] else None) for word in words}


def split_stats(sources, targets, words):
    if len(sources) != len(targets) or not targets:
        raise ValueError(f"expected as many source as target lines, at least one; received {len(sources)} and {len(targets)}")
    source_words = sum(len(line.split()) for line in sources)
    target_words = sum(len(line.split()) for line in targets)
    return {
        "pairs": len(targets),
        "target_words_per_sentence": target_words / len(targets),
        "target_per_source_words": target_words / max(source_words, 1),
        "target_per_source_chars": sum(map(len, targets)) / max(sum(map(len, sources)), 1),
        "commas_per_sentence": sum(line.count(",") for line in targets) / len(targets),
        "final_period": sum(line.rstrip().endswith(".") for line in targets) / len(targets),
        "comma_before": comma_rates(targets, words),
    }


def without_commas(lines):
    """Every comma dropped, and the space it leaves collapsed."""
    return [" ".join(line.replace(",", " ").split()) for line in lines]


def hypothesis_stats(hypotheses, references):
    import sacrebleu

    if len(hypotheses) != len(references):
        raise ValueError(f"expected one hypothesis per reference ({len(references)}); received {len(hypotheses)}")
    bleu = sacrebleu.BLEU()
    return {
        "bleu": bleu.corpus_score(hypotheses, [references]).score,
        "bleu_without_commas": bleu.corpus_score(without_commas(hypotheses), [without_commas(references)]).score,
        "words_per_reference_word": sum(len(h.split()) for h in hypotheses) / sum(len(r.split()) for r in references),
        "commas_per_sentence": sum(line.count(",") for line in hypotheses) / len(hypotheses),
    }


def plot(entry, path):
    groups = ["target words\na source word", "target chars\na source char", "commas\na sentence"]
    keys = ["target_per_source_words", "target_per_source_chars", "commas_per_sentence"]
    for word in entry["words"][:3]:
        groups.append(f"share of '{word}'\nafter a comma")
    series = {
        split: [stats[key] for key in keys] + [stats["comma_before"][word] for word in entry["words"][:3]]
        for split, stats in entry["splits"].items()
    }
    title = f"{entry['direction']} references, target side: {os.path.basename(entry['data_dir'])}"
    machine.grouped_bar_chart(path, title, "value", groups, series)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir", help="folder with SPLIT.LANG files (one sentence a line)")
    parser.add_argument("--direction", required=True, help="SOURCE-TARGET language codes, e.g. en-de")
    parser.add_argument("--splits", default="train,val,test_2016_flickr", help="comma-separated; the first picks the words")
    parser.add_argument("--top", type=int, default=6, help="how many comma-following words to follow")
    parser.add_argument("--hypotheses", nargs="*", default=[], help="translations of --hypothesis-split, one a line")
    parser.add_argument("--hypothesis-split", default="test_2016_flickr")
    parser.add_argument("--results", default=str(machine.RESULTS_DIR / "reference_shift.json"))
    args = parser.parse_args(argv)

    source_lang, _, target_lang = args.direction.partition("-")
    if not target_lang:
        raise SystemExit(f"--direction takes SOURCE-TARGET, such as en-de; received {args.direction!r}")
    data_dir = pathlib.Path(args.data_dir)
    splits = [split for split in args.splits.split(",") if split]
    texts = {}
    for split in splits + ([args.hypothesis_split] if args.hypotheses else []):
        paths = [data_dir / f"{split}.{lang}" for lang in (source_lang, target_lang)]
        missing = [str(path) for path in paths if not path.is_file()]
        if missing:
            raise SystemExit(f"split {split!r} needs {missing}; the folder holds {sorted(p.name for p in data_dir.iterdir())}")
        texts[split] = read_split(data_dir, split, source_lang, target_lang)

    words = comma_followers(texts[splits[0]][1], args.top)
    entry = {
        "data_dir": os.path.normpath(args.data_dir),
        "direction": args.direction,
        "words": words,
        "splits": {split: split_stats(*texts[split], words) for split in splits},
        "hypotheses": {},
    }
    references = texts[args.hypothesis_split][1] if args.hypotheses else []
    for path in args.hypotheses:
        entry["hypotheses"][os.path.normpath(path)] = {
            "split": args.hypothesis_split,
            **hypothesis_stats(read_lines(path), references),
        }

    results_path = pathlib.Path(args.results)
    payload = json.loads(results_path.read_text()) if results_path.is_file() else {"benchmark": "reference_shift"}
    payload.setdefault("corpora", {})[f"{entry['data_dir']} {args.direction}"] = entry
    machine.write_json(results_path, payload)
    plot(entry, results_path.with_suffix(".png"))

    def rate(value):
        return "—" if value is None else f"{value:.0%}"

    print("| split | pairs | target words a sentence | target/source words | target/source chars "
          "| commas a sentence | ends in a period | " + " | ".join(f"`, {word}`" for word in words) + " |")
    print("|---" * (7 + len(words)) + "|")
    for split, stats in entry["splits"].items():
        print(f"| {split} | {stats['pairs']:,} | {stats['target_words_per_sentence']:.2f} "
              f"| {stats['target_per_source_words']:.4f} | {stats['target_per_source_chars']:.4f} "
              f"| {stats['commas_per_sentence']:.3f} | {stats['final_period']:.1%} | "
              + " | ".join(rate(stats["comma_before"][word]) for word in words) + " |")
    if entry["hypotheses"]:
        print("\n| hypotheses | BLEU | BLEU, commas removed on both sides | words a reference word | commas a sentence |")
        print("|---|---|---|---|---|")
        for path, stats in entry["hypotheses"].items():
            print(f"| {path} | {stats['bleu']:.2f} | {stats['bleu_without_commas']:.2f} "
                  f"| {stats['words_per_reference_word']:.4f} | {stats['commas_per_sentence']:.3f} |")


if __name__ == "__main__":
    main()

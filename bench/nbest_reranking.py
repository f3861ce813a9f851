"""N-best reranking on Multi30k, tuned on `val`, then scored once on test2016.

Two ways of choosing among the hypotheses of a beam search other than its own
length-penalised score, both spending decoding time only (nothing is trained):

- **Minimum Bayes risk** (Kumar & Byrne, 2004; Eikema & Aziz, 2020): the hypothesis
  with the highest expected utility against the others, each weighted by the softmax of
  the search's scores at a temperature (or uniformly), the utility sentence BLEU or
  chrF (sacreBLEU's).
- **The reverse direction's score** (the channel model of Yee et al., 2019, without
  their language model): score(y) = search score + w * log p(x | y) / |x|, with
  log p(x | y) teacher-forced through a model of the other direction. A model trained
  with bidirectional steps (`bidirectional_steps`) still translates both ways, so it
  can be its own reverse model (`--reverse-model-dir` left out); a separately trained
  model of the other direction is another 45 minutes of training.

The setting with the best cased sacreBLEU on `val` is scored on test2016, beside the
plain search on the same n-best lists (their first hypotheses).

Usage:

    .venv/bin/python bench/nbest_reranking.py ../shared/data/multi30k \\
        --model-dir saved_models/bidirectional/multi30k_en_de --direction en-de

Adds one entry per (model, reverse model) to `bench/results/nbest_reranking.json`.
"""

import argparse
import json
import os
import pathlib
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

from bench import machine  # noqa: E402
from bench.multi30k import sacrebleu_scores  # noqa: E402
from bench.search_settings import read_split  # noqa: E402

CHANNEL_WEIGHTS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0)
MBR_TEMPERATURES = (None, 1.0, 0.5, 0.25)  # None: every hypothesis weighs the same


def n_best_lists(model, tokenizer, sources, beam_size, alpha, batch_size):
    from keras_transformer.inference.translator import Translator

    translator = Translator(model, tokenizer, beam_size=beam_size, length_penalty=alpha, batch_size=batch_size)
    lists = translator.translate(sources, n_best=beam_size, progress=True)
    return [[(h.text, h.score) for h in hypotheses] for hypotheses in lists]


def reverse_log_probs(model, tokenizer, sources, lists, batch_size=128):
    """log p(source | hypothesis) and the source's length in pieces (with EOS), per hypothesis.

    Teacher-forced through the functional model, batched by length; written here
    because the package decodes but has no forced-scoring API.
    """
    from keras import ops

    from keras_transformer.special_tokens import BOS_ID, EOS_ID

    limit = model.config.max_length - 1
    source_ids = tokenizer.encode(sources)
    items = []  # (sentence, hypothesis, encoder ids: the hypothesis, decoder targets: the source)
    for i, hypotheses in enumerate(lists):
        for j, ids in enumerate(tokenizer.encode([text for text, _ in hypotheses])):
            items.append((i, j, ids[:limit] + [EOS_ID], source_ids[i][:limit] + [EOS_ID]))
    items.sort(key=lambda item: (len(item[2]), len(item[3])))
    scores = {}
    for start in range(0, len(items), batch_size):
        chunk = items[start : start + batch_size]
        encoder = np.zeros((len(chunk), max(len(c[2]) for c in chunk)), "int32")
        labels = np.zeros((len(chunk), max(len(c[3]) for c in chunk)), "int32")
        for row, (_, _, hypothesis, target) in enumerate(chunk):
            encoder[row, : len(hypothesis)] = hypothesis
            labels[row, : len(target)] = target
        decoder = np.concatenate([np.full((len(chunk), 1), BOS_ID, "int32"), labels[:, :-1]], axis=1)
        logits = model({"encoder_inputs": encoder, "decoder_inputs": decoder}, training=False)
        log_probs = ops.convert_to_numpy(ops.log_softmax(ops.cast(logits, "float32"), axis=-1))
        token_log_probs = np.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0] * (labels != 0)
        for row, (i, j, _, _) in enumerate(chunk):
            scores[i, j] = (float(token_log_probs[row].sum()), int((labels[row] != 0).sum()))
    return [[scores[i, j] for j in range(len(hypotheses))] for i, hypotheses in enumerate(lists)]


def channel_choice(lists, reverse, weight):
    return [
        hypotheses[max(range(len(hypotheses)), key=lambda j: hypotheses[j][1] + weight * rev[j][0] / rev[j][1])][0]
        for hypotheses, rev in zip(lists, reverse)
    ]


def mbr_choice(lists, utility, temperature):
    import sacrebleu.metrics

    metric = {"bleu": sacrebleu.metrics.BLEU(effective_order=True), "chrf": sacrebleu.metrics.CHRF()}[utility]
    chosen = []
    for hypotheses in lists:
        texts = [text for text, _ in hypotheses]
        scores = np.array([score for _, score in hypotheses])
        if temperature is None:
            weights = np.full(len(texts), 1.0 / len(texts))
        else:
            weights = np.exp((scores - scores.max()) / temperature)
            weights /= weights.sum()
        # Each hypothesis is also a pseudo-reference for itself, at the utility of a
        # perfect match (100), as when the references are samples that may repeat it.
        expected = [
            sum(w * (100.0 if i == j else metric.sentence_score(candidate, [texts[i]]).score) for i, w in enumerate(weights))
            for j, candidate in enumerate(texts)
        ]
        chosen.append(texts[int(np.argmax(expected))])
    return chosen


def settings():
    for utility in ("bleu", "chrf"):
        for temperature in MBR_TEMPERATURES:
            yield {"method": "mbr", "utility": utility, "temperature": temperature}
    for weight in CHANNEL_WEIGHTS:
        yield {"method": "reverse score", "weight": weight}


def choose(setting, lists, reverse):
    if setting["method"] == "mbr":
        return mbr_choice(lists, setting["utility"], setting["temperature"])
    return channel_choice(lists, reverse, setting["weight"])


def describe(setting):
    if setting["method"] == "mbr":
        weighting = "uniform" if setting["temperature"] is None else f"T {setting['temperature']:g}"
        return f"MBR {setting['utility']} ({weighting})"
    return f"reverse score, weight {setting['weight']:g}"


def oracle_bleu(lists, references):
    """Corpus BLEU of the hypothesis with the best sentence BLEU: the ceiling of any reranker."""
    import sacrebleu.metrics

    metric = sacrebleu.metrics.BLEU(effective_order=True)
    best = [
        max((text for text, _ in hypotheses), key=lambda text: metric.sentence_score(text, [reference]).score)
        for hypotheses, reference in zip(lists, references)
    ]
    return round(sacrebleu_scores(best, references)["bleu"], 2)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir", help="folder with Multi30k's val and test_2016_flickr .de/.en files")
    parser.add_argument("--model-dir", required=True, help="a trained model directory")
    parser.add_argument("--direction", required=True, choices=["de-en", "en-de"])
    parser.add_argument(
        "--reverse-model-dir",
        help="a model of the other direction for the reverse score (default: the model itself, "
        "which must have been trained with bidirectional steps)",
    )
    parser.add_argument("--beam-size", type=int, default=8)
    parser.add_argument("--alpha", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--results", default=str(machine.RESULTS_DIR / "nbest_reranking.json"))
    args = parser.parse_args(argv)

    from keras_transformer.model.directory import load_model_and_tokenizer

    data_dir = pathlib.Path(args.data_dir)
    source_lang, target_lang = args.direction.split("-")
    model, tokenizer = load_model_and_tokenizer(args.model_dir)
    reverse_dir = args.reverse_model_dir or args.model_dir
    reverse_model, reverse_tokenizer = (
        (model, tokenizer) if reverse_dir == args.model_dir else load_model_and_tokenizer(reverse_dir)
    )

    def run(split, candidates):
        sources, references = read_split(data_dir, split, source_lang, target_lang)
        started = time.monotonic()
        lists = n_best_lists(model, tokenizer, sources, args.beam_size, args.alpha, args.batch_size)
        decode_seconds = time.monotonic() - started
        reverse = reverse_log_probs(reverse_model, reverse_tokenizer, sources, lists)
        rows = [{"method": "search", "bleu": round(sacrebleu_scores([h[0][0] for h in lists], references)["bleu"], 2)}]
        for setting in candidates:
            bleu = sacrebleu_scores(choose(setting, lists, reverse), references)["bleu"]
            rows.append({**setting, "bleu": round(bleu, 2)})
            print(f"{split} {describe(setting)}: BLEU {rows[-1]['bleu']:.2f}", flush=True)
        oracle = oracle_bleu(lists, references)
        return rows, {"decode_seconds": round(decode_seconds, 1), "oracle_bleu": oracle}

    val_rows, val_info = run("val", list(settings()))
    print(f"val search: {val_rows[0]['bleu']:.2f}; oracle {val_info['oracle_bleu']:.2f}")
    best = max(val_rows[1:], key=lambda row: row["bleu"])
    best_setting = {key: value for key, value in best.items() if key != "bleu"}
    test_rows, test_info = run("test_2016_flickr", [best_setting])
    print(f"test2016 search: {test_rows[0]['bleu']:.2f}; {describe(best_setting)} (chosen on val): {test_rows[1]['bleu']:.2f}")

    results_path = pathlib.Path(args.results)
    payload = json.loads(results_path.read_text()) if results_path.is_file() else {"benchmark": "nbest_reranking"}
    key = f"{os.path.normpath(args.model_dir)} <- {os.path.normpath(reverse_dir)}"
    payload.setdefault("runs", {})[key] = {
        "direction": args.direction,
        "beam_size": args.beam_size,
        "alpha": args.alpha,
        "val": val_rows,
        "val_info": val_info,
        "chosen_on_val": describe(best_setting),
        "test2016": {"search": test_rows[0]["bleu"], "chosen": test_rows[1]["bleu"], **test_info},
        "machine": machine.machine_info(),
    }
    machine.write_json(results_path, payload)


if __name__ == "__main__":
    main()

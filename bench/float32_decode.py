"""Score a Multi30k run trained in mixed precision with its weights decoded in float32.

A model trained with `model.dtype_policy = "mixed_bfloat16"` keeps float32 variables and
computes in bfloat16; `bench/multi30k.py` scores it as trained (bfloat16 decoding). This
loads the run's last weights (`MODEL_DIR/model.keras`) and its averaged ones
(`MODEL_DIR_averaged`, which `bench/multi30k.py` writes) into a float32 model of the same
config and scores test2016 with the paper's beam 4 (alpha 0.6), greedily and with the
direction's config search, and val with beam 4: the same splits, searches and sacreBLEU
scores as `bench/multi30k.py`, so the two compare cell for cell.

Usage (after `bench/multi30k.py ... --set model.dtype_policy=mixed_bfloat16 --output-dir DIR`):

    .venv/bin/python bench/float32_decode.py ../shared/data/multi30k \
        saved_models/ende_bf16/multi30k_en_de --direction en-de
"""

import argparse
import dataclasses
import json
import os
import pathlib
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
BENCH = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))

import keras  # noqa: E402

import keras_transformer as kt  # noqa: E402
import multi30k  # noqa: E402
from keras_transformer.data.tokenizer import SubwordTokenizer  # noqa: E402
from keras_transformer.inference.translator import Translator  # noqa: E402
from keras_transformer.model.directory import MODEL_FILE, TOKENIZER_FILE  # noqa: E402
from keras_transformer.train.run import load_corpus  # noqa: E402


def float32_model(model_dir):
    """The model in `model_dir` rebuilt with a float32 policy and its (float32) weights."""
    trained = keras.saving.load_model(os.path.join(model_dir, MODEL_FILE), compile=False, safe_mode=True)
    model = kt.build_transformer(dataclasses.replace(trained.config, dtype_policy="float32"))
    model.set_weights(trained.get_weights())
    return trained.config.dtype_policy, model


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir", help="the Multi30k folder (train, val, test_2016_flickr files)")
    parser.add_argument("model_dir", help="a model directory written by bench/multi30k.py")
    parser.add_argument("--direction", default="en-de", choices=sorted(multi30k.CONFIGS))
    parser.add_argument("--output", default=str(BENCH / "results" / "multi30k_bf16_float32_decode.json"))
    args = parser.parse_args(argv)
    model_dir = args.model_dir.rstrip("/")
    # Only the corpus paths and the config's search are read: budget, averaging, output
    # directory and curve are bench/multi30k.py's defaults and go unused here.
    run_config, _ = multi30k.direction_config(args.data_dir, args.direction, 45, 5, [], BENCH.parent / "saved_models", 0)
    corpus = load_corpus(run_config)
    tokenizer = SubwordTokenizer.load(os.path.join(model_dir, TOKENIZER_FILE))
    searches = {
        "beam": multi30k.PAPER_SEARCH,
        "greedy": {"beam_size": 1, "length_penalty": 0.6},
        "search": run_config.search_settings(),
    }
    scores, trained_policy = {}, None
    for weights, directory in (("last", model_dir), ("averaged", model_dir + "_averaged")):
        trained_policy, model = float32_model(directory)
        jobs = [("test2016", corpus["test"], decode) for decode in searches]
        if weights == "last":
            jobs.append(("val", corpus["validation"], "beam"))
        for split, pairs, decode in jobs:
            translator = Translator(model, tokenizer, **searches[decode], batch_size=run_config.eval_batch_size)
            translations = translator.translate([source for source, _ in pairs], progress=True)
            key = f"{split}_{weights}_{decode}"
            scores[key] = multi30k.sacrebleu_scores(translations, [target for _, target in pairs])
            print(f"{key:26s} BLEU {scores[key]['bleu']:.2f}", flush=True)
    payload = {
        "what": f"{model_dir}, trained with dtype_policy={trained_policy}, decoded in float32",
        "direction": args.direction,
        "scores": scores,
    }
    pathlib.Path(args.output).write_text(json.dumps(payload, indent=2) + "\n")
    print(args.output)


if __name__ == "__main__":
    main()

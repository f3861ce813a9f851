"""Screen a Multi30k recipe change at the step count of a CPU budget, on an accelerator.

A 45-minute CPU run (bench/multi30k.py) tests one change an hour. What a recipe reaches
in that budget is set by the updates that fit in it (3,981 for en->de at 2,048 tokens a
batch on a 2-core Xeon), not by the device that makes them: this script replays that
many updates of the same batching on any device, so a GPU screens a change in minutes
(6 to 7 on one H100, decoding val included). A change that wins here is then run in the
real budget with bench/multi30k.py; a change that costs step time (a wider model) must be
screened at its own step count.

Two stages, because the accelerator machine need not have TensorFlow:

1. `prepare` (here: sentencepiece and numpy, plus the package to read the run config):
   tokenizes the training pairs with the run's tokenizer, optionally with BPE-dropout
   (Provilkov et al., 2020: each merge skipped with probability `--bpe-dropout`, a new
   segmentation every epoch), and batches them epoch by epoch as `make_dataset` does
   (drop pairs over max_length, a full shuffle, the run's length buckets,
   `tokens_per_batch // boundary` pairs a batch, the batches of an epoch shuffled) until
   `--steps` batches; writes them, the val split and the run's model and training
   settings (with `total_steps = --steps`) to one .npz.
2. `train` (keras with the JAX backend; TensorFlow is not needed): trains the run's model
   on those batches with the run's schedule, float32 with full-precision matmuls (no
   TF32), then decodes val with the run's beam search and greedily and scores it with
   sacreBLEU (cased, 13a), as bench/multi30k.py scores val. Batches are padded to a few
   fixed shapes (padding changes neither the loss nor the gradients: the loss is a mean
   over real tokens), so XLA compiles the step four times, not once per bucket.

The batches are made here by numpy, not by tf.data, so a screen compares changes with
each other and with its own baseline; the baseline's val BLEU against the CPU run's
says how far the replay is from the real thing.

Usage:

    .venv/bin/python bench/step_matched_screen.py prepare ../shared/data/multi30k \
        --model-dir saved_models/multi30k_en_de --steps 3981 --output screen/base.npz
    .venv/bin/python bench/step_matched_screen.py prepare ../shared/data/multi30k \
        --model-dir saved_models/multi30k_en_de --steps 3981 --bpe-dropout 0.1 --output screen/bpe01.npz
    # the shipped en->de recipe, no CPU run first (its tokenizer is trained here):
    .venv/bin/python bench/step_matched_screen.py prepare ../shared/data/multi30k \
        --recipe en-de --steps 7140 --output screen/ende_7140.npz
    KERAS_BACKEND=jax python bench/step_matched_screen.py train screen/base.npz \
        --set dropout=0.2 --seed 1 --results screen/results.jsonl
    # a wider model at its own (smaller) step count, from the same archive:
    KERAS_BACKEND=jax python bench/step_matched_screen.py train screen/base.npz --steps 2640 \
        --set d_model=320 --set d_ff=1280 --decode beam --results screen/results.jsonl

Run screens one after another, not side by side. The step is GPU-bound, not host-bound:
alone on one H200 it takes 12-15 ms with `XLA_FLAGS=--xla_gpu_autotune_level=0` (the
first 500 steps 74-78 s, XLA compiling the four step shapes; a 5,900-update screen with
val and test2016 decoded takes about 3 minutes), but three started at once (jax 0.11)
took 97 ms a step each with the GPU at 100%, no faster in all than one after another,
and the longest of them ran out of its 10-minute call; five at once with GEMM autotuning
spent their first 8 minutes compiling (bench/results/step_matched_screen.json).
`--splits val test` also scores the run's test split (stored by `prepare` where its files
exist), for reports: recipes are chosen on val.
"""

import argparse
import json
import math
import os
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from keras_transformer.special_tokens import BOS_ID, EOS_ID, PAD_ID  # noqa: E402


def pair_length(source_ids, target_ids):
    """A pair's padded length once EOS / BOS are added, as `pipeline.example_length` counts it."""
    return max(len(source_ids), len(target_ids)) + 1


def fitting(source_ids, target_ids, max_length):
    """The pairs that fit `max_length` once EOS / BOS are added; `make_dataset` drops the rest."""
    kept = [i for i, pair in enumerate(zip(source_ids, target_ids)) if pair_length(*pair) <= max_length]
    return [source_ids[i] for i in kept], [target_ids[i] for i in kept]


def epoch_batches(source_ids, target_ids, rng, boundaries, tokens_per_batch):
    """One epoch of batches as `make_dataset` makes them: shuffle, bucket, batch, shuffle.

    Returns a list of index arrays (pairs of one batch) and their padded lengths.
    """
    lengths = np.array([pair_length(s, t) for s, t in zip(source_ids, target_ids)])
    order = rng.permutation(len(lengths))
    buckets = {boundary: [] for boundary in boundaries}
    sizes = {boundary: max(1, tokens_per_batch // boundary) for boundary in boundaries}
    batches = []
    for index in order:
        boundary = boundaries[np.searchsorted(boundaries, lengths[index])]
        buckets[boundary].append(index)
        if len(buckets[boundary]) == sizes[boundary]:
            batches.append((np.array(buckets[boundary]), boundary))
            buckets[boundary] = []
    batches += [(np.array(rows), boundary) for boundary, rows in buckets.items() if rows]
    return [batches[i] for i in rng.permutation(len(batches))]


def recipe_run(direction, data_dir, overrides):
    """The shipped recipe of `direction` as bench/multi30k.py runs it: its run config and
    its tokenizer, trained here on `data_dir`'s training pairs as that run trains it, so a
    screen needs no CPU run first."""
    import tempfile

    import sentencepiece

    from bench.multi30k import direction_config
    from keras_transformer.train.run import load_corpus, prepare_tokenizer

    # The budget, averaging and output folder are the run's, unused here (--steps sets the updates).
    config, _ = direction_config(data_dir, direction, minutes=45.0, average=1, overrides=overrides,
                                 output_dir=tempfile.gettempdir(), curve_minutes=False)
    tokenizer = prepare_tokenizer(config, load_corpus(config)["train"])
    with tempfile.TemporaryDirectory() as folder:
        tokenizer.save(folder)
        processor = sentencepiece.SentencePieceProcessor(model_file=os.path.join(folder, "tokenizer.model"))
    return config, processor


def prepare(args):
    import sentencepiece

    from keras_transformer.data.pipeline import default_bucket_boundaries, evenly_spaced_boundaries
    from keras_transformer.data.readers import read_parallel_files
    from keras_transformer.train.run_config import RunConfig

    data = pathlib.Path(args.data_dir)
    if args.recipe:
        config, processor = recipe_run(args.recipe, data, args.set or [])
    else:
        model_dir = pathlib.Path(args.model_dir)
        config = RunConfig.from_toml(model_dir / "config.toml", args.set or [])
        processor = sentencepiece.SentencePieceProcessor(model_file=str(model_dir / "tokenizer.model"))
    src, tgt = config.source_lang, config.target_lang
    # The reader the runs use (stripped sentences, malformed lines refused).
    train = read_parallel_files(data / f"{config.train_split}.{src}", data / f"{config.train_split}.{tgt}")[0]
    train_src, train_tgt = [s for s, _ in train], [t for _, t in train]
    model = config.model_config().to_dict()
    max_length = model["max_length"]
    boundaries = np.array(
        evenly_spaced_boundaries(config.bucket_width, max_length) or default_bucket_boundaries(max_length)
    )
    # Token ids are stored in the smallest integer type that holds the vocabulary.
    id_type = np.int16 if config.vocab_size <= np.iinfo(np.int16).max + 1 else np.int32
    rng = np.random.default_rng(args.seed)

    def encode(lines):
        if args.bpe_dropout:
            return processor.encode(lines, enable_sampling=True, alpha=args.bpe_dropout, nbest_size=-1)
        return processor.encode(lines)

    flat, lengths, batch_rows, batch_boundaries, epochs = [], [], [], [], 0
    real_tokens = 0
    while len(batch_rows) < args.steps:
        source_ids, target_ids = fitting(encode(train_src), encode(train_tgt), max_length)
        for rows, boundary in epoch_batches(source_ids, target_ids, rng, boundaries, config.tokens_per_batch):
            if len(batch_rows) == args.steps:
                break
            batch_rows.append(len(rows))
            batch_boundaries.append(boundary)
            for row in rows:
                flat += [source_ids[row], target_ids[row]]
                lengths += [len(source_ids[row]), len(target_ids[row])]
                real_tokens += len(target_ids[row]) + 1
        epochs += 1
    training = dict(config.training_config().to_dict(), total_steps=args.steps)
    meta = {
        "model": model, "training": training, "vocab_size": config.vocab_size,
        "steps": args.steps, "epochs_read": epochs, "bpe_dropout": args.bpe_dropout,
        "tokens_per_batch": config.tokens_per_batch, "real_target_tokens": real_tokens,
        "beam_size": config.eval_beam_size, "length_penalty": config.eval_length_penalty,
        "source_lang": src, "target_lang": tgt,
    }
    out = pathlib.Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    # The evaluation splits travel with the batches: val (what a screen is read on) and, where
    # the run has one on disk, its test split (for reports only: recipes are chosen on val).
    splits = {"val": config.validation_split}
    if config.test_split and (data / f"{config.test_split}.{src}").exists():
        splits["test"] = config.test_split
    evaluation = {}
    for key, split in splits.items():
        pairs = read_parallel_files(data / f"{split}.{src}", data / f"{split}.{tgt}")[0]
        evaluation[f"{key}_source"] = np.array(json.dumps([processor.encode(source) for source, _ in pairs]))
        evaluation[f"{key}_reference"] = np.array(json.dumps([target for _, target in pairs]))
    meta["splits"] = splits
    np.savez_compressed(
        out,
        tokens=np.concatenate([np.asarray(ids, id_type) for ids in flat]),
        lengths=np.asarray(lengths, np.int16),
        batch_rows=np.asarray(batch_rows, np.int32),
        batch_boundaries=np.asarray(batch_boundaries, np.int16),
        **evaluation,
        tokenizer=np.frombuffer(processor.serialized_model_proto(), np.uint8),
        meta=np.array(json.dumps(meta)),
    )
    print(f"{out}: {args.steps} batches, {epochs} epochs read, {real_tokens:,} real target tokens "
          f"({os.path.getsize(out) / 2**20:.1f} MiB)")


# Padded batch shapes: a batch of bucket length L is padded to the first of these lengths
# >= L (the model's max_length above the last) and to the most rows a batch of that group
# holds, so XLA compiles at most 4 step shapes, not one per bucket.
SHAPE_LENGTHS = (16, 32, 48, 64)


def padded_batches(archive, meta):
    """The prepared batches, in order, as `(inputs, labels)` numpy arrays of a few shapes."""
    tokens, lengths = archive["tokens"], archive["lengths"]
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    width = meta["model"]["max_length"]
    groups = [length for length in SHAPE_LENGTHS if length < width] + [width]
    batch_groups = [next(group for group in groups if group >= boundary) for boundary in archive["batch_boundaries"]]
    group_rows = {}
    for group, rows in zip(batch_groups, archive["batch_rows"]):
        group_rows[group] = max(group_rows.get(group, 0), int(rows))
    prepared = []
    pair = 0
    for rows, length in zip(archive["batch_rows"], batch_groups):
        encoder = np.zeros((group_rows[length], length), np.int32)
        decoder = np.zeros_like(encoder)
        labels = np.zeros_like(encoder)
        for row in range(rows):
            source = tokens[offsets[2 * pair]:offsets[2 * pair + 1]]
            target = tokens[offsets[2 * pair + 1]:offsets[2 * pair + 2]]
            encoder[row, :len(source) + 1] = np.append(source, EOS_ID)
            decoder[row, :len(target) + 1] = np.append(BOS_ID, target)
            labels[row, :len(target) + 1] = np.append(target, EOS_ID)
            pair += 1
        prepared.append(({"encoder_inputs": encoder, "decoder_inputs": decoder}, labels))
    return prepared


def decode_split(model, archive, meta, split, method, batch_size=128, limit=None):
    """Hypotheses (detokenized) for `split` ("val" or "test") with `method` "beam" (the run's
    search) or "greedy"."""
    import sentencepiece

    from keras_transformer.inference.decoding import beam_decode, greedy_decode

    processor = sentencepiece.SentencePieceProcessor(model_proto=archive["tokenizer"].tobytes())
    sources = json.loads(str(archive[f"{split}_source"]))[:limit]
    width = meta["model"]["max_length"]
    hypotheses = []
    for start in range(0, len(sources), batch_size):
        chunk = sources[start:start + batch_size]
        encoder = np.zeros((batch_size, width), np.int32)
        for row, ids in enumerate(chunk):
            ids = (ids + [EOS_ID])[:width]
            encoder[row, :len(ids)] = ids
        if method == "beam":
            ids, _ = beam_decode(model, encoder, beam_size=meta["beam_size"], alpha=meta["length_penalty"])
        else:
            ids, _ = greedy_decode(model, encoder)
        # Cut at EOS here: the package's `ids_before_eos` lives with the TensorFlow tokenizer,
        # which this stage does without.
        for row in np.asarray(ids)[:len(chunk)]:
            row = list(row)
            row = row[:row.index(EOS_ID)] if EOS_ID in row else row
            hypotheses.append(processor.decode([int(i) for i in row if i not in (PAD_ID, BOS_ID)]))
    return hypotheses


def _device_name(backend):
    if backend == "jax":
        import jax

        return f"jax {jax.__version__}, {jax.devices()[0].device_kind}"
    return backend


def train(args):
    archive = np.load(args.archive)
    meta = json.loads(str(archive["meta"]))
    # Refused before the backend is chosen and configured: nothing is imported or set for a bad call.
    if args.steps and args.steps > meta["steps"]:
        raise SystemExit(f"--steps {args.steps}: the archive holds {meta['steps']} updates")
    missing = [split for split in args.splits if f"{split}_source" not in archive]
    if missing:
        held = sorted(key[:-len("_source")] for key in archive.files if key.endswith("_source"))
        raise SystemExit(f"--splits {' '.join(args.splits)}: the archive holds {', '.join(held)} only "
                         "(prepare stores the run's test split where its files exist)")
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import keras

    if keras.backend.backend() == "jax":
        import jax

        jax.config.update("jax_default_matmul_precision", "highest")  # float32, not TF32
    import sacrebleu

    from keras_transformer.model import TransformerConfig, build_transformer
    from keras_transformer.train.compile import compile_transformer
    from keras_transformer.train.config import TrainingConfig

    model_values = dict(meta["model"], vocab_size=meta["vocab_size"])
    training_values = dict(meta["training"])
    for change in args.set or []:
        key, value = change.split("=", 1)
        table, key = (("training", key[len("training."):]) if key.startswith("training.")
                      else ("model", key))
        target = training_values if table == "training" else model_values
        target[key] = type(target[key])(json.loads(value)) if target.get(key) is not None else json.loads(value)
    if args.steps:
        # The first N prepared batches are what `prepare --steps N` writes (the same seed
        # draws the same epochs in order), so one archive serves models of several step
        # times; the schedule ends at N.
        training_values["total_steps"] = args.steps
    keras.utils.set_random_seed(args.seed)
    config = TransformerConfig.from_dict(model_values)
    training = TrainingConfig.from_dict(training_values)
    model = build_transformer(config)
    compile_transformer(model, training, jit_compile=True)
    batches = padded_batches(archive, meta)[:args.steps]
    started = time.perf_counter()
    # A Keras epoch is --log-every steps (one log line); the last one runs out of batches
    # where the prepared steps end, which Keras reports with a warning.
    model.fit(
        (batch for batch in batches), steps_per_epoch=args.log_every,
        epochs=math.ceil(len(batches) / args.log_every), verbose=2,
    )
    train_seconds = time.perf_counter() - started
    result = {
        "archive": os.path.basename(args.archive), "set": args.set or [], "seed": args.seed,
        "steps": len(batches), "bpe_dropout": meta["bpe_dropout"], "train_seconds": round(train_seconds, 1),
        "last_loss": round(float(model.history.history["loss"][-1]), 4),
        "device": _device_name(keras.backend.backend()), "keras": keras.__version__,
    }
    for split in args.splits:
        references = json.loads(str(archive[f"{split}_reference"]))[:args.max_sentences]
        for method in args.decode:
            started = time.perf_counter()
            hypotheses = decode_split(model, archive, meta, split, method, limit=args.max_sentences)
            result[f"{split}_{method}"] = round(sacrebleu.corpus_bleu(hypotheses, [references]).score, 2)
            result[f"{split}_{method}_seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(result))
    if args.results:
        with open(args.results, "a") as f:
            f.write(json.dumps(result) + "\n")


def _positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, received {text!r}")
    return value


def _probability(text):
    value = float(text)
    if not 0.0 <= value < 1.0:
        raise argparse.ArgumentTypeError(f"expected a probability in [0, 1), received {text!r}")
    return value


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    stages = parser.add_subparsers(dest="stage", required=True)
    p = stages.add_parser("prepare", help="tokenize and batch (needs the package's TensorFlow side)")
    p.add_argument("data_dir")
    run = p.add_mutually_exclusive_group(required=True)
    run.add_argument("--model-dir", help="a bench/multi30k.py run: config.toml, tokenizer.model")
    run.add_argument("--recipe", choices=("de-en", "en-de"),
                     help="the shipped recipe of this direction, its tokenizer trained here")
    p.add_argument("--steps", type=_positive_int, required=True, help="updates to replay")
    p.add_argument("--bpe-dropout", type=_probability, default=0.0, help="merge dropout, in [0, 1)")
    p.add_argument("--seed", type=int, default=0, help="the batch order's seed")
    p.add_argument("--set", action="append", help="run config overrides, as bench/multi30k.py's")
    p.add_argument("--output", required=True)
    t = stages.add_parser("train", help="train and score val (keras and JAX only)")
    t.add_argument("archive")
    t.add_argument("--set", action="append", help="model field or training.field = JSON value")
    t.add_argument("--seed", type=int, default=0, help="the weights' and dropout's seed")
    t.add_argument("--steps", type=_positive_int, help="replay the first N prepared updates (default all)")
    t.add_argument("--log-every", type=_positive_int, default=500, help="steps a Keras epoch (one log line)")
    t.add_argument("--max-sentences", "--max-val", dest="max_sentences", type=_positive_int,
                   help="score only the first N sentences of each split (a smoke test)")
    t.add_argument("--splits", nargs="+", choices=("val", "test"), default=("val",),
                   help="the splits to decode (default val; test is for reports, never for choosing)")
    t.add_argument("--decode", nargs="+", choices=("beam", "greedy"), default=("beam", "greedy"),
                   help="the val decodings to score (default both; beam alone saves ~20 s on one H100)")
    t.add_argument("--results", help="a JSON-lines file to append the result to")
    args = parser.parse_args(argv)
    prepare(args) if args.stage == "prepare" else train(args)


if __name__ == "__main__":
    main()

"""A WMT-sized corpus: time to the first training step, peak memory, and the batches' feed rate.

Multi30k's training split repeated to N pairs (4.5M is WMT14
en-de's size, its sentences half as long), trained with

    kt-train --config training/configs/multi30k.toml --set data_dir=... --set max_train_seconds=60 --set epochs=1

The corpora are written under --work-dir (default /tmp, never the repository) from the
shared Multi30k files. For each size the command runs twice: the first run binarizes the
training split (timed separately, from its "binarized corpus" line), the second opens the
binarized copy. Each run is stopped once its first step is shown (Keras' progress bar
prints "1/N"): the numbers are the seconds from the command to that step and the peak
resident memory of the process (psutil, polled every 0.2 s).

Also measured, on the same corpus: the batches' feed rate (real target tokens per second
that `IndexBatches` produces, at the recipe's 1,024 tokens a batch and at the paper's
25,000), and on Multi30k itself the batches' statistics of the old path
(`make_dataset`, the pairs in memory) against the new one (batches per epoch, real target
tokens per batch, padding share).

Usage:

    .venv/bin/python bench/corpus_scale.py --sizes 1000000 4500000 20000000
    .venv/bin/python bench/corpus_scale.py --sizes 4500000 --skip-stats

Writes bench/results/corpus_scale.json.
"""

import argparse
import os
import pathlib
import re
import shutil
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench import machine  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIG = REPO / "training" / "configs" / "multi30k.toml"
FIRST_STEP = re.compile(r"(^|\s)1/\d+")


def write_repeated_corpus(multi30k_dir, pairs, directory):
    """Multi30k's train.{de,en} repeated to `pairs` lines, with its val split; returns the directory."""
    directory = pathlib.Path(directory)
    if (directory / "done").exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    for lang in ("de", "en"):
        lines = (pathlib.Path(multi30k_dir) / f"train.{lang}").read_text(encoding="utf-8").splitlines(keepends=True)
        block = "".join(lines)
        with open(directory / f"train.{lang}", "w", encoding="utf-8") as file:
            for _ in range(pairs // len(lines)):
                file.write(block)
            file.writelines(lines[: pairs % len(lines)])
        for split in ("val", "test_2016_flickr"):
            shutil.copy(pathlib.Path(multi30k_dir) / f"{split}.{lang}", directory / f"{split}.{lang}")
    (directory / "done").write_text("")
    return directory


def probe(data_dir, run_dir, binarized_dir, timeout=900, watch_steps_seconds=20):
    """One `kt-train` of the probe, stopped `watch_steps_seconds` after its first step.

    Returns the seconds to the first step, the peak RSS, the binarizing seconds, and the
    step time Keras' progress bar shows last (what one CPU training step takes).
    """
    import psutil

    command = [
        sys.executable, "-m", "training.train", "--config", str(CONFIG), "--set", f"data_dir={data_dir}",
        "--set", "max_train_seconds=60", "--set", "epochs=1", "--set", f"output_dir={run_dir}",
        "--set", f"binarized_dir={binarized_dir}", "--set", "overwrite=true",
    ]
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=0)
    watched = psutil.Process(process.pid)
    peak, first_step, binarize_seconds, buffer = 0, None, None, b""
    os.set_blocking(process.stdout.fileno(), False)
    while process.poll() is None and time.monotonic() - started < timeout:
        peak = max(peak, watched.memory_info().rss)
        chunk = process.stdout.read() or b""
        buffer += chunk
        text = buffer.decode("utf-8", "replace")
        match = re.search(r"binarized corpus: [\d,]+ pairs in (\d+) s", text)
        if match:
            binarize_seconds = float(match.group(1))
        if first_step is None and any(FIRST_STEP.search(line) for line in re.split(r"[\r\n]", text)):
            first_step = time.monotonic() - started
        if first_step is not None and time.monotonic() - started > first_step + watch_steps_seconds:
            break
        time.sleep(0.2)
    process.kill()
    process.wait()
    text = buffer.decode("utf-8", "replace")
    return {
        "seconds_to_first_step": None if first_step is None else round(first_step, 1),
        "ms_per_step": ([None] + [int(ms) for ms in re.findall(r"(\d+)ms/step", text)])[-1],
        "peak_rss_gb": round(peak / 1e9, 2),
        "binarize_seconds": binarize_seconds,
        # The run's own lines on its steps before the first batch (corpus, tokenizer, binarizing).
        "lines": [line for line in text.splitlines() if re.match(r"(corpus|tokenizer|binarized corpus|batches): ", line)],
        "output_tail": text[-1500:] if first_step is None else "",
    }


def feed_rate(binarized_dir, tokens_per_batch, batches=300):
    """Real target tokens per second `IndexBatches` gathers from the binarized corpus in `binarized_dir`."""
    from keras_transformer.data.binarized import open_binarized
    from keras_transformer.data.index_batches import IndexBatches

    (directory,) = [path for path in pathlib.Path(binarized_dir).glob("train-*") if (path / "meta.json").exists()]
    corpus = open_binarized(str(directory))
    plan_started = time.perf_counter()
    index_batches = IndexBatches(corpus, max_length=64, tokens_per_batch=tokens_per_batch,
                                 bucket_boundaries=list(range(4, 64, 4)) + [64])
    index_batches.epoch_plan(0)
    plan_seconds = time.perf_counter() - plan_started
    started = time.perf_counter()
    tokens = sum(int((labels != 0).sum()) for _, labels in index_batches.batches(0, batches))
    seconds = time.perf_counter() - started
    # The same batches as model.fit reads them: through tf.data (from_generator, prefetch).
    started = time.perf_counter()
    dataset_tokens = sum(int((labels != 0).sum()) for _, labels in index_batches.dataset(0).take(batches).as_numpy_iterator())
    dataset_seconds = time.perf_counter() - started
    return {"tokens_per_batch": tokens_per_batch, "target_tokens_per_second": round(tokens / seconds),
            "tf_data_target_tokens_per_second": round(dataset_tokens / dataset_seconds),
            "batches_per_second": round(batches / seconds, 1), "plan_seconds": round(plan_seconds, 2),
            "pairs": corpus.num_pairs}


def batch_statistics(multi30k_dir, tmp_dir):
    """Multi30k's batches per epoch, real target tokens per batch and padding share: old path and new."""
    from keras_transformer.data import readers
    from keras_transformer.data.index_batches import IndexBatches
    from keras_transformer.data.pipeline import make_dataset
    from keras_transformer.data.text_corpus import TextCorpus, binarized_corpus
    from keras_transformer.train.run import prepare_tokenizer
    from keras_transformer.train.run_config import RunConfig

    run_config = RunConfig.from_toml(str(CONFIG), [f"data_dir={multi30k_dir}"])
    paths = (f"{multi30k_dir}/train.de", f"{multi30k_dir}/train.en")
    pairs, _ = readers.read_parallel_files(*paths)
    tokenizer = prepare_tokenizer(run_config, pairs)
    model = run_config.model_config(tokenizer.vocab_size)
    settings = dict(max_length=model.max_length, tokens_per_batch=run_config.tokens_per_batch,
                    bucket_boundaries=run_config.bucket_boundaries(model.max_length))
    old = make_dataset(pairs, tokenizer, seed=0, **settings)
    corpus = binarized_corpus(TextCorpus("files", paths=paths), tokenizer, tmp_dir, progress=False, print_fn=print)
    new = IndexBatches(corpus, seed=0, **settings)
    return {
        "old": _statistics((labels for _, labels in old.dataset.as_numpy_iterator())),
        "new": _statistics((labels for _, labels in new.batches(0, new.num_batches))),
        "same_length_stats": old.stats == new.stats,
    }


def _statistics(label_batches):
    batches, real, padded = 0, 0, 0
    for labels in label_batches:
        batches += 1
        real += int((labels != 0).sum())
        padded += labels.size
    return {"batches_per_epoch": batches, "target_tokens_per_batch": round(real / batches, 1),
            "padding_share": round(1 - real / padded, 4)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--multi30k-dir", default=str(REPO.parent / "shared" / "data" / "multi30k"))
    parser.add_argument("--work-dir", default="/tmp/kt_corpus_scale")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 4_500_000, 20_000_000])
    parser.add_argument("--skip-stats", action="store_true")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds a run may take to its first step")
    parser.add_argument("--reuse", action="store_true",
                        help="keep a binarized copy made before: one probe per size, a later run's")
    parser.add_argument("--output", default=str(machine.RESULTS_DIR / "corpus_scale.json"))
    args = parser.parse_args()
    work = pathlib.Path(args.work_dir)
    results = {"machine": machine.machine_info(), "probes": []}
    if not args.skip_stats:
        results["multi30k_batches"] = batch_statistics(args.multi30k_dir, str(work / "multi30k_binarized"))
        print(results["multi30k_batches"], flush=True)
    for size in args.sizes:
        data_dir = write_repeated_corpus(args.multi30k_dir, size, work / f"corpus_{size}")
        binarized = work / f"binarized_{size}"
        if args.reuse:
            row = {"pairs": size, "second_run": probe(data_dir, work / "runs", binarized, args.timeout)}
        else:
            shutil.rmtree(binarized, ignore_errors=True)
            row = {"pairs": size, "first_run": probe(data_dir, work / "runs", binarized, args.timeout)}
            row["second_run"] = probe(data_dir, work / "runs", binarized, args.timeout)
        row["feed"] = [feed_rate(binarized, tokens) for tokens in (1024, 25_000)]
        print(row, flush=True)
        results["probes"].append(row)
        machine.write_json(args.output, results)


if __name__ == "__main__":
    main()

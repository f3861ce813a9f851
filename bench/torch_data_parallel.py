"""What averaging the gradients costs a PyTorch step under torchrun, and whether it overlaps backward.

Run under torchrun (one process: the same steps without any all-reduce, the baseline):

    OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc_per_node=2 bench/torch_data_parallel.py
    OMP_NUM_THREADS=1 .venv/bin/torchrun --standalone --nproc_per_node=1 bench/torch_data_parallel.py

Each process trains the model on its rows of one fixed global batch, `--steps` steps per
mode, through `model.fit` and `train.torch_data_parallel`:

- `eager`: Keras' eager step (`jit_compile=False`);
- `captured`: the captured step, its graph run as it is (`CapturedTrainStep`);
- `compiled`: the captured graph compiled (`KERAS_TRANSFORMER_TORCH_COMPILER`, inductor
  unless set): forward and backward as one autograd node.

Per step (the median after the first `--warmup` steps) it reports the step's seconds, the
backward pass's (from the all-reduce's opening to its closing call), the seconds spent
waiting for all-reduces still in flight after backward (`wait`: the all-reduce's share of
the step that did not overlap anything), and where in the backward pass each bucket was
launched (0: at its start, 1: at its end, where nothing is left to overlap).
Rank 0 prints one JSON line and, with `--write`, records it in bench/results/torch_data_parallel.json
(one entry per process count and bucket size).
"""

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

os.environ["KERAS_BACKEND"] = "torch"
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench import machine  # noqa: E402

MODES = ("eager", "captured", "compiled")


def _arguments():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="small")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=32)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--bucket-mb", type=float, default=25.0)
    parser.add_argument("--write", action="store_true")
    return parser.parse_args()


class _Timeline:
    """Each step's times: the all-reduce opened, each bucket launched, backward done, reduce done."""

    def __init__(self):
        from keras_transformer.train import torch_data_parallel as tdp

        self.steps = []
        buckets = tdp.GradientBuckets
        start, launch, finish = buckets.start, buckets._launch_ready, buckets.finish
        timeline = self

        def timed_start(self, *args):
            timeline.steps.append({"start": time.perf_counter(), "launches": []})
            return start(self, *args)

        def timed_launch(self):
            before = self._next
            launch(self)
            if self._next > before:
                timeline.steps[-1]["launches"] += [time.perf_counter()] * (self._next - before)

        def timed_finish(self):
            timeline.steps[-1]["backward_done"] = time.perf_counter()
            before = self._next
            result = finish(self)
            timeline.steps[-1]["reduced"] = time.perf_counter()
            timeline.steps[-1]["late_launches"] = timeline.steps[-1].get("late_launches", 0) + (len(self.buckets) - before)
            timeline.steps[-1]["buckets"] = len(self.buckets)
            return result

        buckets.start, buckets._launch_ready, buckets.finish = timed_start, timed_launch, timed_finish


class _StepTimes:
    def __init__(self):
        import keras

        times = self.times = []

        class Clock(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                times.append(time.perf_counter())

            def on_train_batch_end(self, batch, logs=None):
                times[-1] = time.perf_counter() - times[-1]

        self.callback = Clock()


def _model(config, mode, bucket_bytes):
    import keras

    from keras_transformer import build_transformer, torch_capture
    from keras_transformer.train import torch_data_parallel
    from keras_transformer.train.losses import LabelSmoothedCrossEntropy
    from keras_transformer.train.torch_step import CapturedTrainStep

    keras.utils.set_random_seed(1)
    model = build_transformer(config)
    model.compile(optimizer=keras.optimizers.Adam(1e-4), loss=LabelSmoothedCrossEntropy(), jit_compile=False)
    if mode == "captured":
        model.captured_train_step = CapturedTrainStep(model, capture_after=1)
    elif mode == "compiled":
        model.captured_train_step = CapturedTrainStep(model, compiler=torch_capture.default_compiler(), strict=True)
    return torch_data_parallel.attach(model, bucket_bytes=bucket_bytes)


def main():
    args = _arguments()
    import numpy as np
    import torch

    from keras_transformer import distribute, torch_processes
    import keras_transformer as kt

    engine = distribute.select_strategy("auto")
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    config = kt.TransformerConfig.from_preset(args.preset, vocab_size=args.vocab, dropout=0.0)
    rng = np.random.default_rng(0)
    ids = lambda: rng.integers(4, args.vocab, (args.global_batch, args.length)).astype("int32")  # noqa: E731
    encoder, decoder, labels = ids(), ids(), ids()
    shard = torch_processes.shard()
    rows = slice(shard.index, None, shard.count)
    x = {"encoder_inputs": encoder[rows], "decoder_inputs": decoder[rows]}
    y = labels[rows]
    timeline = _Timeline() if torch_processes.is_multi_process() else None
    results = {}
    for mode in args.modes:
        model = _model(config, mode, int(args.bucket_mb * 2**20))
        clock = _StepTimes()
        if timeline:
            timeline.steps.clear()
        model.fit(x, y, batch_size=len(y), epochs=args.steps, verbose=0, callbacks=[clock.callback], shuffle=False)
        kept = slice(args.warmup, None)
        result = {"step_seconds": statistics.median(clock.times[kept])}
        if timeline:
            steps = timeline.steps[kept]
            result.update(
                backward_seconds=statistics.median(s["backward_done"] - s["start"] for s in steps),
                wait_seconds=statistics.median(s["reduced"] - s["backward_done"] for s in steps),
                buckets=steps[0]["buckets"],
                # Where in the backward pass each bucket went out: 0 at its start, 1 at its end.
                launch_points=[round(statistics.median(
                    (s["launches"][i] - s["start"]) / (s["backward_done"] - s["start"]) for s in steps
                ), 2) for i in range(len(steps[0]["launches"]))],
            )
            result["wait_share_of_step"] = result["wait_seconds"] / result["step_seconds"]
        results[mode] = result
    if torch_processes.rank() == 0:
        payload = {
            "machine": machine.machine_info(),
            "engine": distribute.describe(engine),
            "processes": torch_processes.world_size(),
            "settings": {k: v for k, v in vars(args).items() if k != "write"},
            "parameters": int(model.count_params()),
            "results": results,
        }
        print(json.dumps(payload), flush=True)
        if args.write:  # one entry per process count and bucket size, the latest run of each
            path = machine.RESULTS_DIR / "torch_data_parallel.json"
            runs = json.loads(path.read_text())["runs"] if path.exists() else {}
            runs[f"{torch_processes.world_size()} processes, {args.bucket_mb:g} MB buckets"] = payload
            machine.write_json(path, {"runs": runs})


if __name__ == "__main__":
    main()

"""Training tokens/s on one device vs two, and in float32 vs mixed bfloat16, on this machine.

Times `model.fit` steps (forward, backward, Adam update) of a small Transformer (the
`tiny` preset, vocabulary 1000) on one fixed batch of 64 pairs x 32 tokens a side
(2048 target tokens, no padding), after a warm-up fit that compiles the step. Each
configuration runs in its own process, because device layouts and the backend are fixed
when a process starts:

- `tensorflow/1 device`: the default strategy;
- `tensorflow/2 logical CPUs (mirrored)`: `MirroredStrategy` over the one CPU split in
  two logical devices (`tf.config.set_logical_device_configuration`), each replica
  getting half of the same global batch;
- `jax/2 host devices (data_parallel)`: `keras.distribution.DataParallel` over
  `--xla_force_host_platform_device_count=2`;
- each backend's `1 device` in float32 and in `mixed_bfloat16`.

Two logical devices on one CPU add no compute: the comparison shows what the
data-parallel machinery costs (or gains from running two half batches at once) here,
not what two real GPUs would give. Configurations run round-robin `--rounds` times so
that each sees the same background load; per configuration the fastest round counts.
The 1-minute load average is recorded with every timing.

Usage:

    .venv/bin/python bench/scaling.py
    .venv/bin/python bench/scaling.py --rounds 3 --steps 20 --only tensorflow

Writes bench/results/scaling.json.
"""

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import machine  # noqa: E402

PRESET = "tiny"
VOCAB_SIZE = 1000
BATCH = 64
LENGTH = 32
# name -> (backend, strategy, dtype_policy, extra environment)
CONFIGURATIONS = {
    "tensorflow/1 device/float32": ("tensorflow", "default", None, {}),
    "tensorflow/2 logical CPUs (mirrored)/float32": ("tensorflow", "mirrored", None, {}),
    "tensorflow/1 device/mixed_bfloat16": ("tensorflow", "default", "mixed_bfloat16", {}),
    "jax/1 device/float32": ("jax", "default", None, {}),
    "jax/2 host devices (data_parallel)/float32": (
        "jax",
        "data_parallel",
        None,
        {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"},
    ),
    "jax/1 device/mixed_bfloat16": ("jax", "default", "mixed_bfloat16", {}),
    "torch/1 device/float32": ("torch", "default", None, {}),
    "torch/1 device/mixed_bfloat16": ("torch", "default", "mixed_bfloat16", {}),
}


def child(name, steps, repeats):
    """Runs in a fresh process: times `repeats` fits of `steps` steps; prints JSON."""
    backend, strategy, dtype_policy, _ = CONFIGURATIONS[name]
    if strategy == "mirrored":
        import tensorflow as tf

        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * 2
        )
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_transformer as kt
    from keras_transformer import distribute
    from keras_transformer.train.losses import LabelSmoothedCrossEntropy
    from keras_transformer.train.precision import loss_scaled_optimizer

    config = kt.TransformerConfig.from_preset(
        PRESET, vocab_size=VOCAB_SIZE, dtype_policy=dtype_policy
    )
    rng = np.random.default_rng(0)
    inputs = {
        "encoder_inputs": rng.integers(1, VOCAB_SIZE, (BATCH, LENGTH)).astype("int32"),
        "decoder_inputs": rng.integers(1, VOCAB_SIZE, (BATCH, LENGTH)).astype("int32"),
    }
    labels = rng.integers(1, VOCAB_SIZE, (BATCH, LENGTH)).astype("int32")
    data = tf.data.Dataset.from_tensors((inputs, labels)).repeat()
    devices = ["/cpu:0", "/cpu:1"] if strategy == "mirrored" else None

    keras.utils.set_random_seed(0)
    with distribute.distribution_scope(strategy, config=config, devices=devices) as engine:
        model = kt.build_transformer(config)
        optimizer = loss_scaled_optimizer(keras.optimizers.Adam(1e-4), config)
        model.compile(optimizer=optimizer, loss=LabelSmoothedCrossEntropy())
        model.fit(data, epochs=1, steps_per_epoch=3, verbose=0)  # compiles the step
        timings = []
        for _ in range(repeats):
            load = machine.load_average()
            started = time.perf_counter()
            history = model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0)
            seconds = time.perf_counter() - started
            timings.append({"seconds": seconds, "load_average_1min": load})
        final_loss = float(history.history["loss"][-1])
    return {
        "name": name,
        "backend": backend,
        "strategy": strategy,
        "engine": distribute.describe(engine),
        "replicas": distribute.num_replicas(engine),
        "dtype_policy": dtype_policy or "float32",
        "target_tokens_per_step": BATCH * LENGTH,
        "steps": steps,
        "timings": timings,
        "final_loss": final_loss,
    }


def run_child(name, steps, repeats):
    backend, _, _, extra_env = CONFIGURATIONS[name]
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2", **extra_env)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    command = [sys.executable, __file__, "--child", name, "--steps", str(steps)]
    command += ["--repeats", str(repeats)]
    result = subprocess.run(command, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def summarize(name, rounds):
    """The fastest timing over all rounds, as tokens/s, with the load it ran under."""
    timings = [timing for result in rounds for timing in result["timings"]]
    best = min(timings, key=lambda timing: timing["seconds"])
    first = rounds[0]
    tokens = first["target_tokens_per_step"] * first["steps"]
    return {
        "name": name,
        "backend": first["backend"],
        "engine": first["engine"],
        "replicas": first["replicas"],
        "dtype_policy": first["dtype_policy"],
        "target_tokens_per_s": round(tokens / best["seconds"], 1),
        "median_target_tokens_per_s": round(
            tokens / statistics.median(timing["seconds"] for timing in timings), 1
        ),
        "load_average_1min_at_best": best["load_average_1min"],
        "load_average_1min_range": [
            min(timing["load_average_1min"] for timing in timings),
            max(timing["load_average_1min"] for timing in timings),
        ],
        "timings": timings,
        "final_loss": first["final_loss"],
    }


def ratios(summaries):
    by_name = {summary["name"]: summary["target_tokens_per_s"] for summary in summaries}
    pairs = {
        "tensorflow: 2 logical CPUs / 1 device": (
            "tensorflow/2 logical CPUs (mirrored)/float32",
            "tensorflow/1 device/float32",
        ),
        "jax: 2 host devices / 1 device": (
            "jax/2 host devices (data_parallel)/float32",
            "jax/1 device/float32",
        ),
    }
    for backend in ("tensorflow", "jax", "torch"):
        pairs[f"{backend}: mixed_bfloat16 / float32"] = (
            f"{backend}/1 device/mixed_bfloat16",
            f"{backend}/1 device/float32",
        )
    return {
        label: round(by_name[top] / by_name[bottom], 3)
        for label, (top, bottom) in pairs.items()
        if top in by_name and bottom in by_name
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2, help="round-robin passes")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per fit")
    parser.add_argument("--repeats", type=int, default=2, help="timed fits per process")
    parser.add_argument("--only", default="", help="run configurations whose name has this")
    parser.add_argument("--output", default=str(machine.RESULTS_DIR / "scaling.json"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.steps, args.repeats)), flush=True)
        return

    names = [name for name in CONFIGURATIONS if args.only in name]
    rounds = {name: [] for name in names}
    for round_index in range(args.rounds):
        for name in names:
            result = run_child(name, args.steps, args.repeats)
            rounds[name].append(result)
            best = min(timing["seconds"] for timing in result["timings"])
            print(
                f"round {round_index + 1}: {name}: "
                f"{result['target_tokens_per_step'] * args.steps / best:,.0f} target tokens/s "
                f"(load {result['timings'][0]['load_average_1min']})",
                flush=True,
            )
    summaries = [summarize(name, rounds[name]) for name in names]
    payload = {
        "benchmark": "training target tokens/s: one vs two devices, float32 vs mixed_bfloat16",
        "command": "KERAS_BACKEND is set per configuration: .venv/bin/python bench/scaling.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": {"preset": PRESET, "vocab_size": VOCAB_SIZE, "batch": BATCH, "length": LENGTH},
        "machine": machine.machine_info(),
        "results": summaries,
        "ratios": ratios(summaries),
    }
    path = machine.write_json(args.output, payload)
    for summary in summaries:
        print(f"{summary['name']}: {summary['target_tokens_per_s']:,.0f} target tokens/s")
    for label, value in payload["ratios"].items():
        print(f"{label}: {value:.2f}x")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

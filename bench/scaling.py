"""What data parallelism over processes costs on this machine, and what the all-reduce would cost on GPUs.

Three modes, each writing its own JSON in bench/results/:

- default (`scaling_processes.json`): per backend with several-process support, the
  same global batch trained by 2 processes x 1 thread against 1 process x 2 threads,
  and 1 process x 1 thread on half the batch (one process's share):
  - PyTorch: `python -m torch.distributed.run --standalone --nproc_per_node=2`, gloo on
    loopback, `train.torch_data_parallel` attached to Keras' eager step; the all-reduce's
    share of the step is the wait after backward for buckets still in flight (what did
    not overlap the backward pass), timed by wrapping `GradientBuckets`.
  - JAX: Keras' `KERAS_DISTRIBUTION_JOB_ADDRESSES` / `NUM_PROCESSES` / `PROCESS_ID` on
    127.0.0.1, one CPU device per process, `jax_processes.data_parallel`; XLA runs the
    step as one program, so the all-reduce is not timed apart: its share is estimated as
    the step time of 2 x 1 minus that of 1 x 1 on the half batch (the same work per
    process, plus the collective and the cross-process launch).
  - TensorFlow (`MultiWorkerMirroredStrategy`) is not timed here: its worker processes
    are tested (tests/test_distribute.py), and its 2-replica cost on one CPU is in the
    `--logical-devices` mode.
  "1 thread" is a process pinned to one core (`sched_setaffinity`), with
  OMP_NUM_THREADS=1, torch's intra-op threads 1 and XLA's Eigen thread pool off.
  On a 2-core machine neither layout can beat the other on compute; the point is the
  overhead data parallelism adds. Configurations run round-robin `--rounds` times so
  each sees the same background load; the fastest timed fit counts.
- `--on-paper` (`scaling_on_paper.json`, no training): the all-reduce bytes of `base`
  and `big` (their real parameter counts, built on this backend) and the ring
  all-reduce time 2(n-1)/n * S / B against the measured H100 step of base
  (docs/benchmarks.md), with the efficiency without overlap and the gradient
  accumulation that keeps it at 90% or more.
- `--logical-devices` (`scaling.json`): the earlier single-process comparison, one
  device vs two logical devices (TensorFlow `MirroredStrategy` over 2 logical CPUs,
  JAX `DataParallel` over 2 host devices) and float32 vs mixed_bfloat16.

Usage:

    .venv/bin/python bench/scaling.py --rounds 2
    KERAS_BACKEND=jax .venv/bin/python bench/scaling.py --on-paper
    .venv/bin/python bench/scaling.py --logical-devices --rounds 2 --steps 20 --repeats 2
"""

import argparse
import json
import math
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import machine  # noqa: E402

# --- Logical devices (--logical-devices): one process, one CPU seen as two devices -------

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


def main_logical(args, argv):
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
    path = machine.write_json(args.output or machine.RESULTS_DIR / "scaling.json", payload)
    for summary in summaries:
        print(f"{summary['name']}: {summary['target_tokens_per_s']:,.0f} target tokens/s")
    for label, value in payload["ratios"].items():
        print(f"{label}: {value:.2f}x")
    print(f"wrote {path}")


# --- Processes: 2 x 1 thread against 1 x 2 threads -------------------------------------

PROCESS_PRESET = "tiny"
PROCESS_VOCAB = 4000
PROCESS_BATCH = 32  # global rows, PROCESS_LENGTH target tokens each
PROCESS_LENGTH = 32
# name -> (backend, processes, threads per process, global rows)
PROCESS_CONFIGURATIONS = {
    "torch/2 processes x 1 thread": ("torch", 2, 1, PROCESS_BATCH),
    "torch/1 process x 2 threads": ("torch", 1, 2, PROCESS_BATCH),
    "torch/1 process x 1 thread, half batch": ("torch", 1, 1, PROCESS_BATCH // 2),
    "jax/2 processes x 1 thread": ("jax", 2, 1, PROCESS_BATCH),
    "jax/1 process x 2 threads": ("jax", 1, 2, PROCESS_BATCH),
    "jax/1 process x 1 thread, half batch": ("jax", 1, 1, PROCESS_BATCH // 2),
}


def _pin(threads, index):
    """One thread: this process on one core of its own (process `index`'s), before any library starts."""
    if threads == 1 and hasattr(os, "sched_setaffinity"):
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[index % len(cores)]})


class _Waits:
    """Per step under torchrun: the backward pass and the wait for all-reduces after it (wraps GradientBuckets)."""

    def __init__(self):
        from keras_transformer.train import torch_data_parallel as tdp

        self.steps = []
        buckets, steps = tdp.GradientBuckets, self.steps
        start, finish = buckets.start, buckets.finish

        def timed_start(self, *args):
            steps.append({"start": time.perf_counter()})
            return start(self, *args)

        def timed_finish(self):
            steps[-1]["backward_done"] = time.perf_counter()
            result = finish(self)
            steps[-1]["reduced"] = time.perf_counter()
            return result

        buckets.start, buckets.finish = timed_start, timed_finish


def process_child(name, steps, repeats):
    """One process of configuration `name`: times `repeats` fits of `steps` steps on its rows; returns a dict."""
    backend, processes, threads, rows = PROCESS_CONFIGURATIONS[name]
    index = int(os.environ.get("RANK", os.environ.get("KERAS_DISTRIBUTION_PROCESS_ID", "0")))
    _pin(threads, index)
    from keras_transformer import distribute

    engine = distribute.select_strategy("auto")  # first thing: joins the other processes
    import keras
    import numpy as np

    import keras_transformer as kt
    from keras_transformer.train.losses import LabelSmoothedCrossEntropy

    if backend == "torch":
        import torch

        torch.set_num_threads(threads)
    config = kt.TransformerConfig.from_preset(PROCESS_PRESET, vocab_size=PROCESS_VOCAB, dropout=0.0)
    rng = np.random.default_rng(0)
    ids = lambda: rng.integers(4, PROCESS_VOCAB, (rows, PROCESS_LENGTH)).astype("int32")  # noqa: E731
    encoder, decoder, labels = ids(), ids(), ids()
    mine = slice(index, None, processes)  # this process's rows of the global batch
    x = {"encoder_inputs": encoder[mine], "decoder_inputs": decoder[mine]}
    y = labels[mine]
    waits = None
    keras.utils.set_random_seed(0)
    with distribute.distribution_scope(engine):
        model = kt.build_transformer(config)
        model.compile(optimizer=keras.optimizers.Adam(1e-4), loss=LabelSmoothedCrossEntropy(),
                      jit_compile=backend == "jax")
        if backend == "torch" and processes > 1:
            from keras_transformer.train import torch_data_parallel

            waits = _Waits()
            model = torch_data_parallel.attach(model)
        fit = lambda count: model.fit(x, y, batch_size=len(y), epochs=count, verbose=0, shuffle=False)  # noqa: E731
        fit(2)  # compiles (JAX), warms the allocator and the process group
        timings = []
        for _ in range(repeats):
            if waits:
                waits.steps.clear()
            load = machine.load_average()
            started = time.perf_counter()
            history = fit(steps)
            seconds = time.perf_counter() - started
            timing = {"seconds": seconds, "step_seconds": seconds / steps, "load_average_1min": load}
            if waits:
                timing["wait_seconds"] = statistics.median(s["reduced"] - s["backward_done"] for s in waits.steps)
                timing["backward_seconds"] = statistics.median(s["backward_done"] - s["start"] for s in waits.steps)
            timings.append(timing)
    return {
        "name": name,
        "process": index,
        "engine": distribute.describe(engine),
        "parameters": int(model.count_params()),
        "target_tokens_per_step": rows * PROCESS_LENGTH,
        "steps": steps,
        "timings": timings,
        "final_loss": float(history.history["loss"][-1]),
    }


def run_processes(name, steps, repeats):
    """Starts configuration `name`'s processes; returns process 0's result."""
    backend, processes, threads, _ = PROCESS_CONFIGURATIONS[name]
    env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2", OMP_NUM_THREADS=str(threads))
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")])
    child_args = [__file__, "--process-child", name, "--steps", str(steps), "--repeats", str(repeats)]
    if backend == "torch":
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            env.pop(key, None)
        if processes > 1:
            commands = [[sys.executable, "-m", "torch.distributed.run", "--standalone",
                         f"--nproc_per_node={processes}", *child_args]]
        else:
            commands = [[sys.executable, *child_args]]
        envs = [env]
    else:
        flags = "--xla_force_host_platform_device_count=1"
        if threads == 1:
            flags += " --xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {flags}".strip()
        commands, envs = [], []
        if processes > 1:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
            for index in range(processes):
                envs.append(dict(env, KERAS_DISTRIBUTION_JOB_ADDRESSES=f"127.0.0.1:{port}",
                                 KERAS_DISTRIBUTION_NUM_PROCESSES=str(processes),
                                 KERAS_DISTRIBUTION_PROCESS_ID=str(index)))
                commands.append([sys.executable, *child_args])
        else:
            commands, envs = [[sys.executable, *child_args]], [env]
    children = [subprocess.Popen(command, env=child_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for command, child_env in zip(commands, envs)]
    outputs = [child.communicate(timeout=600) for child in children]
    for child, (_, stderr) in zip(children, outputs):
        if child.returncode != 0:
            raise RuntimeError(f"{name} failed:\n{stderr[-4000:]}")
    lines = [line for stdout, _ in outputs for line in stdout.splitlines() if line.startswith("{")]
    results = [json.loads(line) for line in lines]
    return next(result for result in results if result["process"] == 0)


def summarize_processes(name, rounds):
    backend, processes, threads, rows = PROCESS_CONFIGURATIONS[name]
    timings = [timing for result in rounds for timing in result["timings"]]
    best = min(timings, key=lambda timing: timing["seconds"])
    summary = {
        "name": name,
        "backend": backend,
        "processes": processes,
        "threads_per_process": threads,
        "global_rows": rows,
        "engine": rounds[0]["engine"],
        "parameters": rounds[0]["parameters"],
        "best_step_seconds": round(best["step_seconds"], 4),
        "target_tokens_per_s": round(rounds[0]["target_tokens_per_step"] / best["step_seconds"], 1),
        "load_average_1min_at_best": best["load_average_1min"],
        "timings": timings,
        "final_loss": rounds[0]["final_loss"],
    }
    if "wait_seconds" in best:
        summary["allreduce_wait_seconds"] = round(best["wait_seconds"], 4)
        summary["allreduce_wait_share_of_step"] = round(best["wait_seconds"] / best["step_seconds"], 3)
    return summary


def process_comparison(summaries):
    """Per backend: 2 x 1 over 1 x 2 in tokens/s, and the all-reduce's share of the 2-process step."""
    by_name = {summary["name"]: summary for summary in summaries}
    rows = {}
    for backend in ("torch", "jax"):
        two, one, half = (by_name.get(f"{backend}/{suffix}") for suffix in (
            "2 processes x 1 thread", "1 process x 2 threads", "1 process x 1 thread, half batch"))
        if not (two and one and half):
            continue
        row = {
            "2x1_target_tokens_per_s": two["target_tokens_per_s"],
            "1x2_target_tokens_per_s": one["target_tokens_per_s"],
            "2x1_over_1x2": round(two["target_tokens_per_s"] / one["target_tokens_per_s"], 3),
            "2x1_step_seconds": two["best_step_seconds"],
            "1x1_half_batch_step_seconds": half["best_step_seconds"],
            "2x1_minus_1x1_half_share_of_step": round(
                (two["best_step_seconds"] - half["best_step_seconds"]) / two["best_step_seconds"], 3),
        }
        if "allreduce_wait_share_of_step" in two:
            row["allreduce_wait_share_of_step"] = two["allreduce_wait_share_of_step"]
        rows[backend] = row
    return rows


def main_processes(args, argv):
    names = [name for name in PROCESS_CONFIGURATIONS if args.only in name]
    rounds = {name: [] for name in names}
    started = time.perf_counter()
    for round_index in range(args.rounds):
        for name in names:
            result = run_processes(name, args.steps, args.repeats)
            rounds[name].append(result)
            best = min(timing["step_seconds"] for timing in result["timings"])
            wait = [t["wait_seconds"] for t in result["timings"] if "wait_seconds" in t]
            print(f"round {round_index + 1}: {name}: {result['target_tokens_per_step'] / best:,.0f} target tokens/s, "
                  f"step {best:.3f} s" + (f", wait {min(wait):.4f} s" if wait else "")
                  + f" (load {result['timings'][0]['load_average_1min']})", flush=True)
    summaries = [summarize_processes(name, rounds[name]) for name in names]
    comparison = process_comparison(summaries)
    payload = {
        "benchmark": "training target tokens/s: 2 processes x 1 thread vs 1 process x 2 threads, same global batch",
        "command": ".venv/bin/python bench/scaling.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "model": {"preset": PROCESS_PRESET, "vocab_size": PROCESS_VOCAB, "global_rows": PROCESS_BATCH,
                  "length": PROCESS_LENGTH, "dropout": 0.0},
        "allreduce_share": {
            "torch": "median wait after backward for all-reduces still in flight (train.torch_data_parallel), "
                     "over the step; eager step, gloo on loopback",
            "jax": "not timed apart (one XLA program): (2x1 step - 1x1 half-batch step) / 2x1 step",
            "tensorflow": "not measured here: MultiWorkerMirroredStrategy is tested in tests/test_distribute.py",
        },
        "machine": machine.machine_info(),
        "wall_seconds": round(time.perf_counter() - started, 1),
        "results": summaries,
        "comparison": comparison,
    }
    path = machine.write_json(args.output or machine.RESULTS_DIR / "scaling_processes.json", payload)
    plot_processes(payload, path.with_suffix(".png"))
    print(process_table(comparison))
    print(f"wrote {path}")


def plot_processes(payload, path):
    """Target tokens/s per backend, one bar per layout of the two cores."""
    by_name = {summary["name"]: summary["target_tokens_per_s"] for summary in payload["results"]}
    backends = [backend for backend in ("torch", "jax") if any(name.startswith(backend) for name in by_name)]
    layouts = ("2 processes x 1 thread", "1 process x 2 threads", "1 process x 1 thread, half batch")
    series = {layout: [by_name.get(f"{backend}/{layout}") for backend in backends] for layout in layouts}
    info = payload["machine"]
    loads = [summary["load_average_1min_at_best"] for summary in payload["results"]]
    note = (f"{info['cpu_model']}, {info['usable_cores']} cores, shared; load average at the best fits "
            f"{min(loads)}-{max(loads)}; {payload['model']['preset']} preset, "
            f"{payload['model']['global_rows'] * payload['model']['length']} target tokens a global batch")
    machine.grouped_bar_chart(path, "Training target tokens/s: processes vs threads on one CPU",
                              "target tokens/s", backends, series, note=note)


def process_table(comparison):
    lines = ["| backend | 2 processes x 1 thread | 1 process x 2 threads | 2x1 / 1x2 | step 2x1 | step 1x1, half batch "
             "| all-reduce share of the 2x1 step |", "|---|---|---|---|---|---|---|"]
    for backend, row in comparison.items():
        share = (f"{row['allreduce_wait_share_of_step']:.1%} (wait after backward)" if "allreduce_wait_share_of_step" in row
                 else f"{row['2x1_minus_1x1_half_share_of_step']:.1%} (step minus 1x1 half-batch step)")
        lines.append(f"| {backend} | {row['2x1_target_tokens_per_s']:,.0f} | {row['1x2_target_tokens_per_s']:,.0f} "
                     f"| {row['2x1_over_1x2']:.2f}x | {row['2x1_step_seconds']:.3f} s "
                     f"| {row['1x1_half_batch_step_seconds']:.3f} s | {share} |")
    return "\n".join(lines)


# --- On paper: the ring all-reduce on GPUs ------------------------------------------------

# docs/benchmarks.md: base, JAX mixed_bfloat16, one H100 80GB HBM3: 237,657 target tokens/s.
H100_BASE_TARGET_TOKENS_PER_S = 237_657
TARGET_TOKENS_PER_GPU = 25_000  # the paper's ~25k target tokens a batch, per GPU
MEASURED_VOCABULARY = 32_000  # the vocabulary of that measurement
VOCABULARIES = {32_000: "docs/benchmarks.md's H100 row", 37_000: "the paper's shared BPE vocabulary"}
# Nominal bandwidth per GPU per direction, bytes/s.
LINKS = {
    "NVLink (H100 SXM, 450 GB/s, nominal)": 450e9,
    "100 Gb/s Ethernet, one link a node (12.5 GB/s, nominal)": 12.5e9,
}
# 16 GPUs on NVLink need an NVLink Switch system across two nodes; 8 is one HGX H100 board.
WORLD_SIZES = (2, 8, 16)


def matmul_weights_per_target_token(config):
    """Matmul weights a target token passes through (a source token per target token): FLOPs/token is 6x this."""
    d, f = config.d_model, config.d_ff
    encoder = config.num_encoder_layers * (4 * d * d + 2 * d * f)
    decoder = config.num_decoder_layers * (8 * d * d + 2 * d * f)
    return encoder + decoder + d * config.vocab_size  # the output projection


def main_on_paper(args, argv):
    import keras
    import numpy as np

    import keras_transformer as kt

    models = {}
    for preset in ("base", "big"):
        for vocab in VOCABULARIES:
            config = kt.TransformerConfig.from_preset(preset, vocab_size=vocab, dtype_policy="mixed_bfloat16")
            model = kt.build_transformer(config)
            dtypes = sorted({str(weight.dtype) for weight in model.trainable_weights})
            parameters = int(sum(int(np.prod(weight.shape)) for weight in model.trainable_weights))
            models[(preset, vocab)] = {
                "preset": preset, "vocab_size": vocab, "parameters": parameters,
                "variable_dtypes_under_mixed_bfloat16": dtypes,
                "allreduce_bytes_float32": parameters * 4,
                "matmul_weights_per_target_token": matmul_weights_per_target_token(config),
            }
            del model
            keras.backend.clear_session()
    base_step = TARGET_TOKENS_PER_GPU / H100_BASE_TARGET_TOKENS_PER_S
    rows = []
    for (preset, vocab), info in models.items():
        measured = models[("base", MEASURED_VOCABULARY)]
        ratio = info["matmul_weights_per_target_token"] / measured["matmul_weights_per_target_token"]
        step = base_step * ratio
        info["step_seconds_h100"] = round(step, 4)
        info["step_is_estimate"] = info is not measured
        info["step_source"] = ("measured: 25,000 / 237,657 target tokens/s" if info is measured else
                               f"estimate: the measured base step x {ratio:.3f} (matmul FLOPs per target token)")
        for link, bandwidth in LINKS.items():
            for n in WORLD_SIZES:
                seconds = 2 * (n - 1) / n * info["allreduce_bytes_float32"] / bandwidth
                rows.append({
                    "preset": preset, "vocab_size": vocab, "link": link, "gpus": n,
                    "allreduce_seconds": round(seconds, 5), "step_seconds": round(step, 4),
                    "efficiency_no_overlap": round(step / (step + seconds), 3),
                    "accumulation_for_90_percent": max(1, math.ceil(9 * seconds / step)),
                })
    payload = {
        "benchmark": "on paper: ring all-reduce of float32 gradients against the measured H100 step",
        "command": "KERAS_BACKEND=jax .venv/bin/python bench/scaling.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "assumptions": {
            "allreduce_seconds": "2 (n - 1) / n * S / B, ring all-reduce, nominal bandwidth per GPU per direction",
            "gradients": "float32: Keras keeps float32 variables under mixed_bfloat16 (see variable_dtypes...)",
            "base_step": f"{TARGET_TOKENS_PER_GPU:,} target tokens per GPU / {H100_BASE_TARGET_TOKENS_PER_S:,} "
                         "target tokens/s (base, JAX mixed_bfloat16, one H100, docs/benchmarks.md; vocabulary 32,000)",
            "other_steps": "estimate (big; base at 37,000): the measured base step x the ratio of matmul weights per target token (attention scores "
                        "left out), i.e. the same MFU",
            "efficiency": "step / (step + all-reduce): no overlap with the backward pass",
            "accumulation": "k = ceil(9 * all-reduce / step): k steps' gradients summed, one all-reduce, >= 90%",
            "vocabularies": {str(k): v for k, v in VOCABULARIES.items()},
        },
        "models": list(models.values()),
        "rows": rows,
    }
    path = machine.write_json(args.output or machine.RESULTS_DIR / "scaling_on_paper.json", payload)
    print(on_paper_table(payload))
    print(f"wrote {path}")


def on_paper_table(payload):
    lines = ["| model | vocab | parameters | gradients (float32) | step (one H100) | link | GPUs | all-reduce "
             "| efficiency, no overlap | k for >= 90% |", "|---|---|---|---|---|---|---|---|---|---|"]
    models = {(m["preset"], m["vocab_size"]): m for m in payload["models"]}
    for row in payload["rows"]:
        info = models[(row["preset"], row["vocab_size"])]
        step = f"{row['step_seconds']:.3f} s" + (" (est.)" if info["step_is_estimate"] else "")
        link = "NVLink 450 GB/s" if row["link"].startswith("NVLink") else "100 GbE"
        lines.append(f"| {row['preset']} | {row['vocab_size']:,} | {info['parameters'] / 1e6:.1f}M "
                     f"| {info['allreduce_bytes_float32'] / 1e6:.0f} MB | {step} | {link} | {row['gpus']} "
                     f"| {row['allreduce_seconds'] * 1e3:.1f} ms | {row['efficiency_no_overlap']:.0%} "
                     f"| {row['accumulation_for_90_percent']} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--on-paper", action="store_true", help="all-reduce arithmetic for base and big; no training")
    parser.add_argument("--logical-devices", action="store_true", help="the one-process logical-device comparison")
    parser.add_argument("--rounds", type=int, default=2, help="round-robin passes")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per fit (5; 20 for --logical-devices)")
    parser.add_argument("--repeats", type=int, default=2, help="timed fits per process")
    parser.add_argument("--only", default="", help="run configurations whose name has this")
    parser.add_argument("--output", default=None)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--process-child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.process_child:
        result = process_child(args.process_child, args.steps, args.repeats)
        if result["process"] == 0:  # torchrun's processes share one stdout: one line, process 0's
            print(json.dumps(result), flush=True)
        return
    if args.child:
        print(json.dumps(child(args.child, args.steps, args.repeats)), flush=True)
        return
    if args.on_paper:
        return main_on_paper(args, argv)
    if args.logical_devices:
        args.steps = args.steps or 20
        return main_logical(args, argv)
    args.steps = args.steps or 5
    return main_processes(args, argv)


if __name__ == "__main__":
    main()

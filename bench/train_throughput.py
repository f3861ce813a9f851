"""Training throughput of our Transformer against keras-hub and `torch.nn.Transformer`.

Times full training steps (forward, backward, Adam update) on one fixed batch, after
compilation and warm-up, for the `tiny`, `small` and `base` presets, on each Keras
backend. In the same process and interleaved round by round with ours, it times:

- `keras_hub`: the same configuration assembled from keras-hub layers
  (`bench/peers.py`), compiled exactly as ours (`compile_transformer`: same Adam,
  schedule, label-smoothed loss, metrics, `jit_compile="auto"`);
- `torch`: `torch.nn.Transformer` in plain PyTorch with its own training loop
  (`torch.set_num_threads` = the usable cores);
- `ours_attn_dropout`: ours with attention-probability dropout equal to `dropout`,
  which both peers apply and ours by default does not.

Interleaving (one round of each model, then the next round) exposes every model to the
same background load; per model the fastest round counts, and ratios come from one run.

It also reports model FLOPs utilisation: the matmul FLOPs of a step (counted
analytically by `training_flops`) per second, over the float32 matmul peak measured in
the same run (best of several 2048x2048 @ 2048x2048). `mfu_machine_peak`, the headline,
divides by the best rate any framework reached (NumPy's BLAS, PyTorch, TensorFlow,
JAX): one denominator for every model. `mfu` divides by the model's own framework's
peak, which shows how close each gets to what its matmul kernels can do.

Usage (one command; a subprocess per backend, because KERAS_BACKEND must be set before
Keras is imported):

    .venv/bin/python bench/train_throughput.py
    .venv/bin/python bench/train_throughput.py --backends jax --presets small --rounds 5

    .venv/bin/python bench/train_throughput.py --cpus 1   # one pinned core

Writes bench/results/train_throughput.json, train_throughput.png (tokens/s) and
train_throughput_mfu.png (`train_throughput_cpus_1.*` with `--cpus 1`).

Every time is recorded twice: wall time (what training takes) and the CPU time of the
process (what it computed). On a machine shared with other work, wall time grows with
the load and CPU time mostly does not, so a one-core run (`--cpus 1`) compared in CPU
time is the contention-robust view of the same comparison.
"""

import argparse
import gc
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench import machine  # noqa: E402

BACKENDS = ("tensorflow", "jax", "torch")
PRESETS = ("tiny", "small", "base")
MODELS = ("ours", "ours_attn_dropout", "keras_hub", "torch")
MODEL_LABELS = {
    "ours": "ours",
    "ours_attn_dropout": "ours (attention dropout 0.1)",
    "keras_hub": "keras-hub layers",
    "torch": "torch.nn.Transformer",
}
# Sentences x tokens per side, and timed steps per round. `base` takes seconds per step
# on two cores, so it gets a smaller batch and fewer steps.
BATCH = {"tiny": 32, "small": 32, "base": 8}
LENGTH = 32
STEPS = {"tiny": 10, "small": 4, "base": 2}
MATMUL_SIZE = 2048
FIRST_ORDINARY_ID = 4  # ids 0-3 are pad, unk, bos, eos: the fake batch uses real-token ids


def training_flops(config, batch, source_length, target_length):
    """Matmul FLOPs of one training step, counted analytically.

    With d = d_model, f = d_ff, V = vocab, S / T the source / target lengths,
    multiply-adds (MACs) of the forward pass are, per layer:

        encoder, per source token:  4 d^2        Q, K, V, output projections
                                  + 2 d f        the two FFN matrices (3 d f gated)
                                  + 2 S d        Q K^T and P V over S keys
        decoder, per target token:  4 d^2 + 2 T d      self-attention (the full T x T
                                                        product; no model here skips
                                                        the masked half)
                                  + 2 d^2 + 2 S d      cross-attention Q, output, scores
                                  + 2 d f              FFN
                 per source token:  2 d^2              cross-attention K, V of the
                                                        encoder output
        output projection, per target token: d V

    FLOPs = 2 x MACs. A training step is 3 x the forward pass: the backward pass needs
    the gradient with respect to both inputs and weights of every matmul, 2 x forward.
    Embedding gathers, softmax, layer norms, the loss and the optimizer are not counted:
    they are not matrix multiplies (the usual MFU convention, Chowdhery et al., 2022).
    """
    d, f, vocab = config.d_model, config.d_ff, config.vocab_size
    s, t = source_length, target_length
    ffn = (3 if getattr(config, "gated_ffn", False) else 2) * d * f  # a gated FFN has a third matrix
    encoder = config.num_encoder_layers * s * (4 * d * d + ffn + 2 * s * d)
    decoder = config.num_decoder_layers * (
        t * (4 * d * d + 2 * t * d + 2 * d * d + 2 * s * d + ffn) + s * 2 * d * d
    )
    output = t * d * vocab
    forward_macs = batch * (encoder + decoder + output)
    return 3 * 2 * forward_macs


# ---------------------------------------------------------------- one backend
def matmul_peak(framework, size=MATMUL_SIZE, repeats=10):
    """Float32 matmul peak on `framework`: `{"wall": FLOP/s, "cpu": FLOP per CPU second}`.

    Times a `size` x `size` @ `size` x `size` product `repeats` times and keeps the best
    wall time and, separately, the best CPU time of this process (all its threads).
    """
    import numpy as np

    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    if framework == "numpy":

        def run():
            return a @ b  # NumPy's BLAS (OpenBLAS in the wheels): the fastest on this CPU

    elif framework == "torch":
        import torch

        a, b = torch.from_numpy(a), torch.from_numpy(b)

        def run():
            return torch.matmul(a, b)

    elif framework == "jax":
        import jax

        a, b = jax.device_put(a), jax.device_put(b)
        matmul = jax.jit(lambda x, y: x @ y)

        def run():
            return matmul(a, b).block_until_ready()

    elif framework == "tensorflow":
        import tensorflow as tf

        a, b = tf.constant(a), tf.constant(b)

        def run():
            # Eager TF ops on the CPU return when the result is computed.
            return tf.linalg.matmul(a, b)

    else:
        raise ValueError(f"Unknown framework {framework!r}")
    run()
    times = [_timed_with_cpu(run) for _ in range(repeats)]
    flops = 2.0 * size**3
    return {"wall": flops / min(t[0] for t in times), "cpu": flops / min(t[1] for t in times)}


def _timed_with_cpu(function):
    """`(wall seconds, CPU seconds of this process)` of one call.

    CPU time counts only the time this process ran: on a machine shared with other
    work, wall time grows with the load while CPU time mostly does not (spinning
    threads still count), so the two together show how much the load distorted a run.
    """
    cpu, wall = time.process_time(), time.perf_counter()
    function()
    return time.perf_counter() - wall, time.process_time() - cpu


def _fake_batch(config, batch, length, seed):
    import numpy as np

    rng = np.random.default_rng(seed)
    ids = lambda: rng.integers(FIRST_ORDINARY_ID, config.vocab_size, (batch, length), dtype=np.int32)  # noqa: E731
    return ids(), ids(), ids()


def _keras_runner(model, config, source, decoder, labels, steps):
    from keras_transformer.train.compile import compile_transformer

    compile_transformer(model)  # the paper's recipe: TrainingConfig() defaults
    inputs = {"encoder_inputs": source, "decoder_inputs": decoder}

    def run():
        for _ in range(steps):
            logs = model.train_on_batch(inputs, labels, return_dict=True)
        return logs  # NumPy values: the step has finished

    return run


def _torch_runner(config, source, decoder, labels, steps):
    import torch

    from bench.peers import make_torch_peer

    model, step = make_torch_peer(config)
    source, decoder, labels = (torch.from_numpy(x).long() for x in (source, decoder, labels))

    def run():
        for _ in range(steps):
            loss = step(source, decoder, labels)
        return loss.item()

    return run, model


def _parameter_count(name, model):
    if name == "torch":
        return int(sum(p.numel() for p in model.parameters()))
    return int(model.count_params())


def run_backend(backend, presets, models, rounds):
    """Measures every model on every preset in this process; returns a JSON-ready dict."""
    os.environ["KERAS_BACKEND"] = backend
    import keras
    import torch

    from bench.peers import build_keras_hub_transformer
    from keras_transformer.model.config import TransformerConfig
    from keras_transformer.model.transformer import build_transformer

    if keras.backend.backend() != backend:
        raise RuntimeError(
            f"Keras was imported with backend {keras.backend.backend()!r}, not {backend!r}."
        )
    cores = machine.usable_cores()
    torch.set_num_threads(cores)  # the Keras backends use every usable core too
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(0)
    frameworks = [backend] + (["torch"] if "torch" in models and backend != "torch" else []) + ["numpy"]
    peaks = {framework: matmul_peak(framework) for framework in frameworks}
    print(
        f"[{backend}] matmul peak: "
        + ", ".join(
            f"{k} {v['wall'] / 1e9:.1f} GFLOP/s ({v['cpu'] / 1e9:.1f} per CPU-second)"
            for k, v in peaks.items()
        ),
        flush=True,
    )

    results = {"backend": backend, "matmul_peak_flops": peaks, "presets": {}}
    for preset in presets:
        config = TransformerConfig.from_preset(preset, dtype_policy="float32")
        batch, steps = BATCH[preset], STEPS[preset]
        source, decoder, labels = _fake_batch(config, batch, LENGTH, seed=0)
        flops = training_flops(config, batch, LENGTH, LENGTH)
        runners, built = {}, {}
        for name in models:
            keras.utils.set_random_seed(0)
            if name == "torch":
                torch.manual_seed(0)
                runners[name], built[name] = _torch_runner(config, source, decoder, labels, steps)
                continue
            if name == "ours":
                model = build_transformer(config)
            elif name == "ours_attn_dropout":
                model = build_transformer(config.replace(attention_dropout=config.dropout))
            elif name == "keras_hub":
                model = build_keras_hub_transformer(config)
            else:
                raise ValueError(f"Unknown model {name!r}. Expected some of {MODELS}.")
            runners[name] = _keras_runner(model, config, source, decoder, labels, steps)
            built[name] = model

        warmup = {}
        for name, run in runners.items():
            start = time.perf_counter()
            run()  # traces / compiles, then runs `steps` steps
            warmup[name] = time.perf_counter() - start
        step_times = {name: [] for name in runners}
        cpu_times = {name: [] for name in runners}
        for _ in range(rounds):
            for name, run in runners.items():
                wall, cpu = _timed_with_cpu(run)
                step_times[name].append(wall / steps)
                cpu_times[name].append(cpu / steps)

        entry = {
            "batch": batch,
            "source_length": LENGTH,
            "target_length": LENGTH,
            "target_tokens_per_step": batch * LENGTH,
            "steps_per_round": steps,
            "rounds": rounds,
            "training_flops_per_step": flops,
            "models": {},
        }
        for name, times in step_times.items():
            best = min(times)
            entry["models"][name] = {
                "parameters": _parameter_count(name, built[name]),
                "warmup_seconds": round(warmup[name], 3),
                "step_seconds_all_rounds": [round(t, 5) for t in times],
                "step_seconds_best": best,
                "step_seconds_median": sorted(times)[len(times) // 2],
                "cpu_seconds_per_step_all_rounds": [round(t, 5) for t in cpu_times[name]],
                "cpu_seconds_per_step_best": min(cpu_times[name]),
                "target_tokens_per_second": batch * LENGTH / best,
                "achieved_flops": flops / best,
                "achieved_flops_per_cpu_second": flops / min(cpu_times[name]),
            }
            _set_mfu(entry["models"][name], peaks["torch" if name == "torch" else backend])
        entry["ratios"] = _ratios(entry["models"])
        results["presets"][preset] = entry
        _print_preset(backend, preset, entry)
        del runners, built
        keras.backend.clear_session()
        gc.collect()
    # The peak again at the end: under a varying background load the better of the
    # two is closer to what the hardware can do.
    for framework in frameworks:
        again = matmul_peak(framework)
        peaks[framework] = {kind: max(peaks[framework][kind], again[kind]) for kind in again}
    for entry in results["presets"].values():
        for name, m in entry["models"].items():
            _set_mfu(m, peaks["torch" if name == "torch" else backend])
    results["machine"] = machine.machine_info()
    return results


def _set_mfu(model_entry, peak):
    """MFU from wall time over the wall-time peak, and from CPU time over the CPU-time peak.

    With every thread busy and nothing else running the two agree. On a shared machine
    the wall-time figure drops with the load; the CPU-time one does not, unless threads
    spin while they wait (PyTorch's OpenMP pool does, under contention).
    """
    model_entry["mfu"] = model_entry["achieved_flops"] / peak["wall"]
    model_entry["mfu_cpu_time"] = model_entry["achieved_flops_per_cpu_second"] / peak["cpu"]


def _ratios(models):
    """Speed ratios, ours over each peer: from wall time and from CPU time per step."""
    ratios = {}
    for ours in ("ours", "ours_attn_dropout"):
        for peer in ("keras_hub", "torch"):
            if ours in models and peer in models:
                ratios[f"{ours}/{peer}"] = (
                    models[peer]["step_seconds_best"] / models[ours]["step_seconds_best"]
                )
                ratios[f"{ours}/{peer} (CPU time)"] = (
                    models[peer]["cpu_seconds_per_step_best"]
                    / models[ours]["cpu_seconds_per_step_best"]
                )
    return ratios


def _print_preset(backend, preset, entry):
    print(f"[{backend}] {preset}: batch {entry['batch']}x{LENGTH}", flush=True)
    for name, m in entry["models"].items():
        print(
            f"    {MODEL_LABELS[name]:<30} {m['target_tokens_per_second']:>9,.0f} target tok/s"
            f"  step {m['step_seconds_best'] * 1e3:8.1f} ms (CPU {m['cpu_seconds_per_step_best'] * 1e3:7.1f} ms)"
            f"  MFU {m['mfu']:.2f} (CPU-time MFU {m['mfu_cpu_time']:.2f})"
            f"  (rounds: {', '.join(f'{t * 1e3:.0f}' for t in m['step_seconds_all_rounds'])} ms)",
            flush=True,
        )
    for key, value in entry["ratios"].items():
        print(f"    {key}: {value:.2f}x", flush=True)


# ------------------------------------------------------------- all backends
def gather(backends, presets, models, rounds, output, pinned_cpus=None):
    """Runs one subprocess per backend, merges their results, writes JSON and PNGs."""
    start_load = machine.load_average()
    arguments = ["--presets", ",".join(presets), "--models", ",".join(models), "--rounds", str(rounds)]
    parts, _ = machine.run_per_backend(__file__, backends, arguments)
    info = machine.machine_info()
    info["load_average_1min_at_start"] = start_load
    # One denominator for every model: the best float32 matmul rate any framework reached
    # on this machine in this run (the "measured peak"); the per-framework
    # figure (`mfu`, over the model's own framework's matmul) stays beside it.
    machine_peak = max(
        (peak["wall"] for part in parts.values() for peak in part["matmul_peak_flops"].values()),
        default=None,
    )
    for part in parts.values():
        for entry in part["presets"].values():
            for m in entry["models"].values():
                m["mfu_machine_peak"] = m["achieved_flops"] / machine_peak
    payload = {
        "benchmark": "train_throughput",
        "machine_matmul_peak_flops": machine_peak,
        "command": " ".join([pathlib.Path(sys.executable).name] + sys.argv),
        "dtype": "float32",
        "pinned_cpus": pinned_cpus,
        "flops_formula": training_flops.__doc__,
        "machine": info,
        "backends": parts,
    }
    machine.write_json(output, payload)
    output = pathlib.Path(output)
    _plot(payload, output.with_suffix(".png"), output.with_name(output.stem + "_mfu.png"))
    _print_summary(payload)
    return payload


def _plot(payload, speed_path, mfu_path):
    groups, speed, mfu = [], {}, {}
    for backend, part in payload["backends"].items():
        for preset, entry in part["presets"].items():
            groups.append(f"{preset}\n{backend}")
            for name in MODELS:
                m = entry["models"].get(name)
                speed.setdefault(MODEL_LABELS[name], []).append(m and m["target_tokens_per_second"])
                mfu.setdefault(MODEL_LABELS[name], []).append(m and m["mfu_machine_peak"])
    info = payload["machine"]
    note = (
        f"{info['cpu_model']}, {info['usable_cores']} cores, load {info['load_average_1min_at_start']}"
        f"->{info['load_average_1min']}; float32; keras {info['versions']['keras']}, "
        f"torch {info['versions']['torch']}"
    )
    machine.grouped_bar_chart(
        speed_path,
        "Training throughput (target tokens/s, higher is better)",
        "target tokens / s",
        groups,
        {k: v for k, v in speed.items() if any(x is not None for x in v)},
        note=note,
        log_scale=True,
    )
    machine.grouped_bar_chart(
        mfu_path,
        "Model FLOPs utilisation (matmul FLOP/s over the machine's measured float32 matmul peak, "
        f"{payload['machine_matmul_peak_flops'] / 1e9:.0f} GFLOP/s)",
        "MFU",
        groups,
        {k: v for k, v in mfu.items() if any(x is not None for x in v)},
        note=note,
    )


def _print_summary(payload):
    print(
        f"\nMachine float32 matmul peak (best framework): "
        f"{payload['machine_matmul_peak_flops'] / 1e9:.1f} GFLOP/s"
    )
    print("Summary (ratios of target tokens/s, same run):")
    for backend, part in payload["backends"].items():
        for preset, entry in part["presets"].items():
            ratios = ", ".join(f"{k} {v:.2f}x" for k, v in entry["ratios"].items())
            ours = entry["models"].get("ours", {})
            mfu_text = (
                f"ours MFU {ours['mfu_machine_peak']:.2f} of the machine peak "
                f"({ours['mfu']:.2f} of its framework's)" if ours else ""
            )
            print(f"  {backend:<10} {preset:<6} {mfu_text}  {ratios}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated Keras backends")
    parser.add_argument("--presets", default=",".join(PRESETS), help="comma-separated presets")
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, from {MODELS}")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per model (best counts)")
    parser.add_argument(
        "--cpus",
        help="comma-separated CPU ids to pin every run to (e.g. 1): each framework then "
        "sizes its thread pool to them. Default: no pinning, all usable cores",
    )
    parser.add_argument(
        "--output",
        help="JSON path; PNGs go beside it. Default bench/results/train_throughput.json "
        "(train_throughput_cpus_<ids>.json with --cpus)",
    )
    parser.add_argument("--part-output", help=argparse.SUPPRESS)  # one backend, used by gather
    args = parser.parse_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    presets = [p for p in args.presets.split(",") if p]
    models = [m for m in args.models.split(",") if m]
    for values, known, what in ((backends, BACKENDS, "backend"), (presets, PRESETS, "preset"), (models, MODELS, "model")):
        unknown = sorted(set(values) - set(known))
        if unknown:
            parser.error(f"unknown {what}(s) {unknown}; expected some of {known}")
    if args.part_output:
        (backend,) = backends
        machine.write_json(args.part_output, run_backend(backend, presets, models, args.rounds))
        return
    pinned = None
    if args.cpus:
        pinned = sorted(int(cpu) for cpu in args.cpus.split(","))
        os.sched_setaffinity(0, pinned)  # inherited by the per-backend subprocesses
    stem = "train_throughput" + (f"_cpus_{'-'.join(map(str, pinned))}" if pinned else "")
    output = args.output or str(machine.RESULTS_DIR / f"{stem}.json")
    gather(backends, presets, models, args.rounds, output, pinned)


if __name__ == "__main__":
    main()

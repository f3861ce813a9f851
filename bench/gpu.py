"""Training and decoding speed of the paper's base and big models on one GPU.

For each Keras backend (a fresh process each) and each precision policy, it times
full training steps of `base` and `big` (forward, backward, Adam with the warmup
schedule, label-smoothed loss: `compile_transformer` with the paper's defaults) on
one fixed batch, after compilation and warm-up, and the compiled greedy and beam-4
decoders on a batch of sources. Beside each speed it reports model FLOPs utilisation:
the analytic matmul FLOPs of a step (`bench.train_throughput.training_flops`) per
second over the matmul peak measured in the same process, in the same precision
(float32 for "float32", bfloat16/float16 for the mixed policies), through the same
backend (`keras.ops.matmul` of two 8192 x 8192 matrices).

It also checks what a GPU user relies on: every timed step's loss is finite (under
"mixed_float16" through the loss-scaled optimizer), and the decoders return as many
rows as sources.

Usage (needs a CUDA GPU visible to JAX / PyTorch; TensorFlow is not needed):

    python bench/gpu.py
    python bench/gpu.py --backends jax --presets base --policies mixed_bfloat16

Writes bench/results/gpu.json and gpu.png (training tokens/s per model and policy).
"""

import argparse
import math
import os
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench import machine  # noqa: E402
from bench.train_throughput import FIRST_ORDINARY_ID, training_flops  # noqa: E402

BACKENDS = ("jax", "torch")
PRESETS = ("base", "big")
POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")
PEAK_DTYPES = {"float32": "float32", "mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}
BATCH = 128  # sentences per training batch: 128 x 64 = 8,192 target tokens
LENGTH = 64  # source and target length of the training batch
VOCAB = 32000  # a typical WMT joint vocabulary (the paper's base used 37k)
DECODE_BATCH = 128
DECODE_SOURCE_LENGTH = 24
DECODE_STEPS = 64
WARMUP_STEPS = 3
MATMUL_SIZE = 8192


def _synchronize():
    """Waits for the GPU: timings must include the work, not only its launch."""
    import keras

    if keras.backend.backend() == "torch":
        import torch

        torch.cuda.synchronize()


def _device_name():
    import keras

    if keras.backend.backend() == "torch":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("bench/gpu.py: PyTorch sees no CUDA GPU")
        return torch.cuda.get_device_name(0)
    import jax

    device = jax.devices()[0]
    if device.platform != "gpu":
        raise SystemExit(f"bench/gpu.py: JAX's first device is {device.platform}, not a GPU")
    return device.device_kind


def matmul_peak(dtype, size=MATMUL_SIZE, repeats=10):
    """Best FLOP/s of `keras.ops.matmul` on two `size` x `size` matrices of `dtype`."""
    import keras
    from keras import ops

    a = keras.random.normal((size, size), dtype=dtype, seed=0)
    b = keras.random.normal((size, size), dtype=dtype, seed=1)
    matmul = ops.matmul
    if keras.backend.backend() == "jax":
        import jax

        matmul = jax.jit(ops.matmul)
    best = math.inf
    for _ in range(repeats + 2):
        _synchronize()
        start = time.perf_counter()
        c = matmul(a, b)
        float(ops.convert_to_numpy(c[0, 0]))  # waits for the product
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def _fake_ids(shape, vocab, seed):
    import numpy as np

    return np.random.default_rng(seed).integers(FIRST_ORDINARY_ID, vocab, shape, dtype=np.int32)


def time_training(preset, policy, steps, jit_compile="auto"):
    """`{tokens_per_s, step_s, flops, parameters, losses}` of `steps` timed training steps."""
    import keras

    import keras_transformer as kt

    keras.utils.set_random_seed(0)
    config = kt.TransformerConfig.from_preset(preset, vocab_size=VOCAB, dtype_policy=policy)
    model = kt.build_transformer(config)
    kt.compile_transformer(model, jit_compile=jit_compile)
    inputs = {
        "encoder_inputs": _fake_ids((BATCH, LENGTH), VOCAB, 1),
        "decoder_inputs": _fake_ids((BATCH, LENGTH), VOCAB, 2),
    }
    labels = _fake_ids((BATCH, LENGTH), VOCAB, 3)
    compile_start = time.perf_counter()
    for _ in range(WARMUP_STEPS):
        model.train_on_batch(inputs, labels, return_dict=True)
    compile_seconds = time.perf_counter() - compile_start
    losses = []
    _synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        logs = model.train_on_batch(inputs, labels, return_dict=True)  # NumPy: the step is done
        losses.append(float(logs["loss"]))
    seconds = (time.perf_counter() - start) / steps
    if not all(math.isfinite(loss) for loss in losses):
        raise SystemExit(f"bench/gpu.py: non-finite loss training {preset} under {policy}: {losses}")
    return {
        "parameters": int(model.count_params()),
        "step_s": seconds,
        "tokens_per_s": BATCH * LENGTH / seconds,
        "flops_per_step": training_flops(config, BATCH, LENGTH, LENGTH),
        "warmup_s": compile_seconds,
        "first_loss": losses[0],
        "last_loss": losses[-1],
    }, model


def time_decoding(model, rounds=3):
    """Decoding steps x batch per second of the compiled greedy and beam-4 decoders."""
    from keras import ops

    from keras_transformer.inference.compiled import CompiledDecoder
    from keras_transformer.inference.decoding import BEAM_SIZE, LENGTH_PENALTY

    source = _fake_ids((DECODE_BATCH, DECODE_SOURCE_LENGTH), VOCAB, 4)
    results = {}
    for name, method, kwargs in (
        ("greedy", "greedy", {}),
        ("beam4", "beam", {"beam_size": BEAM_SIZE, "alpha": LENGTH_PENALTY}),
    ):
        decoder = CompiledDecoder(model, method, max_length=DECODE_STEPS, **kwargs)
        start = time.perf_counter()
        tokens = ops.convert_to_numpy(decoder(source)[0])
        first = time.perf_counter() - start
        if tokens.shape[0] != DECODE_BATCH:
            raise SystemExit(f"bench/gpu.py: {name} returned {tokens.shape[0]} rows for {DECODE_BATCH} sources")
        best = math.inf
        for _ in range(rounds):
            start = time.perf_counter()
            ops.convert_to_numpy(decoder(source)[0])
            best = min(best, time.perf_counter() - start)
        # Random weights rarely emit EOS, so every row runs all steps: steps x rows is exact.
        results[name] = {"first_call_s": first, "s": best, "tokens_per_s": DECODE_BATCH * DECODE_STEPS / best}
    return results


def run_backend(presets, policies, steps, jit_compile="auto"):
    import keras

    payload = {
        "backend": keras.backend.backend(),
        "device": _device_name(),
        "jit_compile": jit_compile,
        "peaks": {},
        "runs": {},
    }
    for policy in policies:
        dtype = PEAK_DTYPES[policy]
        payload["peaks"][dtype] = matmul_peak(dtype)
        print(f"  {payload['backend']}: {dtype} matmul peak {payload['peaks'][dtype] / 1e12:.0f} TFLOP/s", flush=True)
    for preset in presets:
        for policy in policies:
            keras.config.set_dtype_policy("float32")
            training, model = time_training(preset, policy, steps, jit_compile)
            training["mfu"] = training["flops_per_step"] / training["step_s"] / payload["peaks"][PEAK_DTYPES[policy]]
            entry = {"training": training, "decoding": time_decoding(model)}
            payload["runs"][f"{preset}/{policy}"] = entry
            decoding = entry["decoding"]
            print(
                f"  {payload['backend']:<6} {preset:<5} {policy:<15} train {training['tokens_per_s']:>9,.0f} tok/s "
                f"(MFU {training['mfu']:.2f}, loss {training['first_loss']:.2f}->{training['last_loss']:.2f})  "
                f"decode greedy {decoding['greedy']['tokens_per_s']:>8,.0f} tok/s, "
                f"beam4 {decoding['beam4']['tokens_per_s']:>7,.0f} tok/s",
                flush=True,
            )
            del model
    return payload


def _plot(payload, path):
    groups, series = [], {}
    for backend, part in payload["backends"].items():
        for key, entry in part["runs"].items():
            preset, policy = key.split("/")
            group = f"{preset} / {backend}"
            if group not in groups:
                groups.append(group)
            series.setdefault(policy, {})[group] = entry["training"]["tokens_per_s"]
    aligned = {policy: [values.get(g) for g in groups] for policy, values in series.items()}
    devices = sorted({part["device"] for part in payload["backends"].values()})
    machine.grouped_bar_chart(
        path,
        f"Training throughput on one GPU (batch {BATCH} x {LENGTH} tokens, vocab {VOCAB})",
        "target tokens / s",
        groups,
        aligned,
        note=", ".join(devices),
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated Keras backends")
    parser.add_argument("--presets", default=",".join(PRESETS), help="comma-separated presets")
    parser.add_argument("--policies", default=",".join(POLICIES), help=f"comma-separated, from {POLICIES}")
    parser.add_argument("--steps", type=int, default=20, help="timed training steps per run")
    parser.add_argument(
        "--jit-compile",
        default="auto",
        choices=("auto", "true", "false"),
        help="compile_transformer's jit_compile: XLA on JAX, torch.compile on PyTorch when true",
    )
    parser.add_argument("--output", default=str(machine.RESULTS_DIR / "gpu.json"), help="JSON path; the PNG goes beside it")
    parser.add_argument("--part-output", help=argparse.SUPPRESS)  # one backend, used by run_per_backend
    args = parser.parse_args(argv)
    presets = [p for p in args.presets.split(",") if p]
    policies = [p for p in args.policies.split(",") if p]
    unknown = sorted(set(policies) - set(POLICIES))
    if unknown:
        parser.error(f"unknown policies {unknown}; expected some of {POLICIES}")
    if args.part_output:
        jit_compile = {"auto": "auto", "true": True, "false": False}[args.jit_compile]
        machine.write_json(args.part_output, run_backend(presets, policies, args.steps, jit_compile))
        return
    backends = [b for b in args.backends.split(",") if b]
    parts, failures = machine.run_per_backend(
        pathlib.Path(__file__), backends, [
            "--presets", args.presets, "--policies", args.policies,
            "--steps", str(args.steps), "--jit-compile", args.jit_compile,
        ]
    )
    payload = {"machine": machine.machine_info(), "batch": BATCH, "length": LENGTH, "vocab": VOCAB, "backends": parts}
    output = machine.write_json(args.output, payload)
    _plot(payload, output.with_suffix(".png"))
    print(f"wrote {output} and {output.with_suffix('.png')}")
    if failures:
        raise SystemExit(f"backends failed: {failures}")


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()

"""Training and decoding speed on one GPU: ours on JAX and PyTorch beside hand-written peers.

One run, a fresh process per backend (KERAS_BACKEND is fixed at import), times full
training steps (forward, backward, Adam on the paper's warmup schedule, label-smoothed
loss) on one fixed batch of random ids, after compilation and warm-up, for a sweep of
target tokens per step (batch x length 64: 4k to 32k) of `base`, and of `big` at a
subset, under "mixed_bfloat16" by default ("float32" and "mixed_float16" on request).
Per process, side by side:

- JAX: `ours_jax`, ours with `compile_transformer(model, jit_compile=True)` (XLA)
  trained by `model.fit` (or `train_on_batch`: `--ours-loop`); `flax`, the same shape in
  Flax linen with optax Adam and one `jax.jit`ted step with donated state
  (`bench/flax_peer.py`), skipped with the reason where flax or optax is missing.
- PyTorch: `ours_torch`, ours with `compile_transformer(model, jit_compile=True)`, whose
  step is captured once per batch shape and compiled by inductor
  (`keras_transformer/train/torch_step.py`), trained the same way; `torch_eager`,
  `torch.nn.Transformer` with tied embeddings (`bench/peers.py:make_torch_peer`), bf16
  autocast under a mixed policy, fused Adam; `torch_compiled`, the same with its
  forward pass and loss under `torch.compile`. `torch.nn.Transformer` also drops
  attention probabilities (its one `dropout`), which ours and the Flax peer, with the
  paper's `attention_dropout=0`, do not.

Beside each speed it reports model FLOPs utilisation: the analytic matmul FLOPs of a step
(`bench.train_throughput.training_flops`, the same count for every implementation) per
second over the matmul peak measured in that process, in that precision, through that
backend (`keras.ops.matmul` of two 8192 x 8192 matrices). Ours also decodes (compiled
greedy and beam 4, `CompiledDecoder`) a batch of 128 sources for 64 steps, once per
preset and policy. Every timed loss must be finite and every decode must return a row per
source; a failure is recorded with its reason and the run goes on to the next point.

Ours is timed through `fit` as users train: one epoch of the timed steps, so one epoch's
start and end (and its one read of the loss) are spread over them (30 steps on a GPU).
The peers are timed as hand-written loops that read their losses once, after the last
step. Each timing waits for the device before the clock stops.

Points are measured in the order given (the default puts the targets' points, 8k
and 25k tokens, first), every implementation at a point before the next point. With
`--budget-s`, each backend gets a share of the time (what the one before left is passed
on), starts no measurement it expects not to finish (the last one of that implementation
as the guide), and is stopped at its share plus a minute (so the whole run ends within
the budget plus a minute); each part of the results is written as it is measured, so a
stopped run still reports what it finished and what it was measuring.

TensorFlow is not needed (the GPU machine has none): each process records whether
anything imported it, and the run fails if so.

Usage:

    python bench/gpu.py                                           # all of the above
    python bench/gpu.py --backends jax --presets base --tokens 8192,25600
    python bench/gpu.py --policies float32,mixed_bfloat16 --implementations ours_jax,flax
    .venv/bin/python bench/gpu.py --device cpu                    # smoke test, a few minutes

`--device cpu` is a smoke test of the script itself on a CPU: the `tiny` preset,
vocabulary 1000, length 16, two points (64 and 128 tokens), 3 timed steps, small
decodes, written to a temporary folder unless `--output` is given. Its numbers mean
nothing. On 2 busy cores it took 3.5 minutes (JAX 1.5, PyTorch 2, mostly inductor
compiling; the first run in a fresh inductor cache, 10); `--backends jax` alone, or
`--implementations` without the two compiled PyTorch ones, for a quicker check.

On the lent GPU machine (one H200; its image has JAX, PyTorch, flax and optax with CUDA,
but no Keras and no TensorFlow), carry Keras and its two missing dependencies as wheels.
Once, here, in the repository's root:

    echo /.whl/ >> .git/info/exclude
    .venv/bin/python -m pip download --no-deps --only-binary=:all: --python-version 3.12 \\
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \\
        --platform manylinux2014_x86_64 -d .whl keras==3.15.1 namex==0.1.0 optree==0.20.0

(2.9 MB), then one device call with `carry: [".whl"]` and `timeout_s: 600`, whose command is

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \\
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit; \\
    set -o pipefail; PYTHONUNBUFFERED=1 python3 bench/gpu.py --budget-s 480 \\
        --output $OUT/gpu.json 2>&1 | tee $OUT/gpu.log

(the run ends within 540 s: JAX gets about half the budget, PyTorch what is left). It
writes gpu.json, gpu.png and the whole log under $OUT (copy the first two to
bench/results/); the table at the end of the output (the report section below) is the
summary: tokens/s and MFU per point and implementation, the ratios to the peers,
decoding, and what was not measured.
How many points fit is unmeasured: each point compiles afresh (XLA; capture plus
inductor; torch.compile), tens of seconds each on that machine. A run after one
backend's targets can spend the whole call on them, with other arguments:

    --backends torch --presets base --tokens 8192,25600              # PyTorch against torch.compile
    --backends jax --tokens 8192,25600,32768 --big-tokens 25600       # JAX, base and big

Writes bench/results/gpu.json and gpu.png (target tokens/s and MFU against tokens per step,
one line per implementation, one row of panels per preset and policy).
"""

import argparse
import dataclasses
import gc
import json
import math
import os
import pathlib
import random
import signal
import subprocess
import sys
import tempfile
import time
import traceback

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench import machine  # noqa: E402
from bench.train_throughput import FIRST_ORDINARY_ID, training_flops  # noqa: E402

BACKENDS = ("jax", "torch")
POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")
PEAK_DTYPES = {"float32": "float32", "mixed_bfloat16": "bfloat16", "mixed_float16": "float16"}
IMPLEMENTATIONS = {"jax": ("ours_jax", "flax"), "torch": ("ours_torch", "torch_eager", "torch_compiled")}
ALL_IMPLEMENTATIONS = tuple(name for names in IMPLEMENTATIONS.values() for name in names)
PEERS_WITHOUT_FLOAT16 = ("flax", "torch_eager", "torch_compiled")  # no loss scaling in the peers
GRACE_S = 60  # a backend past its share of --budget-s by this much is stopped
# Per device: what a run measures unless told otherwise. Tokens per step are measured in
# the order given, the points the targets are set at (8k, 25k) first.
DEFAULTS = {
    "gpu": {
        "presets": "base,big",
        "tokens": {"base": "8192,25600,32768,16384,4096", "big": "8192,25600"},
        "length": 64, "vocab": 32000, "steps": 30, "warmup": 3,
        "decode": (128, 24, 64), "matmul_size": 8192,
    },
    "cpu": {
        "presets": "tiny",
        "tokens": {"tiny": "64,128"},
        "length": 16, "vocab": 1000, "steps": 3, "warmup": 2,
        "decode": (4, 8, 8), "matmul_size": 512,
    },
}


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one run measures, resolved from the arguments and the device's defaults."""

    device: str  # "gpu" or "cpu"
    presets: tuple
    policies: tuple
    tokens: dict  # preset -> target tokens per step, in measuring order
    length: int  # source and target length of every training batch
    vocab: int
    steps: int  # timed training steps per measurement
    warmup: int  # untimed steps first (compilation)
    implementations: tuple
    ours_loop: str  # "fit" or "train_on_batch"
    jit_compile: object  # compile_transformer's jit_compile for ours
    decode: tuple  # (batch, source length, steps); () for none
    matmul_size: int


# ------------------------------------------------------------------ one backend's helpers
def _backend():
    import keras

    return keras.backend.backend()


def _wait(values=()):
    """Waits for the device: timings must include the work, not only its launch."""
    if _backend() == "torch":
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
    else:
        import jax

        jax.block_until_ready(values)


def _device_name(plan):
    if plan.device == "cpu":
        return machine.cpu_model()
    if _backend() == "torch":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("bench/gpu.py: PyTorch sees no CUDA GPU (--device cpu for a smoke test)")
        return torch.cuda.get_device_name(0)
    import jax

    device = jax.devices()[0]
    if device.platform != "gpu":
        raise SystemExit(f"bench/gpu.py: JAX's first device is {device.platform}, not a GPU (--device cpu for a smoke test)")
    return device.device_kind


def matmul_peak(dtype, size, repeats=10):
    """Best FLOP/s of `keras.ops.matmul` on two `size` x `size` matrices of `dtype`."""
    import keras
    from keras import ops

    a = keras.random.normal((size, size), dtype=dtype, seed=0)
    b = keras.random.normal((size, size), dtype=dtype, seed=1)
    matmul = ops.matmul
    if _backend() == "jax":
        import jax

        matmul = jax.jit(ops.matmul)
    best = math.inf
    for _ in range(repeats + 2):
        _wait([a, b])
        start = time.perf_counter()
        c = matmul(a, b)
        float(ops.convert_to_numpy(c[0, 0]))  # waits for the product
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best


def _fake_ids(shape, vocab, seed):
    import numpy as np

    return np.random.default_rng(seed).integers(FIRST_ORDINARY_ID, vocab, shape, dtype=np.int32)


def _fake_batch(plan, batch):
    """`(source, decoder inputs, labels)`, int32 NumPy `[batch, length]` each."""
    return tuple(_fake_ids((batch, plan.length), plan.vocab, seed) for seed in (1, 2, 3))


def _config(plan, preset, policy=None):
    import keras_transformer as kt

    return kt.TransformerConfig.from_preset(preset, vocab_size=plan.vocab, dtype_policy=policy)


def _release():
    """Frees the last model's device memory before the next one is built."""
    import keras

    keras.backend.clear_session(free_memory=True)
    gc.collect()
    if _backend() == "torch":
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


# ------------------------------------------------------------------ the implementations
# Each builder returns `(run, parameters, model)`: `run(steps)` trains `steps` steps and
# returns their losses as floats once the device is done; `model` is kept for decoding.
def _build_ours(plan, preset, policy, batch):
    import keras
    import numpy as np

    import keras_transformer as kt

    keras.config.set_dtype_policy("float32")
    # Keras draws its default seeds from Python's `random`. Not `keras.utils.set_random_seed`:
    # it imports TensorFlow, where installed, to seed it too.
    random.seed(0)
    np.random.seed(0)
    model = kt.build_transformer(_config(plan, preset, policy))
    kt.compile_transformer(model, jit_compile=plan.jit_compile)
    source, decoder, labels = _fake_batch(plan, batch)
    if plan.ours_loop == "train_on_batch":
        x = {"encoder_inputs": source, "decoder_inputs": decoder}

        def run(steps):  # the logs come back as NumPy: each step waits for the last
            return [float(model.train_on_batch(x, labels, return_dict=True)["loss"]) for _ in range(steps)]

        return run, int(model.count_params()), model
    tiled = {
        steps: ({"encoder_inputs": np.tile(source, (steps, 1)), "decoder_inputs": np.tile(decoder, (steps, 1))},
                np.tile(labels, (steps, 1)))
        for steps in {plan.warmup, plan.steps}
    }

    def run(steps):  # one epoch of `steps` batches; the reported loss is the epoch's mean
        x, y = tiled[steps]
        history = model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
        _wait([v.value for v in model.trainable_variables])
        return [float(loss) for loss in history.history["loss"]]

    return run, int(model.count_params()), model


def _build_torch_peer(plan, preset, policy, batch, compiled):
    import torch

    from bench.peers import make_torch_peer

    torch._dynamo.reset()  # a fresh compile: the recompile limit counts across peers
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() and plan.device == "gpu" else "cpu")
    autocast = {"float32": None, "mixed_bfloat16": torch.bfloat16}[policy]
    model, step = make_torch_peer(
        _config(plan, preset),
        device=device,
        autocast_dtype=autocast,
        fused_adam=device.type == "cuda",
        compile_loss=compiled,
    )
    tensors = [torch.from_numpy(ids).long().to(device) for ids in _fake_batch(plan, batch)]

    def run(steps):  # a hand-written loop: no host read until the end
        losses = [step(*tensors) for _ in range(steps)]
        _wait()
        return torch.stack([loss.detach() for loss in losses]).float().cpu().tolist()

    return run, sum(p.numel() for p in model.parameters()), model


def _build_flax(plan, preset, policy, batch):
    import jax
    import jax.numpy as jnp

    from bench import flax_peer  # ImportError without flax or optax: the caller skips

    state, step = flax_peer.make_flax_peer(_config(plan, preset), policy=policy)
    parameters = flax_peer.count_parameters(state)
    arrays = [jnp.asarray(ids) for ids in _fake_batch(plan, batch)]
    holder = [state]  # the step donates its state: only the newest may be kept

    def run(steps):
        losses = []
        for _ in range(steps):
            holder[0], loss = step(holder[0], *arrays)
            losses.append(loss)
        return [float(loss) for loss in jax.device_get(losses)]

    return run, parameters, holder


def _build(name, plan, preset, policy, batch):
    if name in ("ours_jax", "ours_torch"):
        return _build_ours(plan, preset, policy, batch)
    if name == "flax":
        return _build_flax(plan, preset, policy, batch)
    return _build_torch_peer(plan, preset, policy, batch, compiled=name == "torch_compiled")


def time_training(name, plan, preset, policy, tokens):
    """`(entry, model)`: the speed of `plan.steps` steps of `name` after `plan.warmup`."""
    batch = max(1, tokens // plan.length)
    start = time.perf_counter()
    run, parameters, model = _build(name, plan, preset, policy, batch)
    run(plan.warmup)
    warmup_s = time.perf_counter() - start
    start = time.perf_counter()
    losses = run(plan.steps)
    step_s = (time.perf_counter() - start) / plan.steps
    if not all(math.isfinite(loss) for loss in losses):
        raise FloatingPointError(f"non-finite training loss: {losses}")
    entry = {
        "implementation": name,
        "preset": preset,
        "policy": policy,
        "tokens_per_step": batch * plan.length,
        "batch": batch,
        "length": plan.length,
        "parameters": int(parameters),
        "step_s": step_s,
        "tokens_per_s": batch * plan.length / step_s,
        "flops_per_step": training_flops(_config(plan, preset), batch, plan.length, plan.length),
        "build_and_warmup_s": warmup_s,
        "first_loss": losses[0],
        "last_loss": losses[-1],
    }
    return entry, model


def time_decoding(model, plan, rounds=3):
    """Decoding steps x batch per second of ours' compiled greedy and beam-4 decoders."""
    from keras import ops

    from keras_transformer.inference.compiled import CompiledDecoder
    from keras_transformer.inference.decoding import BEAM_SIZE, LENGTH_PENALTY

    batch, source_length, steps = plan.decode
    source = _fake_ids((batch, source_length), plan.vocab, 4)
    results = {"batch": batch, "source_length": source_length, "steps": steps}
    for name, method, kwargs in (
        ("greedy", "greedy", {}),
        ("beam4", "beam", {"beam_size": BEAM_SIZE, "alpha": LENGTH_PENALTY}),
    ):
        decoder = CompiledDecoder(model, method, max_length=steps, **kwargs)
        start = time.perf_counter()
        tokens = ops.convert_to_numpy(decoder(source)[0])
        first = time.perf_counter() - start
        if tokens.shape[0] != batch:
            raise ValueError(f"{name} decoding returned {tokens.shape[0]} rows for {batch} sources")
        best = math.inf
        for _ in range(rounds):
            start = time.perf_counter()
            ops.convert_to_numpy(decoder(source)[0])
            best = min(best, time.perf_counter() - start)
        # Random weights rarely emit EOS, so every row runs all steps: steps x rows is exact.
        results[name] = {"first_call_s": first, "s": best, "tokens_per_s": batch * steps / best}
    return results


# ------------------------------------------------------------------ one backend's run
class Budget:
    """A backend's share of `--budget-s`: whether the next measurement should start."""

    def __init__(self, seconds):
        self.end = None if seconds is None else time.perf_counter() + seconds
        self.last_cost = {}

    def reason_to_skip(self, name):
        if self.end is None:
            return None
        left = self.end - time.perf_counter()
        expected = max(self.last_cost.get(name, 0.0), 5.0)
        if left < expected:
            return f"time budget: {left:.0f} s left, {name} is expected to take {expected:.0f} s"
        return None

    def spent(self, name, seconds):
        self.last_cost[name] = seconds


def _skip_reason(name, policy, unavailable, budget):
    if name in unavailable:
        return unavailable[name]
    if policy == "mixed_float16" and name in PEERS_WITHOUT_FLOAT16:
        return "the peers have no float16 loss scaling; time them under mixed_bfloat16 or float32"
    return budget.reason_to_skip(name)


def _unavailable_peers(names):
    """`{name: reason}` for the peers this process cannot run."""
    unavailable = {}
    if "flax" in names:
        try:
            from bench import flax_peer  # noqa: F401
        except ImportError as error:
            unavailable["flax"] = f"flax peer skipped: {error}"
            print(f"  {unavailable['flax']}", flush=True)
    return unavailable


def _measure_point(name, plan, preset, policy, tokens, part, decode_now):
    """Times `name` at one point and, for ours when `decode_now`, its decoding; records both."""
    stage = "training"
    try:
        entry, model = time_training(name, plan, preset, policy, tokens)
        entry["mfu"] = entry["flops_per_step"] / entry["step_s"] / part["peaks"][PEAK_DTYPES[policy]]
        part["training"].append(entry)
        print(
            f"  {preset:<5} {policy:<15} {entry['tokens_per_step']:>6} tok/step  {name:<15} "
            f"{entry['tokens_per_s']:>10,.0f} tok/s  {entry['step_s'] * 1000:7.1f} ms  MFU {entry['mfu']:.3f}  "
            f"(build+warm-up {entry['build_and_warmup_s']:.0f} s, loss {entry['first_loss']:.2f}->{entry['last_loss']:.2f})",
            flush=True,
        )
        if decode_now:
            stage = "decoding"
            decoding = time_decoding(model, plan)
            part["decoding"][f"{preset}/{policy}"] = decoding
            print(
                f"  {preset:<5} {policy:<15} decode ({name}): greedy {decoding['greedy']['tokens_per_s']:,.0f} tok/s, "
                f"beam4 {decoding['beam4']['tokens_per_s']:,.0f} tok/s",
                flush=True,
            )
    except Exception as error:  # noqa: BLE001 - one failed point must not lose the others
        traceback.print_exc()
        part["failed"].append(
            {"implementation": name, "preset": preset, "policy": policy, "tokens_per_step": tokens,
             "stage": stage, "error": repr(error)[:2000]}
        )
    finally:
        model = None  # noqa: F841 - dropped before the next build
        _release()


def _points(plan, names):
    """`(preset, policy, tokens, implementation)` in measuring order: every implementation at a point."""
    for preset in plan.presets:
        for policy in plan.policies:
            for tokens in plan.tokens[preset]:
                for name in names:
                    yield preset, policy, tokens, name


def run_backend(plan, budget_s, part_path):
    """Measures this process' backend over `plan`, writing the part to `part_path` as it goes."""
    backend = _backend()
    budget = Budget(budget_s)
    names = [n for n in IMPLEMENTATIONS[backend] if n in plan.implementations]
    part = {
        "backend": backend, "device": _device_name(plan), "jit_compile": plan.jit_compile,
        "ours_loop": plan.ours_loop, "budget_s": budget_s, "peaks": {}, "training": [],
        "decoding": {}, "skipped": [], "failed": [],
    }
    for dtype in sorted({PEAK_DTYPES[policy] for policy in plan.policies}):
        part["peaks"][dtype] = matmul_peak(dtype, plan.matmul_size)
        print(f"  {backend}: {dtype} matmul peak {part['peaks'][dtype] / 1e12:.1f} TFLOP/s", flush=True)
    machine.write_json(part_path, part)
    unavailable = _unavailable_peers(names)
    decoded = set()  # (preset, policy): ours decodes once each, at its first point
    for preset, policy, tokens, name in _points(plan, names):
        point = {"implementation": name, "preset": preset, "policy": policy, "tokens_per_step": tokens}
        reason = _skip_reason(name, policy, unavailable, budget)
        if reason:
            part["skipped"].append({**point, "reason": reason})
            continue
        decode_now = bool(plan.decode) and name.startswith("ours") and (preset, policy) not in decoded
        if decode_now:
            decoded.add((preset, policy))
        part["in_progress"] = point
        machine.write_json(part_path, part)  # a stopped run says what it was doing
        start = time.perf_counter()
        _measure_point(name, plan, preset, policy, tokens, part, decode_now)
        budget.spent(name, time.perf_counter() - start)
        part["in_progress"] = None
        machine.write_json(part_path, part)
    part["tensorflow_imported"] = "tensorflow" in sys.modules
    machine.write_json(part_path, part)
    return part


# ------------------------------------------------------------------ the parent process
def _run_children(argv, backends, budget_s, folder):
    """Runs each backend's process in turn; returns `(parts, failures)`."""
    parts, failures = {}, {}
    end = None if budget_s is None else time.perf_counter() + budget_s
    for index, backend in enumerate(backends):
        share = None if end is None else max(0.0, (end - time.perf_counter()) / (len(backends) - index))
        part_path = pathlib.Path(folder) / f"{backend}.json"
        command = [sys.executable, str(pathlib.Path(__file__).resolve()), *argv, "--backends", backend,
                   "--part-output", str(part_path)]
        if share is not None:
            command += ["--budget-s", f"{share:.0f}"]
        env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2")
        print(f"{backend}: starting" + ("" if share is None else f" with {share:.0f} s of the budget"), flush=True)
        # Its own session, so a stop also ends its compile workers (inductor's, XLA's).
        child = subprocess.Popen(command, env=env, start_new_session=True)
        try:
            status = child.wait(timeout=None if share is None else share + GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            status = f"stopped after its share of the budget ({share:.0f} s) and {GRACE_S} s more"
        if status != 0:
            status = status if isinstance(status, str) else f"exit status {status}"
            print(f"backend {backend}: {status}", file=sys.stderr, flush=True)
            failures[backend] = status
        if part_path.exists():  # written as it went: a stopped backend keeps its finished points
            parts[backend] = json.loads(part_path.read_text())
    return parts, failures


# ------------------------------------------------------------------ arguments
def _parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="gpu", choices=("gpu", "cpu"), help="cpu: a smoke test with tiny sizes")
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated Keras backends")
    parser.add_argument("--presets", help="comma-separated presets (gpu: base,big; cpu: tiny)")
    parser.add_argument("--policies", default="mixed_bfloat16", help=f"comma-separated, from {POLICIES}")
    parser.add_argument("--tokens", help="target tokens per step, in measuring order, for every preset but big")
    parser.add_argument("--big-tokens", help="the same for `big` (default 8192,25600)")
    parser.add_argument("--length", type=int, help="source and target length (gpu 64, cpu 16)")
    parser.add_argument("--vocab", type=int, help="vocabulary size (gpu 32000, cpu 1000)")
    parser.add_argument("--steps", type=int, help="timed training steps per point (gpu 30, cpu 3)")
    parser.add_argument("--warmup", type=int, help="untimed steps first (gpu 3, cpu 2)")
    parser.add_argument("--implementations", default=",".join(ALL_IMPLEMENTATIONS), help="comma-separated subset")
    parser.add_argument("--ours-loop", default="fit", choices=("fit", "train_on_batch"))
    parser.add_argument("--jit-compile", default="true", choices=("auto", "true", "false"), help="ours' jit_compile")
    parser.add_argument("--no-decode", action="store_true", help="skip the decoding timings")
    parser.add_argument("--budget-s", type=float, help="seconds for the whole run (default: no limit)")
    parser.add_argument("--output", help="JSON path, the PNG beside it (gpu: bench/results/gpu.json)")
    parser.add_argument("--part-output", help=argparse.SUPPRESS)  # one backend, set by _run_children
    return parser


def _split(text):
    return tuple(item for item in text.split(",") if item)


def make_plan(args, parser):
    """The `Plan` of `args`, the device's defaults filling what was not given."""
    defaults = DEFAULTS[args.device]
    presets = _split(args.presets or defaults["presets"])
    policies = _split(args.policies)
    implementations = _split(args.implementations)
    unknown = sorted(set(policies) - set(POLICIES)) + sorted(
        set(implementations) - set(ALL_IMPLEMENTATIONS)
    )
    if unknown:
        parser.error(f"unknown policies or implementations {unknown}")
    tokens = {}
    for preset in presets:  # a preset without defaults of its own takes the device's first
        given = args.big_tokens if preset == "big" else args.tokens
        text = given or defaults["tokens"].get(preset) or next(iter(defaults["tokens"].values()))
        tokens[preset] = tuple(int(t) for t in _split(text))
    return Plan(
        device=args.device,
        presets=presets,
        policies=policies,
        tokens=tokens,
        length=args.length or defaults["length"],
        vocab=args.vocab or defaults["vocab"],
        steps=args.steps or defaults["steps"],
        warmup=args.warmup or defaults["warmup"],
        implementations=implementations,
        ours_loop=args.ours_loop,
        jit_compile={"auto": "auto", "true": True, "false": False}[args.jit_compile],
        decode=() if args.no_decode else defaults["decode"],
        matmul_size=defaults["matmul_size"],
    )



# ------------------------------------------------------------------ the report
# Ratios at equal tokens per step, the printed table, the PNG; reads only the payload.
LABELS = {  # every implementation, in the table's and the legend's order
    "ours_jax": "ours, JAX (XLA)",
    "flax": "Flax linen + optax, jitted step",
    "ours_torch": "ours, PyTorch (captured + inductor)",
    "torch_eager": "torch.nn.Transformer, eager",
    "torch_compiled": "torch.nn.Transformer, torch.compile",
}
# Ratios of target tokens/s at the same point: ours against each peer, and backend against backend.
RATIOS = (("ours_torch", "torch_compiled"), ("ours_torch", "torch_eager"), ("ours_jax", "flax"), ("ours_torch", "ours_jax"))


def ratios(parts):
    """Target tokens/s ratios between implementations measured at the same point."""
    speed = {}
    for part in parts.values():
        for entry in part["training"]:
            key = (entry["preset"], entry["policy"], entry["tokens_per_step"])
            speed.setdefault(key, {})[entry["implementation"]] = entry["tokens_per_s"]
    rows = []
    for (preset, policy, tokens), by_name in sorted(speed.items()):
        for numerator, denominator in RATIOS:
            if numerator in by_name and denominator in by_name:
                rows.append({
                    "preset": preset, "policy": policy, "tokens_per_step": tokens,
                    "ratio": f"{numerator} / {denominator}",
                    "value": by_name[numerator] / by_name[denominator],
                })
    return rows


def _cells(payload):
    """`{(preset, policy, tokens): {implementation: "tokens/s (MFU)"}}`."""
    rows = {}
    for part in payload["backends"].values():
        for entry in part["training"]:
            key = (entry["preset"], entry["policy"], entry["tokens_per_step"])
            rows.setdefault(key, {})[entry["implementation"]] = f"{entry['tokens_per_s']:,.0f} ({entry['mfu']:.2f})"
    return rows


def _decoding_lines(payload):
    lines = []
    for backend, part in payload["backends"].items():
        for key, decoding in part["decoding"].items():
            lines.append(
                f"decode {backend} {key} (batch {decoding['batch']}, {decoding['steps']} steps): "
                f"greedy {decoding['greedy']['tokens_per_s']:,.0f} tok/s, beam4 {decoding['beam4']['tokens_per_s']:,.0f} tok/s"
            )
    return lines


def print_summary(payload):
    """The table of every point, the ratios, decoding, and what was not measured."""
    print("\ntarget tokens/s (MFU) by tokens per step")
    names = list(LABELS)
    print(f"{'preset':<6} {'policy':<15} {'tokens':>6} " + " ".join(f"{n:>18}" for n in names))
    for (preset, policy, tokens), cells in sorted(_cells(payload).items()):
        print(f"{preset:<6} {policy:<15} {tokens:>6} " + " ".join(f"{cells.get(n, '-'):>18}" for n in names))
    for row in payload["ratios"]:
        print(f"{row['preset']} {row['policy']} {row['tokens_per_step']:>6}: {row['ratio']:<30} {row['value']:.2f}")
    print("\n".join(_decoding_lines(payload)))
    for backend, part in payload["backends"].items():
        for item in part["skipped"] + part["failed"]:
            print(f"{backend}: not measured {item}")
        if part.get("in_progress"):
            print(f"{backend}: stopped while measuring {part['in_progress']}")


def _plot_panel(axis, entries, preset, policy, field, ylabel):
    """One line per implementation of `field` against tokens per step."""
    ticks = set()
    for name, label in LABELS.items():
        points = sorted(
            (e["tokens_per_step"], e[field])
            for e in entries
            if e["implementation"] == name and e["preset"] == preset and e["policy"] == policy
        )
        if points:
            axis.plot(*zip(*points), marker="o", label=label)
            ticks.update(tokens for tokens, _ in points)
    axis.set_xscale("log", base=2)
    axis.set_xticks(sorted(ticks), [f"{tokens:,}" for tokens in sorted(ticks)], fontsize=8)
    axis.minorticks_off()
    axis.set_xlabel("target tokens per step")
    axis.set_ylabel(ylabel)
    axis.set_title(f"{preset}, {policy}", fontsize=10)
    axis.grid(alpha=0.3)


def plot(payload, path):
    """tokens/s and MFU against tokens per step: a line per implementation, a row per preset and policy."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a benchmark machine
    import matplotlib.pyplot as plt

    entries = [entry for part in payload["backends"].values() for entry in part["training"]]
    groups = sorted({(entry["preset"], entry["policy"]) for entry in entries}) or [("nothing measured", "")]
    figure, axes = plt.subplots(len(groups), 2, figsize=(12, 4.2 * len(groups) + 0.6), squeeze=False)
    for row, (preset, policy) in enumerate(groups):
        _plot_panel(axes[row][0], entries, preset, policy, "tokens_per_s", "target tokens / s")
        _plot_panel(axes[row][1], entries, preset, policy, "mfu", "MFU (of the matmul peak measured there)")
        if entries:
            axes[row][0].legend(fontsize=8)
    devices = ", ".join(sorted({part["device"] for part in payload["backends"].values()}))
    figure.suptitle(f"Training on {devices or 'no device'} (length {payload['length']}, vocabulary {payload['vocab']})")
    figure.text(0.01, 0.01, "\n".join(_decoding_lines(payload)), fontsize=7)
    figure.tight_layout(rect=(0, 0.04, 1, 1))
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    args = parser.parse_args(argv)
    plan = make_plan(args, parser)
    if args.part_output:
        run_backend(plan, args.budget_s, args.part_output)
        return
    if args.output:
        output = pathlib.Path(args.output)
    elif plan.device == "cpu":  # smoke numbers never replace the GPU results
        output = pathlib.Path(tempfile.gettempdir()) / "keras_transformer_gpu_smoke" / "gpu.json"
    else:
        output = machine.RESULTS_DIR / "gpu.json"
    backends = _split(args.backends)
    with tempfile.TemporaryDirectory() as folder:
        parts, failures = _run_children(argv, backends, args.budget_s, folder)
    if os.environ.get("KERAS_BACKEND") not in BACKENDS:
        # Writing the results imports the package, so Keras: never its TensorFlow default.
        os.environ["KERAS_BACKEND"] = backends[0] if backends else "jax"
    payload = {
        "machine": machine.machine_info(), "plan": dataclasses.asdict(plan), "length": plan.length,
        "vocab": plan.vocab, "backends": parts, "ratios": ratios(parts),
        "failures": {backend: str(status) for backend, status in failures.items()},
    }
    machine.write_json(output, payload)
    plot(payload, output.with_suffix(".png"))
    print_summary(payload)
    print(f"wrote {output} and {output.with_suffix('.png')}")
    problems = [f"{b}: {s}" for b, s in failures.items()]
    problems += [f"{b}: {len(p['failed'])} failed measurements" for b, p in parts.items() if p["failed"]]
    problems += [f"{b}: TensorFlow was imported" for b, p in parts.items() if p.get("tensorflow_imported")]
    if problems:
        raise SystemExit("bench/gpu.py: " + "; ".join(problems))


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()

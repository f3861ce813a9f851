"""Decoding speed of our Transformer against keras-hub's cached `TransformerDecoder`.

Decodes one fixed batch of random source sentences (the `small` preset with random,
seeded weights; 24 source tokens) for exactly L output steps, L in `--lengths`, and
reports sentences/s and output tokens/s (batch x L / seconds) on each Keras backend:

- ours, compiled as users decode (`compiled.CompiledDecoder`: XLA on TensorFlow,
  `jax.jit` on JAX, eager under `no_grad` on PyTorch), with `max_length=L`:
  `greedy` (key/value cache), `greedy_uncached` (reruns the decoder over the whole
  output buffer at every step) and `beam4` (cached, beam 4, length penalty 0.6). Our
  API has no uncached beam search, so there is no `beam4_uncached`.
- keras-hub: the same configuration assembled from keras-hub layers (random weights
  of its own), generating as keras-hub's `BartSeq2SeqLM` does (`bench/peers.py`,
  `KerasHubGenerator`): encoder once, `TransformerDecoder` self/cross-attention caches,
  `GreedySampler` (`greedy`) or `BeamSampler(num_beams=4)` (`beam4`), compiled as
  `CausalLM.make_generate_function` does; `greedy_uncached` reruns the decoder stack
  over the whole prompt at every step.

The beam searches differ as algorithms (ours keeps finished hypotheses and applies the
length penalty; keras-hub's keeps the 4 most probable sequences) but both take L steps
over batch x 4 rows. Every decoder may stop early once every sentence has produced EOS
(keras-hub with `stop_token_ids=(EOS,)`, `Seq2SeqLM.generate`'s default). With random
weights that practically never happens; each result records the longest output and
says whether every step surely ran (`all_steps_ran`).

Before timing, it checks that both sides do the work they claim: our cached greedy
output equals our uncached greedy output (exact ids), keras-hub's cached `next()`
gives the teacher-forced model's logits (within 1e-4) for the first steps, and
keras-hub's cached greedy output equals its uncached one. A failed check stops the run.

Each decoder is called once untimed (tracing and compilation; its time is reported as
warm-up), then `--rounds` interleaved rounds (one call of every decoder per round, so
all see the same background load); per decoder the fastest round counts. Wall and
process CPU time are both recorded.

Usage (one command; a subprocess per backend, because KERAS_BACKEND must be set before
Keras is imported):

    .venv/bin/python bench/decode.py
    .venv/bin/python bench/decode.py --backends jax --lengths 64 --rounds 5
    .venv/bin/python bench/decode.py --lengths 8 --batch 4 --rounds 1   # smoke run

Writes bench/results/decode.json and decode.png (output tokens/s, log scale).
"""

import argparse
import os
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench import machine  # noqa: E402

BACKENDS = ("tensorflow", "jax", "torch")
DECODERS = (
    "ours_greedy",
    "ours_greedy_uncached",
    "ours_beam4",
    "keras_hub_greedy",
    "keras_hub_greedy_uncached",
    "keras_hub_beam4",
)
LABELS = {
    "ours_greedy": "ours greedy",
    "ours_greedy_uncached": "ours greedy, no cache",
    "ours_beam4": "ours beam 4",
    "keras_hub_greedy": "keras-hub greedy",
    "keras_hub_greedy_uncached": "keras-hub greedy, no cache",
    "keras_hub_beam4": "keras-hub beam 4",
}
PRESET = "small"
SOURCE_LENGTH = 24
FIRST_ORDINARY_ID = 4  # ids 0-3 are pad, unk, bos, eos: sources hold real-token ids
LOGITS_TOLERANCE = 1e-4
LOGITS_CHECK_STEPS = 3
# Speed-up targets of the issue, judged at the longest output length measured (64 by default).
TARGETS = {"ours_greedy/keras_hub_greedy": 1.5, "ours_greedy/ours_greedy_uncached": 5.0}


# ------------------------------------------------------------------ helpers
def source_batch(vocab_size, batch, length, seed=0):
    """int32 `[batch, length]` random real-token ids (no padding)."""
    rng = np.random.default_rng(seed)
    return rng.integers(FIRST_ORDINARY_ID, vocab_size, (batch, length), dtype=np.int32)


def output_lengths(rows, eos_id):
    """Per row of int `[R, L]` output ids: tokens up to and including the first EOS, else L."""
    rows = np.asarray(rows)
    has_eos = (rows == eos_id).any(axis=1)
    return np.where(has_eos, (rows == eos_id).argmax(axis=1) + 1, rows.shape[1])


def _timed(function, *args):
    """`(result, wall seconds, CPU seconds of this process)` of `function(*args)`.

    On a machine shared with other work wall time grows with the load while CPU time
    mostly does not, so the two together show how much the load distorted a round.
    """
    cpu, wall = time.process_time(), time.perf_counter()
    result = function(*args)
    return result, time.perf_counter() - wall, time.process_time() - cpu


# ------------------------------------------------------------------ decoders
def ours_decoders(model, length, config):
    """Our compiled decoders for output length `length`: name -> `source -> (best, rows)`.

    `best` is int `[B, L]`, the output; `rows` every row whose end shows how many steps
    ran (for beam search the best hypotheses only, a lower bound).
    """
    from keras import ops

    from keras_transformer.inference.compiled import CompiledDecoder
    from keras_transformer.inference.decoding import BEAM_SIZE, LENGTH_PENALTY

    compiled = {
        "ours_greedy": CompiledDecoder(model, "greedy", max_length=length),
        "ours_greedy_uncached": CompiledDecoder(model, "greedy_uncached", max_length=length),
        "ours_beam4": CompiledDecoder(
            model, "beam", beam_size=BEAM_SIZE, alpha=LENGTH_PENALTY, max_length=length
        ),
    }

    def wrap(decoder):
        def run(source):
            tokens = ops.convert_to_numpy(decoder(source)[0])  # to NumPy: the work is done
            return tokens, tokens

        return run

    return {name: wrap(decoder) for name, decoder in compiled.items()}


def keras_hub_decoders(generator, length, config):
    """keras-hub's compiled generate functions for `length` steps, as `ours_decoders`."""
    import keras_hub
    from keras import ops

    from keras_transformer.inference.decoding import BEAM_SIZE

    greedy = keras_hub.samplers.GreedySampler()
    # All beams come back so that the step count can be read from every row; the best
    # one is the output (the sampler sorts them).
    beam = keras_hub.samplers.BeamSampler(num_beams=BEAM_SIZE, return_all_beams=True)
    compiled = {
        "keras_hub_greedy": generator.generate_function(greedy, length),
        "keras_hub_greedy_uncached": generator.generate_function(greedy, length, cached=False),
    }
    beam_function = generator.generate_function(beam, length)

    def run_greedy(function):
        def run(source):
            tokens = ops.convert_to_numpy(function(source))[:, 1:]  # drop BOS
            return tokens, tokens

        return run

    def run_beam(source):
        beams = ops.convert_to_numpy(beam_function(source)[0])[:, :, 1:]  # [B, K, L]
        return beams[:, 0], beams.reshape(-1, beams.shape[-1])

    decoders = {name: run_greedy(function) for name, function in compiled.items()}
    decoders["keras_hub_beam4"] = run_beam
    return decoders


# ------------------------------------------------------------------ checks
def check_keras_hub_cache(generator, model, source, steps=LOGITS_CHECK_STEPS, seed=1):
    """Fails unless keras-hub's cached `next()` gives the full model's logits, step by step.

    Feeds BOS and then random real-token ids one at a time through the cache, and
    compares each step's logits with the teacher-forced model on the same prefix.
    Returns the largest absolute difference.
    """
    from keras import ops

    from keras_transformer.special_tokens import BOS_ID

    batch = source.shape[0]
    rng = np.random.default_rng(seed)
    prefix = np.concatenate(
        [
            np.full((batch, 1), BOS_ID, np.int32),
            rng.integers(FIRST_ORDINARY_ID, generator.config.vocab_size, (batch, steps - 1), dtype=np.int32),
        ],
        axis=1,
    )
    full = ops.convert_to_numpy(model({"encoder_inputs": source, "decoder_inputs": prefix}))
    prompt = ops.convert_to_tensor(np.pad(prefix, ((0, 0), (0, 1))))  # one empty slot
    cache = generator.initial_cache(ops.convert_to_tensor(source), steps + 1)
    worst = 0.0
    for index in range(1, steps + 1):
        logits, _, cache = generator.next(prompt, cache, index)
        difference = float(np.abs(ops.convert_to_numpy(logits) - full[:, index - 1]).max())
        worst = max(worst, difference)
        if difference > LOGITS_TOLERANCE:
            raise RuntimeError(
                f"keras-hub cached next() at step {index} differs from the teacher-forced "
                f"model by {difference:.3g} (tolerance {LOGITS_TOLERANCE})."
            )
    return worst


def check_same_tokens(outputs, cached, uncached, length):
    """Fails unless decoders `cached` and `uncached` produced exactly the same ids."""
    if cached not in outputs or uncached not in outputs:
        return None
    a, b = outputs[cached], outputs[uncached]
    if not np.array_equal(a, b):
        rows = np.flatnonzero((a != b).any(axis=1)).tolist()
        raise RuntimeError(
            f"{cached} and {uncached} disagree at output length {length}: rows {rows[:10]} "
            f"differ (first: {a[rows[0]].tolist()} vs {b[rows[0]].tolist()})."
        )
    return True


# ------------------------------------------------------------------ one backend
def build_models(config):
    """`(ours, keras-hub peer)`, each with random weights from seed 0."""
    import keras

    from bench.peers import build_keras_hub_transformer
    from keras_transformer.model.transformer import build_transformer

    keras.utils.set_random_seed(0)
    ours = build_transformer(config)
    keras.utils.set_random_seed(0)
    peer = build_keras_hub_transformer(config)
    return ours, peer


def run_backend(backend, decoders, lengths, batch, rounds):
    """Checks and times every decoder at every length in this process; a JSON-ready dict."""
    os.environ["KERAS_BACKEND"] = backend
    import keras
    from keras import ops

    from bench.peers import KerasHubGenerator
    from keras_transformer.model.config import TransformerConfig

    if keras.backend.backend() != backend:
        raise RuntimeError(f"Keras was imported with backend {keras.backend.backend()!r}, not {backend!r}.")
    if backend == "torch":
        import torch

        torch.set_num_threads(machine.usable_cores())  # the other backends use every core too
    keras.config.set_dtype_policy("float32")
    config = TransformerConfig.from_preset(PRESET, dtype_policy="float32")
    ours, peer = build_models(config)
    generator = KerasHubGenerator(peer, config)
    source_np = source_batch(config.vocab_size, batch, SOURCE_LENGTH)
    source = ops.convert_to_tensor(source_np)  # once: conversion is not decoding time

    checks = {}
    if any(name.startswith("keras_hub") for name in decoders):
        worst = check_keras_hub_cache(generator, peer, source_np[:2])
        checks["keras_hub_cached_logits_max_abs_difference"] = worst
        print(f"[{backend}] keras-hub cached logits match the full model (max |diff| {worst:.2g})", flush=True)
    runners = build_runners(ours, generator, config, decoders, lengths)
    warmup, outputs, rows = {}, {}, {}
    for key, run in runners.items():
        (outputs[key], rows[key]), warmup[key], _ = _timed(run, source)
        print(f"[{backend}] warm-up {key[1]} L={key[0]}: {warmup[key]:.1f} s", flush=True)
    checks.update(check_cache_changes_nothing(outputs, decoders, lengths))
    wall, cpu = time_rounds(runners, source, rounds)

    results = {"backend": backend, "checks": checks, "lengths": {}}
    for length in lengths:
        entry = {}
        for name in decoders:
            key = (length, name)
            entry[name] = _result(wall[key], cpu[key], warmup[key], rows[key], batch, length)
        entry_ratios = ratios(entry)
        results["lengths"][str(length)] = {"decoders": entry, "ratios": entry_ratios}
        _print_length(backend, length, entry, entry_ratios)
    return results


def build_runners(ours, generator, config, decoders, lengths):
    """`{(length, name): run}` for the requested decoders at every length."""
    runners = {}
    for length in lengths:
        available = {}
        if any(name.startswith("ours") for name in decoders):
            available.update(ours_decoders(ours, length, config))
        if any(name.startswith("keras_hub") for name in decoders):
            available.update(keras_hub_decoders(generator, length, config))
        for name in decoders:
            runners[length, name] = available[name]
    return runners


def check_cache_changes_nothing(outputs, decoders, lengths):
    """Fails unless each side's cached greedy output equals its uncached one (where both ran)."""
    checks = {}
    for length in lengths:
        by_name = {name: outputs[length, name] for name in decoders}
        for cached, uncached in (
            ("ours_greedy", "ours_greedy_uncached"),
            ("keras_hub_greedy", "keras_hub_greedy_uncached"),
        ):
            if check_same_tokens(by_name, cached, uncached, length):
                checks[f"{cached} == {uncached} (L={length})"] = True
    return checks


def time_rounds(runners, source, rounds):
    """Interleaved rounds, one call of every runner per round: `(wall, cpu)` lists per key."""
    wall = {key: [] for key in runners}
    cpu = {key: [] for key in runners}
    for _ in range(rounds):
        for key, run in runners.items():
            _, seconds, cpu_seconds = _timed(run, source)
            wall[key].append(seconds)
            cpu[key].append(cpu_seconds)
    return wall, cpu


def _result(wall, cpu, warmup, rows, batch, length):
    """The JSON entry of one decoder at one length."""
    # Imported here: `keras_transformer` imports Keras, which only the per-backend
    # subprocesses may do (the backend is fixed at import).
    from keras_transformer.special_tokens import EOS_ID

    best = min(wall)
    lengths = output_lengths(rows, EOS_ID)
    longest = int(lengths.max())
    return {
        "seconds_best": best,
        "seconds_all_rounds": [round(t, 4) for t in wall],
        "cpu_seconds_all_rounds": [round(t, 4) for t in cpu],
        "warmup_seconds": round(warmup, 3),
        "sentences_per_second": batch / best,
        "tokens_per_second": batch * length / best,
        # Tokens up to the first EOS; where no row reached L, the loop may have stopped early.
        "longest_output": longest,
        "mean_output_length": float(lengths.mean()),
        "all_steps_ran": longest == length,
    }


def ratios(entry):
    """Speed ratios (time of the second over time of the first) of the pairs present."""
    pairs = (
        ("ours_greedy", "keras_hub_greedy"),
        ("ours_greedy", "ours_greedy_uncached"),
        ("ours_beam4", "keras_hub_beam4"),
        ("ours_greedy_uncached", "keras_hub_greedy_uncached"),
        ("keras_hub_greedy", "keras_hub_greedy_uncached"),
    )
    return {
        f"{a}/{b}": entry[b]["seconds_best"] / entry[a]["seconds_best"]
        for a, b in pairs
        if a in entry and b in entry
    }


def _print_length(backend, length, entry, entry_ratios):
    print(f"[{backend}] output length {length}:", flush=True)
    for name, m in entry.items():
        note = "" if m["all_steps_ran"] else f"  (stopped early? longest output {m['longest_output']})"
        print(
            f"    {LABELS[name]:<28} {m['sentences_per_second']:>8.1f} sent/s {m['tokens_per_second']:>9,.0f} tok/s"
            f"  warm-up {m['warmup_seconds']:6.1f} s"
            f"  (rounds: {', '.join(f'{t:.3f}' for t in m['seconds_all_rounds'])} s){note}",
            flush=True,
        )
    for key, value in entry_ratios.items():
        print(f"    {key}: {value:.2f}x", flush=True)


# ------------------------------------------------------------------ all backends
def gather(backends, decoders, lengths, batch, rounds, output):
    """Runs one subprocess per backend, merges their results, writes JSON and PNG."""
    start_load = machine.load_average()
    arguments = [
        "--decoders", ",".join(decoders),
        "--lengths", ",".join(map(str, lengths)),
        "--batch", str(batch),
        "--rounds", str(rounds),
    ]
    parts, failures = machine.run_per_backend(__file__, backends, arguments)
    info = machine.machine_info()
    info["load_average_1min_at_start"] = start_load
    payload = {
        "benchmark": "decode",
        "command": " ".join([pathlib.Path(sys.executable).name] + sys.argv),
        "dtype": "float32",
        "preset": PRESET,
        "batch": batch,
        "source_length": SOURCE_LENGTH,
        "rounds": rounds,
        "tokens_per_second": "batch x output length / best round's wall seconds",
        "notes": [
            "Random weights (seed 0), a different model per side: same config and shapes.",
            "Our API has no uncached beam search: no ours_beam4_uncached.",
            "keras-hub beam 4 has no length penalty and no finished-hypothesis set; ours "
            "applies alpha=0.6 (paper 6.1). Both run L steps over batch x 4 rows.",
            "all_steps_ran is True when some output (best hypotheses, for beams) reached L "
            "tokens without an earlier EOS, which proves the loop ran all L steps.",
        ],
        "targets": TARGETS,
        "machine": info,
        "failed_backends": failures,
        "backends": parts,
    }
    payload["target_verdicts"] = target_verdicts(parts, max(lengths))
    machine.write_json(output, payload)
    _plot(payload, pathlib.Path(output).with_suffix(".png"), decoders)
    _print_summary(payload)
    return payload


def target_verdicts(parts, length):
    """Per backend and target ratio: `{"ratio", "target", "met"}` at output length `length`."""
    verdicts = {}
    for backend, part in parts.items():
        measured = part["lengths"][str(length)]["ratios"]
        verdicts[backend] = {
            key: {"ratio": measured[key], "target": target, "met": measured[key] >= target}
            for key, target in TARGETS.items()
            if key in measured
        }
    return verdicts


def _plot(payload, path, decoders):
    groups, series = [], {LABELS[name]: [] for name in decoders}
    for backend, part in payload["backends"].items():
        for length, entry in part["lengths"].items():
            groups.append(f"L={length}\n{backend}")
            for name in decoders:
                m = entry["decoders"].get(name)
                series[LABELS[name]].append(m and m["tokens_per_second"])
    info = payload["machine"]
    machine.grouped_bar_chart(
        path,
        f"Decoding speed, `{PRESET}` preset, batch {payload['batch']} (output tokens/s, higher is better)",
        "output tokens / s",
        groups,
        series,
        note=(
            f"{info['cpu_model']}, {info['usable_cores']} cores, load {info['load_average_1min_at_start']}"
            f"->{info['load_average_1min']}; float32; keras {info['versions']['keras']}, "
            f"keras-hub {info['versions']['keras-hub']}"
        ),
        log_scale=True,
    )


def _print_summary(payload):
    print("\nSummary (speed ratios, same run):")
    for backend, part in payload["backends"].items():
        for length, entry in part["lengths"].items():
            text = ", ".join(f"{k} {v:.2f}x" for k, v in entry["ratios"].items())
            print(f"  {backend:<10} L={length:<3} {text}")
    for backend, verdicts in payload["target_verdicts"].items():
        for key, verdict in verdicts.items():
            print(
                f"  target {backend:<10} {key} >= {verdict['target']}x at the longest length: "
                f"{verdict['ratio']:.2f}x, {'met' if verdict['met'] else 'NOT met'}"
            )
    if payload["failed_backends"]:
        print(f"  failed backends: {payload['failed_backends']}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated Keras backends")
    parser.add_argument("--decoders", default=",".join(DECODERS), help=f"comma-separated, from {DECODERS}")
    parser.add_argument("--lengths", default="32,64", help="comma-separated output lengths (decoding steps)")
    parser.add_argument("--batch", type=int, default=32, help="sentences per batch")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per decoder (best counts)")
    parser.add_argument("--output", default=str(machine.RESULTS_DIR / "decode.json"),
                        help="JSON path; the PNG goes beside it")
    parser.add_argument("--part-output", help=argparse.SUPPRESS)  # one backend, used by gather
    args = parser.parse_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    decoders = [d for d in args.decoders.split(",") if d]
    for values, known, what in ((backends, BACKENDS, "backend"), (decoders, DECODERS, "decoder")):
        unknown = sorted(set(values) - set(known))
        if unknown:
            parser.error(f"unknown {what}(s) {unknown}; expected some of {known}")
    try:
        lengths = [int(x) for x in args.lengths.split(",") if x]
    except ValueError:
        parser.error(f"--lengths must be comma-separated integers. Received: {args.lengths!r}")
    if not lengths or min(lengths) < 1 or args.batch < 1 or args.rounds < 1:
        parser.error("--lengths, --batch and --rounds must be positive")
    if args.part_output:
        (backend,) = backends
        machine.write_json(args.part_output, run_backend(backend, decoders, lengths, args.batch, args.rounds))
        return
    gather(backends, decoders, lengths, args.batch, args.rounds, args.output)


if __name__ == "__main__":
    main()

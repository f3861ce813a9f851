"""Decoding speed of our Transformer against keras-hub and CTranslate2, on the same weights.

Decodes one fixed batch of random source sentences (the `small` and `base` presets
with random, seeded weights; 24 source tokens) for exactly L output steps, L in
`--lengths`, at batch 32 (throughput) and batch 1 (latency), and reports sentences/s
and output tokens/s (batch x L / seconds) on each Keras backend, with the process'
peak RSS while each decoder ran:

- ours, compiled as users decode (`compiled.CompiledDecoder`: XLA on TensorFlow,
  `jax.jit` on JAX, eager under `no_grad` on PyTorch), with `max_length=L`:
  `greedy` (key/value cache), `greedy_uncached` (reruns the decoder over the whole
  output buffer at every step) and `beam4` (cached, beam 4, length penalty 0.6). Our
  API has no uncached beam search, so there is no `beam4_uncached`. `beam4_before` is
  beam 4 as it ran before its first step ran on one row per sentence
  (`beam_decode_before`), side by side with today's.
- ours in Keras int8 (`ours_int8_*`): the same weights after `model.quantize("int8")`.
- CTranslate2 (`ct2_float32_*`, `ct2_int8_*`): the same weights exported by
  `keras_transformer.inference.ctranslate2_export` (made-up vocabulary pieces),
  decoded by `ctranslate2.Translator.translate_batch` with `--ct2-threads` threads
  (`min_decoding_length = max_decoding_length = L`, so it too runs L steps; beam 4
  with CTranslate2's own length penalty 0.6).
- keras-hub: the same configuration assembled from keras-hub layers (random weights
  of its own), generating as keras-hub's `BartSeq2SeqLM` does (`bench/peers.py`,
  `KerasHubGenerator`): encoder once, `TransformerDecoder` self/cross-attention caches,
  `GreedySampler` (`greedy`) or `BeamSampler(num_beams=4)` (`beam4`), compiled as
  `CausalLM.make_generate_function` does; `greedy_uncached` reruns the decoder stack
  over the whole prompt at every step.

The beam searches differ as algorithms (ours keeps finished hypotheses and applies the
length penalty; keras-hub's keeps the 4 most probable sequences) but all take L steps
over batch x 4 rows. Our decoders and keras-hub's may stop early once every sentence
has produced EOS; with random weights that practically never happens, and each result
records the longest output and says whether every step surely ran (`all_steps_ran`).

Before timing, it checks that the decoders do the work they claim: our cached greedy
output equals our uncached greedy output (exact ids), keras-hub's cached `next()`
gives the teacher-forced model's logits (within 1e-4) for the first steps, keras-hub's
cached greedy output equals its uncached one, and CTranslate2 float32's greedy output
equals ours on the first rows (the export carries the weights over). A failed check
stops the run.

Each decoder is called once untimed (tracing and compilation; its time is reported as
warm-up; ours on PyTorch as many times as a long job decodes one shape before that
shape's step is compiled by inductor), then `--rounds` interleaved rounds (one call of every decoder per round, so
all see the same background load); per decoder the fastest round counts. Wall and
process CPU time are both recorded. Peak RSS is sampled every 5 ms while a decoder
runs; it is the whole process' (every model built so far is in it), so compare it
between decoders of one preset, not as a footprint of one engine alone.

The real task (`--task-model-dir DIR`, a trained Multi30k model directory): translate
Multi30k test2016 (`--task-data-dir`, 1,000 sentences, beam 4) with `Translator` (float32,
and Keras int8), and `CTranslate2Translator` (float32 and int8, `--ct2-threads`
threads), timing each from construction (loading, compiling or converting included)
to the last sentence, with sacreBLEU against the references and the peak RSS. Without
a model directory the task is skipped and the JSON says so.

Usage (one command; a subprocess per backend, because KERAS_BACKEND must be set before
Keras is imported):

    .venv/bin/python bench/decode.py
    .venv/bin/python bench/decode.py --backends tensorflow --task-model-dir saved_models/multi30k
    .venv/bin/python bench/decode.py --quick        # a validation run: small, L=8, 1 round
    .venv/bin/python bench/decode.py --markdown bench/results/decode.json   # the table of docs/fast_inference.md

Writes bench/results/decode.json, decode.png (output tokens/s, log scale) and
decode.md (the table, as `--markdown` prints it).
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
    "ours_beam4_before",
    "ours_int8_greedy",
    "ours_int8_beam4",
    "ct2_float32_greedy",
    "ct2_float32_beam4",
    "ct2_int8_greedy",
    "ct2_int8_beam4",
    "keras_hub_greedy",
    "keras_hub_greedy_uncached",
    "keras_hub_beam4",
)
LABELS = {
    "ours_greedy": "ours greedy",
    "ours_greedy_uncached": "ours greedy, no cache",
    "ours_beam4": "ours beam 4",
    "ours_beam4_before": "ours beam 4, before",
    "ours_int8_greedy": "ours int8 greedy",
    "ours_int8_beam4": "ours int8 beam 4",
    "ct2_float32_greedy": "CTranslate2 greedy",
    "ct2_float32_beam4": "CTranslate2 beam 4",
    "ct2_int8_greedy": "CTranslate2 int8 greedy",
    "ct2_int8_beam4": "CTranslate2 int8 beam 4",
    "keras_hub_greedy": "keras-hub greedy",
    "keras_hub_greedy_uncached": "keras-hub greedy, no cache",
    "keras_hub_beam4": "keras-hub beam 4",
}
PRESETS = ("small", "base")
BATCHES = (32, 1)  # throughput, and latency
CT2_THREADS = 2
TASK_ENGINES = (
    "ours_float32", "ours_float32_early", "ours_float32_before", "ours_float32_early_before",
    "ours_int8", "ours_int8_early", "ct2_float32", "ct2_int8",
)
TASK_BEAM_SIZE = 4
TASK_LENGTH_PENALTY = 0.6  # the paper's, for every engine
RSS_SAMPLE_SECONDS = 0.005
SOURCE_LENGTH = 24
FIRST_ORDINARY_ID = 4  # ids 0-3 are pad, unk, bos, eos: sources hold real-token ids
LOGITS_TOLERANCE = 1e-4
LOGITS_CHECK_STEPS = 3
# Speed-up targets the project set, judged at the longest output length measured (64 by
# default), per preset and batch: "a/b" is b's time over a's, so >= 1 means a is faster.
TARGETS = {
    "ours_greedy/keras_hub_greedy": 1.5,
    "ours_greedy/ours_greedy_uncached": 5.0,
    "ours_greedy/ct2_float32_greedy": 1.0,
    "ours_beam4/ct2_float32_beam4": 1.0,
    "ours_int8_greedy/ours_greedy": 1.0,
    "ours_int8_beam4/ours_beam4": 1.0,
}


# ------------------------------------------------------------------ helpers
def source_batch(vocab_size, batch, length, seed=0):
    """int32 `[batch, length]`: random real-token ids ending with EOS, as sources are fed (no padding)."""
    from keras_transformer.special_tokens import EOS_ID

    rng = np.random.default_rng(seed)
    ids = rng.integers(FIRST_ORDINARY_ID, vocab_size, (batch, length), dtype=np.int32)
    ids[:, -1] = EOS_ID
    return ids


def output_lengths(rows, eos_id):
    """Per row of int `[R, L]` output ids: tokens up to and including the first EOS, else L."""
    rows = np.asarray(rows)
    has_eos = (rows == eos_id).any(axis=1)
    return np.where(has_eos, (rows == eos_id).argmax(axis=1) + 1, rows.shape[1])


class PeakRss:
    """Samples this process' resident memory in a thread while the block runs: `.peak` bytes."""

    def __enter__(self):
        import threading

        import psutil

        self._process = psutil.Process()
        self.peak = self._process.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self):
        while not self._stop.wait(RSS_SAMPLE_SECONDS):
            self.peak = max(self.peak, self._process.memory_info().rss)

    def __exit__(self, *exc_info):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._process.memory_info().rss)


def _timed(function, *args):
    """`(result, wall seconds, CPU seconds of this process, peak RSS bytes)` of `function(*args)`.

    On a machine shared with other work wall time grows with the load while CPU time
    mostly does not, so the two together show how much the load distorted a round.
    """
    with PeakRss() as rss:
        cpu, wall = time.process_time(), time.perf_counter()
        result = function(*args)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return result, wall, cpu, rss.peak


# ------------------------------------------------------------------ decoders
def ours_decoders(model, length, config, prefix="ours"):
    """Our compiled decoders for output length `length`: name -> `source -> (best, rows)`.

    `best` is int `[B, L]`, the output; `rows` every row whose end shows how many steps
    ran (for beam search the best hypotheses only, a lower bound). `prefix` "ours_int8"
    names the decoders of the quantized model (which has no uncached one here).
    """
    from keras import ops

    from keras_transformer.inference.compiled import CompiledDecoder
    from keras_transformer.inference.decoding import BEAM_SIZE, LENGTH_PENALTY

    compiled = {
        f"{prefix}_greedy": CompiledDecoder(model, "greedy", max_length=length),
        f"{prefix}_beam4": CompiledDecoder(
            model, "beam", beam_size=BEAM_SIZE, alpha=LENGTH_PENALTY, max_length=length
        ),
    }
    if prefix == "ours":
        compiled["ours_greedy_uncached"] = CompiledDecoder(model, "greedy_uncached", max_length=length)
        compiled["ours_beam4_before"] = before = CompiledDecoder(
            model, "beam", beam_size=BEAM_SIZE, alpha=LENGTH_PENALTY, max_length=length
        )
        before._decode = lambda encoder_inputs, inputs, model=None: beam_decode_before(
            model or before.model, encoder_inputs, **inputs, **before.decode_kwargs
        )

    def wrap(decoder):
        warmed_up = []

        def run(source):
            tokens = ops.convert_to_numpy(decoder(source)[0])  # to NumPy: the work is done
            steps = getattr(decoder, "captured_steps", None)
            if not warmed_up and steps is not None and steps.captures and steps.compiler is not None:
                # PyTorch's warm-up: the searches a long job runs before the shape's step
                # is compiled (COMPILE_AFTER steps), so the timed calls see what it runs.
                for _ in range(steps.compile_after // length + 1):
                    if steps.compiles:
                        break
                    decoder(source)
            warmed_up.append(True)
            return tokens, tokens

        return run

    return {name: wrap(decoder) for name, decoder in compiled.items()}


def beam_decode_before(model, encoder_inputs, beam_size, alpha, max_length=None, **kwargs):
    """`decoding.beam_decode` as it was before the first step ran before the beams' tiling.

    Every step, the first included, on the rows of the beams: the "before" of the table.
    """
    from keras import ops

    from keras_transformer.inference import decoding

    encoder_inputs = decoding._check_encoder_inputs(encoder_inputs)
    width, limits = decoding.decode_lengths(model, encoder_inputs, max_length, kwargs.pop("max_extra", 50))
    encoder_outputs, encoder_padding_mask = model.encode(encoder_inputs)
    self_caches, cross_caches = model.initial_cache(encoder_outputs, width)
    step_fn = decoding._cached_step_fn(
        model, decoding.tile_beams(cross_caches, beam_size), decoding.tile_beams(encoder_padding_mask, beam_size)
    )
    return decoding.beam_search(
        step_fn, self_caches, ops.shape(encoder_inputs)[0], width, beam_size=beam_size, alpha=alpha,
        sentence_max_lengths=limits, **kwargs,
    )


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


class _MadeUpVocabulary:
    """What `ctranslate2_export.transformer_spec` reads of a tokenizer, for random weights."""

    def __init__(self, vocab_size):
        from keras_transformer import special_tokens

        self.vocab_size = vocab_size
        self._special = [special_tokens.PAD_PIECE, special_tokens.UNK_PIECE, special_tokens.BOS_PIECE, special_tokens.EOS_PIECE]

    def id_to_piece(self, token_id):
        return self._special[token_id] if token_id < len(self._special) else f"t{token_id}"


def ct2_engines(model, directory, threads, decoders):
    """`{"float32": ctranslate2.Translator, "int8": ...}` of `model`'s weights, as requested."""
    import ctranslate2

    from keras_transformer.inference.ctranslate2_export import save_spec, transformer_spec

    kinds = sorted({name.split("_")[1] for name in decoders if name.startswith("ct2_")})
    if not kinds:
        return {}
    spec = transformer_spec(model, _MadeUpVocabulary(model.config.vocab_size))
    save_spec(spec, directory)  # float32 weights; int8 is CTranslate2's load-time quantization
    return {
        kind: ctranslate2.Translator(str(directory), device="cpu", compute_type=kind, inter_threads=1, intra_threads=threads)
        for kind in kinds
    }


def ct2_decoders(engines, length, vocab_size):
    """CTranslate2's decoders for `length` steps, as `ours_decoders` (ids as NumPy)."""
    from keras_transformer.inference.decoding import BEAM_SIZE, LENGTH_PENALTY

    vocabulary = _MadeUpVocabulary(vocab_size)
    pieces = [vocabulary.id_to_piece(i) for i in range(vocab_size)]
    index = {piece: i for i, piece in enumerate(pieces)}

    def make(engine, beam_size):
        def run(source):
            # The export adds the EOS the source ends with (`add_source_eos`).
            tokens = [[pieces[i] for i in row[:-1]] for row in np.asarray(source)]
            results = engine.translate_batch(
                tokens,
                beam_size=beam_size,
                length_penalty=LENGTH_PENALTY if beam_size > 1 else 0.0,
                max_decoding_length=length,
                min_decoding_length=length,  # L steps, as the other decoders take
                max_input_length=0,
            )
            ids = np.zeros((len(results), length), np.int32)
            for row, result in enumerate(results):
                hypothesis = [index[piece] for piece in result.hypotheses[0]]
                ids[row, : len(hypothesis)] = hypothesis
            return ids, ids

        return run

    decoders = {}
    for kind, engine in engines.items():
        decoders[f"ct2_{kind}_greedy"] = make(engine, 1)
        decoders[f"ct2_{kind}_beam4"] = make(engine, BEAM_SIZE)
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
def build_models(config, decoders):
    """`(ours, ours in int8 or None, keras-hub peer or None)`, random weights from seed 0."""
    import warnings

    import keras

    from bench.peers import build_keras_hub_transformer
    from keras_transformer.model.transformer import build_transformer

    keras.utils.set_random_seed(0)
    ours = build_transformer(config)
    int8 = None
    if any(name.startswith("ours_int8") for name in decoders):
        int8 = build_transformer(config)
        int8.set_weights(ours.get_weights())  # the same weights, then quantized
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Keras names the layers it leaves in float
            int8.quantize("int8")
    peer = None
    if any(name.startswith("keras_hub") for name in decoders):
        keras.utils.set_random_seed(0)
        peer = build_keras_hub_transformer(config)
    return ours, int8, peer


def run_backend(backend, decoders, presets, batches, lengths, rounds, ct2_threads):
    """Checks and times every decoder at every preset, batch and length; a JSON-ready dict."""
    import tempfile

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
    results = {"backend": backend, "presets": {}}
    for preset in presets:
        config = TransformerConfig.from_preset(preset, dtype_policy="float32")
        ours, int8, peer = build_models(config, decoders)
        generator = KerasHubGenerator(peer, config) if peer is not None else None
        with tempfile.TemporaryDirectory() as folder:
            engines = ct2_engines(ours, pathlib.Path(folder) / "ct2", ct2_threads, decoders)
            checks = {}
            if generator is not None:
                source_np = source_batch(config.vocab_size, 2, SOURCE_LENGTH)
                worst = check_keras_hub_cache(generator, peer, source_np)
                checks["keras_hub_cached_logits_max_abs_difference"] = worst
                print(f"[{backend}/{preset}] keras-hub cached logits match the full model (max |diff| {worst:.2g})", flush=True)
            by_batch = {}
            for batch in batches:
                source_np = source_batch(config.vocab_size, batch, SOURCE_LENGTH)
                source = ops.convert_to_tensor(source_np)  # once: conversion is not decoding time
                runners = build_runners(ours, int8, generator, engines, config, decoders, lengths)
                warmup, outputs, rows = {}, {}, {}
                for key, run in runners.items():
                    (outputs[key], rows[key]), warmup[key], _, _ = _timed(run, source)
                    print(f"[{backend}/{preset}/batch {batch}] warm-up {key[1]} L={key[0]}: {warmup[key]:.1f} s", flush=True)
                checks.update(check_cache_changes_nothing(outputs, decoders, lengths, batch))
                checks.update(check_ct2_equals_ours(outputs, decoders, lengths, batch))
                wall, cpu, rss = time_rounds(runners, source, rounds)
                by_length = {}
                for length in lengths:
                    entry = {}
                    for name in decoders:
                        key = (length, name)
                        entry[name] = _result(wall[key], cpu[key], rss[key], warmup[key], rows[key], batch, length)
                    entry_ratios = ratios(entry)
                    by_length[str(length)] = {"decoders": entry, "ratios": entry_ratios}
                    _print_length(f"{backend}/{preset}/batch {batch}", length, entry, entry_ratios)
                by_batch[str(batch)] = {"lengths": by_length}
            results["presets"][preset] = {"checks": checks, "batches": by_batch}
        del ours, int8, peer, generator, engines
    return results


def build_runners(ours, int8, generator, engines, config, decoders, lengths):
    """`{(length, name): run}` for the requested decoders at every length."""
    runners = {}
    for length in lengths:
        available = {}
        if any(name.startswith("ours_") and not name.startswith("ours_int8") for name in decoders):
            available.update(ours_decoders(ours, length, config))
        if int8 is not None:
            available.update(ours_decoders(int8, length, config, prefix="ours_int8"))
        if generator is not None:
            available.update(keras_hub_decoders(generator, length, config))
        if engines:
            available.update(ct2_decoders(engines, length, config.vocab_size))
        for name in decoders:
            runners[length, name] = available[name]
    return runners


def check_cache_changes_nothing(outputs, decoders, lengths, batch):
    """Fails unless each side's cached greedy output equals its uncached one (where both ran)."""
    checks = {}
    for length in lengths:
        by_name = {name: outputs[length, name] for name in decoders}
        for cached, uncached in (
            ("ours_greedy", "ours_greedy_uncached"),
            ("keras_hub_greedy", "keras_hub_greedy_uncached"),
        ):
            if check_same_tokens(by_name, cached, uncached, length):
                checks[f"{cached} == {uncached} (L={length}, batch {batch})"] = True
    return checks


def check_ct2_equals_ours(outputs, decoders, lengths, batch, rows=2):
    """Fails unless CTranslate2 float32 greedy gives our greedy ids on the first rows.

    Only up to the first EOS or PAD/BOS of ours (CTranslate2 here is made to run all L
    steps, and does not remove PAD and BOS: random weights pick them): the prefix
    before either is the same search on the same weights.
    """
    checks = {}
    if "ours_greedy" not in decoders or "ct2_float32_greedy" not in decoders:
        return checks
    for length in lengths:
        ours, theirs = outputs[length, "ours_greedy"], outputs[length, "ct2_float32_greedy"]
        for row in range(min(rows, len(ours))):
            stop = next((t for t, token in enumerate(ours[row]) if token in (0, 2, 3)), length)
            stop = min(stop, next((t for t, token in enumerate(theirs[row]) if token in (0, 2, 3)), length))
            if stop and not np.array_equal(ours[row, :stop], theirs[row, :stop]):
                raise RuntimeError(
                    f"CTranslate2 float32 greedy differs from ours at L={length}, row {row}: "
                    f"{theirs[row, :stop].tolist()} vs {ours[row, :stop].tolist()}"
                )
        checks[f"ct2_float32_greedy == ours_greedy, first {rows} rows (L={length}, batch {batch})"] = True
    return checks


def time_rounds(runners, source, rounds):
    """Interleaved rounds, one call of every runner per round: `(wall, cpu, peak rss)` per key."""
    wall = {key: [] for key in runners}
    cpu = {key: [] for key in runners}
    rss = {key: 0 for key in runners}
    for _ in range(rounds):
        for key, run in runners.items():
            _, seconds, cpu_seconds, peak = _timed(run, source)
            wall[key].append(seconds)
            cpu[key].append(cpu_seconds)
            rss[key] = max(rss[key], peak)
    return wall, cpu, rss


def _result(wall, cpu, rss, warmup, rows, batch, length):
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
        "peak_rss_mb": round(rss / 2**20, 1),
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
        ("ours_greedy", "ct2_float32_greedy"),
        ("ours_beam4", "ct2_float32_beam4"),
        ("ours_greedy", "ct2_int8_greedy"),
        ("ours_beam4", "ct2_int8_beam4"),
        ("ours_int8_greedy", "ours_greedy"),
        ("ours_int8_beam4", "ours_beam4"),
        ("ours_beam4", "ours_beam4_before"),
        ("ours_beam4_before", "ct2_float32_beam4"),
    )
    return {
        f"{a}/{b}": entry[b]["seconds_best"] / entry[a]["seconds_best"]
        for a, b in pairs
        if a in entry and b in entry
    }


def _print_length(where, length, entry, entry_ratios):
    print(f"[{where}] output length {length}:", flush=True)
    for name, m in entry.items():
        note = "" if m["all_steps_ran"] else f"  (stopped early? longest output {m['longest_output']})"
        print(
            f"    {LABELS[name]:<28} {m['sentences_per_second']:>8.1f} sent/s {m['tokens_per_second']:>9,.0f} tok/s"
            f"  RSS {m['peak_rss_mb']:7.0f} MB  warm-up {m['warmup_seconds']:6.1f} s"
            f"  (rounds: {', '.join(f'{t:.3f}' for t in m['seconds_all_rounds'])} s){note}",
            flush=True,
        )
    for key, value in entry_ratios.items():
        print(f"    {key}: {value:.2f}x", flush=True)


# ------------------------------------------------------------------ the real task
def run_task(backend, model_dir, data_dir, source_lang, target_lang, limit, ct2_threads, engines, rounds):
    """Multi30k test2016 with beam 4 through each engine: seconds from construction, BLEU, RSS.

    Every engine searches with beam 4 and the paper's length penalty 0.6 (whatever search
    the model directory saved). `ours_*_early` stop a sentence by CTranslate2's rule
    (`early_stopping=True`), the others by ours (no alive hypothesis can still win).
    `ours_*_before` decode as `Translator` did before this release's changes (64
    sentences a batch, `beam_decode_before`, no persistent compilation cache).
    Each engine is timed from construction to the last sentence (ours: its compilations
    included; on JAX into an empty persistent compilation cache), then again in
    `rounds` interleaved rounds (every engine once a round; the fastest counts), and
    each of ours once more as a new translator (on JAX, its programs read back from
    that cache).
    """
    import shutil
    import tempfile
    import warnings

    folder = tempfile.mkdtemp(prefix="decode-task-")
    os.environ["KERAS_TRANSFORMER_CACHE"] = str(pathlib.Path(folder) / "cache")  # JAX's cache starts empty

    from keras_transformer.inference.ctranslate2_export import export_ctranslate2
    from keras_transformer.inference.ctranslate2_translator import CTranslate2Translator
    from keras_transformer.inference.evaluation import score_translations
    from keras_transformer.inference.translator import Translator
    from keras_transformer.model.directory import load_model_and_tokenizer

    _, tokenizer = load_model_and_tokenizer(model_dir)  # to count target tokens
    data_dir = pathlib.Path(data_dir)
    sources = (data_dir / f"test_2016_flickr.{source_lang}").read_text(encoding="utf-8").splitlines()[:limit]
    references = (data_dir / f"test_2016_flickr.{target_lang}").read_text(encoding="utf-8").splitlines()[:limit]
    search = {"beam_size": TASK_BEAM_SIZE, "length_penalty": TASK_LENGTH_PENALTY}
    translations = {}

    def ours(int8=False, early_stopping=False, before=False):
        def make():
            model, tokenizer = load_model_and_tokenizer(model_dir)
            if int8:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    model.quantize("int8")
            if not before:
                return Translator(model, tokenizer=tokenizer, early_stopping=early_stopping, **search)
            # As Translator decoded before: 64 sentences a batch, the first step on every
            # beam's row, no persistent compilation cache.
            translator = Translator(
                model, tokenizer=tokenizer, early_stopping=early_stopping, batch_size=64, compilation_cache=False, **search
            )
            decoder = translator.decoder
            decoder._decode = lambda encoder_inputs, inputs, model=None: beam_decode_before(
                model or decoder.model, encoder_inputs, **inputs, **decoder.decode_kwargs
            )
            return translator

        return make

    exported = {}
    if any(name.startswith("ct2") for name in engines):  # a one-off step, timed apart
        started = time.perf_counter()
        exported["dir"] = export_ctranslate2(model_dir, pathlib.Path(folder) / "ct2")
        exported["seconds"] = round(time.perf_counter() - started, 2)

    def ct2(kind):
        return lambda: CTranslate2Translator(exported["dir"], compute_type=kind, intra_threads=ct2_threads, **search)

    makers = {
        "ours_float32": ours(),
        "ours_float32_early": ours(early_stopping=True),
        "ours_float32_before": ours(before=True),
        "ours_float32_early_before": ours(early_stopping=True, before=True),
        "ours_int8": ours(int8=True),
        "ours_int8_early": ours(int8=True, early_stopping=True),
        "ct2_float32": ct2("float32"),
        "ct2_int8": ct2("int8"),
    }
    results, translators = {}, {}
    try:
        for name in engines:  # first calls: construction, compilation and one pass
            def translate(make=makers[name]):
                translators[name] = make()
                return translators[name].translate(sources)

            hypotheses, wall, cpu, rss = _timed(translate)
            scores = score_translations(hypotheses, references)
            target_tokens = sum(len(ids) + 1 for ids in tokenizer.encode(hypotheses))  # with EOS
            results[name] = {
                "seconds": round(wall, 2),
                "cpu_seconds": round(cpu, 2),
                "sentences_per_second": len(sources) / wall,
                "bleu": scores["bleu"],
                "chrf": scores["chrf"],
                "peak_rss_mb": round(rss / 2**20, 1),
                "target_tokens": target_tokens,
                "target_tokens_per_second": target_tokens / wall,
                "repeat_seconds_all_rounds": [],
            }
            print(f"[{backend}/task] {name:<18} first call {wall:7.1f} s  BLEU {scores['bleu']:.2f}  RSS {rss / 2**20:6.0f} MB", flush=True)
            translations[name] = hypotheses
        for _ in range(rounds):  # interleaved: every engine once a round, compiled
            for name in engines:
                again, wall, _, _ = _timed(translators[name].translate, sources)
                if again != translations[name]:
                    raise RuntimeError(f"{name}: a second pass of the same translator translated differently.")
                results[name]["repeat_seconds_all_rounds"].append(round(wall, 2))
        for name in engines:
            m = results[name]
            m["repeat_seconds"] = min(m["repeat_seconds_all_rounds"])
            if name.startswith("ours"):
                m["compilation_seconds"] = round(m["seconds"] - m["repeat_seconds"], 2)
                translators.pop(name)
                fresh, m["new_translator_seconds"], _, _ = _timed(lambda: makers[name]().translate(sources))
                if fresh != translations[name]:
                    raise RuntimeError(f"{name}: a new translator translated differently.")
            print(
                f"[{backend}/task] {name:<18} first {m['seconds']:7.1f} s, best of {rounds} again "
                f"{m['repeat_seconds']:6.1f} s, new translator {m.get('new_translator_seconds', float('nan')):6.1f} s",
                flush=True,
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return {
        "model_dir": str(model_dir),
        "sentences": len(sources),
        "direction": f"{source_lang}-{target_lang}",
        "beam_size": TASK_BEAM_SIZE,
        "length_penalty": TASK_LENGTH_PENALTY,
        "ct2_export_seconds": exported.get("seconds"),
        "rounds": rounds,
        "load_average_1min_at_end": machine.load_average(),
        "engines": results,
    }


# ------------------------------------------------------------------ all backends
def gather(backends, decoders, presets, batches, lengths, rounds, ct2_threads, task, output):
    """Runs one subprocess per backend, merges their results, writes JSON, PNG and markdown."""
    start_load = machine.load_average()
    arguments = [
        "--decoders", ",".join(decoders),
        "--presets", ",".join(presets),
        "--batches", ",".join(map(str, batches)),
        "--lengths", ",".join(map(str, lengths)),
        "--rounds", str(rounds),
        "--ct2-threads", str(ct2_threads),
    ]
    if task["model_dir"]:
        arguments += [
            "--task-model-dir", task["model_dir"],
            "--task-data-dir", task["data_dir"],
            "--task-languages", f"{task['source_lang']}-{task['target_lang']}",
            "--task-limit", str(task["limit"]),
            "--task-engines", ",".join(task["engines"]),
        ]
    parts, failures = machine.run_per_backend(__file__, backends, arguments)
    info = machine.machine_info()
    info["load_average_1min_at_start"] = start_load
    payload = {
        "benchmark": "decode",
        "command": " ".join([pathlib.Path(sys.executable).name] + sys.argv),
        "dtype": "float32 (int8 where named)",
        "presets": list(presets),
        "batches": list(batches),
        "source_length": SOURCE_LENGTH,
        "rounds": rounds,
        "ct2_threads": ct2_threads,
        "tokens_per_second": "batch x output length / best round's wall seconds",
        "notes": [
            "Random weights (seed 0); ours, ours int8 and CTranslate2 share them (int8: "
            "the same weights quantized); keras-hub has its own of the same shapes.",
            "Our API has no uncached beam search: no ours_beam4_uncached.",
            "keras-hub beam 4 has no length penalty and no finished-hypothesis set; ours "
            "applies alpha=0.6 (paper 6.1), CTranslate2 its own length_penalty=0.6. All run "
            "L steps over batch x 4 rows (CTranslate2 with min_decoding_length = L).",
            "all_steps_ran is True when some output (best hypotheses, for beams) reached L "
            "tokens without an earlier EOS, which proves the loop ran all L steps.",
            "peak_rss_mb is the whole process' peak while the decoder ran (every model of "
            "the preset is loaded in it).",
        ],
        "targets": TARGETS,
        "machine": info,
        "failed_backends": failures,
        "backends": parts,
    }
    if not task["model_dir"]:
        payload["task"] = (
            "skipped: no --task-model-dir (a trained Multi30k model directory; "
            "`kt-train --config training/configs/multi30k.toml` makes one in about 45 minutes)"
        )
    payload["target_verdicts"] = target_verdicts(parts, max(lengths))
    machine.write_json(output, payload)
    _plot(payload, pathlib.Path(output).with_suffix(".png"), decoders)
    markdown = markdown_table(payload)
    pathlib.Path(output).with_suffix(".md").write_text(markdown, encoding="utf-8")
    _print_summary(payload)
    print("\n" + markdown)
    return payload


def _entries(parts):
    """`(backend, preset, batch, length, entry)` of every measured length."""
    for backend, part in parts.items():
        for preset, by_preset in part["presets"].items():
            for batch, by_batch in by_preset["batches"].items():
                for length, entry in by_batch["lengths"].items():
                    yield backend, preset, batch, length, entry


def target_verdicts(parts, length):
    """Per backend/preset/batch and target ratio: `{"ratio", "target", "met"}` at `length`."""
    verdicts = {}
    for backend, preset, batch, measured_length, entry in _entries(parts):
        if measured_length != str(length):
            continue
        measured = entry["ratios"]
        verdicts[f"{backend}/{preset}/batch {batch}"] = {
            key: {"ratio": measured[key], "target": target, "met": measured[key] >= target}
            for key, target in TARGETS.items()
            if key in measured
        }
    return verdicts


def _plot(payload, path, decoders):
    groups, series = [], {LABELS[name]: [] for name in decoders}
    for backend, preset, batch, length, entry in _entries(payload["backends"]):
        groups.append(f"{preset} b={batch}\nL={length} {backend}")
        for name in decoders:
            m = entry["decoders"].get(name)
            series[LABELS[name]].append(m and m["tokens_per_second"])
    info = payload["machine"]
    machine.grouped_bar_chart(
        path,
        f"Decoding speed on the same weights (output tokens/s, higher is better; CTranslate2 {payload['ct2_threads']} threads)",
        "output tokens / s",
        groups,
        series,
        note=(
            f"{info['cpu_model']}, {info['usable_cores']} cores, load {info['load_average_1min_at_start']}"
            f"->{info['load_average_1min']}; keras {info['versions']['keras']}, "
            f"keras-hub {info['versions'].get('keras-hub')}"
        ),
        log_scale=True,
    )


def markdown_table(payload):
    """The markdown table (docs/fast_inference.md): one row per decoder and setting, then the real task, then the targets."""
    info = payload["machine"]
    lines = [
        f"<!-- produced by bench/decode.py from {payload['command']!r} -->",
        f"Machine: {info['cpu_model']}, {info['usable_cores']} cores, load "
        f"{info['load_average_1min_at_start']}->{info['load_average_1min']}; keras "
        f"{info['versions']['keras']}, CTranslate2 {payload['ct2_threads']} threads.",
        "",
        "| preset | batch | L | backend | decoder | sentences/s | target tokens/s | peak RSS (MB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for backend, preset, batch, length, entry in _entries(payload["backends"]):
        for name, m in entry["decoders"].items():
            engine = "-" if name.startswith("ct2") else backend
            lines.append(
                f"| {preset} | {batch} | {length} | {engine} | {LABELS[name]} | "
                f"{m['sentences_per_second']:,.1f} | {m['tokens_per_second']:,.0f} | {m['peak_rss_mb']:,.0f} |"
            )
    tasks = {backend: part["task"] for backend, part in payload["backends"].items() if part.get("task")}
    if tasks:
        lines += [
            "",
            "| Multi30k test2016, beam 4 | backend | first call, s (compilation included) | of it compilation, s | again, s (best round) | new translator, s | CTranslate2 float32 / this: first call | again | BLEU | peak RSS (MB) |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for backend, task in tasks.items():
            reference = task["engines"].get("ct2_float32", {})
            for name, m in task["engines"].items():
                engine = "-" if name.startswith("ct2") else backend
                extra = [
                    f"{m[key]:.1f}" if key in m else "-"
                    for key in ("compilation_seconds", "repeat_seconds", "new_translator_seconds")
                ]
                ratios = [
                    f"{reference[key] / m[key]:.2f}x" if key in reference and key in m else "-"
                    for key in ("seconds", "repeat_seconds")
                ]
                lines.append(
                    f"| {name} | {engine} | {m['seconds']:.1f} | {' | '.join(extra)} | {' | '.join(ratios)} | "
                    f"{m['bleu']:.2f} | {m['peak_rss_mb']:,.0f} |"
                )
    else:
        lines += ["", f"Multi30k test2016: {payload.get('task', 'not run')}."]
    lines += ["", "| target | setting | ratio | met |", "|---|---|---|---|"]
    for setting, verdicts in payload["target_verdicts"].items():
        for key, verdict in verdicts.items():
            lines.append(f"| {key} >= {verdict['target']} | {setting} | {verdict['ratio']:.2f}x | {'yes' if verdict['met'] else 'no'} |")
    return "\n".join(lines) + "\n"


def _print_summary(payload):
    print("\nSummary (speed ratios, same run):")
    for backend, preset, batch, length, entry in _entries(payload["backends"]):
        text = ", ".join(f"{k} {v:.2f}x" for k, v in entry["ratios"].items())
        print(f"  {backend:<10} {preset:<5} batch {batch:<3} L={length:<3} {text}")
    for setting, verdicts in payload["target_verdicts"].items():
        for key, verdict in verdicts.items():
            print(
                f"  target {setting:<28} {key} >= {verdict['target']}x: "
                f"{verdict['ratio']:.2f}x, {'met' if verdict['met'] else 'NOT met'}"
            )
    if payload["failed_backends"]:
        print(f"  failed backends: {payload['failed_backends']}")


def _int_list(parser, name, text):
    try:
        values = [int(x) for x in text.split(",") if x]
    except ValueError:
        parser.error(f"--{name} must be comma-separated integers. Received: {text!r}")
    if not values or min(values) < 1:
        parser.error(f"--{name} must be positive integers. Received: {text!r}")
    return values


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated Keras backends")
    parser.add_argument("--decoders", default=",".join(DECODERS), help=f"comma-separated, from {DECODERS}")
    parser.add_argument("--presets", default=",".join(PRESETS), help="comma-separated model presets")
    parser.add_argument("--batches", default=",".join(map(str, BATCHES)), help="comma-separated batch sizes")
    parser.add_argument("--lengths", default="64", help="comma-separated output lengths (decoding steps)")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per decoder (best counts)")
    parser.add_argument("--ct2-threads", type=int, default=CT2_THREADS, help="CTranslate2 intra_threads")
    parser.add_argument("--task-model-dir", help="a trained Multi30k model directory: run the real task")
    parser.add_argument("--task-data-dir", default="../shared/data/multi30k", help="Multi30k raw text files")
    parser.add_argument("--task-languages", help="SRC-TGT of the task (default: the model's config.toml, else de-en)")
    parser.add_argument("--task-limit", type=int, default=1000, help="test2016 sentences to translate")
    parser.add_argument("--task-engines", default=",".join(TASK_ENGINES), help=f"comma-separated, from {TASK_ENGINES}")
    parser.add_argument("--quick", action="store_true", help="a validation run: small, batches 4 and 1, L=8, 1 round, 20 task sentences")
    parser.add_argument("--markdown", metavar="JSON", help="print the markdown table of a results file and exit")
    parser.add_argument("--output", default=str(machine.RESULTS_DIR / "decode.json"),
                        help="JSON path; the PNG and the markdown table go beside it")
    parser.add_argument("--part-output", help=argparse.SUPPRESS)  # one backend, used by gather
    args = parser.parse_args(argv)
    if args.markdown:
        import json

        print(markdown_table(json.loads(pathlib.Path(args.markdown).read_text())))
        return
    if args.quick:
        args.presets, args.batches, args.lengths, args.rounds = "small", "4,1", "8", 1
        args.task_limit = min(args.task_limit, 20)
    backends = [b for b in args.backends.split(",") if b]
    decoders = [d for d in args.decoders.split(",") if d]
    presets = [p for p in args.presets.split(",") if p]
    engines = [e for e in args.task_engines.split(",") if e]
    for values, known, what in (
        (backends, BACKENDS, "backend"),
        (decoders, DECODERS, "decoder"),
        (presets, ("tiny", "small", "base", "big"), "preset"),
        (engines, TASK_ENGINES, "task engine"),
    ):
        unknown = sorted(set(values) - set(known))
        if unknown:
            parser.error(f"unknown {what}(s) {unknown}; expected some of {known}")
    lengths = _int_list(parser, "lengths", args.lengths)
    batches = _int_list(parser, "batches", args.batches)
    if args.rounds < 1 or args.ct2_threads < 1 or args.task_limit < 1:
        parser.error("--rounds, --ct2-threads and --task-limit must be positive")
    task = {"model_dir": args.task_model_dir, "data_dir": args.task_data_dir, "limit": args.task_limit, "engines": engines}
    if args.task_model_dir:
        if not os.path.isfile(os.path.join(args.task_model_dir, "model.keras")):
            parser.error(f"--task-model-dir {args.task_model_dir!r} holds no model.keras")
        task["source_lang"], task["target_lang"] = _task_languages(args.task_languages, args.task_model_dir)
    if args.part_output:
        (backend,) = backends
        part = run_backend(backend, decoders, presets, batches, lengths, args.rounds, args.ct2_threads)
        if args.task_model_dir:
            part["task"] = run_task(
                backend, args.task_model_dir, args.task_data_dir, task["source_lang"], task["target_lang"],
                args.task_limit, args.ct2_threads, engines, args.rounds,
            )
        machine.write_json(args.part_output, part)
        return
    gather(backends, decoders, presets, batches, lengths, args.rounds, args.ct2_threads, task, args.output)


def _task_languages(given, model_dir):
    """`(source, target)` from "SRC-TGT", else the model directory's config.toml, else de-en."""
    if given:
        source, _, target = given.partition("-")
        return source, target
    path = pathlib.Path(model_dir) / "config.toml"
    if path.is_file():
        import tomllib

        values = tomllib.loads(path.read_text(encoding="utf-8"))
        return values.get("source_lang", "de"), values.get("target_lang", "en")
    return "de", "en"


if __name__ == "__main__":
    main()

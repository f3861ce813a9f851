"""Translation memory (kNN-MT): keys are the teacher-forced states, the step mixes exactly.

The memory's distribution is checked on hand-computed numbers; its keys against the
model's own teacher-forced states; the cached step's states against the full decoder's;
the mixed teacher-forced log-probabilities against a NumPy kNN over the same keys; and,
end to end, an untrained model with a memory of three pairs translates them exactly,
eagerly and compiled, while weight 0 decodes as the model alone.
"""

import json
import math

import keras
import numpy as np
import pytest
from conftest import SpaceTokenizer, once_on, tiny_config, to_numpy
from tiny_translation import BATCH_SIZE, make_tiny_model_dir, pick_sentences

import keras_transformer as kt
from keras_transformer.inference import decoding
from keras_transformer.inference.compiled import CompiledDecoder
from keras_transformer.inference.memory import nearest_neighbor_log_probs, piece_idf, search_keys
from keras_transformer.model.directory import load_model_and_tokenizer
from keras_transformer.train.run_config import RunConfig
from keras_transformer.special_tokens import BOS_ID, EOS_ID

SOURCES = ["5 6 7 8", "9 10 11", "12 13 14 15 16"]
TARGETS = ["20 21 22 23 24", "25 26 27", "29 30 31 28"]
ENCODER_INPUTS = np.array([[5, 6, 7, 8, 3, 0], [9, 10, 11, 3, 0, 0], [12, 13, 14, 15, 16, 3]], "int32")


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(5)
    return kt.build_transformer(tiny_config(d_model=32, num_heads=4, d_ff=64, num_decoder_layers=2))


@pytest.fixture(scope="module")
def memory(model):
    return kt.build_translation_memory(model, SpaceTokenizer(), SOURCES, TARGETS, batch_size=2)


def test_the_memory_distribution_is_computed_by_hand():
    keys = np.array([[0, 0], [1, 0], [0, 2], [3, 3]], "float32")
    values = np.array([4, 4, 5, 6], "int32")
    log_p = to_numpy(nearest_neighbor_log_probs(
        keras.ops.array([[0.0, 0.0], [3.0, 2.0]]), search_keys(keys), values, 8, 3, 2.0
    ))
    # Row 0: squared distances 0, 1, 4 (the fourth key, 18, is not among the 3 nearest).
    z = 1 + math.exp(-0.5) + math.exp(-2)
    expected = np.zeros((2, 8))
    expected[0, 4], expected[0, 5] = (1 + math.exp(-0.5)) / z, math.exp(-2) / z
    # Row 1: distances 13, 8, 9, 1 -> keys 3, 1, 2: values 6, 4, 5.
    z = 1 + math.exp(-3.5) + math.exp(-4)
    expected[1, 6], expected[1, 4], expected[1, 5] = 1 / z, math.exp(-3.5) / z, math.exp(-4) / z
    np.testing.assert_allclose(np.exp(log_p), expected, atol=1e-6)
    assert np.isneginf(log_p[0, 6]) and np.isneginf(log_p[1, 0])


def test_keys_are_the_teacher_forced_states_and_values_the_next_tokens(model, memory):
    assert len(memory) == sum(len(t.split()) + 1 for t in TARGETS) and memory.skipped == 0
    encoder_outputs, mask = model.encode(ENCODER_INPUTS)
    targets = SpaceTokenizer().encode(TARGETS)
    decoder_inputs = np.zeros((3, 6), "int32")
    for row, target in enumerate(targets):
        decoder_inputs[row, : len(target) + 1] = [BOS_ID] + target
    _, states = model.decode(decoder_inputs, encoder_outputs, mask, return_states=True)
    states = to_numpy(states)
    for row, target in enumerate(targets):
        for position, token in enumerate(target + [EOS_ID]):
            matches = np.abs(memory.keys - states[row, position]).max(axis=1) < 1e-5
            assert matches.sum() == 1 and memory.values[matches][0] == token


def test_the_cached_step_returns_the_teacher_forced_states(model):
    encoder_outputs, mask = model.encode(ENCODER_INPUTS)
    decoder_inputs = np.array([[BOS_ID, 20, 21, 22], [BOS_ID, 25, 26, 27], [BOS_ID, 29, 30, 31]], "int32")
    logits, states = model.decode(decoder_inputs, encoder_outputs, mask, return_states=True)
    self_caches, cross_caches = model.initial_cache(encoder_outputs, 4)
    for index in range(4):
        step_logits, self_caches, step_states = model.decode_step(
            decoder_inputs[:, index : index + 1], index, self_caches, cross_caches, mask, return_states=True
        )
        np.testing.assert_allclose(to_numpy(step_states), to_numpy(states)[:, index], atol=1e-5)
        np.testing.assert_allclose(to_numpy(step_logits), to_numpy(logits)[:, index], atol=1e-4)


@pytest.mark.parametrize("distance_scale", [None, 3.0])
def test_mixed_log_probs_are_the_interpolation_of_model_and_memory(model, memory, distance_scale):
    mixed_model = kt.MemoryModel(model, memory, neighbors=3, temperature=0.5, weight=0.25,
                                 distance_scale=distance_scale)
    encoder_outputs, mask = model.encode(ENCODER_INPUTS)
    decoder_inputs = np.array([[BOS_ID, 20, 21], [BOS_ID, 25, 7], [BOS_ID, 9, 30]], "int32")
    mixed = to_numpy(mixed_model.decode(decoder_inputs, encoder_outputs, mask))
    logits, states = model.decode(decoder_inputs, encoder_outputs, mask, return_states=True)
    logits, states = to_numpy(logits).astype("float64"), to_numpy(states).astype("float64")
    model_probs = np.exp(logits - logits.max(-1, keepdims=True))
    model_probs /= model_probs.sum(-1, keepdims=True)
    keys = memory.keys.astype("float64")
    expected = np.zeros_like(model_probs)
    for row in range(3):
        for position in range(3):
            distances = ((keys - states[row, position]) ** 2).sum(1)
            nearest = np.argsort(distances)[:3]
            weights = np.exp(-(distances[nearest] - distances[nearest].min()) / 0.5)
            memory_probs = np.zeros(model_probs.shape[-1])
            np.add.at(memory_probs, memory.values[nearest], weights / weights.sum())
            # The share falls with the nearest key's squared distance when a scale is set.
            share = 0.25 if distance_scale is None else 0.25 * np.exp(-distances.min() / distance_scale)
            expected[row, position] = share * memory_probs + (1 - share) * model_probs[row, position]
    np.testing.assert_allclose(np.exp(mixed), expected, atol=1e-5)


def test_the_pair_index_names_each_pairs_keys_and_its_source(memory):
    targets, sources = SpaceTokenizer().encode(TARGETS), SpaceTokenizer().encode(SOURCES)
    assert sorted(memory.pair_lengths.tolist()) == sorted(len(t) + 1 for t in targets)
    assert memory.pair_starts.tolist() == np.concatenate([[0], np.cumsum(memory.pair_lengths)[:-1]]).tolist()
    for start, length, source in zip(memory.pair_starts, memory.pair_lengths, memory.pair_sources):
        row = [target + [EOS_ID] for target in targets].index(memory.values[start : start + length].tolist())
        assert source.tolist() == sources[row]  # the pair's own source


def test_the_pair_search_ranks_pairs_by_tf_idf_cosine(model):
    # Pieces 5 and 6 are in all three sources, 7 in one: idf log(4 / 4) + 1 = 1 and log(4 / 2) + 1.
    sources = [[5, 6, 7], [5, 6], [6, 5, 5]]
    idf = piece_idf(sources, 32)
    np.testing.assert_allclose(idf[[5, 6, 7, 9]], [1, 1, math.log(2) + 1, math.log(4) + 1], rtol=1e-6)
    assert not idf[[0, BOS_ID, EOS_ID]].any()
    # The query "5 7" has the TF-IDF vector (1, 0, a) over pieces (5, 6, 7), a = log 2 + 1;
    # the pairs' are (1, 1, a), (1, 1, 0) and (2, 1, 0).
    a = math.log(2) + 1
    n = math.sqrt(1 + a * a)
    cosines = [(1 + a * a) / (n * math.sqrt(2 + a * a)), 1 / (n * math.sqrt(2)), 2 / (n * math.sqrt(5))]
    order = np.argsort(cosines)[::-1]
    assert order.tolist() == [0, 2, 1]
    rng = np.random.default_rng(1)
    memory = kt.TranslationMemory(rng.normal(size=(3, 32)), [11, 12, 13], 32, pair_lengths=[1, 1, 1],
                                  pair_sources=sources)
    for pairs in (1, 2, 3):
        _, values = kt.MemoryModel(model, memory, pairs=pairs).candidates(keras.ops.array([[5, 7, EOS_ID, 0]]))
        assert to_numpy(values)[0, :pairs].tolist() == [11 + p for p in order[:pairs]]


def test_the_pair_search_reads_each_sentences_nearest_pairs_keys(model, memory):
    # pairs=1: each sentence's nearest stored source is its own; the rest of the slots are empty.
    one = kt.MemoryModel(model, memory, neighbors=2, pairs=1)
    assert one.slots == 6  # min(1 * longest 6, max(6, ceil(2 * 1 * mean 5)))
    keys, values = (to_numpy(x) for x in one.candidates(ENCODER_INPUTS))
    for row, target in enumerate(SpaceTokenizer().encode(TARGETS)):
        own = target + [EOS_ID]
        assert values[row].tolist() == own + [0] * (6 - len(own))
        start = memory.pair_starts[list(memory.values[memory.pair_starts]).index(own[0])]
        np.testing.assert_allclose(keys[row, : len(own)], search_keys(memory.keys[start : start + len(own)]))
        assert (keys[row, len(own) :, -1] == -1e30).all()
    # Every pair, in slots that hold every key: the same search as every key's.
    every = kt.MemoryModel(model, memory, neighbors=3, temperature=0.5, weight=0.25, pairs=10)
    assert (every.pairs, every.slots) == (3, 18)
    full = kt.MemoryModel(model, memory, neighbors=3, temperature=0.5, weight=0.25)
    decoder_inputs = np.array([[BOS_ID, 20, 21], [BOS_ID, 25, 7], [BOS_ID, 9, 30]], "int32")
    encoder_outputs, mask = every.encode(ENCODER_INPUTS)
    np.testing.assert_allclose(
        to_numpy(every.decode(decoder_inputs, encoder_outputs, mask)),
        to_numpy(full.decode(decoder_inputs, *full.encode(ENCODER_INPUTS))),
        atol=1e-5,
    )
    searched = decoding.beam_decode(every, ENCODER_INPUTS, beam_size=2, max_length=6)
    expected = decoding.beam_decode(full, ENCODER_INPUTS, beam_size=2, max_length=6)
    np.testing.assert_array_equal(to_numpy(searched[0]), to_numpy(expected[0]))
    np.testing.assert_allclose(to_numpy(searched[1]), to_numpy(expected[1]), atol=1e-5)


def test_the_pair_search_fills_its_slots_nearest_pair_first(model):
    # Six pairs of 1, 1, 1, 1, 10 and 10 keys (mean 4): pairs=2 gives 16 slots, fewer than
    # the 20 keys of the two long pairs, which are nearest: the nearest's 10, the next's 6.
    lengths = np.array([1, 1, 1, 1, 10, 10])
    sources = [[20], [21], [22], [23], [5, 6], [5, 6, 7]]  # the query is pair 5's source
    rng = np.random.default_rng(0)
    memory = kt.TranslationMemory(rng.normal(size=(24, 32)), np.arange(24) % 30 + 1, 32,
                                  pair_lengths=lengths, pair_sources=sources)
    searcher = kt.MemoryModel(model, memory, pairs=2)
    assert searcher.slots == 16
    keys, values = searcher.candidates(keras.ops.array([[5, 6, 7, EOS_ID, 0]]))
    assert to_numpy(values)[0].tolist() == (np.arange(14, 24) % 30 + 1).tolist() + (np.arange(4, 10) % 30 + 1).tolist()
    np.testing.assert_allclose(to_numpy(keys)[0], search_keys(np.concatenate([memory.keys[14:24], memory.keys[4:10]])),
                               rtol=1e-6)


@pytest.mark.parametrize("method", ["greedy", "beam"])
@pytest.mark.parametrize("pairs", [None, 1])
def test_an_untrained_model_with_a_memory_of_the_pairs_translates_them(model, memory, method, pairs):
    expected = np.zeros((3, 6), "int32")
    for row, target in enumerate(SpaceTokenizer().encode(TARGETS)):
        expected[row, : len(target) + 1] = target + [EOS_ID]
    alone = decoding.greedy_decode(model, ENCODER_INPUTS, max_length=6)[0]
    assert not np.array_equal(to_numpy(alone), expected)  # the model alone has learned nothing
    mixed_model = kt.MemoryModel(model, memory, neighbors=1, temperature=1.0, weight=0.9, pairs=pairs)
    kwargs = {"beam_size": 3} if method == "beam" else {}
    eager = (decoding.beam_decode if method == "beam" else decoding.greedy_decode)(
        mixed_model, ENCODER_INPUTS, max_length=6, **kwargs
    )
    np.testing.assert_array_equal(to_numpy(eager[0]), expected)
    compiled = CompiledDecoder(mixed_model, method, jit_compile=False, max_length=6, **kwargs)(ENCODER_INPUTS)
    np.testing.assert_array_equal(to_numpy(compiled[0]), expected)
    np.testing.assert_allclose(to_numpy(compiled[1]), to_numpy(eager[1]), atol=1e-5)


@pytest.mark.parametrize("pairs", [None, 2])
def test_weight_zero_decodes_as_the_model_alone(model, memory, pairs):
    alone = decoding.beam_decode(model, ENCODER_INPUTS, beam_size=2, max_length=6)
    tokens, scores = decoding.beam_decode(kt.MemoryModel(model, memory, weight=0.0, neighbors=4, pairs=pairs),
                                          ENCODER_INPUTS, beam_size=2, max_length=6)
    np.testing.assert_array_equal(to_numpy(tokens), to_numpy(alone[0]))
    np.testing.assert_allclose(to_numpy(scores), to_numpy(alone[1]), atol=1e-6)


def test_a_saved_memory_loads_as_it_was_and_other_files_are_refused(memory, tmp_path):
    path = memory.save(tmp_path / "train.memory.npz")
    loaded = kt.TranslationMemory.load(path)
    np.testing.assert_array_equal(loaded.keys, memory.keys)
    np.testing.assert_array_equal(loaded.values, memory.values)
    assert (loaded.vocab_size, loaded.skipped) == (memory.vocab_size, memory.skipped)
    np.testing.assert_array_equal(loaded.pair_lengths, memory.pair_lengths)
    assert [ids.tolist() for ids in loaded.pair_sources] == [ids.tolist() for ids in memory.pair_sources]
    # A memory saved without the pair index loads and searches every key.
    bare = kt.TranslationMemory(memory.keys, memory.values, memory.vocab_size)
    assert not kt.TranslationMemory.load(bare.save(tmp_path / "bare.npz")).has_pairs
    # A file holding only part of the pair index names what it lacks.
    with np.load(path) as data:
        partial = {name: data[name] for name in data.files if name != "source_lengths"}
    np.savez(tmp_path / "partial.npz", **partial)
    with pytest.raises(ValueError, match=r"but not source_lengths.*rebuild the memory"):
        kt.TranslationMemory.load(tmp_path / "partial.npz")
    np.savez(tmp_path / "other.npz", keys=memory.keys)
    with pytest.raises(ValueError, match="is not a TranslationMemory"):
        kt.TranslationMemory.load(tmp_path / "other.npz")
    with pytest.raises(ValueError, match=r"saved as \.npz"):
        memory.save(tmp_path / "train.memory")


def test_pairs_too_long_for_the_model_are_skipped_and_counted(model):
    long_target = " ".join(["20"] * model.config.max_length)
    memory = kt.build_translation_memory(model, SpaceTokenizer(), SOURCES[:2], [TARGETS[0], long_target])
    assert memory.skipped == 1 and len(memory) == 6
    with pytest.raises(ValueError, match="No pair fits"):
        kt.build_translation_memory(model, SpaceTokenizer(), SOURCES[:1], [long_target])
    with pytest.raises(ValueError, match="Received: 2 sources and 1 targets"):
        kt.build_translation_memory(model, SpaceTokenizer(), SOURCES[:2], TARGETS[:1])


def test_bad_settings_and_mismatched_memories_are_refused_with_clear_messages(model, memory):
    with pytest.raises(ValueError, match=r"in \[0, 1\). Received: 1.0"):
        kt.MemoryModel(model, memory, weight=1.0)
    # More neighbours than keys: every key is read.
    assert kt.MemoryModel(model, memory, neighbors=len(memory) + 5).neighbors == len(memory)
    with pytest.raises(ValueError, match="temperature"):
        kt.MemoryModel(model, memory, temperature=0.0)
    other = kt.build_transformer(tiny_config())
    with pytest.raises(ValueError, match="keys of width 32 and vocab_size 32 for a model of d_model 16"):
        kt.MemoryModel(other, memory)
    with pytest.raises(TypeError, match="needs a TranslationMemory"):
        kt.MemoryModel(model, memory.keys)
    with pytest.raises(ValueError, match=r"values from 0 to 40"):
        kt.TranslationMemory(memory.keys[:2], np.array([0, 40]), vocab_size=32)
    with pytest.raises(ValueError, match="finite"):
        kt.TranslationMemory(np.full((1, 4), np.nan), np.array([1]), vocab_size=32)
    with pytest.raises(ValueError, match=r"eval_memory_weight.*Received: 1.5"):
        RunConfig(eval_memory_weight=1.5)
    bare = kt.TranslationMemory(memory.keys, memory.values, memory.vocab_size)
    with pytest.raises(ValueError, match="this memory has none .* Rebuild it with build_translation_memory"):
        kt.MemoryModel(model, bare, pairs=2)
    with pytest.raises(ValueError, match="pairs"):
        kt.MemoryModel(model, memory, pairs=0)
    with pytest.raises(ValueError, match="distance_scale"):
        kt.MemoryModel(model, memory, distance_scale=-1.0)
    with pytest.raises(ValueError, match="they sum to 14 for 15 keys"):
        kt.TranslationMemory(memory.keys, memory.values, 32, pair_lengths=[6, 4, 4],
                             pair_sources=memory.pair_sources)
    with pytest.raises(ValueError, match="one source per pair: 3. Received: 2"):
        kt.TranslationMemory(memory.keys, memory.values, 32, pair_lengths=memory.pair_lengths,
                             pair_sources=memory.pair_sources[:2])
    with pytest.raises(ValueError, match=r"token ids in \[0, 32\)"):
        kt.TranslationMemory(memory.keys, memory.values, 32, pair_lengths=memory.pair_lengths,
                             pair_sources=[[5], [40], [6]])
    with pytest.raises(ValueError, match="needs both"):
        kt.TranslationMemory(memory.keys, memory.values, 32, pair_lengths=memory.pair_lengths)


def test_a_translator_of_the_memory_model_translates_memorised_pairs(tmp_path):
    model, tokenizer = make_tiny_model_dir(tmp_path)
    sentences = pick_sentences(tokenizer, count=5)
    targets = sentences[1:] + sentences[:1]  # each sentence "translates" to the next
    memory = kt.build_translation_memory(model, tokenizer, sentences, targets)
    settings = dict(beam_size=2, batch_size=BATCH_SIZE)
    plain = kt.Translator(model, tokenizer, **settings).translate(sentences)
    assert plain != targets
    memory_model = kt.MemoryModel(model, memory, neighbors=1, temperature=1.0, weight=0.9)
    assert kt.Translator(memory_model, tokenizer, **settings).translate(sentences) == targets
    unmixed = kt.MemoryModel(model, memory, weight=0.0)
    assert kt.Translator(unmixed, tokenizer, **settings).translate(sentences) == plain
    with pytest.raises(ValueError, match="A MemoryModel needs its tokenizer"):
        kt.Translator(memory_model)
    # What export and the commands load a model with: the memory model is refused, saying why.
    with pytest.raises(TypeError, match=r"Received: MemoryModel: a MemoryModel decodes with a Translator"):
        load_model_and_tokenizer(memory_model)


@once_on("torch", "the commands' arguments and files are Python, the same on every backend (the memory "
         "decodes on every backend above)")
def test_the_commands_build_a_memory_and_translate_with_it(tmp_path, capsys):
    from keras_transformer.cli import build_memory, evaluate, translate

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    _, tokenizer = make_tiny_model_dir(model_dir)
    sentences = pick_sentences(tokenizer, count=4)
    targets = sentences[1:] + sentences[:1]
    (tmp_path / "train.src").write_text("\n".join(sentences) + "\n", encoding="utf-8")
    (tmp_path / "train.tgt").write_text("\n".join(targets) + "\n", encoding="utf-8")
    memory_path = str(tmp_path / "train.memory.npz")
    assert build_memory.main(["--model-dir", str(model_dir), "--source", str(tmp_path / "train.src"),
                              "--target", str(tmp_path / "train.tgt"), "--output", memory_path]) == 0
    assert "from 4 pairs (0 too long for the model, skipped)" in capsys.readouterr().out
    memory_args = ["--memory", memory_path, "--memory-weight", "0.9", "--memory-neighbors", "1",
                   "--memory-temperature", "1"]
    assert translate.main(["--model-dir", str(model_dir), *memory_args, "--beam-size", "2", *sentences]) == 0
    assert capsys.readouterr().out.splitlines() == targets
    pairs_args = [*memory_args, "--memory-pairs", "1"]  # each sentence's nearest pair: its own
    assert translate.main(["--model-dir", str(model_dir), *pairs_args, "--beam-size", "2", *sentences]) == 0
    assert capsys.readouterr().out.splitlines() == targets
    evaluate_args = ["--model-dir", str(model_dir), *memory_args, "--beam-size", "2",
                     "--source", str(tmp_path / "train.src"), "--reference", str(tmp_path / "train.tgt")]
    assert evaluate.main(evaluate_args) == 0
    assert json.loads(capsys.readouterr().out)["exact_match"] == 1.0
    with pytest.raises(SystemExit):
        evaluate.main([*evaluate_args, "--write-metrics"])
    assert "scores read with --memory are the model's and the memory's" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        translate.main(["--model-dir", str(model_dir), "--model-dir", str(model_dir), *memory_args, "a"])
    assert exit_info.value.code == 2
    assert "--memory takes one --model-dir" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        translate.main(["--model-dir", str(model_dir), "--memory", memory_path, "--memory-weight", "1", "a"])
    assert "in [0, 1). Received: 1.0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        build_memory.main(["--model-dir", str(model_dir), "--source", str(tmp_path / "train.src"),
                           "--target", str(tmp_path / "missing"), "--output", memory_path])
    assert "missing" in capsys.readouterr().err

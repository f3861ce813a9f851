"""Marian / OPUS-MT import: the imported model computes and translates as Hugging Face's.

A tiny random `transformers.MarianMTModel` (tests/tiny_marian.py, built once per
session, nothing downloaded) is imported with `kt.import_marian`, and the model
directory is checked on every backend against the torch model it came from: logits
on a padded batch, greedy translations against `generate(num_beams=1)`, the tokenizer
against Hugging Face's, the SavedModel (TensorFlow) against the Python translator, and
a few `model.fit` steps.
"""

import importlib.util
import json
import os
import shutil

import keras
import numpy as np
import pytest

pytest.importorskip("transformers", reason="needs the marian extra: pip install 'keras-transformer[marian]'")

import tiny_marian  # noqa: E402
from conftest import to_numpy  # noqa: E402

import keras_transformer as kt  # noqa: E402
from keras_transformer.inference.evaluation import evaluate  # noqa: E402
from keras_transformer.inference.translator import pad_batch  # noqa: E402
from keras_transformer.model.directory import load_model_and_tokenizer, read_manifest  # noqa: E402

MAX_EXTRA = 4  # short greedy outputs: source length + 4 tokens at most
# Sentences for translation: corpus ones, an unseen word, the language code, nothing.
SENTENCES = tiny_marian.source_sentences()[::23] + ["der Hund sieht ein Zebra", ">>en<< die Katze malt", ""]
needs_tensorflow = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow", reason="SavedModel export traces on the TensorFlow backend"
)


@pytest.fixture(scope="session")
def marian(tmp_path_factory):
    """The tiny Hugging Face model and the model directory imported from it."""
    reference = tiny_marian.build_tiny_marian(tmp_path_factory.mktemp("hf_marian"))
    reference.model_dir = str(tmp_path_factory.mktemp("imported") / "opus-mt-tiny")
    kt.import_marian(reference.hf_dir, reference.model_dir)
    return reference


@pytest.fixture(scope="module")
def greedy_translator(marian):
    # No XLA: seconds less to compile, and the same numbers.
    return kt.Translator(marian.model_dir, beam_size=1, max_extra=MAX_EXTRA, jit_compile=False)


# ------------------------------------------------------------------ the model
def test_imported_directory_holds_the_model_and_marian_tokenizer(marian):
    files = sorted(os.listdir(marian.model_dir))
    assert files == sorted(
        ["model.keras", "manifest.json", "source.spm", "target.spm", "vocab.json", "marian_tokenizer.json"]
    )
    assert read_manifest(marian.model_dir)["tokenizer_kind"] == "marian"
    model, tokenizer = load_model_and_tokenizer(marian.model_dir)
    assert isinstance(tokenizer, kt.marian.MarianTokenizer)
    # Marian's rows plus one: its pad row is both our PAD and our BOS.
    assert model.config.vocab_size == len(marian.vocab) + 1 == tokenizer.vocab_size
    assert model.config.position_encoding == "fixed" and model.config.activation == "swish"
    assert model.config.output_bias and model.config.scale_embeddings
    assert model.config.layer_norm_epsilon == 1e-5


def test_logits_equal_hugging_face_on_a_padded_batch(marian):
    model, tokenizer = load_model_and_tokenizer(marian.model_dir)
    vocabulary = tokenizer.vocabulary
    sources = tiny_marian.source_sentences()[:3] + ["eine Frau mag den Garten nicht"]
    targets = ["the cat sees the house", "a bird", "the dog likes a car today", "x"]
    source_ids = marian.tokenizer(sources)["input_ids"]  # Hugging Face's, with EOS
    target_ids = marian.tokenizer(text_target=targets)["input_ids"]
    pad = marian.model.config.pad_token_id
    source, source_mask = _padded(source_ids, pad)
    decoder, decoder_mask = _padded([[pad] + ids for ids in target_ids], pad)  # Marian starts at pad
    expected = tiny_marian.hf_logits(marian, source, decoder, source_mask, decoder_mask)

    our_source = np.where(source_mask == 1, vocabulary.to_ours(source), kt.PAD_ID).astype("int32")
    our_decoder = np.where(decoder_mask == 1, vocabulary.to_ours(decoder), kt.PAD_ID).astype("int32")
    our_decoder[:, 0] = kt.BOS_ID
    logits = to_numpy(model({"encoder_inputs": our_source, "decoder_inputs": our_decoder}))
    in_marian_order = logits[..., vocabulary.our_ids]  # our column of each Marian id
    real = decoder_mask == 1
    np.testing.assert_allclose(in_marian_order[real], expected[real], atol=1e-4)
    # The extra column (our PAD) repeats Marian's pad logit, which neither side generates.
    np.testing.assert_allclose(logits[..., kt.PAD_ID][real], expected[..., pad][real], atol=1e-4)


def test_greedy_translations_equal_generate(marian, greedy_translator):
    translations = greedy_translator.translate(SENTENCES)
    tokenizer = greedy_translator.tokenizer
    source_ids = [ids + [kt.EOS_ID] for ids in tokenizer.encode(SENTENCES[:-1])]
    # The translator's own compiled search, on the batch shape it pads these sentences to.
    encoder_inputs = pad_batch(source_ids, greedy_translator.model.config.max_length, len(source_ids))
    tokens = to_numpy(greedy_translator.decoder(encoder_inputs)[0])
    lengths = []
    for row, (sentence, ids) in enumerate(zip(SENTENCES[:-1], source_ids)):
        # Hugging Face's limit counts the same tokens as ours: source length + MAX_EXTRA,
        # and it forces EOS at the last one (forced_eos_token_id), as our decoding does.
        expected_ids, expected_text = tiny_marian.hf_greedy(marian, sentence, len(ids) + MAX_EXTRA)
        expected_ids = expected_ids[: list(expected_ids).index(0) + 1]  # up to Marian's EOS (0)
        ours = tokens[row, : len(expected_ids)]
        np.testing.assert_array_equal(tokenizer.vocabulary.to_marian(ours), expected_ids, err_msg=sentence)
        assert not tokens[row, len(expected_ids) :].any()
        assert translations[row] == expected_text, sentence
        lengths.append(len(expected_ids))
    assert translations[-1] == ""
    # Some sentences end by themselves, some at the limit: both paths are compared.
    assert min(lengths) < max(lengths)
    scores = evaluate(greedy_translator, SENTENCES, translations, progress=False)
    assert scores["exact_match"] == 1.0


@needs_tensorflow
def test_saved_model_translates_as_the_python_translator(marian, greedy_translator, tmp_path):
    from keras_transformer.inference.export import translate_with_saved_model

    path = kt.export_saved_model(marian.model_dir, base_dir=tmp_path, name="opus", beam_size=1, max_extra=MAX_EXTRA)
    translations, _ = translate_with_saved_model(path, SENTENCES)
    assert translations == greedy_translator.translate(SENTENCES)


def test_fit_fine_tunes_the_imported_model(marian, tmp_path):
    model, tokenizer = load_model_and_tokenizer(marian.model_dir)
    pairs = list(zip(tiny_marian.source_sentences()[:8], tiny_marian.target_sentences()[:8]))
    source = [ids + [kt.EOS_ID] for ids in tokenizer.encode([s for s, _ in pairs])]
    target = tokenizer.encode_target([t for _, t in pairs])
    encoder_inputs, _ = _padded(source, kt.PAD_ID)
    decoder_inputs, _ = _padded([[kt.BOS_ID] + ids for ids in target], kt.PAD_ID)
    labels, _ = _padded([ids + [kt.EOS_ID] for ids in target], kt.PAD_ID)
    inputs = {"encoder_inputs": encoder_inputs.astype("int32"), "decoder_inputs": decoder_inputs.astype("int32")}
    before = {w.path: to_numpy(w).copy() for w in model.weights}
    # Eager on TensorFlow and compiled on JAX: the quicker of the two on each, for 3 steps.
    eager = keras.backend.backend() == "tensorflow"
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss=kt.LabelSmoothedCrossEntropy(0.0), run_eagerly=eager)
    history = model.fit(inputs, labels.astype("int32"), batch_size=8, epochs=3, shuffle=False, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < losses[0]
    changed = {w.path for w in model.weights if not np.array_equal(to_numpy(w), before[w.path])}
    assert "token_embedding/embeddings" in changed and "token_embedding/output_bias" in changed
    # Marian's position tables are fixed: not trained.
    assert not [path for path in changed if "position" in path]
    # The fine-tuned model saves and loads with its tokenizer like any model directory.
    model.save(str(tmp_path / "model.keras"))
    tokenizer.save(tmp_path)
    reloaded, _ = load_model_and_tokenizer(tmp_path)
    np.testing.assert_array_equal(to_numpy(reloaded.weights[0]), to_numpy(model.weights[0]))


# ----------------------------------------------------------------- tokenizer
def test_tokenizer_ids_equal_hugging_face(marian, greedy_translator):
    tokenizer = greedy_translator.tokenizer
    sources = SENTENCES + ["der Hund sieht €", ">>xx<< das Haus", ">>en<<"]
    for sentence, ours in zip(sources, tokenizer.encode(sources)):
        expected = marian.tokenizer(sentence)["input_ids"][:-1]  # without its EOS
        assert tokenizer.vocabulary.to_marian(ours).tolist() == expected, sentence
    targets = tiny_marian.target_sentences()[::31] + ["the zebra sees ü"]
    for sentence, ours in zip(targets, tokenizer.encode_target(targets)):
        expected = marian.tokenizer(text_target=sentence)["input_ids"][:-1]
        assert tokenizer.vocabulary.to_marian(ours).tolist() == expected, sentence


def test_tokenizer_graph_ops_equal_python(greedy_translator):
    tokenizer = greedy_translator.tokenizer
    sources = SENTENCES + ["der Hund sieht €", ">>en<<"]
    assert [ids.tolist() for ids in tokenizer.tokenize(sources).numpy()] == tokenizer.encode(sources)
    assert tokenizer.tokenize(">>en<< die Katze").numpy().tolist() == tokenizer.encode([">>en<< die Katze"])[0]
    targets = tiny_marian.target_sentences()[::17]
    assert [ids.tolist() for ids in tokenizer.tokenize_target(targets).numpy()] == tokenizer.encode_target(targets)
    ids = np.random.default_rng(0).integers(0, tokenizer.vocab_size, size=(16, 12)).astype("int32")
    decoded = [text.decode("utf-8") for text in tokenizer.detokenize(ids).numpy()]
    assert decoded == tokenizer.decode(ids)


def test_decoding_equals_hugging_face_skip_special_tokens(marian, greedy_translator):
    """Any ids, source-only pieces and special tokens included, decode as Hugging Face's do."""
    tokenizer = greedy_translator.tokenizer
    ids = np.random.default_rng(1).integers(kt.UNK_ID, tokenizer.vocab_size, size=(20, 10))
    ids[ids == kt.EOS_ID] = kt.UNK_ID  # whole sequences; EOS cuts are checked elsewhere
    expected = [
        marian.tokenizer.decode(tokenizer.vocabulary.to_marian(row).tolist(), skip_special_tokens=True) for row in ids
    ]
    assert tokenizer.decode(ids) == expected


def test_tokenizer_survives_a_seed_reset_and_round_trips(greedy_translator, tmp_path):
    tokenizer = greedy_translator.tokenizer
    keras.utils.set_random_seed(7)  # clears TensorFlow's eager kernel cache
    assert tokenizer.tokenize(["die Katze"]).to_list() == tokenizer.encode(["die Katze"])
    tokenizer.save(tmp_path)
    copy = kt.marian.MarianTokenizer.load(tmp_path)
    assert copy.fingerprint == tokenizer.fingerprint
    assert copy.encode(SENTENCES) == tokenizer.encode(SENTENCES)


# ----------------------------------------------------------- command and errors
def test_import_command_writes_the_model_directory(marian, tmp_path, capsys):
    from keras_transformer.cli import import_marian

    output = tmp_path / "imported"
    assert import_marian.main(["--hf-dir", marian.hf_dir, "--output-dir", str(output)]) == 0
    assert "written to" in capsys.readouterr().out
    assert read_manifest(output) == read_manifest(marian.model_dir)
    # A second import refuses to replace it, in one line, exit status 2.
    with pytest.raises(SystemExit) as exit_info:
        import_marian.main(["--hf-dir", marian.hf_dir, "--output-dir", str(output)])
    assert exit_info.value.code == 2
    assert "already exists" in capsys.readouterr().err


def test_clone_entry_point_runs_the_command():
    """`python -m training.import_marian` runs the same main as `kt-import-marian`."""
    from keras_transformer.cli import import_marian

    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "training", "import_marian.py")
    spec = importlib.util.spec_from_file_location("clone_import_marian", path)
    clone_entry_point = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(clone_entry_point)
    assert clone_entry_point.main is import_marian.main


@pytest.mark.parametrize(
    "change, message",
    [
        ({"share_encoder_decoder_embeddings": False}, "share_encoder_decoder_embeddings=False"),
        ({"decoder_attention_heads": 4}, "decoder_attention_heads=4"),
        ({"decoder_ffn_dim": 64}, "decoder_ffn_dim=64"),
        ({"activation_function": "gelu_new"}, "activation_function='gelu_new'"),
        ({"model_type": "bart"}, "model_type='bart'"),
    ],
    ids=["unshared_embeddings", "heads_differ", "ffn_differs", "activation", "not_marian"],
)
def test_what_cannot_be_represented_is_refused_naming_it(marian, tmp_path, change, message):
    hf_dir = tmp_path / "hf"
    shutil.copytree(marian.hf_dir, hf_dir)
    with open(hf_dir / "config.json", encoding="utf-8") as file:
        config = json.load(file)
    config.update(change)
    (hf_dir / "config.json").write_text(json.dumps(config), encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        kt.import_marian(hf_dir, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_bad_directories_are_refused(marian, tmp_path):
    with pytest.raises(FileNotFoundError, match="No Hugging Face model directory"):
        kt.import_marian(tmp_path / "missing", tmp_path / "out")
    partial = tmp_path / "partial"
    shutil.copytree(marian.hf_dir, partial)
    os.remove(partial / "target.spm")
    with pytest.raises(FileNotFoundError, match="has no target.spm"):
        kt.import_marian(partial, tmp_path / "out")
    separate = tmp_path / "separate"
    shutil.copytree(marian.hf_dir, separate)
    shutil.copy(separate / "vocab.json", separate / "target_vocab.json")
    with pytest.raises(ValueError, match="separate source and target vocabularies"):
        kt.import_marian(separate, tmp_path / "out")
    with pytest.raises(FileExistsError, match="already exists"):
        kt.import_marian(marian.hf_dir, marian.model_dir)
    assert not (tmp_path / "out").exists()


def test_a_weight_with_no_place_is_refused(marian, tmp_path):
    from safetensors.numpy import load_file, save_file

    hf_dir = tmp_path / "hf"
    shutil.copytree(marian.hf_dir, hf_dir)
    weights = load_file(str(hf_dir / "model.safetensors"))
    weights["model.encoder.layernorm_embedding.weight"] = np.ones(tiny_marian.D_MODEL, "float32")
    save_file(weights, str(hf_dir / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ValueError, match="no place for.*layernorm_embedding"):
        kt.import_marian(hf_dir, tmp_path / "out")


def _padded(sequences, pad):
    """`(ids [B, L], mask [B, L])` of lists of ids, right-padded with `pad`."""
    length = max(len(ids) for ids in sequences)
    ids = np.full((len(sequences), length), pad, dtype="int64")
    mask = np.zeros((len(sequences), length), dtype="int64")
    for row, sequence in enumerate(sequences):
        ids[row, : len(sequence)] = sequence
        mask[row, : len(sequence)] = 1
    return ids, mask

"""A tiny random Hugging Face Marian model, written as `save_pretrained` writes OPUS-MT ones.

Nothing is downloaded: two sentencepiece models (German-like source, English-like
target) are trained on made-up sentences, `vocab.json` is their union laid out as
Marian's (`</s>` 0, `<unk>` 1, ..., `<pad>` last, and a language code `>>en<<`), and
`transformers.MarianMTModel` is built from a small `MarianConfig` (d_model 16, 2+2
layers, swish, scaled embeddings, like OPUS-MT's) with random weights, random layer
norms and a random `final_logits_bias`, so that every weight's mapping matters.
"""

import io
import itertools
import json
import os
import types

import numpy as np
import sentencepiece

D_MODEL = 16
MAX_POSITIONS = 64
LANGUAGE_CODE = ">>en<<"

_SUBJECTS = ("die Katze", "der Hund", "ein Vogel", "das Pferd", "eine Frau")
_VERBS = ("sieht", "malt", "findet", "mag")
_OBJECTS = ("das Haus", "den Baum", "ein Auto", "den Garten", "das Brot")
_EN_SUBJECTS = ("the cat", "the dog", "a bird", "the horse", "a woman")
_EN_VERBS = ("sees", "paints", "finds", "likes")
_EN_OBJECTS = ("the house", "the tree", "a car", "the garden", "the bread")


def source_sentences():
    return [" ".join(words) for words in itertools.product(_SUBJECTS, _VERBS, _OBJECTS)]


def target_sentences():
    return [" ".join(words) for words in itertools.product(_EN_SUBJECTS, _EN_VERBS, _EN_OBJECTS)]


def _train_spm(sentences, vocab_size):
    """A sentencepiece model with sentencepiece's default ids (unk 0, <s> 1, </s> 2), as Marian's."""
    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(sentences),
        model_writer=model,
        vocab_size=vocab_size,
        character_coverage=1.0,
        input_sentence_size=0,
        shuffle_input_sentence=False,
        minloglevel=2,
    )
    return model.getvalue()


def _marian_vocab(*spm_models):
    """vocab.json as Marian writes it: </s> 0, <unk> 1, every piece once, <pad> last."""
    vocab = {"</s>": 0, "<unk>": 1}
    for proto in spm_models:
        processor = sentencepiece.SentencePieceProcessor()
        processor.LoadFromSerializedProto(proto)
        for piece_id in range(processor.GetPieceSize()):
            if processor.IsControl(piece_id) or processor.IsUnknown(piece_id):
                continue
            vocab.setdefault(processor.IdToPiece(piece_id), len(vocab))
    vocab.setdefault(LANGUAGE_CODE, len(vocab))
    vocab["<pad>"] = len(vocab)
    return vocab


def build_tiny_marian(directory):
    """Writes a tiny random Marian model to `directory`; returns what the tests compare with.

    Returns a namespace: `hf_dir`, `model` (the torch `MarianMTModel`, in eval mode),
    `tokenizer` (Hugging Face's `MarianTokenizer`), `vocab` (vocab.json's dict).
    """
    import torch
    import transformers

    directory = str(directory)
    os.makedirs(directory, exist_ok=True)
    source_spm = _train_spm(source_sentences(), 40)
    target_spm = _train_spm(target_sentences(), 32)
    vocab = _marian_vocab(source_spm, target_spm)
    for name, data in (("source.spm", source_spm), ("target.spm", target_spm)):
        with open(os.path.join(directory, name), "wb") as file:
            file.write(data)
    with open(os.path.join(directory, "vocab.json"), "w", encoding="utf-8") as file:
        json.dump(vocab, file, ensure_ascii=False)
    pad_id = vocab["<pad>"]
    config = transformers.MarianConfig(
        vocab_size=len(vocab),
        d_model=D_MODEL,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=MAX_POSITIONS,
        activation_function="swish",
        scale_embedding=True,
        dropout=0.1,
        pad_token_id=pad_id,
        decoder_start_token_id=pad_id,
        eos_token_id=0,
        forced_eos_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.MarianMTModel(config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "embed_positions" in name:
                continue  # Marian's fixed sinusoids
            scale = 0.1 if name.endswith("bias") or "layer_norm" in name else 0.35
            offset = 1.0 if "layer_norm" in name and name.endswith("weight") else 0.0
            parameter.copy_(offset + scale * torch.randn(parameter.shape, generator=generator))
        bias = 0.5 * torch.randn(model.final_logits_bias.shape, generator=generator)
        bias[0, 0] += 2.0  # EOS likelier: some translations end before the limit
        model.final_logits_bias.copy_(bias)
    model.eval()
    model.save_pretrained(directory)
    tokenizer = transformers.MarianTokenizer(
        source_spm=os.path.join(directory, "source.spm"),
        target_spm=os.path.join(directory, "target.spm"),
        vocab=os.path.join(directory, "vocab.json"),
    )
    tokenizer.save_pretrained(directory)
    return types.SimpleNamespace(hf_dir=directory, model=model, tokenizer=tokenizer, vocab=vocab)


def hf_logits(reference, source_ids, decoder_ids, source_mask, decoder_mask):
    """Hugging Face's float32 logits `[B, T, V]` for Marian ids (numpy in, numpy out)."""
    import torch

    with torch.no_grad():
        output = reference.model(
            input_ids=torch.tensor(source_ids),
            attention_mask=torch.tensor(source_mask),
            decoder_input_ids=torch.tensor(decoder_ids),
            decoder_attention_mask=torch.tensor(decoder_mask),
        )
    return output.logits.numpy()


def hf_greedy(reference, sentence, max_new_tokens):
    """Hugging Face's greedy translation of one sentence: (Marian ids without the start, text)."""
    import torch

    batch = reference.tokenizer([sentence], return_tensors="pt")
    pad_id = reference.model.config.pad_token_id
    with torch.no_grad():
        output = reference.model.generate(
            **batch,
            num_beams=1,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            bad_words_ids=[[pad_id]],  # as OPUS-MT's generation config: never the pad token
        )
    ids = output[0, 1:].tolist()
    text = reference.tokenizer.decode(output[0], skip_special_tokens=True)
    return np.array(ids), text

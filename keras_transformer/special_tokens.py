"""Ids of the special tokens, defined once for tokenizer, pipeline, model and decoding.

Pad is 0 so that zero-padding (the default of every padded batch op) is padding, and
padding masks are simply `ids != 0`. The subword tokenizer is trained with exactly these
ids, and a tokenizer whose ids differ is refused when it is loaded.
"""

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3

PAD_PIECE = "<pad>"
UNK_PIECE = "<unk>"
BOS_PIECE = "<s>"
EOS_PIECE = "</s>"

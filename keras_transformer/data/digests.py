"""Content digests of files: blake2b, read a block at a time, Ctrl-C checked between blocks.

What a cached file is checked against (`data.binarized_checks`) and what names a
corpus's input files in the cache (`data.content_key`). blake2b from `hashlib`: in the
standard library, and about as fast as reading a file from a local disk; sha256 is
faster only where the CPU has SHA instructions, and several times slower where not.
"""

import hashlib

from keras_transformer import interrupts

NAME = "blake2b"  # how meta.json and the record of input files label a digest
_BLOCK = 1 << 20  # hashlib releases the GIL on blocks this size: other threads run meanwhile


def new_digest():
    """An empty blake2b hasher (16 bytes: a checksum against damage, not a signature)."""
    return hashlib.blake2b(digest_size=16)


def file_digest(path):
    """The hex blake2b of the file at `path`: one read of the file."""
    digest = new_digest()
    buffer = bytearray(_BLOCK)
    view = memoryview(buffer)
    with open(path, "rb") as file:
        while count := file.readinto(buffer):
            digest.update(view[:count])
            interrupts.raise_if_interrupted()
    return digest.hexdigest()


__all__ = ["NAME", "new_digest", "file_digest"]

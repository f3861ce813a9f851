"""The content digests of a corpus's input files: what names its binarized copy and tokenizer in the cache.

A cached copy is named by what it was made from, so a file's content, not its path,
size and modification time, goes into the key: an rsync or a restore can bring other
text under the same size and time. Hashing a corpus costs one read of it, so a file's
blake2b is remembered in a small record in the cache folder (`RECORD_FILE`), under the
machine, the file's path, device, inode, size, modification time and change time
(ctime). The kernel sets ctime to the current time at every change to a file, a change
of its modification time included (`os.utime`, `touch -d`, `rsync -t`, `tar -x`), and
no call sets it back: a file with the same ctime has not changed since it was hashed,
and is not read again. As git does with its index, a digest is recorded only when the
file's ctime is `RACY_SECONDS` older than the hashing: a change within the clock's
granularity of the hash would otherwise go unseen.
"""

import json
import os
import time

from keras_transformer.atomic import write_text_atomically
from keras_transformer.data import digests
from keras_transformer.data.cache_staging import host_name

RECORD_FILE = "input-digests.json"
RACY_SECONDS = 2.0  # a file changed this recently is hashed again at its next use


def file_digest(path, record_dir=None):
    """`blake2b:HEX` of the file at `path`, from the record in `record_dir` when the file is unchanged.

    Args:
        path: str, an input file (FileNotFoundError names it when missing).
        record_dir: str or None, where the record lives (a cache folder); None hashes
            the file and records nothing.
    """
    status = os.stat(path)
    key = _stat_key(path, status)
    record = _read_record(record_dir)
    if key in record:
        return record[key]
    started = time.time_ns()
    digest = f"{digests.NAME}:{digests.file_digest(path)}"
    settled = status.st_ctime_ns < started - int(RACY_SECONDS * 1e9)
    if record_dir is not None and settled and _stat_key(path, os.stat(path)) == key:
        _write_record(record_dir, {**_current(record), key: digest})
    return digest


def _stat_key(path, status):
    # The machine too: a cache folder may be shared, and two machines' local disks may hold
    # files of the same path and inode (made from one image).
    return "|".join(map(str, (host_name(), os.path.abspath(path), status.st_dev, status.st_ino, status.st_size,
                              status.st_mtime_ns, status.st_ctime_ns)))


def _read_record(record_dir):
    if record_dir is None:
        return {}
    try:
        with open(os.path.join(record_dir, RECORD_FILE), encoding="utf-8") as file:
            record = json.load(file)
    except (OSError, ValueError):  # none yet, or damaged: a record is only a shortcut
        return {}
    return record if isinstance(record, dict) else {}


def _current(record):
    """The entries of `record` whose file is still as it was when hashed (the others can never match again)."""
    kept = {}
    for key, digest in record.items():
        path = key.rsplit("|", 5)[0].split("|", 1)[-1]
        try:
            if _stat_key(path, os.stat(path)) == key:
                kept[key] = digest
        except OSError:
            pass
    return kept


def _write_record(record_dir, record):
    """Writes the record atomically; runs writing it at once each keep a whole one (the last wins)."""
    os.makedirs(record_dir, exist_ok=True)
    try:
        write_text_atomically(os.path.join(record_dir, RECORD_FILE), json.dumps(record, indent=0, sort_keys=True))
    except OSError:
        pass  # a read-only or full cache: the digest is still right, only not remembered


__all__ = ["RECORD_FILE", "RACY_SECONDS", "file_digest"]

"""Atomic file writes: write beside the target, then rename onto it.

A process killed while it writes a file (SIGKILL, a preempted machine, a full disk)
must not leave a half-written model where a good one was. Keras writes `.keras` and
`.weights.h5` files in place, truncating the old file first, so these helpers hand
Keras a temporary path in the target's directory and `os.replace` it onto the target
once it is complete and flushed. On POSIX the rename is atomic: a reader sees the old
file or the new one, never a mix, and a crash leaves at most a hidden `.partial` file
(which no checkpoint pattern matches) beside an intact target.

Directories (SavedModel exports) have their own helper,
`write_directory_atomically`; a training run stages its whole model directory and
renames it into place (`keras_transformer.train.run`). `remove_partial_files` clears
the temporaries a killed writer left.
"""

import contextlib
import os
import shutil
import uuid

_WEIGHTS_SUFFIX = ".weights.h5"  # Keras refuses save_weights paths without it


@contextlib.contextmanager
def atomic_path(target):
    """Yields a temporary path beside `target`; renames it onto `target` on success.

    The temporary name is hidden and keeps `target`'s suffix (`.keras`,
    `.weights.h5`, ...), because Keras checks the suffix of the path it writes. If the
    body raises, the temporary file is removed and `target` is left as it was.

    Args:
        target: str or path-like, the file to (re)write.

    Example:

    ```python
    with atomic_path("runs/demo/model.keras") as temporary:
        model.save(temporary)
    ```
    """
    target = os.fspath(target)
    directory, name = os.path.split(os.path.abspath(target))
    os.makedirs(directory, exist_ok=True)
    suffix = _WEIGHTS_SUFFIX if name.endswith(_WEIGHTS_SUFFIX) else os.path.splitext(name)[1]
    # "tmp" before the suffix: checkpoint patterns like `(\d+)\.weights\.h5$` never match.
    temporary = os.path.join(directory, f".{name}.partial-{uuid.uuid4().hex[:12]}.tmp{suffix}")
    try:
        yield temporary
        _fsync(temporary)
        os.replace(temporary, target)
        _fsync(directory)  # the rename itself survives a power cut
    finally:
        if os.path.lexists(temporary):
            os.remove(temporary)


def save_model_atomically(model, path, **kwargs):
    """`model.save(path, **kwargs)` through `atomic_path`; returns `path`.

    Example:

    ```python
    save_model_atomically(model, "runs/demo/model.keras")
    # 'runs/demo/model.keras'
    ```
    """
    with atomic_path(path) as temporary:
        model.save(temporary, **kwargs)
    return path


def save_weights_atomically(model, path):
    """`model.save_weights(path)` through `atomic_path`; returns `path`.

    Example:

    ```python
    save_weights_atomically(model, "runs/demo/checkpoints/epoch_003.weights.h5")
    # 'runs/demo/checkpoints/epoch_003.weights.h5'
    ```
    """
    with atomic_path(path) as temporary:
        model.save_weights(temporary)
    return path


def write_bytes_atomically(path, data):
    """Writes `data` (bytes) to `path` through `atomic_path`; returns `path`.

    Example:

    ```python
    write_bytes_atomically("runs/demo/tokenizer.model", tokenizer.model_proto)
    # 'runs/demo/tokenizer.model'
    ```
    """
    with atomic_path(path) as temporary:
        with open(temporary, "wb") as file:
            file.write(data)
    return path


def write_text_atomically(path, text):
    """Writes `text` (str, UTF-8) to `path` through `atomic_path`; returns `path`.

    Example:

    ```python
    write_text_atomically("runs/demo/config.toml", run_config.to_toml())
    # 'runs/demo/config.toml'
    ```
    """
    return write_bytes_atomically(path, text.encode("utf-8"))


def is_partial_file(name):
    """Whether `name` is a temporary that `atomic_path` left behind (a process killed mid-write)."""
    return name.startswith(".") and ".partial-" in name


def remove_partial_files(directory):
    """Deletes the temporaries killed writers left in `directory` and its subdirectories.

    Returns:
        list of str, the paths removed.
    """
    removed = []
    for root, _, files in os.walk(directory):
        for name in files:
            if is_partial_file(name):
                path = os.path.join(root, name)
                os.remove(path)
                removed.append(path)
    return removed


def write_directory_atomically(target, write, *, overwrite=False):
    """Calls `write(temporary)` and renames the directory it filled to `target`.

    The temporary directory is hidden (`.<name>.tmp-<random>`) beside `target`, so TF
    Serving, which only loads integer-named versions, never sees a half-written one,
    and if `write` raises, `target` is left as it was and the temporary is removed.
    An existing `target` is replaced only with `overwrite`: it is moved aside, the new
    one renamed in, and then the old one deleted.

    Raises:
        FileExistsError: `target` exists (checked before and after writing) and
            `overwrite` is False.
    """
    if os.path.exists(target) and not overwrite:
        raise FileExistsError(f"{target} already exists; pass overwrite=True to replace it.")
    parent, name = os.path.split(os.path.abspath(target))
    os.makedirs(parent, exist_ok=True)
    temporary = os.path.join(parent, f".{name}.tmp-{uuid.uuid4().hex[:12]}")
    try:
        write(temporary)
        if not os.path.exists(target):
            os.rename(temporary, target)
            return
        if not overwrite:  # appeared while we were writing
            raise FileExistsError(f"{target} already exists; pass overwrite=True to replace it.")
        # A directory cannot be renamed onto a non-empty one: move the old one aside.
        retired = os.path.join(parent, f".{name}.old-{uuid.uuid4().hex[:12]}")
        os.rename(target, retired)
        os.rename(temporary, target)
        shutil.rmtree(retired, ignore_errors=True)
    finally:
        shutil.rmtree(temporary, ignore_errors=True)


def _fsync(path):
    """Flushes a file or directory to disk; a no-op where the OS cannot (Windows dirs)."""
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if os.path.isdir(path) else 0)
    try:
        descriptor = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)


def fsync_directory(path):
    """Flushes a directory's entries (a rename into or out of it) to disk, where the OS can."""
    _fsync(path)


__all__ = [
    "atomic_path",
    "save_model_atomically",
    "save_weights_atomically",
    "write_bytes_atomically",
    "write_text_atomically",
    "is_partial_file",
    "remove_partial_files",
    "write_directory_atomically",
    "fsync_directory",
]

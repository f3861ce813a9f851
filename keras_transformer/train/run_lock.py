"""One kt-train run at a time in a model directory: a lock beside it, held for the whole run.

`exclusive_use(model_dir)` takes `.<name>.lock` beside the model directory before the
run reads anything there, and holds it until the run ends. A second run, started an
hour or a millisecond later, is refused with `ModelDirectoryInUse`, whose message names
the holder: its pid, host and start time, which the holder writes into the file.

Taking the lock is one atomic system call, `fcntl.flock(LOCK_EX | LOCK_NB)`, so of two
runs started at the same instant exactly one passes. The kernel releases a flock when
its holder ends, however it ends (SIGKILL included), so a killed run leaves no lock in
the next run's way; the file itself is removed when the run ends. The file is replaced,
never reused, once removed: a run that opened it just before its holder removed it sees
that the name now points elsewhere, and opens again.

Where flock is not there (some network filesystems answer ENOLCK; Windows has no
`fcntl`) the file's existence is the lock: created with `O_CREAT | O_EXCL`, removed when
the run ends. A killed run leaves that file behind; the next run removes it when it names
this host and a pid that no longer runs. One that names another host (or cannot be read)
is left alone, and the refusal says which file to remove once no run uses it.

Only a run's chief process takes the lock (`run_training`): the other processes of a
multi-worker run write nothing in the model directory.
"""

import contextlib
import datetime
import errno
import json
import os
import socket
import time
import uuid
import warnings

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

LOCK_SUFFIX = ".lock"

# Times a run opens the lock file again when it was removed or replaced between the open
# and the lock (the holder ended, or a stale file was removed): a few suffice.
_ATTEMPTS = 20
# A holder writes its pid into the file just after it locks: a refused run reading it in
# between looks again every _HOLDER_POLL_SECONDS, for up to _HOLDER_WAIT_SECONDS, before
# it says it does not know.
_HOLDER_WAIT_SECONDS = 1.0
_HOLDER_POLL_SECONDS = 0.02
_CHOOSE_ANOTHER = (
    "wait for it to finish, or choose another `name` or `output_dir` "
    "(--set name=... or --set output_dir=...)."
)


class ModelDirectoryInUse(FileExistsError):
    """Another kt-train run holds the model directory (`exclusive_use`); the message names it."""


def lock_path(model_dir):
    """The lock of `model_dir`: `.<name>.lock` beside it (RunConfig refuses names starting with ".")."""
    parent, name = os.path.split(os.path.normpath(model_dir))
    return os.path.join(parent, f".{name}{LOCK_SUFFIX}")


@contextlib.contextmanager
def exclusive_use(model_dir):
    """Holds the lock of `model_dir` for the body of the `with`: no other run may use it meanwhile.

    Makes the parent directory (`output_dir`) if it is missing, to hold the lock, and
    removes it again at the end if it is left empty (a run refused before it wrote).

    Raises:
        ModelDirectoryInUse: another run holds it; the message names the run's pid, host
            and start time.
    """
    path = lock_path(model_dir)
    made = []  # the directories made to hold the lock, deepest first
    try:
        lock = _acquire(model_dir, path, made)
        try:
            yield
        finally:
            lock.release()
    finally:
        _remove_empty(made)


class _HeldLock:
    def __init__(self, fd, path):
        self.fd, self.path = fd, path

    def release(self):
        # Removed while still locked, so that a run which opened this file meanwhile finds
        # the name gone when it gets the lock, and opens again (`_take`).
        try:
            if _names_file(self.path, self.fd):
                os.remove(self.path)
        except OSError:
            pass
        finally:
            os.close(self.fd)  # releases the flock


def _acquire(model_dir, path, made):
    for _ in range(_ATTEMPTS):
        made.extend(_make_directories(os.path.dirname(path) or "."))
        lock = _take(model_dir, path)
        if lock is not None:
            return lock
    raise ModelDirectoryInUse(
        f"{model_dir} is in use by another kt-train run: its lock {path} changed hands "
        f"{_ATTEMPTS} times while this run tried to take it; {_CHOOSE_ANOTHER}"
    )


def _take(model_dir, path):
    """One try: the held lock; None when the file went or changed meanwhile (try again)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        created = True
    except FileExistsError:
        try:
            fd = os.open(path, os.O_RDWR)
        except FileNotFoundError:  # its holder removed it meanwhile
            return None
        created = False
    except FileNotFoundError:  # output_dir removed meanwhile by a run that left it empty
        return None
    try:
        try:
            _flock(fd)
        except BlockingIOError:
            raise ModelDirectoryInUse(_in_use_message(model_dir, path, _read_holder(fd), flock=True)) from None
        except OSError as error:
            return _take_without_flock(model_dir, path, fd, created, error)
        if not _names_file(path, fd):  # locked a file its holder had removed: not the lock now
            os.close(fd)
            return None
        _write_holder(fd)
        return _HeldLock(fd, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise


def _flock(fd):
    if fcntl is None:
        raise OSError(errno.ENOSYS, "there is no fcntl module on this system")
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def _take_without_flock(model_dir, path, fd, created, error):
    """The fallback where flock fails: whoever created the file holds the lock."""
    warnings.warn(
        f"{path}: no flock here ({error}); the lock is the file itself, removed when the run "
        "ends. A run killed on another host leaves it behind: remove it once no run uses it.",
        stacklevel=6,
    )
    if created:
        _write_holder(fd)
        return _HeldLock(fd, path)
    holder = _read_holder(fd)
    if holder and holder["host"] == socket.gethostname() and not _pid_runs(holder["pid"]):
        _remove_stale(path, fd)
        os.close(fd)
        return None
    raise ModelDirectoryInUse(_in_use_message(model_dir, path, holder, flock=False))


def _remove_stale(path, fd):
    """Removes the lock file of a dead run, `fd` open on it, never a live run's that took its place."""
    aside = f"{path}.stale-{uuid.uuid4().hex[:12]}"
    try:
        os.rename(path, aside)  # atomic: of two runs removing it, one moves it
    except FileNotFoundError:
        return
    if not _names_file(aside, fd):  # a live run's lock had replaced the stale one: put it back
        try:
            os.link(aside, path)
        except FileExistsError:
            pass
        except OSError:
            os.rename(aside, path)
    with contextlib.suppress(OSError):
        os.remove(aside)


def _names_file(path, fd):
    """Whether `path` is the file open as `fd` (not removed, not replaced by another)."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


def _write_holder(fd):
    started = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M:%S %Z")
    line = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": started}) + "\n"
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, line.encode("utf-8"))
    os.fsync(fd)  # for a network filesystem's other hosts


def _read_holder(fd):
    """The holder's {"pid", "host", "started"} from the lock file, or None if it says none."""
    deadline = time.monotonic() + _HOLDER_WAIT_SECONDS
    while True:
        holder = _parse_holder(os.pread(fd, 4096, 0))
        if holder is not None or time.monotonic() > deadline:
            return holder
        time.sleep(_HOLDER_POLL_SECONDS)


def _parse_holder(data):
    try:
        holder = json.loads(data.decode("utf-8"))
    except ValueError:  # empty, cut short or not ours
        return None
    if not isinstance(holder, dict):
        return None
    pid, host, started = holder.get("pid"), holder.get("host"), holder.get("started")
    if isinstance(pid, int) and isinstance(host, str) and isinstance(started, str):
        return holder
    return None


def _pid_runs(pid):
    """Whether process `pid` of this host runs (or cannot be told: then it is taken to run)."""
    if os.name == "nt" or pid <= 0:  # os.kill(pid, 0) ends a process on Windows
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: it runs, as another user
        return True
    return True


def _in_use_message(model_dir, path, holder, *, flock):
    if holder:
        who = f"pid {holder['pid']} on host {holder['host']}, started {holder['started']}"
    else:
        who = f"its lock {path} does not say which"
    message = f"{model_dir} is in use by another kt-train run ({who}); {_CHOOSE_ANOTHER}"
    if not flock:
        message += f" No run uses it any more (one killed on another host)? Then remove {path}."
    return message


def _make_directories(directory):
    """Makes `directory` and the missing ones above it; returns those made, deepest first."""
    missing, current = [], os.path.abspath(directory)
    while not os.path.isdir(current) and os.path.dirname(current) != current:
        missing.append(current)
        current = os.path.dirname(current)
    if missing:
        os.makedirs(directory, exist_ok=True)
    return missing


def _remove_empty(directories):
    """Removes the directories `exclusive_use` made, deepest first, as long as they are empty."""
    for directory in directories:
        try:
            os.rmdir(directory)
        except OSError:  # not empty: the run wrote there, or another run holds its lock there
            return


__all__ = ["ModelDirectoryInUse", "exclusive_use", "lock_path"]

"""Staging directories in a cache folder that several runs, on several machines, may share.

A directory of the cache is written under a staging name beside its final one and
renamed onto it once complete (`data.binarized`). The name says who writes it,
`NAME.tmp-HOST-PID-RANDOM`, because a cache folder in a network home directory is seen
by other machines, whose process ids mean nothing here. A staging directory is removed
as abandoned only when it is this machine's and its process is gone (a killed run), or
when nobody has touched it for `STALE_SECONDS`: its writer touches it at every chunk
(`heartbeat`), so a live writer on another machine is never removed under it. A copy
found damaged is moved aside as `NAME.old-HOST-PID-RANDOM` before it is deleted; the
same rules clear one a killed run left.
"""

import os
import re
import secrets
import shutil
import socket
import time

STALE_SECONDS = 24 * 3600  # untouched this long: its writer, wherever it ran, is gone
_KINDS = ("tmp", "old")


def host_name():
    """This machine's name as staging names carry it (only letters, digits, `.`, `_`, `-`)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", socket.gethostname()) or "unknown"


def new_path(directory, kind="tmp"):
    """`directory.KIND-HOST-PID-RANDOM`: a name no other run, here or elsewhere, will pick."""
    return f"{directory}.{kind}-{host_name()}-{os.getpid()}-{secrets.token_hex(4)}"


def heartbeat(path):
    """Marks `path` as still being written (its modification time: now)."""
    os.utime(path)


def remove_abandoned(directory, print_fn=None):
    """Deletes the staging and moved-aside directories of `directory` that nobody will finish.

    Returns:
        list of str, the directories removed.
    """
    parent, name = os.path.split(os.path.abspath(directory))
    removed = []
    for entry in sorted(os.listdir(parent)) if os.path.isdir(parent) else ():
        path = os.path.join(parent, entry)
        if _is_staging_of(entry, name) and _abandoned(entry[len(name) + 1:], path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
            if print_fn is not None:
                print_fn(f"removed {path}, left by a run that ended before finishing it")
    return removed


def _is_staging_of(entry, name):
    return any(entry.startswith(f"{name}.{kind}-") for kind in _KINDS)


def _abandoned(suffix, path):
    """Whether the staging directory `path` (`suffix` = `KIND-HOST-PID-RANDOM`) is nobody's.

    A name of another form (an earlier version's `NAME.tmp-PID`) is judged by its age only.
    """
    parts = suffix.split("-", 1)[1].rsplit("-", 2)  # [host, pid, random]; a host may hold "-"
    if len(parts) == 3 and parts[0] == host_name() and parts[1].isdigit() and not _alive(int(parts[1])):
        return True
    try:
        return time.time() - os.stat(path).st_mtime > STALE_SECONDS
    except FileNotFoundError:  # its writer renamed or removed it meanwhile
        return False


def _alive(pid):
    """Whether process `pid` exists on this machine."""
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    return True


__all__ = ["STALE_SECONDS", "host_name", "new_path", "heartbeat", "remove_abandoned"]

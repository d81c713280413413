"""Whose store this is: ssh's StrictModes, for a store directory.

A replay unpickles values, and it loads a value only when the record naming
it verifies with the store's key: whoever can write the key file, or the
directory that holds it (and so replace the file), can sign a pickle that
runs code in the next kernel that replays it. So before the key is read,
the store directory, its key file and its database folder must belong to the
user opening it (or to root) and be writable by no group and no other user.
Otherwise opening refuses, in one line naming the path and the fix, and
nothing is read. Root is no exception: a root kernel replaying a store
another user can write would run that user's code as root.

A symlink is judged by what it points at (``os.stat``), and the link itself
must belong to the user or root as well: a link another user owns can be
pointed elsewhere at any time.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ..errors import StoreError


def check_private(path: Path, what: str) -> None:
    """Raise :class:`StoreError` unless ``path`` is this user's (or root's) and not
    writable by group or others; nothing to check where it does not exist, or on a
    system without user ids.
    """
    if not hasattr(os, "getuid"):
        return
    try:
        link = os.lstat(path)
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise StoreError(f"cannot check the store {what} {path}: {exc.strerror or exc}") from None
    me = os.getuid()
    for who, info in (("link", link), ("", st)):
        if info.st_uid not in (me, 0):
            raise StoreError(
                f"the store {what} {path}{' (a symlink)' if who else ''} belongs to another "
                f"user (uid {info.st_uid}); nothing was read from it, since whoever can write "
                "it can make a replay run their code. Use a store of your own (`--store DIR`, "
                "NBDURABLE_DIR), or `nbdurable copy` the runs you trust into one"
            )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise StoreError(
            f"the store {what} {path} is writable by others (mode {stat.S_IMODE(st.st_mode):o}); "
            "nothing was read from it, since whoever can write it can make a replay run "
            f"their code. If you trust what is in it: chmod go-w {path}"
        )

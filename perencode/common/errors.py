"""The one exception type the CLI turns into a single red line and exit code 2, and the
one line for a write the filesystem refuses wherever it happens."""

import errno
import os

# The errors of a full, over-quota, read-only or forbidden filesystem: the user's to fix.
DISK_ERRORS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
               errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
               errno.EPERM: "operation not permitted"}


class UserError(Exception):
    """A mistake the user can fix (bad recipe, missing file, foreign checkpoint...).

    The message must be one line naming the file/field and what is allowed.
    """


def refused_write(exc: OSError, path: str | os.PathLike | None = None) -> str | None:
    """One line for an OSError that is the filesystem refusing a write or a lock (naming the
    path: the error's own, else `path`), None for any other error (a bug: its traceback is
    wanted)."""
    if exc.errno == errno.ENOLCK:
        return (f"{exc.filename or 'a lock file'}: the filesystem refuses file locks (no "
                f"locking on this mount, e.g. NFS without lockd); use a folder on a local or "
                f"lock-capable filesystem")
    if exc.errno not in DISK_ERRORS:
        return None
    return f"{exc.filename or path or 'a file'}: cannot write: {DISK_ERRORS[exc.errno]}"

"""The lock that keeps one run in an output folder (`OutputDirLock`, taken by `lock_output_dir` on the main process),
and the message of a folder that cannot be written."""

import contextlib
import errno
import json
import os
import socket
import time
from pathlib import Path

from transformers.utils import logging as hf_logging

from .processes import from_main_process

logger = hf_logging.get_logger(__name__)


LOCK_FILE = ".hfst_run.lock"  # in the output folder of a live run (OutputDirLock)


class OutputDirLockedError(RuntimeError):
    """Another live process holds the output folder."""


class OutputDirLock:
    """A run owns its output folder: two runs writing one folder would interleave checkpoints and results, and a
    resuming run would move aside the checkpoint a live run is still writing.

    `acquire()` takes an exclusive `fcntl.flock` on `output_dir/.hfst_run.lock` (making the folder where there is
    none) and writes the holder's pid, host, start time and command into it. The kernel drops the lock when its
    process ends, however it ends (SIGKILL included), so a dead holder's folder is taken over without a word, and a
    live holder's gives `OutputDirLockedError` naming its pid and host. Hold it for the whole run: `release()` removes
    the lock file, and the folders `acquire()` made if nothing else was written into them (a run that failed before
    writing anything leaves no trace). On systems without `fcntl` (Windows) no lock is taken."""

    def __init__(self, output_dir, command=""):
        self.path = Path(output_dir) / LOCK_FILE
        self.command, self.handle, self.created = command, None, []

    def acquire(self):
        try:
            import fcntl
        except ImportError:  # not POSIX: run unlocked
            return self
        missing = [p for p in (self.path.parent, *self.path.parent.parents) if not p.exists()]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.created = [p for p in missing if p.is_dir()]  # deepest first, as release removes them
        while True:
            handle = self._open()
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                handle.seek(0)
                holder = handle.read().strip()
                handle.close()
                try:
                    info = json.loads(holder)
                    who = f"process {info['pid']} on {info['host']} (started {info['started']}: {info['command']})"
                except (ValueError, KeyError, TypeError):
                    who = "another process"
                raise OutputDirLockedError(
                    f"{self.path.parent} is in use by {who}. Two runs must not share an output folder: wait for it "
                    "to finish, stop it, or pass another --output_dir."
                ) from None
            # a holder's release removes the file: one opened before that removal is locked by no one else, so a
            # lock on it would be a second lock on the folder; open the path again
            if self._is_the_file_at_path(handle):
                break
            handle.close()
        handle.seek(0)
        handle.truncate()
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                  "command": self.command}
        handle.write(json.dumps(holder))
        handle.flush()
        self.handle = handle
        return self

    def _open(self):
        """The lock file, opened for reading and writing without following a link: a symlink (or anything but a
        regular file) at its path is refused, so a run never writes through it into a file that is not its own."""
        if self.path.is_symlink() or (self.path.exists() and not self.path.is_file()):
            kind = "a symbolic link" if self.path.is_symlink() else "not a regular file"
            raise OutputDirLockedError(
                f"{self.path} is {kind}; a run writes its lock only into a regular file of its own. Remove it (or pass "
                "another --output_dir)."
            )
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)  # no link followed, even one made just now
        try:
            fd = os.open(self.path, flags, 0o644)
        except OSError as err:
            if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):  # the folder is not writable
                raise
            raise OutputDirLockedError(f"{self.path} cannot be opened as a lock file: {err}") from None
        return os.fdopen(fd, "r+")

    def _is_the_file_at_path(self, handle):
        """Whether the open `handle` is the file now at the lock's path (not one a releasing holder removed)."""
        try:
            ours, now = os.fstat(handle.fileno()), os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return False
        return (ours.st_dev, ours.st_ino) == (now.st_dev, now.st_ino)

    def release(self):
        if self.handle is None:
            return
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # while still locked: a process that opened it meanwhile opens the path again
        self.handle.close()  # closing the file drops the flock
        self.handle = None
        for folder in self.created:  # made by acquire and still empty: the run wrote nothing there
            try:
                folder.rmdir()
            except OSError:
                break
        self.created = []

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


def lock_output_dir(training_args, command="", script="train"):
    """Takes the `OutputDirLock` of `training_args.output_dir` on the main process and returns it; under several
    processes every rank learns whether it was taken, and all exit with the holder named if it was not. A folder that
    cannot be made or written (below a file, read-only, no permission) ends the run naming it and the cause."""
    out = Path(training_args.output_dir)
    if out.exists() and not out.is_dir():
        raise SystemExit(f"[{script}] --output_dir {out} is a file, not a folder: pass a folder (new or one of a run).")
    lock = OutputDirLock(training_args.output_dir, command)
    error = None
    if training_args.process_index == 0:
        try:
            lock.acquire()
        except OutputDirLockedError as err:
            error = str(err)
        except OSError as err:  # making the folder: below a file, read-only file system, no permission
            error = unwritable_message(out, err)
    error = from_main_process(error)
    if error:
        raise SystemExit(f"[{script}] {error}")
    return lock


def unwritable_message(out, err):
    """Why the folder `out` cannot be made or written (`err`, the OSError that said so), and what to do."""
    if out.is_symlink() and not out.exists():
        return f"--output_dir {out} is a symbolic link to {os.readlink(out)}, which does not exist. Pass a folder."
    blocking = next((p for p in (out, *out.parents) if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        return (f"--output_dir {out}: cannot make it, {blocking} is a file (not a folder). Pass a folder path that is "
                "not below a file.")
    cause = err.strerror or type(err).__name__
    return f"--output_dir {out}: cannot make or write it ({cause}: {err.filename or out}). Pass a folder you can write."

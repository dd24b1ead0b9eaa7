"""Lake storage on a POSIX file system (local disks and HDFS-style mounts).

Atomic renames give whole-file writes, ``link()`` gives create-if-absent, and an
advisory lock beside a file gives compare-and-swap (see :class:`LocalStorage`).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import tempfile
import uuid
from typing import BinaryIO

from cdc_compaction.core.exceptions import PreconditionFailedError, StorageError
from cdc_compaction.core.storage.base import FileInfo

log = logging.getLogger(__name__)


def _default_file_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


_FILE_MODE = _default_file_mode()


class LocalStorage:
    """A POSIX file system: atomic renames, ``link()`` for create-if-absent."""

    def join(self, *parts: str) -> str:
        return os.path.join(*parts)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def makedirs(self, path: str) -> None:
        os.makedirs(path, exist_ok=True)

    def list_dir(self, path: str) -> list[FileInfo]:
        out = []
        try:
            with os.scandir(path) as it:
                for e in it:
                    try:
                        st = e.stat()
                    except FileNotFoundError:
                        # Renamed or deleted between the listing and the stat (a writer's temp
                        # file), or a dangling link: it is not a file to read, so skip it alone.
                        log.warning("%s vanished or is a dangling link; skipped", e.path)
                        continue
                    if e.is_dir():
                        out.append(FileInfo(e.path, e.name, True, 0, st.st_mtime))
                        continue
                    # The inode is new for every copy, so a file landed again (even by `cp -p`, same bytes
                    # and mtime) gets another token. Not the status-change time: a chmod or a hard link of a
                    # committed file is the same landing. A file moved back from the archive keeps inode and
                    # mtime: it is new input because its commit's archive is done (pending.in_place).
                    token = f"{st.st_ino}:{st.st_mtime_ns}"
                    out.append(FileInfo(e.path, e.name, False, st.st_size, st.st_mtime, token))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StorageError(f"cannot list {path}: {exc}") from exc
        return sorted(out, key=lambda f: f.name)

    def read_text(self, path: str) -> str:
        try:
            with open(path, encoding="utf-8") as fh:
                return fh.read()
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {exc}") from exc

    def open_read(self, path: str) -> BinaryIO:
        """A seekable binary reader (Parquet footers are read from the end)."""
        try:
            return open(path, "rb")
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {exc}") from exc

    def _temp_beside(self, path: str, data: str | bytes) -> str:
        directory = os.path.dirname(path) or "."
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(
            prefix=f".{os.path.basename(path)}.", suffix=f".{uuid.uuid4().hex[:8]}.tmp", dir=directory
        )
        os.chmod(tmp, _FILE_MODE)  # mkstemp creates 0600; other readers (Spark, auditors) need access
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            os.fsync(fh.fileno())
        return tmp

    def write_text(self, path: str, text: str) -> None:
        """Replace ``path`` atomically: readers see the old or the new content, never a mix."""
        self.write_bytes(path, text.encode("utf-8"))

    def write_bytes(self, path: str, data: bytes) -> None:
        """Write a whole file atomically (hidden temporary, then rename)."""
        tmp = self._temp_beside(path, data)
        try:
            os.replace(tmp, path)
        except OSError as exc:
            os.unlink(tmp)
            raise StorageError(f"cannot write {path}: {exc}") from exc

    def upload(self, local_path: str, path: str) -> None:
        """Write the local file ``local_path`` to ``path`` atomically, streamed (never whole in memory)."""
        directory = os.path.dirname(path) or "."
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(
            prefix=f".{os.path.basename(path)}.", suffix=f".{uuid.uuid4().hex[:8]}.tmp", dir=directory
        )
        try:
            os.chmod(tmp, _FILE_MODE)
            with os.fdopen(fd, "wb") as out, open(local_path, "rb") as src:
                shutil.copyfileobj(src, out, 1 << 20)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise StorageError(f"cannot write {path} from {local_path}: {exc}") from exc

    def set_mtime(self, path: str, epoch_s: float) -> bool:
        """Give ``path`` the modification time ``epoch_s``; True (a local file's time can be set).

        Readers of a Delta log travel by timestamp through its commit files' modification times
        (``formats/delta.py``): a commit file written late, or written again, keeps its commit's time."""
        try:
            os.utime(path, (epoch_s, epoch_s))
        except OSError as exc:
            raise StorageError(f"cannot set the modification time of {path}: {exc}") from exc
        return True

    def create_exclusive(self, path: str, text: str) -> None:
        """Create ``path`` with ``text`` only if it does not exist (complete content or nothing)."""
        tmp = self._temp_beside(path, text)
        try:
            os.link(tmp, path)
        except FileExistsError as exc:
            raise PreconditionFailedError(f"{path} exists already") from exc
        except OSError as exc:
            if exc.errno == errno.EEXIST:
                raise PreconditionFailedError(f"{path} exists already") from exc
            raise StorageError(f"cannot create {path}: {exc}") from exc
        finally:
            os.unlink(tmp)

    @staticmethod
    def _token(path: str) -> str | None:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        # A replace() gives the path a new inode, so this changes with every write.
        return f"{st.st_ino}-{st.st_mtime_ns}-{st.st_size}"

    def read_versioned(self, path: str) -> tuple[str | None, str | None]:
        """The content of ``path`` and a token that changes whenever it is replaced (None, None if absent)."""
        with self._locked(path):
            token = self._token(path)
            return (self.read_text(path), token) if token is not None else (None, None)

    def write_if_match(self, path: str, text: str, token: str | None) -> None:
        """Compare-and-swap: replace ``path`` only if it is still at ``token`` (None: must not exist)."""
        with self._locked(path):
            current = self._token(path)
            if current != token:
                raise PreconditionFailedError(f"{path} changed since it was read (expected {token}, found {current})")
            self.write_text(path, text)

    class _Lock:
        def __init__(self, path: str) -> None:
            directory = os.path.dirname(path) or "."
            os.makedirs(directory, exist_ok=True)
            self.fd = os.open(os.path.join(directory, f".{os.path.basename(path)}.lock"), os.O_CREAT | os.O_RDWR)

        def __enter__(self) -> None:
            fcntl.flock(self.fd, fcntl.LOCK_EX)

        def __exit__(self, *exc: object) -> None:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)

    def _locked(self, path: str) -> LocalStorage._Lock:
        """An exclusive advisory lock beside ``path`` (local to this host; S3 uses If-Match instead)."""
        return LocalStorage._Lock(path)

    def copy(self, src: str, dst: str) -> None:
        """Copy to a hidden temporary name, then rename: ``dst`` is complete whenever it exists."""
        os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
        tmp = os.path.join(os.path.dirname(dst), f".{os.path.basename(dst)}.{uuid.uuid4().hex[:8]}.copying")
        try:
            shutil.copyfile(src, tmp)
            os.replace(tmp, dst)
        except OSError as exc:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise StorageError(f"cannot copy {src} to {dst}: {exc}") from exc

    def size(self, path: str) -> int:
        try:
            return os.path.getsize(path)
        except OSError as exc:
            raise StorageError(f"cannot stat {path}: {exc}") from exc

    def delete(self, path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StorageError(f"cannot delete {path}: {exc}") from exc

    def delete_tree(self, path: str) -> None:
        if os.path.isdir(path):
            shutil.rmtree(path)

    def remove_dir_if_empty(self, path: str) -> bool:
        try:
            os.rmdir(path)
            return True
        except OSError:
            return False

"""Host-side file transfer for the local provider, safe against the sandbox's own links.

``upload`` and ``download`` run in the host process (as root, when sandboxes get a
private uid) on a directory that the sandbox's code may change at any moment - also
while the transfer runs, from a command still executing. A path is therefore never
resolved by name and never followed through a link:

- the path is taken lexically (``a/../b`` is ``b``; one that leaves the working
  directory is refused) and opened one component at a time, each relative to the
  descriptor of the directory before it, with ``O_NOFOLLOW | O_DIRECTORY``: a
  component swapped for a symbolic link (to a host directory, say) fails the transfer
  instead of leading it out of the sandbox;
- with a private uid, every directory passed through must belong to the sandbox's
  user, so the host only writes where the sandbox itself could;
- what the host creates (a missing directory, the uploaded file) is made in a staging
  directory only the host can enter, given to the sandbox's user there, and then
  renamed into place relative to the parent's descriptor - so nothing is ever chowned
  or written through a name the sandbox controls, and an upload replaces a file
  atomically instead of writing into whatever inode the name points at;
- a download opens the file with ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO cannot block it)
  and reads it only if it is a regular file owned by the sandbox's user (a hard link
  to a host file is refused).

Limits: a file is transferred whole in memory; a symbolic link inside the sandbox is
never followed, even one that points inside it (download its target instead).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import uuid

from telescope.api.sandbox import SandboxError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_LINK_ERRORS = (errno.ELOOP, errno.ENOTDIR)


class SandboxFiles:
    """Transfers files between the host and one sandbox's working directory."""

    def __init__(self, sandbox_id: str, workdir: str, staging: str, uid: int | None, gid: int | None) -> None:
        self.sandbox_id = sandbox_id
        self.workdir = workdir
        self.staging = staging  # root-only, on the working directory's file system
        self.uid = uid
        self.gid = gid

    # ------------------------------------------------------------------ paths
    def _parts(self, path: str) -> list[str]:
        rel = os.path.relpath(os.path.normpath(path), self.workdir) if os.path.isabs(path) else os.path.normpath(path)
        parts = [] if rel == "." else rel.split(os.sep)
        if parts and parts[0] == os.pardir:
            raise SandboxError(f"path {path!r} is outside the sandbox {self.sandbox_id}")
        return parts

    def _link_error(self, shown: str) -> SandboxError:
        return SandboxError(
            f"{shown!r} in sandbox {self.sandbox_id} is a symbolic link or not a directory: the host follows "
            "no links inside a sandbox (one could lead outside the sandbox)"
        )

    def _check_owner(self, fd: int, shown: str) -> None:
        if self.uid is not None and os.fstat(fd).st_uid != self.uid:
            raise SandboxError(
                f"{shown!r} in sandbox {self.sandbox_id} does not belong to the sandbox's user: "
                "the host transfers files only inside the sandbox's own directories"
            )

    def _open_dirs(self, parts: list[str], create: bool, path: str) -> int:
        """A descriptor of directory ``parts`` below the working directory, links never followed."""
        fd = os.open(self.workdir, _DIR_FLAGS)
        try:
            self._check_owner(fd, ".")
            for i, name in enumerate(parts):
                shown = "/".join(parts[: i + 1])
                try:
                    nxt = os.open(name, _DIR_FLAGS, dir_fd=fd)
                except FileNotFoundError:
                    if not create:
                        raise SandboxError(f"no file {path!r} in sandbox {self.sandbox_id}") from None
                    nxt = self._make_dir(fd, name, shown)
                except OSError as exc:
                    if exc.errno in _LINK_ERRORS:
                        raise self._link_error(shown) from None
                    raise SandboxError(f"cannot open {shown!r} in sandbox {self.sandbox_id}: {exc}") from None
                os.close(fd)
                fd = nxt
                self._check_owner(fd, shown)
            return fd
        except BaseException:
            os.close(fd)
            raise

    # --------------------------------------------------------------- creating
    def _give(self, name: str, stage: int) -> None:
        if self.uid is not None:
            assert self.gid is not None
            os.chown(name, self.uid, self.gid, dir_fd=stage, follow_symlinks=False)  # in the root-only staging

    def _make_dir(self, parent: int, name: str, shown: str) -> int:
        """Create directory ``name`` in ``parent`` (staged, given to the sandbox, renamed in); open it."""
        stage = os.open(self.staging, _DIR_FLAGS)
        staged = uuid.uuid4().hex
        try:
            os.mkdir(staged, 0o755, dir_fd=stage)
            self._give(staged, stage)
            try:
                os.rename(staged, name, src_dir_fd=stage, dst_dir_fd=parent)
            except OSError:  # the sandbox made one meanwhile (or a file there): use what is there
                os.rmdir(staged, dir_fd=stage)
        finally:
            os.close(stage)
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            if exc.errno in _LINK_ERRORS:
                raise self._link_error(shown) from None
            raise SandboxError(f"cannot create {shown!r} in sandbox {self.sandbox_id}: {exc}") from None

    def make_dirs(self, path: str) -> None:
        """Create directory ``path`` (and its parents) in the sandbox, owned by its user."""
        os.close(self._open_dirs(self._parts(path), create=True, path=path))

    def write(self, path: str, data: bytes) -> None:
        """Put ``data`` at ``path``: a new file of the sandbox's user, replacing any file there."""
        parts = self._parts(path)
        if not parts:
            raise SandboxError(f"cannot upload to {path!r}: it is the working directory of sandbox {self.sandbox_id}")
        parent = self._open_dirs(parts[:-1], create=True, path=path)
        stage = os.open(self.staging, _DIR_FLAGS)
        staged = uuid.uuid4().hex
        try:
            fd = os.open(staged, _NEW_FILE_FLAGS, 0o644, dir_fd=stage)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            self._give(staged, stage)
            os.rename(staged, parts[-1], src_dir_fd=stage, dst_dir_fd=parent)
        except OSError as exc:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(staged, dir_fd=stage)
            raise SandboxError(f"cannot upload {path!r} to sandbox {self.sandbox_id}: {exc}") from None
        finally:
            os.close(stage)
            os.close(parent)

    # ---------------------------------------------------------------- reading
    def read(self, path: str) -> bytes:
        """The content of regular file ``path`` of the sandbox (never through a link)."""
        parts = self._parts(path)
        if not parts:
            raise SandboxError(f"cannot download {path!r}: it is the working directory of sandbox {self.sandbox_id}")
        parent = self._open_dirs(parts[:-1], create=False, path=path)
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent)
        except FileNotFoundError:
            raise SandboxError(f"no file {path!r} in sandbox {self.sandbox_id}") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise self._link_error(path) from None
            raise SandboxError(f"cannot read {path!r} in sandbox {self.sandbox_id}: {exc}") from None
        finally:
            os.close(parent)
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode):
                raise SandboxError(f"{path!r} in sandbox {self.sandbox_id} is not a regular file")
            self._check_owner(f.fileno(), path)
            return f.read()

"""Opening input files safely: only regular files, never blocking, with reasons people can act on.

A FIFO opened for reading blocks until a writer comes, `/dev/zero` never ends, and a symlink
loop or a dangling link is "no such file" to `open()`. Every reader of user-named files goes
through here, so each of these gets the same clear refusal. Beside them, the one step
every writer of a file put in place by a rename shares: the rename made durable
(`sync_directory`). No JAX here.
"""

from __future__ import annotations

import errno
import os
import resource
import stat
from dataclasses import dataclass
from typing import NamedTuple


class FileRefused(Exception):  # noqa: N818 - internal; callers turn it into their own error
    """An input file cannot be used; `reason` says why, in words."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


def kind(mode: int) -> str:
    """What a file of this mode is, in words (`a FIFO (named pipe)`)."""
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO or pipe (process substitution <(...) gives one too)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def why_unopenable(path: str | os.PathLike[str], error: OSError) -> str:
    """Why `open(path)` failed, telling a dangling link and a symlink loop from a missing file."""
    if error.errno == errno.ENOENT and os.path.islink(path):
        try:
            return f"dangling symlink (its target {os.readlink(path)!r} does not exist)"
        except OSError:  # pragma: no cover - it was a link a moment ago
            return "dangling symlink"
    if error.errno == errno.ENOENT:
        return "no such file"
    if error.errno == errno.ELOOP:
        return "symlink loop (links that point at each other never reach a file)"
    if error.errno == errno.ENOTDIR:
        return "a directory in its path is not a directory"
    if error.errno in (errno.EACCES, errno.EPERM):
        return "permission denied"
    if error.errno == errno.ENAMETOOLONG:
        return "path too long"
    return f"cannot open: {error.strerror or error}"


class DescriptorLimit(NamedTuple):
    """This process's limit on open descriptors (RLIMIT_NOFILE): the soft limit (what
    EMFILE means: every descriptor below it is open), the hard one (None: unlimited), and
    a soft limit to raise it to (the hard one, or 4x and at least 65,536 where unlimited)."""

    soft: int
    hard: int | None
    raised: int

    @classmethod
    def now(cls) -> DescriptorLimit:
        """The limit as it is now (`resource.getrlimit`: no descriptor needed)."""
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY:
            return cls(soft, None, max(4 * soft, 65536))
        return cls(soft, hard, hard)


def open_regular(
    path: str | os.PathLike[str], what: str = "a regular file"
) -> tuple[int, os.stat_result]:
    """Open a regular file for reading without blocking; return its descriptor and status.

    The caller owns (and closes) the descriptor, which is in ordinary blocking mode.

    Raises:
        FileRefused: the file is missing, unreadable or not a regular file, with why.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise FileRefused(why_unopenable(path, e)) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FileRefused(f"is {kind(info.st_mode)}, not {what}")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd, info


def check_regular(path: str | os.PathLike[str], what: str = "a regular file") -> str | None:
    """Why `path` is not a readable regular file, or None if it is one. Never blocks."""
    try:
        fd, _ = open_regular(path, what)
    except FileRefused as e:
        return e.reason
    os.close(fd)
    return None


def read_capped(path: str | os.PathLike[str], limit: int, what: str = "a regular file") -> bytes:
    """The whole of a regular file of at most `limit` bytes.

    Files whose size the kernel does not know (`/proc`) are read up to `limit` + 1 bytes.

    Raises:
        FileRefused: as `open_regular`, or the file is larger than `limit`.
    """
    fd, info = open_regular(path, what)
    try:
        if info.st_size > limit:
            raise FileRefused(f"is {info.st_size} bytes; at most {limit} are accepted")
        chunks = []
        total = 0
        while total <= limit:
            try:
                chunk = os.read(fd, min(1 << 20, limit + 1 - total))
            except OSError as e:
                raise FileRefused(f"cannot read: {e.strerror or e}") from None
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
        if total > limit:
            raise FileRefused(f"is more than {limit} bytes; at most {limit} are accepted")
        return b"".join(chunks)
    finally:
        os.close(fd)


# Who may have chosen a file's contents ------------------------------------------------


@dataclass(frozen=True, slots=True)
class Untrusted:
    """Why a file is not trusted: `reason` in words, and the user concerned.

    Attributes:
        reason: `owned by uid 65534 (nobody)`, `its directory /srv/x is world-writable`...
        uid: The owner concerned (of the file, link or directory the reason names).
        name: That user's name, or None when the system has no name for the uid.
        fix: How to make it trusted, in words (with the path).
    """

    reason: str
    uid: int
    name: str | None
    fix: str


def user_name(uid: int) -> str | None:
    """The login name of `uid`, or None."""
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except (KeyError, OverflowError):
        return None


def _who(uid: int) -> str:
    name = user_name(uid)
    return f"{name} (uid {uid})" if name is not None else f"uid {uid} (no user has that id)"


def _not_us(me: int) -> str:
    return "not by you (root)" if me == 0 else f"not by you ({_who(me)}) or root"


def _private_group(gid: int, uid: int) -> bool:
    """Whether `gid` is `uid`'s own group (a "user private group", as `useradd` makes), so
    that group-writable means writable by the owner alone.

    It is when the group is the owner's primary group and has the owner's name, lists no
    other member, and is no other account's primary group: `useradd -g alice bob` makes bob
    a member of group alice that the group's own entry does not list. Accounts are those
    the system's account database enumerates (`pwd.getpwall()`, as `getent passwd`).
    """
    import grp
    import pwd

    try:
        user = pwd.getpwuid(uid)
        group = grp.getgrgid(gid)
    except (KeyError, OverflowError):
        return False
    if gid != user.pw_gid or group.gr_name != user.pw_name:
        return False
    if not set(group.gr_mem) <= {user.pw_name}:
        return False
    return not any(other.pw_gid == gid and other.pw_uid != uid for other in pwd.getpwall())


def _others_can_write(info: os.stat_result) -> str | None:
    """`world-writable`, `group-writable`, or None when only the owner may write."""
    if info.st_mode & stat.S_IWOTH:
        return "world-writable"
    if info.st_mode & stat.S_IWGRP and not _private_group(info.st_gid, info.st_uid):
        return "group-writable"
    return None


#: The most symlinks one lookup follows (Linux's MAXSYMLINKS): more is a loop to the kernel.
_MAX_LINKS = 40


def _resolve(path: str | os.PathLike[str]) -> tuple[str, list[tuple[str, os.stat_result]]]:
    """The real path of `path` and every symlink the kernel follows to reach it, in order,
    each as a real path with its own status (`lstat`): links in the directories on the
    way included, and links a link leads to.

    Raises:
        OSError: a component is missing or cannot be examined, or the links loop.
    """
    text = os.fspath(path)
    here = "/" if text.startswith("/") else os.getcwd()
    todo = text.split("/")[::-1]  # components still to walk, the next one last
    links: list[tuple[str, os.stat_result]] = []
    while todo:
        part = todo.pop()
        if part in ("", "."):
            continue
        if part == "..":
            here = os.path.dirname(here)
            continue
        step = os.path.join(here, part)
        info = os.lstat(step)
        if not stat.S_ISLNK(info.st_mode):
            here = step
            continue
        if len(links) == _MAX_LINKS:
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), text)
        links.append((step, info))
        target = os.readlink(step)
        if target.startswith("/"):
            here = "/"
        todo.extend(target.split("/")[::-1])
    return here, links


def untrusted(path: str | os.PathLike[str], what: str = "the policy") -> Untrusted | None:
    """Why a file (or directory) could hold contents that neither you nor root chose, or None.

    `what` names it in the fixes (`move the policy into a directory of your own`).

    The reasoning is git's (`safe.directory`, after CVE-2022-24765) carried to one file.
    Whoever can write the file, or change which file its name refers to, chooses what it
    says. That is: the file's owner (and its group or everyone, if it is writable by
    them); the owner of every symlink followed on the way to it (the name itself, a link
    it leads to, a link to a directory of its path: each can be re-pointed by its owner);
    and whoever can write a directory holding the name or one of those links, or the
    file. Each of those must be you (the effective uid) or root. A directory writable by
    others is allowed only with the sticky bit (like /tmp, mode 1777): there only an
    entry's owner, the directory's owner and root can rename or remove it, and both are
    checked. Group-writable counts as the owner's alone when the group is the owner's
    private group (see `_private_group`).

    A path that cannot be examined gives None: reading it reports what is wrong. Systems
    without POSIX owners (Windows) have nothing to check.
    """
    if not hasattr(os, "geteuid"):  # pragma: no cover - not POSIX
        return None
    me = os.geteuid()
    trusted = {me, 0}
    try:
        info = os.stat(path)
        real, links = _resolve(path)
    except (OSError, ValueError):
        return None
    shown = os.path.abspath(path)
    take_over = f"chown {user_name(me) or me} {shown}"
    if info.st_uid not in trusted:
        return Untrusted(
            f"owned by {_who(info.st_uid)}, {_not_us(me)}",
            info.st_uid,
            user_name(info.st_uid),
            f"take it over if you trust its contents: {take_over}",
        )
    for link, held in links:
        if held.st_uid in trusted:
            continue
        if link == shown:
            reason, fix = "a symlink", f"replace the link with a link or copy of your own: {shown}"
        else:
            reason = f"a symlink on the way to it, {link}, is"
            fix = f"replace {link} with a link or copy of your own, or name {real} directly"
        return Untrusted(
            f"{reason} owned by {_who(held.st_uid)}, {_not_us(me)}",
            held.st_uid,
            user_name(held.st_uid),
            fix,
        )
    writable = _others_can_write(info)
    if writable is not None:
        return Untrusted(
            f"{writable} (mode {stat.S_IMODE(info.st_mode):04o}): others can change it",
            info.st_uid,
            user_name(info.st_uid),
            f"chmod go-w {real}",
        )
    holding = (shown, *(link for link, _ in links), real)
    for directory in dict.fromkeys(os.path.dirname(p) for p in holding):
        try:
            held = os.stat(directory)
        except OSError:
            return None
        if held.st_uid not in trusted:
            return Untrusted(
                f"its directory {directory} is owned by {_who(held.st_uid)}, {_not_us(me)}, "
                "and its owner can put another file in its place",
                held.st_uid,
                user_name(held.st_uid),
                f"move {what} into a directory of your own",
            )
        writable = _others_can_write(held)
        if writable is not None and not held.st_mode & stat.S_ISVTX:
            return Untrusted(
                f"its directory {directory} is {writable} (mode "
                f"{stat.S_IMODE(held.st_mode):04o}) without the sticky bit: others can put "
                "another file in its place",
                held.st_uid,
                user_name(held.st_uid),
                f"chmod go-w {directory}, or move {what} into a directory of your own",
            )
    return None


def sync_directory(directory: str | os.PathLike[str]) -> None:
    """Make a rename in `directory` durable; a filesystem that cannot sync one is left be."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

"""A local directory sent to the login node in one transfer, arriving whole or not at all.

The tree goes as one tar stream on the stdin of one remote command: a shell script that
unpacks it into a fresh hidden sibling of the destination and renames that into place, so
no reader on the cluster ever sees a partial directory. It refuses a destination that
exists, and on any failure (a truncated stream, a full disk, a dropped connection, a
signal) removes the sibling it made; the local side writes nothing.

A tar stream that stops between two members unpacks without an error; so the archive
ends with an empty marker file of a fresh random name, and only a tree holding it moves into
place (without it). The archive is built here with `tarfile` (POSIX pax format: any file name, long or not
UTF-8, travels as its bytes) and unpacked by the cluster's tar (GNU tar on Linux).
"""

from __future__ import annotations

import io
import os
import posixpath
import secrets
import tarfile

from launcher.errors import RunError, SchedulerError
from launcher.schedulers.ssh.connection import Connection, said

# Exit statuses of the remote script; other failures are the shell's or tar's own.
EXISTS = 17
NO_PARENT = 18
NO_TEMPORARY = 19
UNPACK_FAILED = 20
RENAME_FAILED = 21
INCOMPLETE = 22

# $1 destination, $2 the temporary sibling, $3 the parent, $4 1 to create the parent and
# its own missing parents, 2 to create the parent alone (its own parent must exist),
# $5 the name of the archive's last member.
# The EXIT trap, set once the sibling is ours, removes it on any way out but success; a
# signal exits through it too (dash, unlike bash, skips EXIT traps on signals otherwise).
# mv -T renames the directory itself, never into a directory that appeared meanwhile.
# One line: a word holding a newline would need $'...', which not every sh reads.
RECEIVE = "; ".join(f"""\
set -u
dest=$1 tmp=$2 parent=$3
if [ "$4" = 1 ]; then mkdir -p -- "$parent" || exit {NO_PARENT}; fi
if [ "$4" = 2 ] && [ ! -d "$parent" ]; then mkdir -- "$parent" || exit {NO_PARENT}; fi
[ -d "$parent" ] || exit {NO_PARENT}
if [ -e "$dest" ] || [ -L "$dest" ]; then exit {EXISTS}; fi
mkdir -- "$tmp" || exit {NO_TEMPORARY}
trap 'rm -rf -- "$tmp"' EXIT
trap 'exit 129' HUP INT TERM PIPE
tar -x -f - -C "$tmp" --no-same-owner || exit {UNPACK_FAILED}
[ -f "$tmp/$5" ] && [ ! -L "$tmp/$5" ] || exit {INCOMPLETE}
rm -f -- "$tmp/$5" || exit {INCOMPLETE}
if [ -e "$dest" ] || [ -L "$dest" ]; then exit {EXISTS}; fi
mv -T -- "$tmp" "$dest" || exit {RENAME_FAILED}
trap - EXIT
""".splitlines())


def archive(local_dir: str | os.PathLike[str], last: str | None = None) -> bytes:
    """The tree under `local_dir` as a tar archive, its entries relative to it, in name
    order, then an empty file named `last` (when given); symbolic links stay links. Owners
    are left out: files on the cluster belong to whoever unpacks them."""
    root = os.fspath(local_dir)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT,
                      encoding="utf-8", errors="surrogateescape") as tar:
        for name in sorted(os.listdir(root)):
            tar.add(os.path.join(root, name), arcname=name, recursive=True, filter=_anonymous)
        if last is not None:
            tar.addfile(_anonymous(tarfile.TarInfo(last)), io.BytesIO(b""))
    return buffer.getvalue()


def _anonymous(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def temporary_sibling(remote_dir: str) -> tuple[str, str]:
    """(the destination's parent, a fresh hidden name beside the destination)."""
    parent = posixpath.dirname(remote_dir) or "."
    return parent, posixpath.join(parent, f".glaunch-partial-{secrets.token_hex(8)}")


def check_remote_dir(remote_dir: str) -> str:
    """`remote_dir` normalised; ValueError when it names no directory that can be created
    (the root, `.`, `..`) or starts with `~`, which is sent as a literal name, unexpanded."""
    if not remote_dir or "\0" in remote_dir:
        raise ValueError(f"not a remote directory: {remote_dir!r}")
    if remote_dir.startswith("~"):
        raise ValueError(f"remote directory {remote_dir!r}: give it absolute or relative to the remote home, "
                         "without ~ (it is not expanded)")
    path = posixpath.normpath(remote_dir)
    if posixpath.basename(path) in ("", ".", ".."):
        raise ValueError(f"remote directory {remote_dir!r} names no directory that can be created")
    return path


def send_tree(conn: Connection, local_dir: str | os.PathLike[str], remote_dir: str, *, parents: bool = False,
              make_parent: bool = False, timeout_s: float | None = None) -> None:
    """Send the tree under `local_dir` to `remote_dir` on the login node in one call. The
    directory appears there complete, or not at all. SchedulerError (exit 3), naming the
    host, when `remote_dir` already exists, its parent is missing (`parents`: create it and
    what it lacks above; `make_parent`: create it where its own parent exists), or anything
    fails; RunError when `local_dir` cannot be read."""
    dest = check_remote_dir(remote_dir)
    last = f".glaunch-complete-{secrets.token_hex(8)}"
    try:
        data = archive(local_dir, last)
    except OSError as exc:
        raise RunError(f"cannot read {os.fspath(local_dir)!r} to send it: {exc.strerror or exc}") from None
    parent, tmp = temporary_sibling(dest)
    mode = "1" if parents else "2" if make_parent else "0"
    words = ["sh", "-c", RECEIVE, "glaunch-receive", dest, tmp, parent, mode, last]
    done = conn.run(words, input=data, timeout_s=timeout_s)
    if done.returncode == 0:
        return
    where = conn.where()
    reasons = {
        EXISTS: f"{dest!r} already exists on {where}: nothing was sent",
        NO_PARENT: f"no directory {parent!r} on {where} to receive {posixpath.basename(dest)!r}",
        NO_TEMPORARY: f"cannot create a directory in {parent!r} on {where}",
        UNPACK_FAILED: f"unpacking into {dest!r} on {where} failed, nothing was left there",
        INCOMPLETE: f"the tree for {dest!r} reached {where} incomplete, nothing was left there",
        RENAME_FAILED: f"moving the unpacked tree to {dest!r} on {where} failed, nothing was left there",
    }
    reason = reasons.get(done.returncode, f"sending to {dest!r} on {where} failed (exit {done.returncode}), "
                                          "nothing was left there")
    detail = said(done.stderr)
    raise SchedulerError(f"{reason} ({detail})" if detail else reason)

"""What glaunch does on a login node over one Connection: Slurm's commands through the
same Client (timeouts, retries, lookups) as on the cluster itself, and the few file
operations a run kept there needs. Every word goes through launcher.shell (Connection.run
quotes it); the scripts here are fixed text that takes its values as positional arguments.
"""

from __future__ import annotations

import posixpath
import subprocess
import weakref
from typing import Mapping, Sequence

from launcher.errors import SchedulerError
from launcher.schedulers.slurm.client import Account, Client
from launcher.schedulers.ssh.connection import Connection, NoAnswer, said

# $1 the directory to run in ("": the login directory), then the command: run as on the
# cluster itself (launcher.schedulers.slurm.client.clean_env), without the login shell's
# SLURM_* (but SLURM_CONF) and the input variables of Slurm's commands, which would reshape
# the request or the query.
SLURM_ENV = "; ".join((
    'if [ -n "$1" ]; then cd -- "$1" || exit 126; fi',
    "shift",
    "for v in $(env | sed -n -E 's/^((SLURM|SBATCH|SALLOC|SRUN|SQUEUE|SACCT|SINFO|SCANCEL|SCONTROL|SACCTMGR)"
    "_[A-Za-z0-9_]*)=.*/\\1/p'); do [ \"$v\" = SLURM_CONF ] || unset \"$v\"; done",
    "SLURM_TIME_FORMAT=standard",
    "export SLURM_TIME_FORMAT",
    'exec "$@"',
))
# $1 the file; exit 3 when it is missing.
READ = '[ -e "$1" ] || exit 3; exec cat -- "$1"'
MISSING = 3
# $1 the file, $2 a fresh name beside it: stdin replaces the file whole.
WRITE = 'cat > "$2" && mv -f -- "$2" "$1" || { rm -f -- "$2"; exit 1; }'
# $1 the folder, then its files: a tar stream of those that exist on stdout.
PACK_FILES = ('cd -- "$1" || exit 3; shift; for f; do [ -f "$f" ] && printf "%s\\0" "$f"; done | '
              'exec tar -c -f - --null --no-recursion -T -')
# $1 a folder, then NAME=OFFSET words: for each task log there (*_log.out, *_log.err), its
# name, the offset sent from (0 when the file is now shorter than the one given), the
# length, each ended by a NUL, then that many bytes: what it holds past the offset.
LOG_TAILS = ('cd -- "$1" 2>/dev/null || exit 0; shift; t=$(mktemp) || exit 4; trap \'rm -f -- "$t"\' EXIT; '
             'for f in *_log.out *_log.err; do [ -f "$f" ] || continue; off=0; '
             'for a; do case "$a" in "$f="*) off=${a#*=} ;; esac; done; '
             'case "$off" in ""|*[!0-9]*) off=0 ;; esac; '
             'size=$(wc -c < "$f") || continue; size=$((size)); if [ "$size" -lt "$off" ]; then off=0; fi; '
             'tail -c +$((off + 1)) -- "$f" > "$t" || continue; n=$(wc -c < "$t"); n=$((n)); '
             'printf "%s\\0%s\\0%s\\0" "$f" "$off" "$n"; cat -- "$t"; done')
# $1 a folder, $2 the most bytes sent of one file, then PATTERN=OFFSET words (PATTERN: a
# path relative to the folder, `*` allowed; one that no name matches is skipped; a file a
# `*` pattern matches and another word names is sent for that word only): for each regular
# file a pattern names, as LOG_TAILS does, its name, the offset sent from, the length, each
# ended by a NUL, then at most $2 bytes past the offset.
FILES_SINCE = ('cd -- "$1" 2>/dev/null || exit 0; limit=$2; shift 2; t=$(mktemp) || exit 4; '
               'trap \'rm -f -- "$t"\' EXIT; '
               'for a; do want=${a##*=}; case "$want" in ""|*[!0-9]*) want=0 ;; esac; '
               'for f in ${a%=*}; do [ -f "$f" ] || continue; '
               'case "${a%=*}" in *"*"*) for b; do case "$b" in "$f="*) continue 2 ;; esac; done ;; esac; '
               'off=$want; '
               'size=$(wc -c < "$f") || continue; size=$((size)); if [ "$size" -lt "$off" ]; then off=0; fi; '
               'tail -c +$((off + 1)) -- "$f" | head -c "$limit" > "$t" || continue; n=$(wc -c < "$t"); n=$((n)); '
               'printf "%s\\0%s\\0%s\\0" "$f" "$off" "$n"; cat -- "$t"; done; done')
# $1 the folder: the tar stream on stdin unpacked over what it holds.
UNPACK = 'exec tar -x -f - -C "$1" --no-same-owner'
# $1 a run directory, $2 a new folder in it, then names: those that exist move into the
# folder, then the tar stream on stdin is unpacked into the run directory. While it
# unpacks, the folder holds MARK: every name that existed is in the folder by then.
ASIDE_MARK = ".glaunch-unpacking"
SET_ASIDE = ('cd -- "$1" || exit 3; aside=$2; shift 2; mkdir -p -- "$aside" || exit 4; '
             'for f; do if [ -e "$f" ] || [ -L "$f" ]; then mv -- "$f" "$aside/" || exit 5; fi; done; '
             f': > "$aside/{ASIDE_MARK}" || exit 6; tar -x -f - --no-same-owner || exit 7; '
             f'rm -f -- "$aside/{ASIDE_MARK}"')
# SET_ASIDE undone ($3: 1 when it completed): each name the folder holds comes back over
# what is there; once every name had been set aside (MARK, or $3), a name the folder does
# not hold was new, and goes.
PUT_BACK = ('cd -- "$1" || exit 3; aside=$2; whole=$3; shift 3; [ -d "$aside" ] || exit 0; '
            f'if [ -e "$aside/{ASIDE_MARK}" ]; then whole=1; fi; '
            'for f; do if [ -e "$aside/$f" ] || [ -L "$aside/$f" ]; then rm -rf -- "$f"; mv -- "$aside/$f" "$f"; '
            'elif [ "$whole" = 1 ]; then rm -rf -- "$f"; fi; done; '
            f'rm -f -- "$aside/{ASIDE_MARK}"; rmdir -- "$aside" 2>/dev/null; exit 0')
# The account: home, user and group names, each ended by a NUL.
ACCOUNT = 'printf "%s\\0%s\\0%s\\0" "$HOME" "$(id -un)" "$(id -Gn)"'


def slurm_client(conn: Connection, *, cwd: str | None = None) -> Client:
    """A Slurm Client whose commands run on `conn`'s login node (in `cwd` when given) in the
    environment SLURM_ENV leaves, as the account there; the local environment stays here.
    A command that does not end within its bound is a timeout to the Client: a lost sbatch
    answer is looked up."""

    def runner(cmd: Sequence[str], *, timeout: float, input: str | None = None,
               env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        words = ["sh", "-c", SLURM_ENV, "glaunch-slurm", cwd or "", *cmd]
        try:
            done = conn.run(words, input=input.encode() if input is not None else None, timeout_s=timeout)
        except NoAnswer:
            raise subprocess.TimeoutExpired(list(cmd), timeout) from None
        return subprocess.CompletedProcess(list(cmd), done.returncode, done.out, done.err)

    return Client(runner=runner, environ={}, account_of=lambda: account(conn))


_ACCOUNTS: weakref.WeakKeyDictionary[Connection, Account] = weakref.WeakKeyDictionary()


def account(conn: Connection) -> Account:
    """The remote account (user, home, groups): asked once per connection."""
    if conn not in _ACCOUNTS:
        done = conn.run(["sh", "-c", ACCOUNT])
        fields = [f.decode(errors="surrogateescape") for f in done.stdout.split(b"\0")]
        if done.returncode != 0 or len(fields) < 4 or not fields[0] or not fields[1]:
            raise SchedulerError(f"{conn.where()} did not say its home directory and user ({said(done.stderr)})")
        _ACCOUNTS[conn] = Account(user=fields[1], home=fields[0], groups=frozenset(fields[2].split()) or None)
    return _ACCOUNTS[conn]


def home_and_user(conn: Connection) -> tuple[str, str]:
    """The remote account's home directory and user name."""
    found = account(conn)
    return found.home, found.user


def read_bytes(conn: Connection, path: str) -> bytes | None:
    """The remote file's bytes, or None when it does not exist."""
    done = conn.run(["sh", "-c", READ, "glaunch-read", path])
    if done.returncode == MISSING:
        return None
    if done.returncode != 0:
        raise SchedulerError(f"cannot read {path!r} on {conn.where()} ({said(done.stderr)})")
    return done.stdout


def write_bytes(conn: Connection, path: str, data: bytes) -> None:
    """Replace the remote file whole with `data`."""
    fresh = posixpath.join(posixpath.dirname(path), f".{posixpath.basename(path)}.glaunch-new")
    done = conn.run(["sh", "-c", WRITE, "glaunch-write", path, fresh], input=data)
    if done.returncode != 0:
        raise SchedulerError(f"cannot write {path!r} on {conn.where()} ({said(done.stderr)})")


def run_checked(conn: Connection, words: Sequence[str], what: str) -> None:
    done = conn.run(words)
    if done.returncode != 0:
        raise SchedulerError(f"{what} on {conn.where()} failed ({said(done.stderr) or f'exit {done.returncode}'})")


def remove_tree(conn: Connection, path: str) -> None:
    """Remove a directory this command sent, after a failure."""
    run_checked(conn, ["rm", "-rf", "--", path], f"removing {path!r}")


def pack_files(conn: Connection, folder: str, names: Sequence[str]) -> bytes:
    """The files `names` (relative to `folder`) that exist, as a tar stream."""
    done = conn.run(["sh", "-c", PACK_FILES, "glaunch-pack", folder, *names])
    if done.returncode != 0:
        raise SchedulerError(f"cannot read the records in {folder!r} on {conn.where()} ({said(done.stderr)})")
    return done.stdout


def unpack_over(conn: Connection, folder: str, archive: bytes) -> None:
    """Unpack a tar stream into `folder`, replacing the files it holds."""
    done = conn.run(["sh", "-c", UNPACK, "glaunch-unpack", folder], input=archive)
    if done.returncode != 0:
        raise SchedulerError(f"cannot write into {folder!r} on {conn.where()} ({said(done.stderr)})")


def set_aside(conn: Connection, run_dir: str, aside: str, names: Sequence[str], archive: bytes) -> None:
    """In `run_dir`: the files `names` moved into the new folder `aside` (relative), then
    `archive` unpacked there; one call."""
    done = conn.run(["sh", "-c", SET_ASIDE, "glaunch-aside", run_dir, aside, *names], input=archive)
    if done.returncode != 0:
        raise SchedulerError(f"cannot set the previous files of {run_dir!r} aside on {conn.where()} "
                             f"({said(done.stderr) or f'exit {done.returncode}'})")


def put_back(conn: Connection, run_dir: str, aside: str, names: Sequence[str], *, whole: bool) -> None:
    """`set_aside` undone (`whole`: it completed): the files `names` back from `aside`."""
    done = conn.run(["sh", "-c", PUT_BACK, "glaunch-put-back", run_dir, aside, "1" if whole else "0", *names])
    if done.returncode != 0:
        raise SchedulerError(f"cannot put the previous files of {run_dir!r} back on {conn.where()} "
                             f"({said(done.stderr) or f'exit {done.returncode}'})")


def log_tails(conn: Connection, folder: str, offsets: Mapping[str, int]) -> list[tuple[str, int, bytes]]:
    """(name, offset, bytes past it) of each task log in `folder`, from the offsets given
    (0 for a log not given, or one now shorter than its offset); one call."""
    words = [f"{name}={offset}" for name, offset in sorted(offsets.items())]
    done = conn.run(["sh", "-c", LOG_TAILS, "glaunch-tails", folder, *words])
    if done.returncode != 0:
        raise SchedulerError(f"cannot read the logs in {folder!r} on {conn.where()} ({said(done.stderr)})")
    return parse_tails(done.stdout)


def files_since(conn: Connection, folder: str, wanted: Mapping[str, int], limit: int) -> list[tuple[str, int, bytes]]:
    """(name, offset, at most `limit` bytes past it) of each file in `folder` that a pattern
    of `wanted` (a path relative to it, `*` allowed in its names) matches, from the
    pattern's offset (0 where the file is now shorter); one call. Patterns are glob text:
    their names come from glaunch, never from the cluster."""
    words = [f"{pattern}={offset}" for pattern, offset in wanted.items()]
    done = conn.run(["sh", "-c", FILES_SINCE, "glaunch-files", folder, str(limit), *words])
    if done.returncode != 0:
        raise SchedulerError(f"cannot read the files of {folder!r} on {conn.where()} ({said(done.stderr)})")
    return parse_tails(done.stdout)


def parse_tails(stream: bytes) -> list[tuple[str, int, bytes]]:
    """LOG_TAILS's answer: its records up to the first one that is not whole."""
    out: list[tuple[str, int, bytes]] = []
    at = 0
    while at < len(stream):
        fields = []
        for _ in range(3):
            end = stream.find(b"\0", at)
            if end < 0:
                return out
            fields.append(stream[at:end])
            at = end + 1
        if not (fields[1].isdigit() and fields[2].isdigit()):
            return out
        length = int(fields[2])
        if at + length > len(stream):
            return out
        out.append((fields[0].decode(errors="surrogateescape"), int(fields[1]), stream[at:at + length]))
        at += length
    return out

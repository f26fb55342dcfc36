"""What glaunch does on a login node over one Connection: Slurm's commands through the
same Client (timeouts, retries, lookups) as on the cluster itself, and the few file
operations a run kept there needs. Every word goes through launcher.shell (Connection.run
quotes it); the scripts here are fixed text that takes its values as positional arguments.
"""

from __future__ import annotations

import posixpath
import subprocess
import weakref
from dataclasses import dataclass
from typing import Mapping, Sequence

from launcher import shell
from launcher.errors import SchedulerError
from launcher.schedulers.slurm.client import Account, Client
from launcher.rundir.layout import CANCEL_FILE
from launcher.processes import Finished
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
# (bash) $1 the script that runs a command as on the cluster (SLURM_ENV), $2 a directory to run
# in, then pairs of (stdin text, the command as one line of words quoted by launcher.shell,
# which eval reads back as exactly those words): each command runs in turn; for each, its
# exit status and the lengths of its stdout and its stderr, each ended by a NUL, then
# those bytes.
BATCH = "; ".join((
    'env_script=$1; dir=$2; shift 2',
    't=$(mktemp -d) || exit 4',
    "trap 'rm -rf -- \"$t\"' EXIT",
    'while [ $# -ge 2 ]; do input=$1; line=$2; shift 2',
    'printf %s "$input" | eval "sh -c \\"\\$env_script\\" glaunch-slurm \\"\\$dir\\" $line" >"$t/o" 2>"$t/e"',
    's=$?; o=$(wc -c <"$t/o"); e=$(wc -c <"$t/e")',
    'printf "%s\\0%s\\0%s\\0" "$s" "$((o))" "$((e))"',
    'cat -- "$t/o" "$t/e"; done',
))


# $1 run.json, $2 a fresh name beside it, $3 the job's task as staged, $4 its place, $5
# SLURM_ENV, $6 the job's id: stdin replaces run.json whole, the task moves into place,
# then the job is released (scontrol release, as on the cluster).
PLACE_AND_RELEASE = "; ".join((
    'cat > "$2" && mv -f -- "$2" "$1" || { rm -f -- "$2"; exit 11; }',
    'mv -f -- "$3" "$4" || exit 12',
    'exec sh -c "$5" glaunch-slurm "" scontrol release "$6"',
))
NOT_PLACED = {11: "writing run.json", 12: "putting the job's task in place"}
# $1 SLURM_ENV, $2 a file to print once the jobs are cancelled ("": none), $3 the number of
# (run directory, job id) pairs that follow, those pairs, then the jobs to cancel: each job
# id appended to its run's cancel file (what `glaunch cancel` writes on the cluster itself),
# then one scancel, as on the cluster, and the file printed; scancel's exit status. Exit
# 11 when a mark could not be written: nothing was cancelled.
CANCEL_MARKED = "; ".join((
    'env_script=$1; back=$2; n=$3; shift 3',
    f'while [ "$n" -gt 0 ]; do printf "%s\\n" "$2" >> "$1/{CANCEL_FILE}" || exit 11; n=$((n - 1)); shift 2; done',
    'sh -c "$env_script" glaunch-slurm "" scancel "$@" >/dev/null; s=$?',
    'if [ -n "$back" ]; then cat -- "$back" 2>/dev/null; fi',
    'exit $s',
))
NOT_MARKED = 11


@dataclass(frozen=True)
class Asked:
    """A command of a batch: its words, and the text on its stdin."""

    cmd: tuple[str, ...]
    input: str = ""


def slurm_client(conn: Connection, *, cwd: str | None = None) -> Client:
    """A Slurm Client whose commands run on `conn`'s login node (in `cwd` when given) in the
    environment SLURM_ENV leaves, as the account there; the local environment stays here.
    A command that does not end within its bound is a timeout to the Client: a lost sbatch
    answer is looked up. A command asked ahead on this connection (`ask_ahead`) is
    answered from there, with no round trip."""

    def runner(cmd: Sequence[str], *, timeout: float, input: str | None = None,
               env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        known = _answered(conn, Asked(tuple(cmd), input or ""))
        if known is not None:
            return known
        words = ["sh", "-c", SLURM_ENV, "glaunch-slurm", cwd or "", *cmd]
        try:
            done = conn.run(words, input=input.encode() if input is not None else None, timeout_s=timeout)
        except NoAnswer:
            raise subprocess.TimeoutExpired(list(cmd), timeout) from None
        except SchedulerError:
            if list(cmd[:1]) != ["sbatch"] or "--test-only" in cmd:
                raise
            # The link dropped: sbatch may have queued the job and its answer was lost. As
            # for a timeout, the Client looks the job up before it tries again.
            raise subprocess.TimeoutExpired(list(cmd), timeout) from None
        return subprocess.CompletedProcess(list(cmd), done.returncode, done.out, done.err)

    return Client(runner=runner, environ={}, account_of=lambda: account(conn), where=conn.where())


_ACCOUNTS: weakref.WeakKeyDictionary[Connection, Account] = weakref.WeakKeyDictionary()


def account(conn: Connection, *, along: Sequence[Asked] = ()) -> Account:
    """The remote account (user, home, groups): asked once per connection; with it, in the
    same round trip, the commands `along` (asked ahead, see `ask_ahead`)."""
    if conn not in _ACCOUNTS:
        if along:
            first, *rest = run_batch(conn, [Asked(("sh", "-c", ACCOUNT)), *along])
            _keep(conn, along, rest)
            done_code, out, err = first.returncode, first.stdout.encode(errors="surrogateescape"), first.stderr
        else:
            done = conn.run(["sh", "-c", ACCOUNT])
            done_code, out, err = done.returncode, done.stdout, said(done.stderr)
        fields = [f.decode(errors="surrogateescape") for f in out.split(b"\0")]
        if done_code != 0 or len(fields) < 4 or not fields[0] or not fields[1]:
            raise SchedulerError(f"{conn.where()} did not say its home directory and user ({err})")
        _ACCOUNTS[conn] = Account(user=fields[1], home=fields[0], groups=frozenset(fields[2].split()) or None)
    elif along:
        ask_ahead(conn, along)
    return _ACCOUNTS[conn]


# Answers of commands asked ahead, by connection: served to the Slurm client in place of a
# round trip. Only commands whose answer holds for the rest of one glaunch command are
# asked ahead (the cluster's settings, the account's associations, the interpreter, a
# `--test-only`); a failed one answers once, so that a retry asks the cluster again.
_AHEAD: weakref.WeakKeyDictionary[Connection, dict[Asked, subprocess.CompletedProcess[str]]] = \
    weakref.WeakKeyDictionary()


def ask_ahead(conn: Connection, commands: Sequence[Asked], *, cwd: str | None = None) -> None:
    """Run `commands` on the login node in one round trip (in `cwd`, as slurm_client's
    runner would), keeping their answers for the Slurm clients of `conn`."""
    if commands:
        _keep(conn, commands, run_batch(conn, commands, cwd=cwd))


def _keep(conn: Connection, commands: Sequence[Asked], answers: Sequence[subprocess.CompletedProcess[str]]) -> None:
    kept = _AHEAD.setdefault(conn, {})
    for asked, answer in zip(commands, answers):
        kept[asked] = answer


def _answered(conn: Connection, asked: Asked) -> subprocess.CompletedProcess[str] | None:
    kept = _AHEAD.get(conn)
    if not kept or asked not in kept:
        return None
    answer = kept[asked]
    if answer.returncode != 0:
        del kept[asked]
    return answer


def run_batch(conn: Connection, commands: Sequence[Asked], *, cwd: str | None = None,
              timeout_s: float | None = None) -> list[subprocess.CompletedProcess[str]]:
    """Each command run on the login node as slurm_client's runner runs one, all in one
    round trip; their answers in order. A command whose answer did not come back whole (the
    link dropped, the bound passed) is missing from the end of the list."""
    # bash, not sh: launcher.shell may quote a word as $'...', which eval must read back.
    words = ["bash", "-c", BATCH, "glaunch-batch", SLURM_ENV, cwd or ""]
    for asked in commands:
        words += [asked.input, shell.join(asked.cmd)]
    done = conn.run(words, timeout_s=timeout_s)
    answers = parse_batch(done.stdout)
    return [subprocess.CompletedProcess(list(asked.cmd), status, out, err)
            for asked, (status, out, err) in zip(commands, answers)]


def parse_batch(stream: bytes) -> list[tuple[int, str, str]]:
    """BATCH's answer: (status, stdout, stderr) of each command, up to the first one that
    is not whole."""
    out: list[tuple[int, str, str]] = []
    at = 0
    while at < len(stream):
        fields = []
        for _ in range(3):
            end = stream.find(b"\0", at)
            if end < 0 or not stream[at:end].isdigit():
                return out
            fields.append(int(stream[at:end]))
            at = end + 1
        status, n_out, n_err = fields
        if at + n_out + n_err > len(stream):
            return out
        text = stream[at:at + n_out].decode(errors="surrogateescape")
        err = stream[at + n_out:at + n_out + n_err].decode(errors="replace")
        out.append((status, text, err))
        at += n_out + n_err
    return out


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


def place_and_release(conn: Connection, record: str, data: bytes, task_from: str, task_to: str,
                      job_id: str) -> subprocess.CompletedProcess[str]:
    """In one round trip: `record` replaced whole with `data`, the task file moved from
    `task_from` to `task_to`, then job `job_id` released; scontrol's answer.
    SchedulerError when a file could not be put in place (the job is then still held)."""
    fresh = posixpath.join(posixpath.dirname(record), f".{posixpath.basename(record)}.glaunch-new")
    done = conn.run(["sh", "-c", PLACE_AND_RELEASE, "glaunch-place", record, fresh, task_from, task_to, SLURM_ENV,
                     job_id], input=data)
    if done.returncode in NOT_PLACED:
        raise SchedulerError(f"{NOT_PLACED[done.returncode]} on {conn.where()} failed ({said(done.stderr)})")
    cmd = ["scontrol", "release", job_id]
    return subprocess.CompletedProcess(cmd, done.returncode, done.out, done.err)


def cancel_marked(conn: Connection, marks: Sequence[tuple[str, str]], jobs: Sequence[str],
                  read_back: str = "") -> Finished:
    """In one round trip: each (run directory, job id) of `marks` said in that run's cancel
    file (its job controller then ends the start as cancelled, not requeued), then one
    scancel of `jobs`; scancel's exit status and stderr, and on stdout the file `read_back`
    as it is then (a run's run.json: the job it names now). SchedulerError, nothing
    cancelled, when a mark could not be written."""
    words = ["sh", "-c", CANCEL_MARKED, "glaunch-cancel", SLURM_ENV, read_back, str(len(marks))]
    for run_dir, job_id in marks:
        words += [run_dir, job_id]
    done = conn.run([*words, *jobs])
    if done.returncode == NOT_MARKED:
        raise SchedulerError(f"marking the cancel in the run's directory on {conn.where()} failed "
                             f"({said(done.stderr)}); nothing was cancelled")
    return done


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

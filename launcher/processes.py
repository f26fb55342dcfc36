"""Running an external tool (git, Slurm's clients, py-spy, nvidia-smi) so that it can
neither hold glaunch past a bound nor crash it with what it prints.

- Each tool starts in a session of its own: at its deadline the whole process group is
  killed, the children it started too (a git hook, an ssh, a credential helper), not only
  the process glaunch started.
- Its pipes are read against the deadline, never to their end: a child that left the
  group and still holds them cannot keep the caller waiting; they are closed after the
  kill.
- Output is kept as bytes, up to a limit (the rest is read and dropped, so the tool is
  never blocked on a full pipe), and decoded by the caller for what it is: text shown to
  a user (`shown`: undecodable bytes become U+FFFD) or paths that must round-trip
  (`fs_text`: surrogateescape, as os.fsdecode does).

Standard library only: the in-job runtime uses it too.
"""

from __future__ import annotations

import os
import select
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import IO, Callable, Mapping, Sequence

# The answers of Slurm's clients, py-spy and nvidia-smi are far below this even on a
# cluster of thousands of nodes; a tool printing more is not answering what was asked.
DEFAULT_MAX_OUTPUT = 64 << 20
CHUNK = 1 << 16
# How long to wait for a killed tool to be reaped: SIGKILL ends it, unless it is stuck in
# the kernel (a hung NFS mount), which no one can wait out.
REAP_S = 1.0
# How long run_command gives a tool unless told otherwise.
COMMAND_TIMEOUT_S = 30


def shown(data: bytes) -> str:
    """Bytes a tool printed, as text for a user: bytes that are not UTF-8 become U+FFFD."""
    return data.decode("utf-8", "replace")


def without_tool_prefix(tool: str, line: str) -> str:
    """`line` as `tool` printed it, less the `tool:` (then `error:`) it starts its messages
    with, however often: a message that quotes a tool names the tool once itself (`cannot
    reach login1 (ssh: Could not resolve hostname login1 ...)`, not `ssh: ssh: ...`)."""
    rest = line.strip()
    prefixes = (f"{os.path.basename(tool).lower()}:", "error:")
    while any(rest.lower().startswith(p) for p in prefixes):
        rest = rest.split(":", 1)[1].lstrip()
    return rest


def fs_text(data: bytes) -> str:
    """Bytes a tool printed that name files: undecodable bytes kept as surrogates, so that
    os.fsencode (and every os call) gets the original bytes back."""
    return data.decode("utf-8", "surrogateescape")


@dataclass(frozen=True)
class Finished:
    """A tool that ended within its bound: its exit status and what it printed (`truncated`:
    one of the streams went past the limit, and holds only its beginning)."""

    returncode: int
    stdout: bytes
    stderr: bytes
    truncated: bool = False

    @property
    def out(self) -> str:
        return shown(self.stdout)

    @property
    def err(self) -> str:
        return shown(self.stderr)


class Started:
    """A tool started now, in a session of its own, and finished (read) later with
    `finish`: two of them can run at once. OSError when it cannot be started (missing,
    not executable, `cwd` no folder). Used as a context manager, one never finished is
    killed, its group with it, on the way out."""

    def __init__(self, words: Sequence[str], *, input: bytes | None = None, env: Mapping[str, str] | None = None,
                 cwd: str | os.PathLike[str] | None = None, max_output: int | None = DEFAULT_MAX_OUTPUT) -> None:
        self._input = input
        self._max_output = max_output
        self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
            list(words), stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=dict(env) if env is not None else None, cwd=cwd,
            start_new_session=True)

    def finish(self, deadline: float) -> Finished | None:
        """Feed the input, read the output until both streams end and the tool exits, or
        until `deadline` (a time.monotonic() value): then kill its group and return None.
        Interrupted (KeyboardInterrupt, SystemExit from a signal handler), it kills the
        group before it lets the exception through: no tool outlives the call."""
        proc, self._proc = self._proc, None
        if proc is None:
            raise RuntimeError("finish() called twice")
        out, err = _Sink(self._max_output), _Sink(self._max_output)
        try:
            ended = _exchange(proc, self._input, deadline, ((proc.stdout, out), (proc.stderr, err)))
            returncode = proc.wait(timeout=max(deadline - time.monotonic(), 0.0)) if ended else None
        except subprocess.TimeoutExpired:
            returncode = None
        except BaseException:
            _kill(proc)
            raise
        if returncode is None:
            _kill(proc)
            return None
        _close(proc)
        return Finished(returncode, out.data(), err.data(), out.cut or err.cut)

    def kill(self) -> None:
        """End the tool and its group now, without reading what it printed."""
        proc, self._proc = self._proc, None
        if proc is not None:
            _kill(proc)

    def __enter__(self) -> Started:
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


def run_bounded(words: Sequence[str], *, timeout_s: float, input: bytes | None = None,
                env: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None,
                max_output: int | None = DEFAULT_MAX_OUTPUT) -> Finished | None:
    """Run a tool to its end within `timeout_s`: what it answered, or None when it ran past
    the bound (its whole process group is killed then). stdin is `input`, or nothing
    (/dev/null: no tool waits on a terminal). OSError when it cannot be started."""
    deadline = time.monotonic() + timeout_s
    return Started(words, input=input, env=env, cwd=cwd, max_output=max_output).finish(deadline)



def run_command(words: Sequence[str], *, timeout_s: float | None = None, env: Mapping[str, str] | None = None,
                say: Callable[[str], None] | None = None) -> str | None:
    """A tool's stdout as text (bytes that are not UTF-8 as U+FFFD: a stack names files and
    strings of any encoding); None, and a line through `say` (default: on stderr), when it
    cannot start, fails or runs longer than `timeout_s` (default COMMAND_TIMEOUT_S, read
    when called), which ends it with every process it started."""
    say = say or _say_on_stderr
    timeout_s = COMMAND_TIMEOUT_S if timeout_s is None else timeout_s
    try:
        proc = run_bounded(words, timeout_s=timeout_s, env=env)
    except (OSError, subprocess.SubprocessError) as exc:
        say(f"{words[0]}: {exc}")
        return None
    if proc is None:
        say(f"{' '.join(words[:2])}: no answer within {timeout_s:g} s")
        return None
    if proc.returncode != 0:
        say(f"{' '.join(words[:2])}: exit status {proc.returncode}: {proc.err.strip()[:300]}")
        return None
    return proc.out


def _say_on_stderr(message: str) -> None:
    print(f"glaunch: {message}", file=sys.stderr, flush=True)


class _Sink:
    """One output stream: its first `limit` bytes (None: all), and whether there was more."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.parts: list[bytes] = []
        self.size = 0
        self.cut = False

    def add(self, data: bytes) -> None:
        room = len(data) if self.limit is None else max(min(len(data), self.limit - self.size), 0)
        if room:
            self.parts.append(data[:room])
            self.size += room
        self.cut = self.cut or room < len(data)

    def data(self) -> bytes:
        return b"".join(self.parts)


def _exchange(proc: subprocess.Popen[bytes], input: bytes | None, deadline: float,
              reading: Sequence[tuple[IO[bytes] | None, _Sink]]) -> bool:
    """Write `input` and read each output stream into its sink until every stream ended:
    True; False at `deadline`."""
    with selectors.DefaultSelector() as selector:
        for stream, sink in reading:
            if stream is not None:
                selector.register(stream, selectors.EVENT_READ, sink)
        view, written = memoryview(input or b""), 0
        if proc.stdin is not None:
            if view:
                selector.register(proc.stdin, selectors.EVENT_WRITE)
            else:
                proc.stdin.close()
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            for key, _ in selector.select(left):
                if key.fileobj is proc.stdin and proc.stdin is not None:
                    written = _write(selector, proc.stdin, view, written)
                    continue
                data = os.read(key.fd, CHUNK)
                if data:
                    key.data.add(data)
                else:
                    selector.unregister(key.fileobj)
    return True


def _write(selector: selectors.BaseSelector, stdin: IO[bytes], view: memoryview, written: int) -> int:
    """One chunk of the input, no larger than a pipe takes without blocking; stdin is
    closed once all is written, or when the tool stopped reading (it may not need it)."""
    try:
        written += os.write(stdin.fileno(), view[written:written + select.PIPE_BUF])
    except BrokenPipeError:
        written = len(view)
    if written >= len(view):
        selector.unregister(stdin)
        _close_quietly(stdin)
    return written


def _kill(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL to the tool's whole group, a short wait to reap it, and its pipes closed
    unread: a process that left the group may hold them for ever."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.wait(timeout=REAP_S)
    except subprocess.TimeoutExpired:
        pass
    _close(proc)


def _close(proc: subprocess.Popen[bytes]) -> None:
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            _close_quietly(stream)


def _close_quietly(stream: IO[bytes]) -> None:
    try:
        stream.close()
    except OSError:         # stdin's buffer flushed into a pipe nobody reads any more
        pass


def process_runs(pid: int) -> bool:
    """Whether process `pid` runs on this node (a zombie, ended but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read(4096).rsplit(b")", 1)[-1].split()[:1]
    except OSError:
        return False
    return state != [b"Z"]

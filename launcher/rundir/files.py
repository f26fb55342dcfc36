"""Small file operations both sides share: atomic writes, tolerant JSON reads, and opening
files of a run or state directory that someone may have replaced by a FIFO, a device or a
huge file. Standard library only (the in-job runtime uses them on every rank)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import stat
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar

from launcher.errors import RunError

T = TypeVar("T")

# run.json of a run with thousands of requeues stays far below this; anything bigger is
# not a record glaunch wrote, and reading it whole could exhaust memory.
MAX_RECORD_BYTES = 16 * 1024 * 1024
# No JSON file glaunch reads nests deeper than a few levels; past this one it was not
# written by glaunch, and a recursive reader (or printer) of it could exhaust the stack.
MAX_JSON_DEPTH = 64
# What a record glaunch writes (run.json, a sweep's, a checkpoint directory's owner) may
# hold: its writers stay far below each bound (a detail is at most a few KB, a start list
# one entry per requeue). A record past one was forged or damaged; it is refused when read,
# so that no command prints megabytes of it.
MAX_RECORD_TEXT = 16 * 1024
MAX_RECORD_ITEMS = 100_000
MAX_RECORD_NUMBER = 2**63          # no count, step, id or time glaunch writes comes near
# The most of a key path a message about a record shows.
MAX_KEY_PATH = 120


class NotARegularFile(OSError):
    """A path that should hold a regular file holds something else (FIFO, device, directory)."""


def open_regular(path: str | os.PathLike[str], flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """A descriptor of the regular file at `path`. Opening never blocks (a FIFO would wait
    for a writer forever) and anything but a regular file is refused."""
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC, mode)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotARegularFile(f"{path} is not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_text(path: str | os.PathLike[str], limit: int = MAX_RECORD_BYTES) -> str:
    """The UTF-8 text of a regular file of at most `limit` bytes. OSError when it cannot be
    read or is not a regular file; ValueError when it is larger or not UTF-8."""
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"larger than {limit} bytes")
    return data.decode("utf-8")


def json_type(value: object) -> str:
    """JSON's name for the type of a decoded value."""
    names = {dict: "object", list: "list", str: "string", bool: "boolean", int: "number", float: "number",
             type(None): "null"}
    return names.get(type(value), type(value).__name__)


def json_safe(value: object) -> object:
    """`value` with each float JSON cannot hold (NaN, Infinity: a diverged run's loss) as
    its name, so what glaunch prints as JSON is JSON to a strict parser (jq)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {key: json_safe(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(item) for item in value]
    return value


def load_json_object(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON object in `path`; OSError when it cannot be read, ValueError (with what is
    wrong) when it is not a JSON object."""
    try:
        text = read_text(path)
    except UnicodeDecodeError:
        raise ValueError("not UTF-8 text") from None
    return parse_json_object(text)


def load_bounded_object(path: str | os.PathLike[str]) -> dict[str, Any]:
    """`load_json_object`, and ValueError (naming where) for a record past the bounds of
    what glaunch writes: a text longer than MAX_RECORD_TEXT characters or not Unicode (a
    lone surrogate, which no terminal can print), a list or object of more than
    MAX_RECORD_ITEMS entries, an integer beyond MAX_RECORD_NUMBER (no float holds one of
    JSON's unbounded integers)."""
    data = load_json_object(path)
    check_bounds(data, max_text=MAX_RECORD_TEXT, max_items=MAX_RECORD_ITEMS, max_number=MAX_RECORD_NUMBER)
    return data


def read_record(path: str | os.PathLike[str], from_dict: Callable[[dict[str, Any]], T], what: str) -> T:
    """The record `from_dict` makes of the JSON object in `path` (within the bounds of
    `load_bounded_object`); RunError naming the file and what is wrong when it cannot be
    read back."""
    try:
        return from_dict(load_bounded_object(path))
    except OSError as exc:
        raise RunError(f"cannot read the {what}: {exc.strerror or exc}", file=str(path)) from None
    except ValueError as exc:
        raise RunError(f"damaged {what}: {exc}", file=str(path)) from None


def parse_json_object(text: str) -> dict[str, Any]:
    """The JSON object `text` holds; ValueError (with what is wrong) when it holds none."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise ValueError("not JSON: nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    except ValueError as exc:      # a number too long to convert
        raise ValueError(f"not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ValueError(f"a JSON {json_type(data)}, not an object")
    check_bounds(data)
    return data


def check_bounds(data: Any, *, max_depth: int = MAX_JSON_DEPTH, max_text: int | None = None,
                 max_items: int | None = None, max_number: int | None = None) -> None:
    """ValueError naming the first place (a key path) where decoded JSON `data` nests more
    than `max_depth` deep, or (when given) holds a text of more than `max_text` characters
    or one that is not Unicode, a list or object of more than `max_items` entries, or an
    integer beyond +-`max_number`. Iterative: it must take what a recursive reader could not."""
    scalars = max_text is not None or max_number is not None
    if not isinstance(data, (dict, list)):
        if scalars:
            _check_scalar(data, None, max_text, max_number)
        return
    todo: list[tuple[Any, Any, int]] = [(data, None, 1)]
    while todo:
        value, where, depth = todo.pop()
        if depth > max_depth:
            raise ValueError(f"{_key_path(where)}nested more than {max_depth} deep")
        if max_items is not None and len(value) > max_items:
            raise ValueError(f"{_key_path(where)}{len(value)} entries (at most {max_items})")
        for key, child in value.items() if isinstance(value, dict) else enumerate(value):
            if isinstance(child, (dict, list)):
                todo.append((child, (where, key), depth + 1))
            elif scalars:
                _check_scalar(child, (where, key), max_text, max_number)
            if scalars and isinstance(key, str):
                _check_scalar(key, where, max_text, max_number)


def _check_scalar(value: Any, where: Any, max_text: int | None, max_number: int | None) -> None:
    if isinstance(value, str):
        _check_text(value, where, max_text)
    elif isinstance(value, int) and max_number is not None and abs(value) > max_number:
        raise ValueError(f"{_key_path(where)}a number of {len(str(abs(value)))} digits (larger than {max_number})")


def _check_text(text: str, where: Any, max_text: int | None) -> None:
    if max_text is None:
        return
    if len(text) > max_text:
        raise ValueError(f"{_key_path(where)}a text of {len(text)} characters (at most {max_text})")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise ValueError(f"{_key_path(where)}a text that is not Unicode (a lone surrogate)") from None


def _key_path(where: Any) -> str:
    """`starts[0].versions.node1: ` for the link chain (parent, key) `check_bounds` keeps;
    nothing for the top."""
    keys = []
    while where is not None:
        where, key = where
        keys.append(f"[{key}]" if isinstance(key, int) else f".{key}")
    text = "".join(reversed(keys)).lstrip(".")
    if len(text) > MAX_KEY_PATH:
        text = text[:MAX_KEY_PATH] + "..."
    return f"{text}: " if text else ""


def read_json(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """A JSON object from `path`, or None when it is missing, unreadable or not an object."""
    try:
        return load_json_object(path)
    except (OSError, ValueError):
        return None


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a rename or a new entry in `path` durable; some filesystems refuse, harmlessly."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_text(path: str | os.PathLike[str], text: str, *, durable: bool = True) -> None:
    """Write `text` so a reader sees the old content or the new, never a part: a temp file
    beside it (named per host and process, for shared filesystems), fsync, rename, fsync
    of the directory (`durable=False`: neither fsync, for what is read only while its
    writer runs and made durable later with others). The temp file is always a new one:
    whatever had its name (a file left by a killed writer, a FIFO) is replaced, never
    written into."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.uname().nodename}-{os.getpid()}")
    try:
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
        raise
    if durable:
        fsync_dir(path.parent)


def directory_problem(path: str | os.PathLike[str]) -> str | None:
    """Why a directory could not be used (created if missing, then written) at `path`, or
    None. Looks only: creates nothing."""
    path = Path(os.path.abspath(path))
    probe = path
    while True:
        try:
            st = os.stat(probe)
            break
        except FileNotFoundError:
            if probe.parent == probe:
                return f"{path} cannot be created"
            probe = probe.parent
        except NotADirectoryError:
            probe = probe.parent
        except OSError as exc:
            return f"{probe}: {exc.strerror or exc}"
    if not stat.S_ISDIR(st.st_mode):
        what = "a file" if stat.S_ISREG(st.st_mode) else "not a directory"
        return f"{probe} is {what}" + ("" if probe == path else f": {path} cannot be created there")
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{probe} is not writable" + ("" if probe == path else f": {path} cannot be created there")
    return None


@contextlib.contextmanager
def exclusive_lock(path: str | os.PathLike[str], what: str) -> Iterator[None]:
    """Hold an flock on `path` (created as a regular file) for the block: the job and the
    CLI read-modify-write the same records. `what` names the record in the error."""
    try:
        fd = open_regular(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW)
    except OSError as exc:
        raise RunError(f"cannot lock the {what}: {exc.strerror or exc}", file=str(path)) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def lock_held(path: str | os.PathLike[str]) -> bool:
    """Whether some live process holds an `exclusive_lock` on `path` (the system lets go of
    it when that process ends, however it ends)."""
    try:
        fd = open_regular(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
    return False

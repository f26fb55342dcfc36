"""Every command that reads a run's record, run over records damaged in every field.

A valid run is made as a dry run and then recorded as having completed (with what its
ranks measured); each row damages one field of its run.json (missing, every JSON type,
NaN and Infinity literals, a huge text, a long list, nesting deep enough to break a
recursive reader, bytes that are not UTF-8, the file cut inside the field), or one whole
file (run.json, result.json, remote.json, the run index's entry), and runs `status` (text
and --json), `list`, `logs`, `cancel`, `resume --dry-run` and `submit --after --dry-run`
in-process on it. None may print a traceback, exit outside 0-3, write more than
OUTPUT_LIMIT, or end in more than one error line; a record that names another run than
the one asked for is refused. No process is signalled and no Slurm command runs."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from badinput import run_cli
from launcher import api
from launcher.rundir import registry
from launcher.rundir.layout import REMOTE_FILE
from launcher.rundir.records import RunRecord

REPO = Path(__file__).resolve().parents[2]
DDP = str(REPO / "examples" / "torch_ddp.yaml")
OUTPUT_LIMIT = 64 * 1024
RUN_ID = "hostile-run"
OTHER_ID = "other-run"
# A pid no process has (above any pid_max): a cancel that got that far would signal nothing.
NO_SUCH_PID = 2**22 + 5

# What replaces one field's value, as the bytes written into run.json.
HUGE_TEXT = b'"' + b"v" * 100_000 + b'"'          # more than OUTPUT_LIMIT
VALUES: dict[str, bytes] = {
    "null": b"null", "true": b"true", "zero": b"0", "negative": b"-7", "float": b"1.5",
    "big-number": b"1" + b"0" * 400, "overflow-float": b"1e999", "nan": b"NaN", "infinity": b"-Infinity",
    "text": b'"x"', "name-text": b'"NOT_A_STATE"', "escape-text": b'"\\u001b[2J\\u0007"', "lone-surrogate": b'"\\ud800"',
    "list": b"[1, 2]", "object": b'{"a": {"b": 1}}', "huge-text": HUGE_TEXT,
    "long-list": b"[" + b"0," * 100_000 + b"0]", "deep-500": b"[" * 500 + b"]" * 500,
    "deep-100000": b"[" * 100_000 + b"]" * 100_000, "not-utf8": b'"\xff\xfe"',
}
MARK = "@@HOSTILE@@"


def completed_run(runs: Path, run_id: str) -> Path:
    """A run the way the status tests make one: a dry run, then recorded as run and
    completed (RECORD: what its ranks measured on two nodes that imported different
    torches, a resume, a run it waited for), with its result and a log."""
    run = api.submit(DDP, dry_run=True, runs_dir=str(runs))
    run_dir = run.run_dir.rename(runs / run_id)
    data = json.loads((run_dir / "run.json").read_text())
    data.update(json.loads(json.dumps(RECORD).replace("@RUN_DIR@", str(run_dir))), run_id=run_id)
    registry.write(run_dir, RunRecord.from_dict(data))
    (run_dir / "result.json").write_text(json.dumps(RESULT))
    (run_dir / "logs" / "100_0_log.out").write_text("step 1\n")
    return run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Any]:
    """The run every row damages and another run, made once; each row writes its files back."""
    root = tmp_path_factory.mktemp("hostile")
    with pytest.MonkeyPatch.context() as patch:
        (root / "home").mkdir()
        patch.setenv("HOME", str(root / "home"))
        patch.setenv("GLAUNCH_STATE_DIR", str(root / "state"))
        run_dir = completed_run(root / "runs", RUN_ID)
        other_dir = completed_run(root / "runs", OTHER_ID)
    files = {name: (run_dir / name).read_bytes() for name in ("run.json", "result.json")}
    return {"run_dir": run_dir, "other_dir": other_dir, "files": files}


def field_paths(value: Any, prefix: tuple = (), depth: int = 3):
    """Each key path of `value` (objects and lists), `depth` levels down."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        yield prefix + (key,)
        if depth > 1:
            yield from field_paths(item, prefix + (key,), depth - 1)


def _with_value(data: Any, path: tuple, new: Any) -> Any:
    data = json.loads(json.dumps(data))
    parent = data
    for key in path[:-1]:
        parent = parent[key]
    if new is _MISSING:
        if isinstance(parent, dict):
            del parent[path[-1]]
        else:
            parent.pop(path[-1])
    else:
        parent[path[-1]] = new
    return data


_MISSING = object()


def damaged(data: dict, path: tuple, variant: str) -> bytes:
    """`data` as JSON with the field at `path` missing, cut short, or holding VALUES[variant]."""
    if variant == "missing":
        return json.dumps(_with_value(data, path, _MISSING), indent=2).encode()
    text = json.dumps(_with_value(data, path, MARK), indent=2).encode()
    if variant == "cut-here":
        return text[:text.index(MARK.encode()) - 1]
    if variant == "five-mb":
        return text.replace(MARK.encode(), b"9" * 5_000_000)
    return text.replace(f'"{MARK}"'.encode(), VALUES[variant])


def field_rows(name: str, data: dict, depth: int = 3) -> list[tuple[str, str, Any]]:
    """(row id, file, (path, variant)) for every field of `data` and every way to damage it."""
    rows = []
    for path in field_paths(data, depth=depth):
        where = ".".join(map(str, path))
        for variant in ("missing", "cut-here", *VALUES):
            rows.append((f"{name}:{where}:{variant}", name, (path, variant)))
    return rows


def _record_data() -> tuple[dict, dict]:
    """run.json and result.json of a run made as `completed_run` makes one (the values of
    the rows; the files themselves are written per module)."""
    record = {
        "run_id": RUN_ID, "name": "torch-ddp", "site": "local", "scheduler": "local", "transport": "local",
        "run_dir": "@RUN_DIR@",
        "experiment_file": DDP, "created": "2025-03-01T10:00:00+00:00", "dry_run": False, "nodes": 1,
        "world_size": 2, "partition": "local", "requeue_max": 3, "crash_retries": 0, "state": "COMPLETED",
        "job_id": "100",
        "starts": [{"job_id": "100", "restart": 0, "submitted": "2025-03-01T10:00:00+00:00",
                    "started": "2025-03-01T10:00:10+00:00", "ended": "2025-03-01T10:05:00+00:00",
                    "state": "COMPLETED", "reason": None, "detail": None, "exit_code": 0, "resumed_from": None,
                    "stopped_at": None, "pid": NO_SUCH_PID, "pid_start": 1, "first_step": 1, "last_step": 40,
                    "first_step_at": "2025-03-01T10:00:20+00:00", "last_step_at": "2025-03-01T10:04:50+00:00",
                    "step_time_s": {"median": 0.5, "p90": 0.6}, "peak_memory_gb": 1.5,
                    "memory": {"kind": "host_rss"},
                    "versions": {"node1": {"python": "3.11.7", "torch": "2.13.0+cpu"},
                                 "node2": {"python": "3.11.7", "torch": "2.12.0+cpu"}},
                    "hang": {"kind": "stall", "bound_s": 60, "silent": [{"rank": 1, "node": "node2", "step": 5}],
                             "stacks": ["stacks/node2.txt"]},
                    "bad_node": "node2", "exclusion": "excluded from later starts", "excluded_nodes": ["node3"],
                    "watchdog": {"state": "watching", "bound_s": 60, "basis": "fixed",
                                 "slow": [{"rank": 1, "node": "node2", "ratio": 1.5}]}}],
        "reason": None, "detail": None, "excluded_nodes": ["node3"], "cancel_requested": {"job_id": "99"},
        "provenance": {"glaunch": "0.1.0", "python": "3.11.7", "packages": {"torch": "2.13.0+cpu"},
                       "git": {"commit": "0" * 40, "branch": "main", "dirty": False},
                       "profiles": [{"path": "/x/local.yaml", "sha256": "0" * 64}]},
        "resumes": [{"number": 1, "at": "2025-03-01T10:00:05+00:00", "overrides": ["a=1"], "first_start": 0,
                     "ended": {"state": "TIMEOUT"}}],
        "after": [{"ref": OTHER_ID, "kind": "ok", "job_ids": ["99"]}],
        "accounting": True,
    }
    result = {"final_step": 40, "final_loss": 0.25, "world_size": 2}
    return record, result


RECORD, RESULT = _record_data()
REMOTE = {"login": {"host": "login.invalid", "user": "u", "port": 22}, "run_dir": "/scratch/u/run"}
# Whole files: (row id, file, content or a marker of what to put there).
DIRECTORY, DEV_ZERO, OTHER_RECORD, FIFO = "<directory>", "<symlink to /dev/zero>", "<symlink to other>", "<fifo>"
FILE_ROWS = [
    (f"{name}:{case}", name, content)
    for name in ("run.json", "result.json", REMOTE_FILE)
    for case, content in [
        ("empty", b""), ("truncated", b'{"run_id": "hos'), ("not-utf8", b'{"\xff": 1}'), ("list", b"[]"),
        ("text", b'"run"'), ("nan", b"NaN"), ("deep", b"[" * 100_000), ("deep-object", b'{"a":' * 100_000),
        ("nul", b"\0" * 100), ("directory", DIRECTORY), ("dev-zero", DEV_ZERO), ("fifo", FIFO)]
] + [("run.json:other-run", "run.json", OTHER_RECORD)]
# The run index's only entry for RUN_ID.
INDEX_ROWS = [
    ("index:other-run-dir", "index", "@OTHER_DIR@"),
    ("index:run-dir-is-run-json", "index", "@RUN_DIR@/run.json"),
    ("index:run-dir-dev-null", "index", "/dev/null"),
    ("index:run-dir-relative", "index", "runs/../runs"),
]
ROWS = (field_rows("run.json", RECORD) + field_rows("result.json", RESULT) + field_rows(REMOTE_FILE, REMOTE) + FILE_ROWS + INDEX_ROWS)
# Rows whose run.json is another run's: every command naming RUN_ID refuses it.
IDENTITY_ROWS = {"run.json:other-run", "index:other-run-dir", "run.json:run_id:text", "run.json:run_id:name-text"}
# A state of the right shape that neither glaunch nor Slurm names: nothing says whether the
# run ended, so it is not resumed; status shows it as unknown.
UNKNOWN_STATE = "run.json:state:name-text"


def restore(run_dir: Path, files: dict[str, bytes]) -> None:
    for name in ("run.json", "result.json", REMOTE_FILE):
        path = run_dir / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif os.path.lexists(path):
            path.unlink()
        if name in files:
            path.write_bytes(files[name])


def put(run_dir: Path, other_dir: Path, name: str, content: Any) -> None:
    path = run_dir / name
    if os.path.lexists(path):
        path.unlink()
    if content == DIRECTORY:
        path.mkdir()
    elif content == DEV_ZERO:
        path.symlink_to("/dev/zero")
    elif content == OTHER_RECORD:
        path.symlink_to(other_dir / "run.json")
    elif content == FIFO:
        os.mkfifo(path)
    else:
        path.write_bytes(content.replace(b"@RUN_DIR@", str(run_dir).encode()))


COMMANDS = [
    ("status", ["status", RUN_ID]),
    ("status-json", ["status", RUN_ID, "--json"]),
    ("list", ["list"]),
    ("logs", ["logs", RUN_ID]),
    ("cancel", ["cancel", RUN_ID]),
    ("resume", ["resume", RUN_ID, "--dry-run"]),
    ("after", ["submit", DDP, "--dry-run", "--runs-dir", "@RUNS@", "--after", RUN_ID]),
]


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory) -> tuple[Path, Path]:
    """Slurm's commands, each recording its call and failing, and an ssh that cannot connect
    (a remote.json that still reads back is followed to its login)."""
    bin_dir = tmp_path_factory.mktemp("stand-ins")
    calls = bin_dir / "calls"
    for name in ("scancel", "squeue", "sacct", "sbatch", "scontrol"):
        (bin_dir / name).write_text(f'#!/bin/bash\necho "{name} $*" >> {calls}\nexit 1\n')
        (bin_dir / name).chmod(0o755)
    (bin_dir / "ssh").write_text("#!/bin/bash\necho 'ssh: cannot connect' >&2\nexit 255\n")
    (bin_dir / "ssh").chmod(0o755)
    return bin_dir, calls


def _recorded_pid(pid: Any) -> bool:
    """A pid a damaged record could name (the run's, or a value of the rows) or this very
    process (group): never to be signalled. glaunch's own children are."""
    return (isinstance(pid, bool) or not isinstance(pid, int) or pid <= 1
            or pid in (NO_SUCH_PID, os.getpid(), os.getpgrp()))


@pytest.fixture
def guarded(stand_ins, isolated_env, monkeypatch):
    """No process a record names may be signalled, no Slurm command run."""
    signalled: list = []
    for name in ("kill", "killpg"):
        real = getattr(os, name)

        def guard(pid, sig, real=real, name=name):
            if _recorded_pid(pid):
                signalled.append((name, pid, sig))
                return None
            return real(pid, sig)
        monkeypatch.setattr(os, name, guard)
    bin_dir, calls = stand_ins
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    yield
    ran = calls.read_text() if calls.exists() else ""
    calls.unlink(missing_ok=True)
    assert signalled == []
    assert ran == ""


def run_command(argv: list[str], monkeypatch, capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `glaunch ARGV` in-process; an exception that escapes
    the CLI is what a user would see as a traceback."""
    try:
        return run_cli(monkeypatch, capsys, ["glaunch", *argv])
    except Exception as exc:            # any escape is the failure this test looks for
        out, err = capsys.readouterr()
        return -1, out, err + f"Traceback (escaped from the CLI): {type(exc).__name__}: {str(exc)[:200]}"


@pytest.mark.parametrize("row_id, name, content", ROWS, ids=[row[0] for row in ROWS])
def test_every_command_on_a_damaged_record(runs, guarded, tmp_path, monkeypatch, capsys, row_id, name, content):
    run_dir, other_dir = runs["run_dir"], runs["other_dir"]
    restore(run_dir, runs["files"])
    registry.register(OTHER_ID, str(other_dir))
    if name == "index":                        # the only entry for RUN_ID
        entry = content.replace("@OTHER_DIR@", str(other_dir)).replace("@RUN_DIR@", str(run_dir))
        registry.register(RUN_ID, entry)
    else:
        registry.register(RUN_ID, str(run_dir))
        if isinstance(content, tuple):          # one field damaged in the file as the run wrote it
            base = json.loads(runs["files"][name]) if name in runs["files"] else REMOTE
            content = damaged(base, *content)
        put(run_dir, other_dir, name, content)
    monkeypatch.chdir(tmp_path)
    failures = []
    for command, argv in COMMANDS:
        argv = [arg.replace("@RUNS@", str(tmp_path / "runs")) for arg in argv]
        code, out, err = run_command(argv, monkeypatch, capsys)
        said = f"{command}: exit {code}; {err[-400:]!r}"
        errors = [line for line in err.splitlines() if line.startswith("glaunch: error: ")]
        if "Traceback" in out + err or code not in (0, 1, 2, 3):
            failures.append(said)
        elif len(out) + len(err) > OUTPUT_LIMIT:
            failures.append(f"{command}: {len(out) + len(err)} bytes of output")
        elif code != 0 and (len(errors) != 1 or not err.endswith(errors[0] + "\n")):
            failures.append(f"{command}: not one error line: {said}")
        elif command == "status-json" and code == 0 and not strict_json(out):
            failures.append(f"{command}: not strict JSON: {out[:200]!r}")
        elif row_id in IDENTITY_ROWS and command not in ("list",) and code == 0:
            failures.append(f"{command}: another run's record was taken for {RUN_ID}: {out[:200]!r}")
        elif row_id == UNKNOWN_STATE and command == "resume" and code not in (1, 2):
            failures.append(f"{command}: a run in a state nobody knows was resumed: {said}")
        elif row_id == UNKNOWN_STATE and command == "status" and "UNKNOWN (run.json says NOT_A_STATE)" not in out:
            failures.append(f"{command}: the state is not shown as unknown: {out[:200]!r}")
    assert not failures, "\n".join(failures)


def strict_json(text: str) -> bool:
    def refuse(name):
        raise ValueError(name)
    try:
        json.loads(text, parse_constant=refuse)
    except ValueError:
        return False
    return True


def test_the_undamaged_run_passes_all_commands(runs, guarded, tmp_path, monkeypatch, capsys):
    """The rows damage a record every command takes as it is."""
    restore(runs["run_dir"], runs["files"])
    registry.register(RUN_ID, str(runs["run_dir"]))
    registry.register(OTHER_ID, str(runs["other_dir"]))
    monkeypatch.chdir(tmp_path)
    for command, argv in COMMANDS:
        argv = [arg.replace("@RUNS@", str(tmp_path / "runs")) for arg in argv]
        code, out, err = run_command(argv, monkeypatch, capsys)
        assert code == 0, (command, err)
        assert "Traceback" not in err
    record = json.loads(runs["files"]["run.json"])
    damaged_fields = {path for _, name, (path, _) in field_rows("run.json", RECORD)}
    assert {(key,) for key in record} <= damaged_fields
    assert {("starts", 0, key) for key in record["starts"][0]} <= damaged_fields


def only_error(err: str) -> str:
    (line,) = err.splitlines()
    assert line.startswith("glaunch: error: "), line
    return line


@pytest.mark.parametrize("where", [("starts", 0, "versions", "node1", "torch"), ("provenance", "packages", "torch")])
def test_a_huge_version_string_is_refused_when_read(runs, guarded, monkeypatch, capsys, where):
    """A 5 MB version forged into run.json: one line naming the file and the key, not
    megabytes of status."""
    run_dir = runs["run_dir"]
    restore(run_dir, runs["files"])
    registry.register(RUN_ID, str(run_dir))
    (run_dir / "run.json").write_bytes(damaged(json.loads(runs["files"]["run.json"]), where, "five-mb"))
    for argv in (["status", RUN_ID], ["status", RUN_ID, "--json"]):
        code, out, err = run_command(argv, monkeypatch, capsys)
        assert (code, out) == (1, "")
        line = only_error(err)
        assert len(line) < 1000
        assert str(run_dir / "run.json") in line
        assert ".".join(map(str, where)).replace(".0.", "[0].") + ": a text of 5000000 characters" in line


def test_resume_of_a_run_in_a_state_nobody_names(runs, guarded, monkeypatch, capsys):
    """Not a dry run: refused before anything is moved, written or started."""
    run_dir = runs["run_dir"]
    restore(run_dir, runs["files"])
    registry.register(RUN_ID, str(run_dir))
    record = json.loads(runs["files"]["run.json"]) | {"state": "NOT_A_STATE"}
    (run_dir / "run.json").write_text(json.dumps(record))
    before = sorted(p.name for p in run_dir.iterdir())
    code, out, err = run_command(["resume", RUN_ID], monkeypatch, capsys)
    assert code == 1, err
    line = only_error(err)
    assert f"{run_dir / 'run.json'}: state: damaged run record: 'NOT_A_STATE'" in line
    assert json.loads((run_dir / "run.json").read_text()) == record
    assert sorted(p.name for p in run_dir.iterdir()) == before
    code, out, err = run_command(["status", RUN_ID], monkeypatch, capsys)
    assert code == 0 and out.startswith(f"run {RUN_ID}: UNKNOWN (run.json says NOT_A_STATE)"), out


def test_a_deeply_nested_local_record_of_a_remote_run(runs, guarded, monkeypatch, capsys):
    run_dir = runs["run_dir"]
    restore(run_dir, runs["files"])
    registry.register(RUN_ID, str(run_dir))
    with registry.updating(run_dir) as record:      # the record here of a run submitted over SSH
        record.transport = "ssh://u@login"
    (run_dir / REMOTE_FILE).write_text('{"login": ' * 100_000)
    for argv in (["status", RUN_ID], ["cancel", RUN_ID], ["logs", RUN_ID]):
        code, out, err = run_command(argv, monkeypatch, capsys)
        assert code == 1, (argv, err)
        assert str(run_dir / REMOTE_FILE) in only_error(err)


def test_a_record_linked_from_another_run_is_refused(runs, guarded, monkeypatch, capsys):
    run_dir = runs["run_dir"]
    restore(run_dir, runs["files"])
    registry.register(RUN_ID, str(run_dir))
    (run_dir / "run.json").unlink()
    (run_dir / "run.json").symlink_to(runs["other_dir"] / "run.json")
    code, out, err = run_command(["cancel", RUN_ID], monkeypatch, capsys)
    assert (code, out) == (1, "")
    assert (f"{run_dir / 'run.json'}: run_id: damaged run record: the record of run {OTHER_ID}, not of run "
            f"{RUN_ID}") in only_error(err)

"""A damaged or hand-edited run registry: every bad run.json, index line or rank-written
file is reported (the file and what is wrong), never a traceback, and never hides the
other runs. Job ids that do not have Slurm's shape are damage: they never reach scancel."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher import api
from launcher.errors import ConfigError, GlaunchError, RunError
from launcher.rundir import registry
from launcher.rundir.records import RecordError, RunRecord, StartRecord, is_job_id, job_id_of
from launcher.views.listing import format_list
from launcher.views.status_text import format_status

REPO = Path(__file__).resolve().parents[2]


def good_record(run_id: str = "good-run") -> dict:
    return {"run_id": run_id, "name": "good", "site": "local", "scheduler": "local", "created": "2024-01-01T00:00:00+00:00",
            "dry_run": False, "nodes": 1, "world_size": 2, "requeue_max": 3, "crash_retries": 0,
            "state": "COMPLETED", "job_id": "1000",
            "starts": [{"job_id": "1000", "restart": 0, "state": "COMPLETED", "exit_code": 0, "pid": 4242}]}


def edited(**changes) -> str:
    data = good_record()
    for key, value in changes.items():
        if key.startswith("start_"):
            data["starts"][0][key[len("start_"):]] = value
        else:
            data[key] = value
    return json.dumps(data)


def without(key: str, start: bool = False) -> str:
    data = good_record()
    (data["starts"][0] if start else data).pop(key)
    return json.dumps(data)


# (id, run.json text or bytes, fragment of the message)
DAMAGED_RECORDS = [
    # not a JSON object at all
    ("empty", "", "not JSON"),
    ("truncated", edited()[:40], "not JSON"),
    ("garbage", "run_id = x\n", "not JSON"),
    ("list", "[]", "a JSON list, not an object"),
    ("string", '"run"', "a JSON string, not an object"),
    ("null", "null", "a JSON null, not an object"),
    ("nested-too-deep", "[" * 200_000, "nested too deeply"),
    ("not-utf8", b'{"run_id": "\xff\xfe"}', "not UTF-8"),
    ("nan-json-number", edited(nodes=float("nan")), "nodes: not an integer"),
    # the run's own fields
    ("run-id-missing", without("run_id"), "run_id: missing"),
    ("run-id-number", edited(run_id=7), "run_id: not a run id"),
    ("run-id-escape", edited(run_id="x\x1b[2Jy"), "run_id: not a run id"),
    ("run-id-path", edited(run_id="../../etc"), "run_id: not a run id"),
    ("state-garbage", edited(state="done; rm -rf ~"), "state: not a state"),
    ("state-number", edited(state=3), "state: not a state"),
    ("state-lowercase", edited(state="running"), "state: not a state"),
    ("dry-run-string", edited(dry_run="yes"), "dry_run: not true or false"),
    ("nodes-string", edited(nodes="2"), "nodes: not an integer"),
    ("nodes-negative", edited(nodes=-1), "nodes: negative"),
    ("requeue-max-null", edited(requeue_max=None), "requeue_max: missing"),
    ("requeue-max-bool", edited(requeue_max=True), "requeue_max: not an integer"),
    ("site-list", edited(site=["a"]), "site: not text"),
    ("reason-dict", edited(reason={"a": 1}), "reason: not text"),
    # job ids: only Slurm's shape ever reaches a Slurm command
    ("job-id-dict", edited(job_id={"id": 1}), "job_id: not a Slurm job id"),
    ("job-id-me", edited(job_id="--me"), "job_id: not a Slurm job id: '--me'"),
    ("job-id-user", edited(job_id="-u root"), "job_id: not a Slurm job id"),
    ("job-id-trailing-option", edited(job_id="123 --me"), "job_id: not a Slurm job id"),
    ("job-id-newline", edited(job_id="123\n"), "job_id: not a Slurm job id"),
    ("job-id-list", edited(job_id="1,2"), "job_id: not a Slurm job id"),
    ("job-id-empty", edited(job_id=""), "job_id: not a Slurm job id"),
    ("job-id-negative", edited(job_id=-1), "job_id: not a Slurm job id"),
    ("job-id-other-digits", edited(job_id="\u0661\u0662"), "job_id: not a Slurm job id"),
    ("job-id-array-range", edited(job_id="12_[1-3]"), "job_id: not a Slurm job id"),
    ("job-id-het", edited(job_id="12+0"), "job_id: not a Slurm job id"),
    # the starts
    ("starts-string", edited(starts="1000"), "starts: a JSON string, not a list"),
    ("starts-dict", edited(starts={"0": {}}), "starts: a JSON object, not a list"),
    ("start-list", edited(starts=[[]]), "starts[0]: a JSON list, not an object"),
    ("start-job-id-missing", without("job_id", start=True), "starts[0].job_id: missing"),
    ("start-job-id-dict", edited(start_job_id={}), "starts[0].job_id: not a Slurm job id"),
    ("start-job-id-me", edited(start_job_id="--me"), "starts[0].job_id: not a Slurm job id"),
    ("start-restart-string", edited(start_restart="1"), "starts[0].restart: not an integer"),
    ("start-restart-negative", edited(start_restart=-2), "starts[0].restart: negative"),
    ("start-restart-float", edited(start_restart=1.5), "starts[0].restart: not an integer"),
    ("start-state-escape", edited(start_state="\x1b[31mRUNNING"), "starts[0].state: not a state"),
    ("start-exit-code-string", edited(start_exit_code="0"), "starts[0].exit_code: not an integer"),
    ("start-stopped-at-list", edited(start_stopped_at=[1]), "starts[0].stopped_at: not an integer"),
    ("start-ended-number", edited(start_ended=5), "starts[0].ended: not text"),
]


def make_run(runs: Path, run_id: str, text: str | bytes) -> Path:
    run_dir = runs / run_id
    run_dir.mkdir(parents=True)
    data = text if isinstance(text, bytes) else text.encode()
    (run_dir / "run.json").write_bytes(data)
    registry.register(run_id, str(run_dir))
    return run_dir


@pytest.mark.parametrize("case, text, fragment", DAMAGED_RECORDS, ids=[c[0] for c in DAMAGED_RECORDS])
def test_damaged_record_is_a_run_error_naming_file_and_field(tmp_path, isolated_env, case, text, fragment):
    run_dir = make_run(tmp_path / "runs", "damaged", text)
    with pytest.raises(RunError) as caught:
        api.status(str(run_dir))
    message = str(caught.value)
    assert str(run_dir / "run.json") in message
    assert fragment in message
    assert caught.value.exit_code == 1
    # the same for every other reader
    with pytest.raises(RunError, match="damaged run record"):
        api.cancel(str(run_dir))
    with pytest.raises(RunError, match="damaged run record"):
        api.wait(str(run_dir), poll_s=0)


def test_list_reports_each_damaged_record_and_lists_every_other_run(tmp_path, isolated_env):
    runs = tmp_path / "runs"
    make_run(runs, "first-good", json.dumps(good_record("first-good")))
    for case, text, _ in DAMAGED_RECORDS:
        make_run(runs, case, text)
    make_run(runs, "last-good", json.dumps(good_record("last-good")))
    rows = api.list_runs(limit=1000)
    good = [r["run_id"] for r in rows if not r.get("error")]
    bad = {Path(r["run_dir"]).name: r["error"] for r in rows if r.get("error")}
    assert good == ["last-good", "first-good"]
    assert set(bad) == {case for case, _, _ in DAMAGED_RECORDS}
    for case, _, fragment in DAMAGED_RECORDS:
        assert fragment in bad[case], (case, bad[case])
    text = format_list(rows)
    assert text.count("bad record: ") == len(DAMAGED_RECORDS)
    assert "\x1b" not in text                # a hostile value never reaches the terminal raw


def test_damaged_record_does_not_count_towards_the_limit(tmp_path, isolated_env):
    runs = tmp_path / "runs"
    make_run(runs, "old-good", json.dumps(good_record("old-good")))
    make_run(runs, "newer-bad", "[]")
    rows = api.list_runs(limit=1)
    assert [r["run_id"] for r in rows] == ["newer-bad", "old-good"]


# (id, index line as bytes, fragment)
BAD_INDEX_LINES = [
    ("garbage", b"garbage", "not JSON"),
    ("truncated", b'{"run_id": "a", "run_dir": "/x', "not JSON"),
    ("list", b"[]", "not a JSON object"),
    ("number", b"42", "not a JSON object"),
    ("no-run-dir", b'{"run_id": "a"}', "no run_dir path"),
    ("run-dir-number", b'{"run_id": "a", "run_dir": 5}', "no run_dir path"),
    ("run-dir-empty", b'{"run_id": "a", "run_dir": ""}', "no run_dir path"),
    ("run-dir-nul", b'{"run_id": "a", "run_dir": "/tmp/a\\u0000b"}', "no run_dir path"),
    ("run-id-dict", b'{"run_id": {}, "run_dir": "/tmp"}', "no run_id"),
    ("nested-too-deep", b"[" * 20_000, "nested too deeply"),
    ("not-utf8", b'{"run_id": "\xff", "run_dir": "/tmp"}', "not JSON"),
    ("too-long", b'{"run_id": "a", "run_dir": "' + b"x" * 200_000 + b'"}', "longer than"),
]


def test_bad_index_lines_are_skipped_and_reported(tmp_path, isolated_env):
    runs = tmp_path / "runs"
    make_run(runs, "before", json.dumps(good_record("before")))
    index = registry.read_index().path
    with open(index, "ab") as f:
        for _, line, _ in BAD_INDEX_LINES:
            f.write(line + b"\n")
        f.write(b"\n")                          # blank lines are not damage
    make_run(runs, "after", json.dumps(good_record("after")))
    report = registry.read_index()
    assert [e["run_id"] for e in report.entries] == ["before", "after"]
    assert len(report.bad_lines) == len(BAD_INDEX_LINES)
    for (case, _, fragment), problem in zip(BAD_INDEX_LINES, report.bad_lines):
        assert fragment in problem, (case, problem)
    rows = api.list_runs()
    assert [r["run_id"] for r in rows if not r.get("error")] == ["after", "before"]
    (summary,) = [r["error"] for r in rows if r.get("error")]
    assert str(index) in summary and f"{len(BAD_INDEX_LINES)} bad line(s)" in summary
    assert api.status("after")["state"] == "COMPLETED"   # found by id past the bad lines


def test_unusable_index_or_state_dir_is_a_config_error(tmp_path, isolated_env, monkeypatch):
    state = Path(isolated_env["GLAUNCH_STATE_DIR"])
    state.mkdir()
    (state / "runs.jsonl").mkdir()
    with pytest.raises(ConfigError, match="GLAUNCH_STATE_DIR"):
        api.list_runs()
    os.rmdir(state / "runs.jsonl")
    os.mkfifo(state / "runs.jsonl")            # would block a plain open() forever
    with pytest.raises(ConfigError, match="not a regular file"):
        api.list_runs()
    state_file = tmp_path / "a-file"
    state_file.write_text("")
    monkeypatch.setenv("GLAUNCH_STATE_DIR", str(state_file))
    with pytest.raises(ConfigError, match="GLAUNCH_STATE_DIR") as caught:
        api.list_runs()
    assert caught.value.exit_code == 2


@pytest.mark.parametrize("kind", ["fifo", "directory", "dev-zero", "huge"])
def test_run_json_that_is_not_a_small_regular_file(tmp_path, isolated_env, kind):
    run_dir = tmp_path / "runs" / "odd"
    run_dir.mkdir(parents=True)
    path = run_dir / "run.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    else:
        with open(path, "wb") as f:
            f.write(b'{"run_id": "odd", "detail": "')
            f.write(b"x" * (17 * 1024 * 1024))
            f.write(b'"}')
    registry.register("odd", str(run_dir))
    with pytest.raises(RunError) as caught:
        api.status("odd")
    assert str(path) in str(caught.value)
    assert ("not a regular file" in str(caught.value) or "larger than" in str(caught.value)
            or "Is a directory" in str(caught.value)), str(caught.value)
    (row,) = api.list_runs()
    assert row["error"] == str(caught.value)


# (id, result.json content, fragment of the status line)
DAMAGED_RESULTS = [
    ("not-json", "{", "not JSON"),
    ("list", "[1, 2]", "a JSON list, not an object"),
    ("deep", "[" * 100_000, "nested too deeply"),
]


@pytest.mark.parametrize("case, text, fragment", DAMAGED_RESULTS, ids=[c[0] for c in DAMAGED_RESULTS])
def test_damaged_result_is_reported_in_status(tmp_path, isolated_env, case, text, fragment):
    run_dir = make_run(tmp_path / "runs", "r", json.dumps(good_record("r")))
    (run_dir / "result.json").write_text(text)
    summary = api.status("r")
    assert summary["result"] is None
    assert fragment in summary["result_error"] and str(run_dir / "result.json") in summary["result_error"]
    assert "result: unreadable" in format_status(summary)


def test_hostile_values_are_escaped_in_status_text(tmp_path, isolated_env):
    record = good_record("r")
    record["site"] = "\x1b]0;owned\x07"
    record["detail"] = "line\x1b[2J"
    run_dir = make_run(tmp_path / "runs", "r", json.dumps(record))
    (run_dir / "result.json").write_text(json.dumps({"final_step": "\x1b[31m", "final_loss": 1.0}))
    text = format_status(api.status("r"))
    assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b" in text


def test_bad_created_time_is_an_unknown_age_not_a_traceback(tmp_path, isolated_env):
    for run_id, created in (("naive", "2024-01-01T00:00:00"), ("garbage", "yesterday"), ("null", None)):
        record = good_record(run_id)
        record["created"] = created
        make_run(tmp_path / "runs", run_id, json.dumps(record))
    ages = {r["run_id"]: r["age"] for r in api.list_runs()}
    assert ages["garbage"] == ages["null"] == "?"
    assert ages["naive"].endswith("d")


def test_job_id_shape():
    for good in ("1", "123456", "12_3", 77):
        assert job_id_of(good) == str(good)
    for bad in ("--me", "-u", "1 2", "1_", "_1", "1_2_3", "0x10", "1e3", " 1", "1\n", None, True, 1.0, [1], -5):
        with pytest.raises(RecordError):
            job_id_of(bad)


def test_values_from_rank_files_never_make_the_record_unreadable():
    """stop.json / resume.json may hold anything: a start keeps only what reads back."""
    record = RunRecord(run_id="r")
    record.record_start("5", 0, stopped_at="x", resumed_from=[1], exit_code=2.5)
    record.record_start("5", 1, stopped_at=40, resumed_from=30, exit_code=-15)
    again = RunRecord.from_dict(json.loads(json.dumps(record.to_dict())))
    assert [(s.stopped_at, s.resumed_from, s.exit_code) for s in again.starts] == [(None, None, None),
                                                                                   (40, 30, -15)]
    assert StartRecord.from_dict({"job_id": 9}).job_id == "9"


def test_jobend_with_damaged_rank_files_records_a_readable_end(tmp_path, isolated_env):
    """The end of a start reads stop.json, resume.json and crash.json written in the job:
    hostile content there still leaves a run.json every command can read."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    registry.write(run_dir, RunRecord.from_dict(good_record("r") | {"state": "RUNNING", "starts": []}))
    (run_dir / "stop.json").write_text(json.dumps({"restart": 0, "step": "x"}))
    (run_dir / "resume.json").write_text(json.dumps({"restart": 0, "step": {"a": 1}}))
    (run_dir / "crash.json").write_text("[" * 100_000)
    env = dict(isolated_env, GLAUNCH_JOB_ID="1234", GLAUNCH_RESTART="0")
    proc = subprocess.run([sys.executable, "-m", "launcher.jobcontrol.jobend", str(run_dir), "--status", "1"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    (start,) = registry.read(run_dir).starts
    assert (start.state, start.stopped_at, start.resumed_from) == ("REQUEUED", None, None)


def glaunch(*args, env):
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)


def test_cli_list_and_status_on_damage(tmp_path, isolated_env):
    runs = tmp_path / "runs"
    make_run(runs, "good-run", json.dumps(good_record()))
    bad_dir = make_run(runs, "bad-run", edited(job_id="--me"))
    with open(registry.read_index().path, "ab") as f:
        f.write(b"{not json\n")
    proc = glaunch("list", env=isolated_env)
    assert proc.returncode == 0, proc.stderr
    assert "good-run" in proc.stdout
    assert f"bad record: {bad_dir / 'run.json'}: damaged run record: job_id: not a Slurm job id: '--me'" in proc.stdout
    assert "bad index: " in proc.stdout and "line 3: not JSON" in proc.stdout
    proc = glaunch("list", "--json", env=isolated_env)
    assert proc.returncode == 0 and len(json.loads(proc.stdout)["runs"]) == 3
    for command in ("status", "cancel"):
        proc = glaunch(command, "bad-run", env=isolated_env)
        assert proc.returncode == 1, (command, proc.stderr)
        assert "Traceback" not in proc.stderr
        assert str(bad_dir / "run.json") in proc.stderr and "job_id" in proc.stderr
    state_file = tmp_path / "state-is-a-file"
    state_file.write_text("")
    proc = glaunch("list", env=dict(isolated_env, GLAUNCH_STATE_DIR=str(state_file)))
    assert proc.returncode == 2 and "GLAUNCH_STATE_DIR" in proc.stderr and "Traceback" not in proc.stderr


# --- fuzz: any JSON in any field of run.json ---------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20)
    | st.sampled_from(["--me", "-u root", "1000", "12_3", "RUNNING", "COMPLETED", "local", "slurm", "1", "0"]),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8)
RUN_KEYS = list(good_record()) + ["accounting", "extra"]
START_KEYS = list(good_record()["starts"][0]) + ["pid_start", "nodes"]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(run_changes=st.dictionaries(st.sampled_from(RUN_KEYS), JSON_VALUES, max_size=3),
       start_changes=st.dictionaries(st.sampled_from(START_KEYS), JSON_VALUES, max_size=3),
       drop=st.sets(st.sampled_from(RUN_KEYS), max_size=2), scheduler=st.sampled_from(["local", "slurm"]))
def test_fuzzed_record_is_read_or_reported_never_a_traceback(tmp_path, isolated_env, monkeypatch, run_changes,
                                                              start_changes, drop, scheduler):
    sent = []
    monkeypatch.setattr(os, "killpg", lambda *args: sent.append(args))   # fake: a fuzzed pid is never signalled
    # Stand-ins for Slurm's commands (none here, and a real one must never see a fuzzed id):
    # each records its arguments.
    bin_dir, calls = tmp_path / "fake-slurm-bin", tmp_path / "slurm-calls"
    bin_dir.mkdir(exist_ok=True)
    for name in ("scancel", "squeue", "sacct"):
        (bin_dir / name).write_text(f'#!/bin/bash\nprintf "%s\\n" "$*" >> {calls}\nexit 1\n')
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    data = good_record()
    data["state"], data["scheduler"] = "RUNNING", scheduler
    data["starts"][0].update(start_changes)
    data.update(run_changes)
    for key in drop:
        data.pop(key, None)
    run_dir = tmp_path / "runs" / "fuzz"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "run.json").write_text(json.dumps(data))
    try:
        summary = api.status(str(run_dir))
    except RunError as exc:
        assert str(run_dir / "run.json") in str(exc)
    else:
        text = format_status(summary)
        assert "\x1b" not in text
        json.dumps(summary)
        record = registry.read(run_dir)
        assert record.job_id is None or job_id_of(record.job_id)
        assert all(job_id_of(s.job_id) for s in record.starts)
        try:
            api.cancel(str(run_dir))
        except GlaunchError:
            pass
    assert sent == []
    for line in calls.read_text().splitlines() if calls.exists() else []:
        words = line.split()
        job_ids = [words[0]] if len(words) == 1 else [words[words.index("-j") + 1]]   # scancel ID / -j ID
        assert all(is_job_id(j) for j in job_ids) and "--me" not in words and "-u" not in words, line


def test_a_run_whose_record_names_no_nodes_shows_a_dash_not_none():
    rows = [{"run_id": "stopped-submission", "state": "FAILED", "site": "far", "nodes": None, "age": "1s"},
            {"run_id": "queued", "state": "PENDING", "site": "far", "nodes": 2, "age": "5s"}]
    lines = format_list(rows).splitlines()
    assert lines[1].split()[3] == "-" and lines[2].split()[3] == "2" and "None" not in lines[1]

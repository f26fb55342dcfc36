"""The ledger of peer recoveries (recovery.peer): what the rank that failed appends to the
run directory, read back by goodput as a road of its own (recoveries, lost steps, failure
-> next step), shown by `glaunch status` (text and JSON) and fed to the projection; every
line read as an untrusted record, the file bounded."""

import json
import os
import time

import pytest

from launcher.resolution.goodput_projection import PEER_ROAD, costs_with_defaults, project
from launcher.rundir.layout import RunDir
from launcher.rundir.records import RunRecord
from launcher.runner import goodput
from launcher.runtime import peer
from launcher.runtime.peerplan import Report, plan_recovery
from launcher.rundir.rankcontext import context
from launcher.views.status_text import format_status

T0 = "2025-03-01T10:00:00+00:00"


@pytest.fixture
def rank1(tmp_path, monkeypatch):
    """Rank 1 of 2 in job 100, start 0, its run directory `tmp_path`."""
    for name, value in {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "1",
                        "GLAUNCH_RUN_DIR": str(tmp_path), "GLAUNCH_JOB_ID": "100", "GLAUNCH_RESTART": "0"}.items():
        monkeypatch.setenv(name, value)
    return context()


def recorded(ctx, step: int, *, failed_after_update: bool = False, next_step: int | None = None) -> dict:
    """Rank 1's step `step` raised (after its update: nothing redone); rank 0 sends its state;
    the entry appended once the next step ended, as the runtime does."""
    committed = step if failed_after_update else step - 1
    plan = plan_recovery(1, [Report(0, committed, False, "RuntimeError: Connection closed by peer"),
                             Report(1, committed, True, "ValueError: injected")], 2)
    assert peer.ledger_writer(plan) == 1
    cause = peer.failure_cause(plan, [Report(0, committed, False, "RuntimeError: Connection closed by peer"),
                                      Report(1, committed, True, "ValueError: injected")], ctx)
    assert cause[0] == 1 and cause[2] == "ValueError: injected"
    pending = peer._Unrecorded(peer.ledger_entry(plan, step, cause, 0.04, time.time() - 0.3, ctx),
                               time.monotonic() - 0.3)
    entry = pending.entry(next_step)
    peer.append_ledger(ctx.run_dir, entry)
    return entry


def record_of(run_dir) -> RunRecord:
    """One completed start of 20 steps of 0.25 s, in `run_dir`."""
    return RunRecord.from_dict({"run_id": "r", "state": "COMPLETED", "run_dir": str(run_dir), "starts": [
        {"job_id": "100", "restart": 0, "started": T0, "ended": "2025-03-01T10:00:30+00:00", "state": "COMPLETED",
         "submitted": T0, "first_step": 1, "first_step_at": "2025-03-01T10:00:05+00:00", "last_step": 20,
         "last_step_at": "2025-03-01T10:00:10+00:00", "step_time_s": {"median": 0.25}}]})


def test_each_recovery_is_one_line_read_back_as_its_own_road(rank1, tmp_path):
    recorded(rank1, 7, next_step=7)
    recorded(rank1, 12, failed_after_update=True, next_step=13)
    lines = RunDir(tmp_path).peer_recovery_file.read_text().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    assert (first["step"], first["resume_after"], first["lost_steps"], first["next_step"]) == (7, 6, 1, 7)
    assert (first["failed"], first["source"], first["receivers"]) == ([1], 0, [1])
    assert first["job_id"] == "100" and first["restart"] == 0 and first["checkpoint_read"] is False
    assert 0.3 <= first["to_next_step_s"] < 5

    good = goodput.summarize(record_of(tmp_path), now=time.time())["goodput"]
    road = good["peer_recoveries"]
    assert road["recoveries"] == 2 and road["lost_steps"] == 1       # the second failed after its update
    assert [e["step"] for e in road["entries"]] == [7, 12] and road["damaged_lines"] == 0
    assert road["recovery_s"] == {"median": 0.04, "max": 0.04}
    assert 0.3 <= road["to_next_step_s"]["median"] <= road["to_next_step_s"]["max"] < 5
    # The run's own lost steps count the step done again (one step of 0.25 s); no interruption.
    assert good["lost_steps"] == 1 and good["lost_s"] == 0.25 and good["interruptions"] == 0

    costs = goodput.projection_costs(good)
    assert costs["peer_s"] == road["to_next_step_s"]["median"]
    projected = project(None, costs_with_defaults(costs, 100), [(128, 8)], 4 * 3600).to_json()
    roads = {r["road"]: r for r in projected["sizes"][0]["roads"]}
    assert projected["costs"]["peer_measured"] is True and PEER_ROAD in roads

    text = format_status({"run_id": "r", "state": "COMPLETED", "site": "s", "job_id": "100", "restarts": 0,
                          "run_dir": str(tmp_path), "starts": [], "goodput": good})
    assert "peer recoveries: 2 in the start they happened in, no checkpoint read; lost steps 1" in text, text
    assert ("newest: job 100 start 0, step 12: rank(s) 1 failed (ValueError: injected); state of step 12 "
            "from rank 0 to rank(s) 1") in text, text


def test_a_run_without_a_ledger_has_no_peer_road(tmp_path):
    good = goodput.summarize(record_of(tmp_path), now=time.time())["goodput"]
    assert good["peer_recoveries"] is None and good["lost_steps"] == 0
    assert "peer_s" not in goodput.projection_costs(good)
    text = format_status({"run_id": "r", "state": "COMPLETED", "site": "s", "job_id": "100", "restarts": 0,
                          "run_dir": str(tmp_path), "starts": [], "goodput": good})
    assert "peer recover" not in text


def test_the_ledger_is_read_from_the_directory_status_names(rank1, tmp_path):
    # A record naming another directory (a copy; a run that lives elsewhere): the ledger
    # of the directory given is read.
    recorded(rank1, 3, next_step=3)
    elsewhere = record_of(tmp_path / "nowhere")
    assert goodput.summarize(elsewhere, now=time.time())["goodput"]["peer_recoveries"] is None
    assert goodput.summarize(elsewhere, now=time.time(), run_dir=tmp_path)["goodput"]["peer_recoveries"][
        "recoveries"] == 1


# Lines no rank writes: each is left out and counted, none is shown or fails status.
FORGED = [
    b"not json",
    b"[1, 2]",
    b'{"step": -1, "resume_after": 0, "lost_steps": 0, "world_size": 2, "failed": [1], "receivers": [1], "source": 0}',
    b'{"step": 3, "resume_after": 5, "lost_steps": 0, "world_size": 2, "failed": [1], "receivers": [1], "source": 0}',
    b'{"step": 3, "resume_after": 2, "lost_steps": 1, "world_size": 2, "failed": [7], "receivers": [1], "source": 0}',
    b'{"step": 3, "resume_after": 2, "lost_steps": 1, "world_size": 2, "failed": [1], "receivers": [1], "source": 2}',
    b'{"step": 3, "resume_after": 2, "lost_steps": true, "world_size": 2, "failed": [1], "receivers": [1], '
    b'"source": 0}',
    b'{"step": 3, "resume_after": 2, "lost_steps": 1, "world_size": 2, "failed": "1", "receivers": [1], "source": 0}',
    b'{"step": 3, "resume_after": 2, "lost_steps": 1, "world_size": 2, "failed": [1], "receivers": [1], '
    b'"source": 0, "error": "\\ud800"}',
    b'{"step": 3, "resume_after": 2, "lost_steps": 1, "world_size": 2, "failed": [1], "receivers": [1], '
    b'"source": 0, "error": "' + b"x" * 70_000 + b'"}',
    b"[" * 100_000,
    b"\xff\xfe not utf-8",
    b'{"step": 99999999999999999999999999, "resume_after": 2, "lost_steps": 1, "world_size": 2, "failed": [1], '
    b'"receivers": [1], "source": 0}',
]


def test_forged_lines_are_counted_and_left_out(rank1, tmp_path):
    recorded(rank1, 7, next_step=7)
    with open(RunDir(tmp_path).peer_recovery_file, "ab") as f:
        f.write(b"\n".join(FORGED) + b"\n")
        # Times that are not times, an odd error and node: kept as None or cut, the entry kept.
        f.write(json.dumps({"step": 9, "resume_after": 8, "lost_steps": 1, "world_size": 2, "failed": [1],
                            "receivers": [1], "source": 0, "to_next_step_s": -3, "recovery_s": "fast",
                            "failed_at": "yesterday", "next_step_at": 12, "job_id": "100; rm -rf /", "node": "n" * 1000,
                            "error": "\x1b[31mred"}).encode() + b"\n")
        f.write(b'{"step": 10, "resume_after": 9, "lost_st')       # a line still being written
    good = goodput.summarize(record_of(tmp_path), now=time.time())["goodput"]
    road = good["peer_recoveries"]
    assert road["damaged_lines"] == len(FORGED) and road["recoveries"] == 2, road
    odd = road["entries"][-1]
    assert odd["to_next_step_s"] is None and odd["recovery_s"] is None
    assert odd["failed_at"] is None and odd["next_step_at"] is None
    assert odd["job_id"] is None and len(odd["node"]) == goodput.PEER_TEXT
    text = format_status({"run_id": "r", "state": "COMPLETED", "site": "s", "job_id": "100", "restarts": 0,
                          "run_dir": str(tmp_path), "starts": [], "goodput": good})
    assert f"{len(FORGED)} line(s) of the peer recovery ledger are not records: left out" in text
    assert "\x1b" not in text and "rm -rf" not in text


def test_a_ledger_past_the_bound_is_read_to_it_and_said(rank1, tmp_path, monkeypatch):
    monkeypatch.setattr(goodput, "PEER_LEDGER_READ", 4096)
    for step in range(1, 40):
        recorded(rank1, step, next_step=step)
    assert RunDir(tmp_path).peer_recovery_file.stat().st_size > 4096
    road = goodput.summarize(record_of(tmp_path), now=time.time())["goodput"]["peer_recoveries"]
    assert road["truncated"] and road["damaged_lines"] == 0          # the line cut at the bound is not counted
    assert 0 < road["recoveries"] < 39 and len(road["entries"]) == min(road["recoveries"], goodput.PEER_ENTRIES_SHOWN)
    text = format_status({"run_id": "r", "state": "COMPLETED", "site": "s", "job_id": "100", "restarts": 0,
                          "run_dir": str(tmp_path), "starts": [], "goodput": {"starts": [{}], "peer_recoveries": road}})
    assert "the peer recovery ledger is larger than glaunch reads" in text


def test_a_fifo_or_a_directory_in_its_place_is_said_never_waited_on(tmp_path):
    path = RunDir(tmp_path).peer_recovery_file
    os.mkfifo(path)
    began = time.monotonic()
    road = goodput.summarize(record_of(tmp_path), now=time.time())["goodput"]["peer_recoveries"]
    assert time.monotonic() - began < 5
    assert road["recoveries"] == 0 and "not a regular file" in road["problem"]
    path.unlink()
    path.mkdir()
    road = goodput.summarize(record_of(tmp_path), now=time.time())["goodput"]["peer_recoveries"]
    assert road["recoveries"] == 0 and road["problem"]


def test_a_ledger_that_cannot_be_written_is_logged_and_the_run_goes_on(rank1, tmp_path, capsys):
    RunDir(tmp_path).peer_recovery_file.mkdir()
    recorded(rank1, 7, next_step=7)                # no exception
    assert "peer recovery: not recorded in" in capsys.readouterr().err


def test_a_lost_process_is_recorded_as_its_own_failure_not_as_the_source_s_loss_of_it(tmp_path, monkeypatch):
    """Rank 3 of 4 lost its process: rank 0, the source, records the recovery. The entry names
    rank 3, the node its peers asked to start it again on, and its replacement's account;
    not rank 0, its node, or its gloo error on losing its peer."""
    for name, value in {"RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "0",
                        "GLAUNCH_RUN_DIR": str(tmp_path), "GLAUNCH_JOB_ID": "100", "GLAUNCH_RESTART": "0"}.items():
        monkeypatch.setenv(name, value)
    ctx = context()
    reports = [Report(0, 7, False, "RuntimeError: Connection closed by peer"),
               Report(1, 7, False, "RuntimeError: Connection closed by peer"),
               Report(2, 7, False, "RuntimeError: Connection closed by peer"),
               Report(3, -1, True, "process lost; started again", replaced=True)]
    plan = plan_recovery(2, reports, 4)
    assert peer.ledger_writer(plan) == 0
    request = RunDir(tmp_path).peer_replace_request("100", 0, 2, 3)
    request.parent.mkdir(parents=True)
    request.write_text(json.dumps({"job_id": "100", "restart": 0, "generation": 2, "rank": 3, "node": "dnode2"}))
    entry = peer.ledger_entry(plan, 8, peer.failure_cause(plan, reports, ctx), 0.1, time.time(), ctx)
    assert (entry["rank"], entry["node"], entry["error"]) == (3, "dnode2", "process lost; started again")
    request.unlink()                                    # asked by another rank: the node is not known here
    assert peer.failure_cause(plan, reports, ctx) == (3, None, "process lost; started again")

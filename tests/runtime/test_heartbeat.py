"""Heartbeats: rate-limited, always whole files, step numbers given or counted, step and
save times apart, and never an error in the training loop."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from launcher.rundir.layout import HEARTBEAT_BYTES, heartbeat_bytes, read_heartbeat
from launcher.runtime import heartbeats, stop
from launcher.rundir.heartbeatrecord import checked_heartbeat


class CountingBeats(heartbeats.Beats):
    """The real writer, counting its writes."""

    writes = 0

    def write(self, now=None):
        self.writes += 1
        super().write(now)


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    for key in list(os.environ):
        if key.startswith("GLAUNCH_") or key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            monkeypatch.delenv(key, raising=False)
    heartbeats.reset()
    stop.reset_stop()
    yield
    heartbeats.reset()


def beats(tmp_path, interval=5.0, every=0, restart=0, cls=heartbeats.Beats):
    return cls(run_dir=tmp_path, interval_s=interval, checkpoint_every=every, rank=3, node="n1", job_id="77",
               restart=restart)


def test_writes_at_most_once_per_interval(tmp_path):
    b = beats(tmp_path, interval=0.2, cls=CountingBeats)
    began = time.monotonic()
    for step in range(1, 61):
        b.beat(step, total=60)
        time.sleep(0.02)
    elapsed = time.monotonic() - began
    # Besides: the first step's write, and the one that gives the watchdog its early bound.
    assert 2 <= b.writes <= elapsed / 0.2 + 2, (b.writes, elapsed)
    data = read_heartbeat(tmp_path / "heartbeats" / "rank-00003.json")
    assert data["rank"] == 3 and data["node"] == "n1" and data["job_id"] == "77" and data["total"] == 60
    assert data["step"] >= 50                      # a write every 0.2 s: at most 10 steps behind
    assert data["time"] <= data["written"]


def test_readers_never_see_a_partial_file(tmp_path):
    b = beats(tmp_path, interval=1e-9)            # a write at every beat
    path = tmp_path / "heartbeats" / "rank-00003.json"
    b.beat(0)
    seen, problems, done = [], [], threading.Event()

    def read():
        while not done.is_set():
            record = read_heartbeat(path)
            if record is None:
                problems.append(path.read_bytes()[:80])
            else:
                seen.append(record["step"])

    reader = threading.Thread(target=read)
    reader.start()
    for step in range(1, 1001):
        b.beat(step)
    done.set()
    reader.join()
    assert not problems, problems[:3]
    assert seen and seen == sorted(seen)
    assert sorted(p.name for p in path.parent.iterdir()) == ["rank-00003.json"]
    assert path.stat().st_size == HEARTBEAT_BYTES       # written in place, at its fixed size


def test_counted_steps_start_after_the_resumed_step(tmp_path):
    (tmp_path / "resume.json").write_text(json.dumps({"restart": 2, "step": 40, "job_id": "77"}))
    b = beats(tmp_path, interval=60.0, restart=2)
    for _ in range(5):
        b.beat()
    assert (b.first_step, b.step) == (41, 45)
    stale = beats(tmp_path / "other", interval=60.0, restart=2)
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "resume.json").write_text(json.dumps({"restart": 1, "step": 40}))
    stale.beat()
    assert stale.step == 1                          # another start's resume.json is not this start's


def test_checkpoint_steps_are_timed_apart(tmp_path):
    b = beats(tmp_path, interval=60.0, every=4)
    for step in range(1, 13):
        time.sleep(0.01)
        if step % 4 == 0:
            time.sleep(0.1)                        # the save
        b.beat(step)
    times = b.step_times()
    assert times["count"] == 8                     # 11 intervals, 3 of them end at a checkpoint step
    saves = b.save_times()
    # Lower bounds are the sleeps; on a loaded machine any step may take longer, so the
    # ordering (a plain step is shorter than every save) is what holds.
    assert times["median"] >= 0.009 and len(saves) == 3 and all(s >= 0.09 for s in saves), saves
    assert times["median"] < min(saves), (times, saves)
    heartbeats.reset(b)
    heartbeats.note_checkpoint(12, 1.5)             # the checkpoint code's own figure wins
    assert b.save_times() == [1.5] and b.checkpoint_step == 12


def test_repeated_and_backward_steps(tmp_path):
    b = beats(tmp_path, interval=60.0)
    b.beat(10)
    first = b.time
    b.beat(10)                                     # twice in one step: the step was reached earlier
    assert b.time == first and b.step_times() is None
    b.beat(11)
    b.beat(5)                                      # rolled back: timing goes on from there
    assert (b.first_step, b.step) == (5, 5)


def test_an_interval_that_held_a_peer_recovery_is_no_step_time(tmp_path):
    """A hang its peers waited out, then the state sent to the rank that replaced it: the
    interval to the redone step is neither a step's time (the watchdog's auto bound is taken
    from those) nor a rank's own work; the steps after are timed again."""
    b = beats(tmp_path, interval=60.0)
    for step in range(1, 5):
        time.sleep(0.01)
        b.beat(step)
    before = (b.seen, b.busy_count)
    time.sleep(0.3)                                # step 5 hung, its peers waited, then recovered
    b.interrupted()
    b.beat(5)
    assert (b.seen, b.busy_count) == before and max(b.recent) < 0.25, list(b.recent)
    time.sleep(0.01)
    b.beat(6)
    assert b.seen == before[0] + 1 and b.first_step == 1
    assert b.pace()["step_p99_s"] < 0.25


def test_should_stop_beats_under_a_launcher(tmp_path, monkeypatch):
    monkeypatch.setenv("GLAUNCH_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("GLAUNCH_JOB_ID", "55")
    monkeypatch.setenv("GLAUNCH_GPU_SAMPLE_S", "0")
    for step in range(1, 4):
        assert stop.should_stop(step=step, total=3) is False
    data = read_heartbeat(tmp_path / "heartbeats" / "rank-00000.json")
    assert data["job_id"] == "55" and data["first_step"] == 1 and data["total"] == 3
    stop.request_stop()
    assert stop.should_stop() is True              # counted: the step after 3
    assert heartbeats.current().step == 4 and heartbeats.current().stop_decided is not None


def test_no_files_outside_a_launcher(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for step in range(1, 4):
        stop.should_stop(step=step)
    assert heartbeats.current().step == 3
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_run_dir_never_reaches_the_loop(tmp_path, capsys):
    blocker = tmp_path / "run"
    blocker.write_text("a file where the run directory should be")
    b = beats(blocker, interval=1e-9)
    for step in range(1, 5):
        b.beat(step)
    assert capsys.readouterr().err.count("heartbeat not written") == 1


def test_bad_interval_falls_back(monkeypatch, capsys):
    monkeypatch.setenv("GLAUNCH_HEARTBEAT_S", "soon")
    assert heartbeats.interval_from_env() == heartbeats.DEFAULT_INTERVAL_S
    assert "GLAUNCH_HEARTBEAT_S='soon'" in capsys.readouterr().err
    monkeypatch.setenv("GLAUNCH_HEARTBEAT_S", "0")
    assert heartbeats.interval_from_env() == 0


def test_interval_zero_writes_no_file(tmp_path):
    b = beats(tmp_path, interval=0)
    for step in range(1, 4):
        b.beat(step)
    assert b.step == 3 and not (tmp_path / "heartbeats").exists()


def test_torn_and_damaged_records_read_as_none(tmp_path):
    path = tmp_path / "rank-00000.json"
    old = heartbeat_bytes({"step": 19, "time": 1.0})
    new = heartbeat_bytes({"step": 20, "time": 2.0})
    assert len(old) == len(new) == HEARTBEAT_BYTES
    cut = old.index(b"19") + 1
    path.write_bytes(new[:cut] + old[cut:])          # a read that raced the write: "29"
    assert b'"step":29' in path.read_bytes()
    assert read_heartbeat(path, attempts=2) is None
    path.write_bytes(new)
    assert read_heartbeat(path) == {"step": 20, "time": 2.0}
    for damage in (b"", b"{}", b"[1]\n" + b"%08x" % 0, b"\xff" * 50):
        path.write_bytes(damage)
        assert read_heartbeat(path, attempts=1) is None
    big = heartbeat_bytes({"node": "n" * 3000})
    assert len(big) == 4 * HEARTBEAT_BYTES and read_heartbeat_bytes(big, tmp_path)["node"] == "n" * 3000


def read_heartbeat_bytes(data: bytes, tmp_path) -> dict | None:
    path = tmp_path / "one.json"
    path.write_bytes(data)
    return read_heartbeat(path)


def test_what_the_watchdog_reads_starting_saving_stopping(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    monkeypatch.setattr(heartbeats, "began", lambda ctx: None)    # no GPU sampler, no atexit here
    monkeypatch.setenv("GLAUNCH_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("GLAUNCH_JOB_ID", "77")
    path = tmp_path / "heartbeats" / "rank-00001.json"
    heartbeats.starting()
    data = read_heartbeat(path)
    assert data["state"] == "starting" and data["step"] is None and data["time"] is None
    assert data["pid"] == os.getpid() and data["job_step"] == "0" and data["world_size"] == 2 and data["host"]
    assert "watch" not in data                    # the bounds are task.json's, not the ranks'
    heartbeats.heartbeat(1)                       # the first step is written at once
    assert read_heartbeat(path)["step"] == 1 and read_heartbeat(path)["state"] == "running"
    with heartbeats.saving(1):
        data = read_heartbeat(path)
        assert data["state"] == "saving" and data["saving_since"] >= data["time"]
    data = read_heartbeat(path)
    assert data["state"] == "running" and data["saving_since"] is None and data["checkpoint_step"] == 1
    heartbeats.note_stop_decided()
    assert read_heartbeat(path)["state"] == "stopping"


def test_a_rank_announces_itself_when_its_script_uses_the_runtime_not_before(tmp_path, monkeypatch):
    """The task's own record and its own stop handler say nothing of the script; the
    script's install_stop_handler, glaunch's Lightning callback or a first step do, and the
    heartbeat says so at once (the watchdog's evidence: launcher.jobcontrol.watchdog.armed_at)."""
    monkeypatch.setattr(heartbeats, "began", lambda ctx: None)    # no GPU sampler, no atexit here
    monkeypatch.setenv("GLAUNCH_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("GLAUNCH_JOB_ID", "77")
    path = tmp_path / "heartbeats" / "rank-00000.json"
    heartbeats.starting()
    stop.take_stop_signals()                      # the task's call, before the script runs
    assert read_heartbeat(path)["announced_at"] is None
    before = time.time()
    stop.install_stop_handler()                   # the script's
    announced = read_heartbeat(path)["announced_at"]
    assert before <= announced <= time.time() and read_heartbeat(path)["step"] is None
    stop.install_stop_handler()
    heartbeats.heartbeat(1)
    assert read_heartbeat(path)["announced_at"] == announced      # the first announcement stays
    stop.uninstall_stop_handler()


def test_a_first_step_is_an_announcement_and_a_bad_one_is_refused(tmp_path):
    b = beats(tmp_path)
    b.beat(1)
    data = read_heartbeat(tmp_path / "heartbeats" / "rank-00003.json")
    assert data["announced_at"] == data["time"] == data["first_time"]
    assert checked_heartbeat(data, world_size=4, now=data["time"])["announced_at"] == data["time"]
    for bad in ("soon", float("inf"), -1, True, data["time"] + 10**6):
        with pytest.raises(ValueError, match="announced_at"):
            checked_heartbeat(dict(data, announced_at=bad), world_size=4, now=data["time"])


def test_glaunch_s_lightning_callback_announces_the_rank(tmp_path, monkeypatch):
    pytest.importorskip("lightning")
    from launcher.runtime.lightning import GlaunchCallback

    monkeypatch.setattr(heartbeats, "began", lambda ctx: None)
    monkeypatch.setenv("GLAUNCH_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("GLAUNCH_JOB_ID", "77")
    GlaunchCallback()
    assert read_heartbeat(tmp_path / "heartbeats" / "rank-00000.json")["announced_at"] is not None

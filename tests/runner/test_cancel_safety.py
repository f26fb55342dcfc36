"""`glaunch cancel` signals only what glaunch started and only while it runs: a local job is
proven by its job lock, its pid's start time and its own process group; a Slurm job id
must have Slurm's shape. Anything else is "nothing to cancel", with no signal sent."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher import api
from launcher.errors import RunError, SchedulerError
from launcher.rundir import registry
from launcher.rundir.layout import RunDir
from launcher.schedulers.local import hold_job_lock, process_start_time

REPO = Path(__file__).resolve().parents[2]


def write_run(tmp_path: Path, *, state: str, start: dict | None = None, scheduler: str = "local",
              job_id: str = "1000") -> Path:
    run_dir = tmp_path / "runs" / "r"
    run_dir.mkdir(parents=True)
    starts = [dict({"job_id": job_id, "restart": 0, "state": state}, **(start or {}))]
    record = {"run_id": "r", "site": scheduler, "scheduler": scheduler, "dry_run": False, "requeue_max": 0,
              "crash_retries": 0, "state": state, "job_id": job_id, "starts": starts}
    (run_dir / "run.json").write_text(json.dumps(record))
    registry.register("r", str(run_dir))
    return run_dir


@pytest.fixture
def bystander():
    """An unrelated process, leading its own process group (what a reused pid can be)."""
    proc = subprocess.Popen(["sleep", "120"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def still_alive(proc: subprocess.Popen) -> bool:
    time.sleep(0.3)
    return proc.poll() is None


def test_finished_run_with_a_reused_pid_signals_nothing(tmp_path, isolated_env, bystander):
    run_dir = write_run(tmp_path, state="COMPLETED",
                        start={"pid": bystander.pid, "pid_start": process_start_time(bystander.pid)})
    message = api.cancel("r")
    assert "nothing to cancel (COMPLETED)" in message
    assert still_alive(bystander)
    assert registry.read(run_dir).state == "COMPLETED"


def test_stale_running_record_without_a_live_job_signals_nothing(tmp_path, isolated_env, bystander):
    """glaunch died, the record still says RUNNING, and its pid now belongs to another
    process (even one with the recorded start time): nobody holds the job lock."""
    run_dir = write_run(tmp_path, state="RUNNING", start={"pid": bystander.pid,
                                                          "pid_start": process_start_time(bystander.pid)})
    # Reading the record brings it to its end first: nothing holds its job lock.
    assert "nothing to cancel (FAILED)" in api.cancel("r")
    assert still_alive(bystander)
    record = registry.read(run_dir)
    assert (record.state, record.reason, record.starts[-1].state) == ("FAILED", "lost", "FAILED")
    assert "glaunch resume continues from it" in record.detail


def test_live_run_whose_pid_was_reused_signals_nothing(tmp_path, isolated_env, bystander):
    run_dir = write_run(tmp_path, state="RUNNING", start={"pid": bystander.pid,
                                                          "pid_start": process_start_time(bystander.pid) - 1})
    lock = hold_job_lock(RunDir(run_dir))       # the run's job is alive somewhere
    try:
        assert f"process {bystander.pid} is no longer job 1000" in api.cancel("r")
    finally:
        os.close(lock)
    assert still_alive(bystander)
    assert registry.read(run_dir).state == "RUNNING"


def test_record_without_a_start_time_signals_nothing(tmp_path, isolated_env, bystander):
    run_dir = write_run(tmp_path, state="RUNNING", start={"pid": bystander.pid})
    lock = hold_job_lock(RunDir(run_dir))
    try:
        assert "no start time recorded" in api.cancel("r")
    finally:
        os.close(lock)
    assert still_alive(bystander)


def test_process_not_leading_its_group_is_not_signalled(tmp_path, isolated_env):
    follower = subprocess.Popen(["sleep", "120"])        # in the test's own process group
    try:
        run_dir = write_run(tmp_path, state="RUNNING",
                            start={"pid": follower.pid, "pid_start": process_start_time(follower.pid)})
        lock = hold_job_lock(RunDir(run_dir))
        try:
            assert "does not lead its process group" in api.cancel("r")
        finally:
            os.close(lock)
        assert still_alive(follower)
    finally:
        follower.kill()
        follower.wait()


@pytest.mark.parametrize("pid", [1, 0, -1, -100, "1", True, None, 1.0, [1]])
def test_pid_that_is_not_a_job_process_is_never_signalled(tmp_path, isolated_env, monkeypatch, pid):
    """pid 1 would be killpg(1) (init's group), 0 the caller's group, -1 every process: the
    signalling calls are replaced by a recorder (fake_kill) so a failure here harms nothing."""
    sent = []

    def fake_kill(*args):
        sent.append(args)

    monkeypatch.setattr(os, "killpg", fake_kill)
    monkeypatch.setattr(os, "kill", fake_kill)
    run_dir = write_run(tmp_path, state="RUNNING", start={"pid": pid, "pid_start": process_start_time(1)})
    lock = hold_job_lock(RunDir(run_dir))
    try:
        message = api.cancel("r")
    finally:
        os.close(lock)
    assert "nothing to cancel" in message
    assert sent == []
    assert registry.read(run_dir).state == "RUNNING"


@pytest.fixture
def fake_scancel(tmp_path, isolated_env, monkeypatch):
    """A stand-in for Slurm's scancel (no Slurm here) that records its arguments."""
    bin_dir = tmp_path / "fake-slurm-bin"
    bin_dir.mkdir()
    calls = tmp_path / "scancel-calls"
    script = bin_dir / "scancel"
    script.write_text(f'#!/bin/bash\nprintf "%s\\n" "$*" >> {calls}\n')
    script.chmod(0o755)
    for quiet in ("squeue", "sacct"):       # `cancel` reads the job's state first: none known
        (bin_dir / quiet).write_text("#!/bin/bash\nexit 0\n")
        (bin_dir / quiet).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return calls


@pytest.mark.parametrize("job_id", ["--me", "-u root", "123 --me", "--user=root", "1;2"])
def test_slurm_job_id_of_another_shape_never_reaches_scancel(tmp_path, fake_scancel, job_id):
    write_run(tmp_path, state="PENDING", scheduler="slurm", job_id="1")
    path = RunDir(tmp_path / "runs" / "r").run_file
    record = json.loads(path.read_text())
    record["job_id"] = job_id
    path.write_text(json.dumps(record))
    with pytest.raises(RunError, match="not a Slurm job id"):
        api.cancel("r")
    assert not fake_scancel.exists()


def test_slurm_job_of_slurms_shape_is_cancelled_only_while_in_flight(tmp_path, fake_scancel):
    run_dir = write_run(tmp_path, state="PENDING", scheduler="slurm", job_id="4242")
    squeue_says_origin(tmp_path, f"{run_dir}/logs/.submission_file_1a2b.sh|glaunch:r")
    assert "cancelled job 4242" in api.cancel("r")
    assert fake_scancel.read_text() == "4242\n"
    path = RunDir(run_dir).run_file
    record = json.loads(path.read_text())
    record["state"] = "COMPLETED"
    path.write_text(json.dumps(record))
    assert "nothing to cancel (COMPLETED)" in api.cancel("r")
    assert fake_scancel.read_text() == "4242\n"


def squeue_says_origin(tmp_path: Path, origin: str) -> None:
    """The fake squeue answers `squeue -h -j JOB -o %o|%k` (the job's batch script and
    comment) with `origin`, and nothing else (no state known)."""
    squeue = tmp_path / "fake-slurm-bin" / "squeue"
    squeue.write_text(f'#!/bin/bash\ncase "$*" in *"%o|%k"*) printf "%s\\n" {shlex.quote(origin)} ;; esac\n')


@pytest.mark.parametrize("origin, cancelled", [
    ("{run_dir}/logs/.submission_file_1a2b.sh|glaunch:r", True),        # submitit's script, the run's marker
    ("{run_dir}/job.sbatch|(null)", True),                               # queued again by its controller
    ("{runs}/other/logs/.submission_file_9f.sh|glaunch:other", False),   # another run's job
    ("/home/u/interactive.sh|(null)", False),                            # a job of the user's own
    ("{runs}/r-not/job.sbatch|glaunch:r-not", False),                    # a run whose name extends this one's
    ("(null)|glaunch:rr", False),
])
def test_cancel_ends_only_a_job_slurm_says_is_the_run_s(tmp_path, fake_scancel, origin, cancelled):
    """run.json names job 4242 (edited, or another run's record put in its place): scancel
    ends it only where squeue says the job comes from this run; else nothing is marked or
    cancelled, and the error says why."""
    run_dir = write_run(tmp_path, state="RUNNING", scheduler="slurm", job_id="4242")
    squeue_says_origin(tmp_path, origin.format(run_dir=run_dir, runs=run_dir.parent))
    if cancelled:
        assert "cancelled job 4242" in api.cancel("r")
        assert fake_scancel.read_text() == "4242\n"
        return
    with pytest.raises(SchedulerError, match="its record names job 4242, but Slurm's record of it is not the run's"):
        api.cancel("r")
    assert not fake_scancel.exists()
    assert not RunDir(run_dir).cancel_file.exists()


def test_a_job_slurm_does_not_list_is_not_said_cancelled_nor_marked(tmp_path, fake_scancel):
    """The run's record says RUNNING, and squeue here lists no job 4242: it has ended, or
    SLURM_CONF reaches another cluster, whose scancel would exit 0 and end nothing. Nothing
    is marked (the mark would make the run's next end a cancel) or cancelled: exit 3."""
    run_dir = write_run(tmp_path, state="RUNNING", scheduler="slurm", job_id="4242")
    with pytest.raises(SchedulerError, match=r"Slurm does not list its job 4242 \(squeue\): the job has ended, or "
                                             r"these Slurm commands reach another cluster"):
        api.cancel("r")
    assert not fake_scancel.exists()
    assert not RunDir(run_dir).cancel_file.exists()


# --- a real local run -----------------------------------------------------------------------


def group_alive(pgid: int) -> bool:
    """Whether any process (zombies aside) is still in process group `pgid`."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2:].split()
        if int(fields[2]) == pgid and fields[0] != b"Z":
            return True
    return False


def start_long_run(runs: Path, env) -> tuple[subprocess.Popen, Path, int]:
    proc = subprocess.Popen([sys.executable, "-m", "launcher.cli", "submit", "examples/torch_ddp.yaml",
                             "--runs-dir", str(runs), "entrypoint.args=[--steps,400,--seconds-per-step,0.5]"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for run_dir in runs.glob("*"):
            try:
                start = registry.read(run_dir).starts[-1]
            except (RunError, IndexError):
                continue
            if start.get("pid_start") is not None:
                return proc, run_dir, start.get("pid")
        assert proc.poll() is None, proc.stdout.read().decode()
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("the local run never recorded its job's process")


def wait_for(predicate, timeout: float = 30) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.2)
    return False


def test_cancel_of_a_live_local_run_stops_it(tmp_path, isolated_env):
    proc, run_dir, pid = start_long_run(tmp_path / "runs", isolated_env)
    try:
        out = subprocess.run([sys.executable, "-m", "launcher.cli", "cancel", run_dir.name], cwd=REPO,
                             env=isolated_env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "cancelled job" in out.stdout
        proc.wait(timeout=60)
        assert wait_for(lambda: not group_alive(pid))
        record = registry.read(run_dir)
        assert record.state == "CANCELLED"
        assert "nothing to cancel (CANCELLED)" in api.cancel(str(run_dir))
    finally:
        if proc.poll() is None:
            proc.kill()
        if group_alive(pid):
            os.killpg(pid, signal.SIGKILL)


def test_cancel_reaches_a_job_whose_glaunch_process_was_killed(tmp_path, isolated_env):
    """The job inherits the job lock, so it stays cancellable after `glaunch submit` dies."""
    proc, run_dir, pid = start_long_run(tmp_path / "runs", isolated_env)
    try:
        proc.kill()
        proc.wait()
        assert group_alive(pid)
        assert "cancelled job" in api.cancel(str(run_dir))
        assert wait_for(lambda: not group_alive(pid))
        # Nobody was left to record the end: the next command reading the record does.
        assert registry.read(run_dir).state == "RUNNING"
        assert api.status(str(run_dir))["state"] == "CANCELLED"
        assert registry.read(run_dir).starts[-1].state == "CANCELLED"
    finally:
        if group_alive(pid):
            os.killpg(pid, signal.SIGKILL)


def test_the_cancel_mark_is_on_disk_before_the_job_is_signalled(tmp_path, isolated_env, monkeypatch, bystander):
    """A job that stops at once may end, and the loop running it read the record, before a
    mark written after the signal: the run would end FAILED, not CANCELLED."""
    from launcher.schedulers import local

    run_dir = write_run(tmp_path, state="RUNNING",
                        start={"pid": bystander.pid, "pid_start": process_start_time(bystander.pid)})
    marks_at_signal = []

    def killpg(pid, sig):
        marks_at_signal.append(local.CANCEL_KEY in registry.read(run_dir).extra)

    monkeypatch.setattr(local.os, "killpg", killpg)
    lock = hold_job_lock(RunDir(run_dir))
    try:
        assert "cancelled job 1000" in api.cancel("r")
    finally:
        os.close(lock)
    assert marks_at_signal == [True]


def test_a_job_gone_before_its_signal_keeps_no_cancel_mark(tmp_path, isolated_env, monkeypatch, bystander):
    from launcher.schedulers import local

    run_dir = write_run(tmp_path, state="RUNNING",
                        start={"pid": bystander.pid, "pid_start": process_start_time(bystander.pid)})

    def killpg(pid, sig):
        raise ProcessLookupError

    monkeypatch.setattr(local.os, "killpg", killpg)
    lock = hold_job_lock(RunDir(run_dir))
    try:
        assert "has just ended" in api.cancel("r")
    finally:
        os.close(lock)
    assert local.CANCEL_KEY not in registry.read(run_dir).extra

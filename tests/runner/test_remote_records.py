"""A run kept on a cluster reached over SSH: every record read from there is checked to be
the run asked for before anything acts on it, and a damaged one never replaces the copy
here. The login node is stood in for by a 'ssh' that runs each command here, in a bash
whose start-up file prints on both streams, with Slurm's commands stubbed (they log what
they are asked)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from launcher.errors import RunError, SchedulerError
from launcher.rundir import registry
from launcher.runner import remote
from launcher.schedulers.ssh.connection import Connection
from launcher.schedulers.ssh.command import Login

NOISY_RC = """\
echo "Welcome. Ran: $BASH_EXECUTION_STRING"
echo "notice: quota 91% full" >&2
trap 'echo bye; echo bye >&2' EXIT
"""


@pytest.fixture
def cluster(tmp_path, isolated_env, monkeypatch):
    """(the folder that stands for runs_root on the cluster, the file each Slurm command run
    there is logged to: squeue says every job runs, the others answer nothing)."""
    rc, asked, fake, stubs = tmp_path / "noisy.rc", tmp_path / "slurm-asked", tmp_path / "fake-ssh", tmp_path / "stubs"
    rc.write_text(NOISY_RC)
    stubs.mkdir()
    for tool in ("scancel", "squeue", "sacct", "sbatch", "scontrol"):
        (stubs / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {asked}\n')
        (stubs / tool).chmod(0o755)
    with open(stubs / "squeue", "a") as f:         # every job asked for is running
        f.write('while [ "$1" != -j ]; do shift; done; for job in $(echo "$2" | tr , " "); do\n'
                f'  case "$*" in *%o*) cat "{tmp_path}/origins/$job" 2>/dev/null ;;\n'
                '    *%i*) echo "$job|RUNNING|None" ;; *) echo "RUNNING|None" ;; esac\ndone\n')
    fake.write_text(f'#!/bin/sh\nfor last; do :; done\nPATH={stubs}:$PATH BASH_ENV={rc} exec bash -c "$last"\n')
    fake.chmod(0o755)

    def connect(login):
        return Connection(login, state_dir=tmp_path / "ssh", runner=[str(fake)])

    monkeypatch.setattr(remote, "connect", connect)
    runs = tmp_path / "cluster"
    runs.mkdir()
    return runs, asked


def record(run_id: str, run_dir: Path, job_id: str) -> dict:
    return {"run_id": run_id, "run_dir": str(run_dir), "scheduler": "slurm", "state": "RUNNING", "job_id": job_id}


def kept_here(run_id: str, cluster_dir: Path, job_id: str) -> Path:
    """The record here of a run submitted over SSH to `cluster_dir`."""
    home = remote.records_dir() / run_id
    home.mkdir(parents=True)
    (home / "remote.json").write_text(remote.Where(Login("login1"), str(cluster_dir)).to_json())
    (home / "run.json").write_text(json.dumps(record(run_id, cluster_dir, job_id)))
    registry.register(run_id, str(home))
    return home


def on_cluster(run_dir: Path, data: dict | str) -> None:
    run_dir.mkdir()
    (run_dir / "run.json").write_text(data if isinstance(data, str) else json.dumps(data))


def test_a_record_swapped_on_the_cluster_is_refused_and_the_other_runs_job_is_never_cancelled(cluster):
    runs, asked = cluster
    home = kept_here("a-1", runs / "a-1", "101")
    before = (home / "run.json").read_text()
    # a-1's directory on the cluster now holds b-2's record (and names b-2's job).
    on_cluster(runs / "a-1", record("b-2", runs / "b-2", "202"))
    with pytest.raises(RunError) as caught:
        remote.cancel(home)
    said = str(caught.value)
    assert "a-1" in said and "b-2" in said and "\n" not in said, said
    assert not asked.exists() or "scancel" not in asked.read_text()
    assert (home / "run.json").read_text() == before


def test_a_record_edited_on_the_cluster_to_name_another_run_s_job_cancels_nothing(cluster, tmp_path):
    """a-1's own record there, its job id edited to b-2's job: Slurm says whose job 202 is
    (its script and marker), and cancel refuses it before any mark or scancel."""
    runs, asked = cluster
    home = kept_here("a-1", runs / "a-1", "101")
    on_cluster(runs / "a-1", record("a-1", runs / "a-1", "202"))
    (tmp_path / "origins").mkdir()
    (tmp_path / "origins" / "202").write_text(f"{runs}/b-2/logs/.submission_file_1.sh|glaunch:b-2\n")
    with pytest.raises(SchedulerError, match="run a-1: its record names job 202, but Slurm's record of it is not"):
        remote.cancel(home)
    assert "scancel" not in asked.read_text()
    assert not (runs / "a-1" / "cancel").exists() and not list((runs / "a-1").glob("*cancel*"))
    # Its own job, as Slurm says it: cancelled.
    (tmp_path / "origins" / "202").write_text(f"{runs}/a-1/logs/.submission_file_1.sh|glaunch:a-1\n")
    assert "cancelled job 202" in remote.cancel(home)
    assert "scancel 202" in asked.read_text()


def test_a_record_moved_from_another_directory_is_refused(cluster):
    runs, asked = cluster
    home = kept_here("a-1", runs / "a-1", "101")
    on_cluster(runs / "a-1", record("a-1", runs / "elsewhere", "101"))
    with pytest.raises(RunError, match="elsewhere"):
        remote.refreshed(home)
    assert not asked.exists()


def test_a_damaged_record_on_the_cluster_leaves_the_copy_here_as_it_was(cluster):
    runs, _ = cluster
    home = kept_here("a-1", runs / "a-1", "101")
    before = (home / "run.json").read_text()
    on_cluster(runs / "a-1", "{not json")
    with pytest.raises(RunError, match="damaged run record"):
        remote.refreshed(home)
    assert (home / "run.json").read_text() == before


def test_the_record_of_the_run_asked_for_is_read_through_a_noisy_shell(cluster):
    runs, _ = cluster
    home = kept_here("a-1", runs / "a-1", "101")
    ended = {**record("a-1", runs / "a-1", "101"), "state": "COMPLETED",
             "starts": [{"job_id": "101", "restart": 0, "state": "COMPLETED", "exit_code": 0}]}
    on_cluster(runs / "a-1", ended)
    assert remote.refreshed(home).state == "COMPLETED"
    assert json.loads((home / "run.json").read_text())["state"] == "COMPLETED"


def test_a_refresh_brings_what_status_and_the_console_read_in_one_call(cluster):
    from launcher.rundir.layout import RunDir, heartbeat_bytes
    from launcher.runner.status import summarize
    from launcher.views.console import status_line

    runs, asked = cluster
    home = kept_here("a-1", runs / "a-1", "101")
    there = runs / "a-1"
    running = {**record("a-1", there, "101"),
               "starts": [{"job_id": "101", "restart": 0, "state": "RUNNING"}]}
    on_cluster(there, running)
    (there / "heartbeats").mkdir()
    now = time.time()
    beat = {"restart": 0, "step": 120, "total": 400, "step_s": 0.5, "time": now, "state": "running"}
    (there / "heartbeats" / "rank-00000.json").write_bytes(heartbeat_bytes(beat))
    (there / "heartbeats" / "notes.json").write_text("{}")
    (there / "logs").mkdir()
    (there / "logs" / "101_0_log.out").write_text("step 1\nstep 2\n")
    (there / "logs" / "101_1_log.out").write_text("rank 1\n")

    calls = []
    real = Connection.run
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Connection, "run", lambda self, *a, **k: calls.append(a) or real(self, *a, **k))
        fresh = remote.refreshed(home)
    # One call for the files (then Slurm: squeue, sacct).
    assert sum("glaunch-files" in words for (words, *_) in calls) == 1 and len(calls) == 3, calls
    assert summarize(home, fresh)["progress"]["step"] == 120
    assert "step 120/400" in status_line(RunDir(home), fresh, now, home / "checkpoints")
    assert (home / "logs" / "101_0_log.out").read_text() == "step 1\nstep 2\n"
    assert not (home / "logs" / "101_1_log.out").exists() and not (home / "heartbeats" / "notes.json").exists()

    with open(there / "logs" / "101_0_log.out", "a") as f:
        f.write("step 3\n")
    (there / "result.json").write_text('{"loss": 0.5}')
    remote.refreshed(home)
    assert (home / "logs" / "101_0_log.out").read_text() == "step 1\nstep 2\nstep 3\n"
    assert summarize(home, registry.read(home))["result"] == {"loss": 0.5}


def test_list_shows_a_remote_run_as_its_job_recorded_it_there(cluster):
    from launcher.runner.manage import list_runs

    runs, _ = cluster
    kept_here("a-1", runs / "a-1", "101")
    kept_here("c-3", runs / "c-3", "303")
    on_cluster(runs / "a-1", {**record("a-1", runs / "a-1", "101"), "state": "RUNNING"})
    on_cluster(runs / "c-3", record("b-2", runs / "b-2", "202"))        # not c-3's: left as it was
    for home in ("a-1", "c-3"):
        with registry.updating(remote.records_dir() / home) as kept:
            kept.state = "PENDING"
    states = {row["run_id"]: row["state"] for row in list_runs()}
    assert states == {"a-1": "RUNNING", "c-3": "PENDING"}


def kept_sweep(runs: Path, sweep_id: str, jobs: list[str]) -> Path:
    """The record here of a sweep submitted over SSH, its elements' directories under its own."""
    from launcher.runner import sweeps

    home = remote.records_dir() / sweep_id
    home.mkdir(parents=True)
    (home / "remote.json").write_text(remote.Where(Login("login1"), str(runs / sweep_id)).to_json())
    elements = []
    for index, job in enumerate(jobs):
        run_id = f"{sweep_id}-{index}"
        element_home = home / run_id
        element_home.mkdir()
        (element_home / "remote.json").write_text(
            remote.Where(Login("login1"), str(runs / sweep_id / run_id)).to_json())
        (element_home / "run.json").write_text(json.dumps(record(run_id, runs / sweep_id / run_id, job)))
        elements.append(sweeps.SweepElement(index, run_id, str(element_home), {"lr": str(index)}))
    sweeps.write(home, sweeps.SweepRecord(sweep_id, "s", "far", "slurm", str(home), "exp.yaml", "2026-01-01T00:00:00",
                                          False, [], None, elements))
    registry.register(sweep_id, str(home))
    return home


def test_a_sweeps_table_has_each_elements_step_and_result_and_refuses_a_swapped_one(cluster):
    from launcher.rundir.layout import heartbeat_bytes
    from launcher.runner.manage import status

    runs, asked = cluster
    kept_sweep(runs, "sw", ["70", "71"])
    (runs / "sw").mkdir()
    running = {**record("sw-0", runs / "sw" / "sw-0", "70"), "starts": [{"job_id": "70", "restart": 0}]}
    on_cluster(runs / "sw" / "sw-0", running)
    (runs / "sw" / "sw-0" / "heartbeats").mkdir()
    beat = {"restart": 0, "step": 12, "total": 40, "step_s": 0.5, "time": time.time(), "state": "running"}
    (runs / "sw" / "sw-0" / "heartbeats" / "rank-00000.json").write_bytes(heartbeat_bytes(beat))
    on_cluster(runs / "sw" / "sw-1", {**record("sw-1", runs / "sw" / "sw-1", "71"), "state": "COMPLETED"})
    (runs / "sw" / "sw-1" / "result.json").write_text('{"final_step": 40, "final_loss": 0.25}')
    table = {row["run_id"]: row for row in status("sw")["elements"]}
    assert (table["sw-0"]["state"], table["sw-0"]["step"]) == ("RUNNING", 12), table
    assert table["sw-1"]["result"] == {"final_step": 40, "final_loss": 0.25}, table

    (runs / "sw" / "sw-1" / "run.json").write_text(json.dumps(record("sw-0", runs / "sw" / "sw-0", "70")))
    with pytest.raises(RunError, match=r"sw-0.*sw-1|sw-1.*sw-0"):
        status("sw")


def test_logs_of_a_run_whose_directory_holds_another_run_are_refused(cluster):
    runs, _ = cluster
    home = kept_here("a-1", runs / "a-1", "101")
    on_cluster(runs / "a-1", record("b-2", runs / "b-2", "202"))
    (runs / "a-1" / "logs").mkdir()
    (runs / "a-1" / "logs" / "202_0_log.out").write_text("b's secret\n")
    shown: list[str] = []
    with pytest.raises(RunError, match="b-2"):
        remote.logs(home, rank=None, follow=False, echo=shown.append, poll_s=0)
    assert shown == [] and not (home / "logs" / "202_0_log.out").exists()


def test_logs_copy_every_ranks_log_with_the_checked_record_in_one_call(cluster):
    runs, _ = cluster
    home = kept_here("a-1", runs / "a-1", "101")
    on_cluster(runs / "a-1", {**record("a-1", runs / "a-1", "101"), "starts": [{"job_id": "101", "restart": 0}]})
    (runs / "a-1" / "logs").mkdir()
    for rank in (0, 1):
        (runs / "a-1" / "logs" / f"101_{rank}_log.out").write_text(f"rank {rank} says hi\n")
    (runs / "a-1" / "logs" / "notes.txt").write_text("not a task log\n")
    calls, shown = [], []
    real = Connection.run
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Connection, "run", lambda self, *a, **k: calls.append(a) or real(self, *a, **k))
        remote.logs(home, rank=None, follow=False, echo=shown.append, poll_s=0)
    assert len(calls) == 1, calls
    assert any("rank 0 says hi" in line for line in shown) and any("rank 1 says hi" in line for line in shown)
    assert sorted(p.name for p in (home / "logs").iterdir()) == ["101_0_log.out", "101_1_log.out"]


def test_the_console_of_a_remote_run_reads_the_checkpoint_copied_here_not_the_clusters_path(cluster):
    """A resumed run's resolved values name its checkpoint directory on the cluster; the
    console (submit or resume --wait) reads `latest` from the record here, where it is copied."""
    from launcher.rundir.layout import RunDir
    from launcher.views.console import Console, status_line

    runs, _ = cluster
    there = runs / "a-1"
    home = kept_here("a-1", there, "101")
    (home / "resolved.yaml").write_text(f"derived:\n  checkpoint_dir: {there / 'checkpoints'}\n")
    (home / "checkpoints").mkdir()
    (home / "checkpoints" / "latest").write_text("step-00000100\n")
    console = Console(home, lambda text: None, live=False)
    assert console.checkpoint_dir == home / "checkpoints"
    fresh = registry.read(home)
    assert "checkpoint 100" in status_line(RunDir(home), fresh, time.time(), console.checkpoint_dir)


@pytest.mark.parametrize("login, name", [
    (None, "local"),
    (Login(host="login1"), "ssh://login1"),
    (Login(host="login1.hpc.example.org", user="alice", port=2222), "ssh://alice@login1.hpc.example.org:2222"),
])
def test_a_run_record_names_the_transport_of_its_commands(login, name):
    from launcher.resolution.jobplan import Transport
    from launcher.rundir.records import RecordError, RunRecord

    assert Transport(login).name == name
    record = RunRecord.from_dict({"run_id": "r-1", "scheduler": "slurm", "transport": name})
    assert record.transport == name and record.to_dict()["transport"] == name
    with pytest.raises(RecordError, match="transport"):
        RunRecord.from_dict({"run_id": "r-1", "transport": ["ssh://login1"]})


def test_logs_of_one_rank_under_torchrun_are_its_workers_own_as_on_the_login_node(cluster):
    """Under torchrun a node's task log holds every worker's lines; `logs --rank 1` shows rank
    1's own log (torchrun's --log-dir), copied from the cluster with the task logs in the
    same call, and only what it gained at the next poll. A name outside torchrun's layout
    there is not copied."""
    runs, _ = cluster
    home = kept_here("t-1", runs / "t-1", "101")
    on_cluster(runs / "t-1", {**record("t-1", runs / "t-1", "101"), "starts": [{"job_id": "101", "restart": 0}]})
    spec = json.loads((Path(__file__).parents[1] / "golden" / "local-slurm.torchrun.task.json").read_text())
    for folder in (runs / "t-1", home):         # submit copies task.json into the record here
        (folder / "task.json").write_text(json.dumps({**spec, "run_dir": str(runs / "t-1"), "run_id": "t-1"}))
    logs = runs / "t-1" / "logs"
    logs.mkdir()
    (logs / "101_0_log.out").write_text("[default0]: rank 0 says hi\n[default1]: rank 1 says hi\n")
    worker = logs / "workers" / "101_0_0" / "none_abc" / "attempt_0" / "1" / "stdout.log"
    worker.parent.mkdir(parents=True)
    worker.write_text("rank 1 alone\n")
    rank0 = logs / "workers" / "101_0_0" / "none_abc" / "attempt_0" / "0" / "stdout.log"
    rank0.parent.mkdir(parents=True)
    rank0.write_text("rank 0 alone\n")          # another rank's: not copied for --rank 1
    odd = logs / "workers" / "101_0_0" / "none_abc" / "attempt_0" / "1" / "notes.log"
    odd.write_text("not a worker log\n")
    calls, shown = [], []
    real = Connection.run
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Connection, "run", lambda self, *a, **k: calls.append(a) or real(self, *a, **k))
        remote.logs(home, rank=1, follow=False, echo=shown.append, poll_s=0)
    assert len(calls) == 1, calls
    assert shown == ["[r1] rank 1 alone"], shown
    copied = home / worker.relative_to(runs / "t-1")
    assert copied.read_text() == "rank 1 alone\n" and not (home / odd.relative_to(runs / "t-1")).exists()
    assert not (home / rank0.relative_to(runs / "t-1")).exists()
    with open(worker, "a") as f:
        f.write("rank 1 again\n")
    shown.clear()
    remote.logs(home, rank=1, follow=False, echo=shown.append, poll_s=0)
    assert copied.read_text() == "rank 1 alone\nrank 1 again\n"


@pytest.mark.parametrize("name, taken", [
    ("logs/workers/101_0_0/none_abc/attempt_0/1/stdout.log", True),
    ("logs/workers/101_0_0/none_abc/attempt_0/1/stderr.log", True),
    ("logs/workers/101_0_0/../attempt_0/1/stdout.log", False),
    ("logs/workers/101_0_0/none_abc/attempt_0/1/../../../../../run.json", False),
    ("logs/workers/101_0_0/none_abc/attempt_0/1/notes.log", False),
    ("logs/101_0_log.out", False),
    ("checkpoints/workers/101_0_0/x/attempt_0/1/stdout.log", False),
])
def test_only_names_in_torchrun_s_layout_are_taken_as_workers_logs(name, taken):
    assert remote._is_worker_log(name) is taken


def test_a_listing_whose_login_does_not_answer_marks_those_runs_as_last_recorded(tmp_path, isolated_env,
                                                                              monkeypatch):
    """`glaunch list` with the login node unreachable: its runs keep their states as last
    recorded here, and the listing says so (STATE?), never passing them off as current."""
    from launcher.runner import manage
    from launcher.views.listing import format_list

    down = tmp_path / "down-ssh"
    down.write_text("#!/bin/sh\necho 'ssh: connect to host login1 port 22: Connection refused' >&2\nexit 255\n")
    down.chmod(0o755)
    monkeypatch.setattr(remote, "connect",
                        lambda login: Connection(login, state_dir=tmp_path / "ssh", runner=[str(down)]))
    home = kept_here("a-1", tmp_path / "cluster" / "a-1", "101")
    (row,) = [r for r in manage.list_runs() if r.get("run_id") == "a-1"]
    assert row["state"] == "RUNNING" and row["stale"].startswith("as last recorded: login1: ")
    assert "Connection refused" in row["stale"], row
    text = format_list([row])
    assert "RUNNING?" in text and "STATE?: as last recorded: login1: " in text
    assert (home / "run.json").exists()

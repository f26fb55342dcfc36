"""The one undo of a submission over SSH (launcher.runner.cluster_undo): what a run's, a
sweep's or a resume's submission did on the cluster taken back, what a dropped link left
named and kept, and left.json read back only as far as it names the run's own things.

The cluster is a folder here: `HereConnection` runs the words a Connection would send
over SSH in a local shell (the same on_login scripts), or fails as a dropped link does;
`FakeSlurm` answers squeue and scancel from a table."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.errors import SchedulerError
from launcher.runner import cluster_undo
from launcher.runner.cluster_undo import Held, OnCluster, SetAside
from launcher.schedulers.ssh import on_login


class HereConnection:
    """A Connection whose host is this machine; `dropped`: every call fails as ssh does
    when the link is gone."""

    def __init__(self, dropped: bool = False) -> None:
        self.dropped = dropped
        self.login = type("Login", (), {"host": "login1"})()

    def run(self, words, *, input=None, timeout_s=None):
        if self.dropped:
            raise SchedulerError("ssh to login1: Connection closed by 10.0.0.1 port 22")
        return subprocess.run(list(words), input=input, capture_output=True, timeout=30)

    def where(self) -> str:
        return "login1"


class FakeSlurm:
    """squeue lists `queued` (id -> comment); scancel removes one; `dropped`: no answer."""

    def __init__(self, queued: dict[str, str] | None = None, dropped: bool = False) -> None:
        self.queued = dict(queued or {})
        self.dropped = dropped
        self.cancelled: list[str] = []

    def call(self, *cmd, **_):
        if self.dropped:
            raise SchedulerError("squeue: no answer from login1")
        if cmd[0] == "squeue":
            rows = "".join(f"{job}|{comment}|/elsewhere/job.sbatch\n" for job, comment in self.queued.items())
            return subprocess.CompletedProcess(list(cmd), 0, rows, "")
        if cmd[0] == "scancel":
            self.cancelled.append(cmd[1])
            gone = any(job.split("_")[0] == cmd[1] for job in self.queued)
            self.queued = {j: c for j, c in self.queued.items() if j.split("_")[0] != cmd[1]}
            return subprocess.CompletedProcess(list(cmd), 0 if gone else 1, "",
                                               "" if gone else "scancel: error: Invalid job id specified")
        raise AssertionError(cmd)


@pytest.fixture
def account(monkeypatch):
    monkeypatch.setattr(on_login, "account", lambda conn, **_: on_login.Account("alice", "/home/alice", None))


def tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


def test_a_whole_undo_cancels_the_jobs_finds_the_lost_one_and_removes_the_directory(tmp_path, account):
    run_dir = tmp_path / "runs" / "r1"
    (run_dir / "logs").mkdir(parents=True)
    slurm = FakeSlurm({"41": "glaunch:r1", "57_[0-3]": "glaunch:s1:array-1"})
    done = OnCluster(placed=str(run_dir), held=[Held(f"{run_dir}/job.sbatch", "glaunch:r1", "41"),
                                                Held(f"{run_dir}/a1.sbatch", "glaunch:s1:array-1", None, array=True)])
    assert cluster_undo.undo(HereConnection(), slurm, done) is None
    assert slurm.cancelled == ["41", "57"] and slurm.queued == {}
    assert not run_dir.exists()


def test_a_dropped_link_leaves_everything_named_and_a_lost_answer_as_maybe_queued(tmp_path, account):
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    done = OnCluster(placed=str(run_dir), held=[Held(f"{run_dir}/job.sbatch", "glaunch:r1", None)])
    left = cluster_undo.undo(HereConnection(dropped=True), FakeSlurm(dropped=True), done)
    assert left == done and run_dir.exists()
    said = left.said("r1", "login1")
    assert said == (f"left on login1: a held job it may have queued and the directory {run_dir} "
                    "(glaunch cancel r1 removes them once login1 answers)")


def test_a_job_that_scancel_could_not_reach_keeps_its_directory_and_names_its_id(tmp_path, account):
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    done = OnCluster(placed=str(run_dir), held=[Held(f"{run_dir}/job.sbatch", "glaunch:r1", "41")])
    left = cluster_undo.undo(HereConnection(), FakeSlurm(dropped=True), done)
    assert left == done and run_dir.exists()
    assert "held job 41 and the directory" in left.said("r1", "login1")


def test_a_resume_undone_puts_the_previous_files_and_record_back(tmp_path, account):
    run_dir = tmp_path / "run"
    (run_dir / "resumes" / "1").mkdir(parents=True)
    (run_dir / "job.sbatch").write_text("new job")
    (run_dir / "run.json").write_text("SUBMITTING")
    (run_dir / "resumes" / "1" / "job.sbatch").write_text("old job")
    (run_dir / "logs").mkdir()
    (run_dir / "logs" / "task.pkl").write_text("the resume's task")
    aside = SetAside(str(run_dir), "resumes/1", ("job.sbatch",), True, "the record before", ("logs/task.pkl",))
    slurm = FakeSlurm({"77": "glaunch:r1"})
    done = OnCluster(set_aside=aside, held=[Held(f"{run_dir}/job.sbatch", "glaunch:r1", "77")])
    assert cluster_undo.undo(HereConnection(), slurm, done) is None
    assert tree(run_dir) == {"job.sbatch": "old job", "run.json": "the record before"}
    assert slurm.cancelled == ["77"]
    left = cluster_undo.undo(HereConnection(dropped=True), FakeSlurm(dropped=True), done)
    assert left == done
    assert left.said("r1", "login1") == (f"left on login1: held job 77 and the previous files of {run_dir} set aside "
                                         f"in {run_dir}/resumes/1 (glaunch cancel r1 undoes them once login1 answers)")


def test_what_is_left_is_kept_and_read_back_whole(tmp_path):
    cluster = "/scratch/alice/runs/r1"
    left = OnCluster(placed=cluster, held=[Held(f"{cluster}/job.sbatch", "glaunch:r1", "41"),
                                           Held(f"{cluster}/a0.sbatch", "glaunch:r1:array-0", None, array=True)],
                     set_aside=SetAside(cluster, "resumes/2", ("job.sbatch", "lib"), False, '{"run_id": "r1"}',
                                        ("logs/.task.pkl",)))
    cluster_undo.write_left(tmp_path, left, forget=False)
    assert cluster_undo.read_left(tmp_path, "r1", cluster) == cluster_undo.Left(left, False)
    assert cluster_undo.read_left(tmp_path / "none", "r1", cluster) is None


CLUSTER = "/scratch/alice/runs/r1"
MARKED = Held(f"{CLUSTER}/job.sbatch", "glaunch:r1", None)

# left.json as found in a record here -> what of it is taken (a hostile or damaged file
# never names another directory to remove, another job to cancel or files outside the run).
READ_BACK = [
    ('{"job_id": "41", "run_dir": "%s", "maybe_queued": false}' % CLUSTER,
     cluster_undo.Left(OnCluster(CLUSTER, None, [Held(f"{CLUSTER}/job.sbatch", "glaunch:r1", "41")]), True)),
    ('{"job_id": "41; rm -rf ~", "run_dir": "/home/alice", "maybe_queued": true}',
     cluster_undo.Left(OnCluster(None, None, [MARKED]), True)),
    ("not json", cluster_undo.Left(OnCluster(held=[MARKED]), False)),
    ("[1, 2]", cluster_undo.Left(OnCluster(held=[MARKED]), False)),
    (json.dumps({"placed": "/home/alice", "held": [], "set_aside": None, "forget": True}),
     cluster_undo.Left(OnCluster(), True)),
    (json.dumps({"placed": CLUSTER + "/../other", "held": [], "set_aside": None, "forget": True}),
     cluster_undo.Left(OnCluster(), True)),
    (json.dumps({"placed": CLUSTER, "forget": True, "set_aside": None,
                 "held": [{"script": "/home/alice/job.sbatch", "marker": "m", "job_id": "1"},
                          {"script": f"{CLUSTER}/../x/job.sbatch", "marker": "m", "job_id": "2"},
                          {"script": f"{CLUSTER}/job.sbatch", "marker": "m", "job_id": "3 4"},
                          {"script": f"{CLUSTER}/job.sbatch", "marker": 5, "job_id": "5"},
                          "41",
                          {"script": f"{CLUSTER}/job.sbatch", "marker": "m", "job_id": "6", "array": True}]}),
     cluster_undo.Left(OnCluster(CLUSTER, None, [Held(f"{CLUSTER}/job.sbatch", "m", "6", True)]), True)),
    (json.dumps({"placed": None, "held": [], "forget": False,
                 "set_aside": {"run_dir": CLUSTER, "aside": "../../etc", "names": ["a"], "whole": True,
                               "record": "{}"}}),
     cluster_undo.Left(OnCluster(), False)),
    (json.dumps({"placed": None, "held": [], "forget": False,
                 "set_aside": {"run_dir": CLUSTER, "aside": "resumes/1", "names": ["/etc/passwd"], "whole": True,
                               "record": "{}"}}),
     cluster_undo.Left(OnCluster(), False)),
    (json.dumps({"placed": None, "held": [], "forget": False,
                 "set_aside": {"run_dir": CLUSTER, "aside": "resumes/1", "names": ["a"], "whole": True,
                               "record": "{}", "added": ["logs/../../x"]}}),
     cluster_undo.Left(OnCluster(), False)),
    (json.dumps({"placed": None, "held": [], "forget": False,
                 "set_aside": {"run_dir": "/other", "aside": "resumes/1", "names": ["a"], "whole": True,
                               "record": "{}"}}),
     cluster_undo.Left(OnCluster(), False)),
    # A submission's journal: the release it asked is taken only for a held job it names.
    (json.dumps({"placed": CLUSTER, "held": [{"script": f"{CLUSTER}/job.sbatch", "marker": "m", "job_id": "7"}],
                 "set_aside": None, "forget": True, "submitting": {"releasing": "7"}}),
     cluster_undo.Left(OnCluster(CLUSTER, None, [Held(f"{CLUSTER}/job.sbatch", "m", "7")]), True, True, "7")),
    (json.dumps({"placed": CLUSTER, "held": [{"script": f"{CLUSTER}/job.sbatch", "marker": "m", "job_id": "7"}],
                 "set_aside": None, "forget": True, "submitting": {"releasing": "8"}}),
     cluster_undo.Left(OnCluster(CLUSTER, None, [Held(f"{CLUSTER}/job.sbatch", "m", "7")]), True, True, None)),
    (json.dumps({"placed": CLUSTER, "held": [], "set_aside": None, "forget": True, "submitting": "yes"}),
     cluster_undo.Left(OnCluster(CLUSTER), True, False, None)),
]


@pytest.mark.parametrize(("text", "taken"), READ_BACK)
def test_left_json_is_taken_only_as_far_as_it_names_the_runs_own_things(tmp_path, text, taken):
    (tmp_path / cluster_undo.LEFT_FILE).write_text(text)
    assert cluster_undo.read_left(tmp_path, "r1", CLUSTER) == taken


def test_a_submission_journals_each_step_before_the_cluster_is_asked_and_its_lock_dies_with_its_process(tmp_path):
    done = OnCluster(journal=cluster_undo.Journal(tmp_path))
    done.place(CLUSTER)
    assert cluster_undo.read_left(tmp_path, "r1", CLUSTER) == cluster_undo.Left(OnCluster(CLUSTER), True, True)
    index = done.asked(f"{CLUSTER}/job.sbatch", "glaunch:r1")
    assert cluster_undo.read_left(tmp_path, "r1", CLUSTER).on_cluster.held == [MARKED]
    done.answered(index, "41")
    assert cluster_undo.read_left(tmp_path, "r1", CLUSTER).on_cluster.held[0].job_id == "41"

    assert not cluster_undo.under_way(tmp_path)          # no submission ever held it
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                               "from launcher.runner import cluster_undo\n"
                               "with cluster_undo.submitting(Path(sys.argv[1])):\n"
                               "    print('held', flush=True); time.sleep(60)", str(tmp_path)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert cluster_undo.under_way(tmp_path)
        holder.kill()                                    # killed: the system lets go of its lock
        holder.wait(timeout=30)
        assert not cluster_undo.under_way(tmp_path)
    finally:
        holder.kill()

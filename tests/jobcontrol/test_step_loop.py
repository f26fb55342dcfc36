"""The job controller's loop of job steps, without a cluster: the controller of a rendered
job.sbatch driven with a fake edge (srun, scontrol, sbatch, scancel) and the start's
beginning and end answered by the test. After a restart the next step runs on the nodes the
end names, with the next start number, rendezvous host and port; a requeue requeues and
keeps the job off the nodes named; a resubmission submits job.sbatch again after this job;
the end ends the controller with the end's status."""

from __future__ import annotations

import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from launcher.jobcontrol import controller, jobend, jobstart
from launcher.jobcontrol.controller import (Controller, JobSteps, SlurmConfig, TakenBack, after_step, master_port,
                                           parse, port_not_in_use, preemption_requeues, start_number)
from launcher.jobcontrol.jobend import NextRoad, StepEnd
from launcher.jobcontrol.jobstart import Action, Begun

GOLDEN = Path(__file__).parent.parent / "golden"
PORT = (10000, 20000, 1329)


class FakeEdge:
    """Slurm for the controller: each step records its nodes and what its ranks would read,
    and returns the next status; every other command is recorded."""

    def __init__(self, statuses: list[int], *, taken: TakenBack | None = None, requeue_ok: bool = True,
                 successor: str | None = "5000", outlive: frozenset[int] = frozenset(),
                 watch_fails: bool = False, busy_ports: frozenset[int] = frozenset(),
                 release: tuple[int, int] | None = (22, 5), preempt_mode: str = "REQUEUE",
                 preempt_type: str = "preempt/partition_prio") -> None:
        self.statuses, self.taken = list(statuses), taken
        self.release, self.preempt_mode, self.preempt_type = release, preempt_mode, preempt_type
        self.busy_ports = busy_ports   # ports a process already listens on at the rendezvous host
        self.outlive = outlive     # the steps (1, 2...) whose watchdog finds them outliving their ranks
        self.watch_fails = watch_fails
        self.ended = threading.Event()
        self.requeue_ok, self.successor = requeue_ok, successor
        self.steps: list[str] = []
        self.commands: list[str] = []
        self.signals: list[int] = []
        self.watched: list[tuple[tuple[str, ...], tuple[str, ...]]] = []

    def hostnames(self, nodelist):
        return ["n1", "n2", "n3"] if nodelist else None

    def node_addr(self, host):
        return host

    def taken_back(self, job_id, timeout_s=60):
        return self.taken

    def run_step(self, argv, env, leave=lambda: False):
        nodes = next(a.split("=", 1)[1] for a in argv if a.startswith("--nodelist="))
        self.steps.append(f"{nodes} {env['GLAUNCH_RESTART']} {env.get('MASTER_ADDR')} {env.get('MASTER_PORT')}")
        if len(self.steps) in self.outlive:     # srun waits until the watchdog's end_step
            assert self.ended.wait(10)
            self.ended.clear()
        return self.statuses.pop(0)

    def end_step(self):
        self.commands.append("step ended")
        self.ended.set()

    def signal_step(self, signum):
        self.signals.append(signum)

    def requeue(self, job_ref):
        self.commands.append(f"requeue {job_ref}")
        return self.requeue_ok

    def exclude(self, job_ref, nodes):
        self.commands.append(f"update JobId={job_ref} ExcNodeList={','.join(nodes)}")
        return True

    def submit_next(self, script, after, exclude):
        self.commands.append(f"sbatch {script.name} after {after} exclude {','.join(exclude)}")
        return self.successor

    def cancel(self, args):
        self.commands.append("scancel " + " ".join(args))
        return True

    def watch(self, run_dir, stop, allocation, in_use, end_step):
        self.watched.append((tuple(allocation), tuple(in_use)))
        if self.watch_fails:
            raise TypeError("a defect of the watchdog's")
        if len(self.watched) in self.outlive:
            end_step()

    def end_on_term(self):
        self.commands.append("SIGTERM ends")

    def ignore_term(self):
        self.commands.append("SIGTERM ignored")

    def wait_for_requeue(self):
        self.commands.append("wait")

    def config(self):
        return SlurmConfig(10.0, self.release, self.preempt_type, 5)

    def partition(self):
        self.commands.append("show partition")
        return f"PartitionName=debug\n   OverTimeLimit=NONE PreemptMode={self.preempt_mode}\n"

    def port_in_use(self, host, port):
        return port in self.busy_ports

    def serve_store(self, host, world_size):
        return None         # not this machine's rendezvous host: rank 0 starts the store


@pytest.fixture
def job_env(monkeypatch, tmp_path):
    """What env.sh exports for the controller (the job, its requeue count, its rendezvous)."""
    env = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "n[1-3]", "GLAUNCH_JOB_ID": "4242",
           "GLAUNCH_RESTART": "0", "MASTER_ADDR": "n1", "MASTER_PORT": str(master_port("4242", 0, PORT))}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def run_job(monkeypatch, tmp_path, roads: list[NextRoad], statuses: list[int], *, begun: Begun | None = None,
            requeue: bool = True, resubmit: bool = False, carried: bool = True, **edge_options):
    """The controller of a 2-node job with one spare, to its end: (exit status, edge, ends)."""
    ends: list[tuple[StepEnd, int]] = []

    def end_of_start(run_dir, end, job_id, restart):
        ends.append((end, restart))
        return roads[len(ends) - 1]

    monkeypatch.setattr(jobend, "end_of_start", end_of_start)
    monkeypatch.setattr(jobend, "record_successor", lambda *args: carried)
    monkeypatch.setattr(jobstart, "begin", lambda run_dir, job_id, requeues: begun or Begun(Action.START, requeues))
    edge = FakeEdge(statuses, **edge_options)
    job = JobSteps(tmp_path, nodes=2, srun=("srun", "--nodes=2"), task=("python", "-m", "task"), requeue=requeue,
                   resubmit=resubmit, port=PORT)
    return Controller(job, edge).run(), edge, ends


def port(start: int) -> int:
    return master_port("4242", start, PORT)


def test_a_rendezvous_port_already_listened_on_moves_to_the_next_free_one(job_env, monkeypatch, tmp_path, capsys):
    """Daemons listen on the ports derived for start 0 and start 1 (the local clusters'
    slurmctld sat inside the span): each step rendezvous on the next port that none listens
    on, and the batch log says so."""
    assert port(1) == port(0) + 1
    code, edge, _ = run_job(monkeypatch, tmp_path, [NextRoad("restart", ("n2", "n3")), NextRoad("done")], [1, 0],
                            busy_ports=frozenset({port(0), port(1)}))
    assert code == 0
    assert edge.steps == [f"n1,n2 0 n1 {port(0) + 2}", f"n2,n3 1 n2 {port(1) + 1}"]
    err = capsys.readouterr().err
    assert f"the rendezvous port {port(0)} is in use on n1: this step rendezvous on {port(0) + 2}" in err
    assert f"the rendezvous port {port(1)} is in use on n2: this step rendezvous on {port(1) + 1}" in err


@pytest.mark.parametrize("road", [NextRoad("restart", ("n2", "n3")), NextRoad("requeue")])
def test_a_job_slurm_is_ending_is_neither_restarted_nor_requeued(job_env, monkeypatch, tmp_path, road, capsys):
    """A cancel whose slurmstepd line the batch log's tail no longer holds reads as a crash,
    whose road is a restart or a requeue; Slurm is ending the job (its SIGTERM, then
    JobState=COMPLETING): no new step (it would be cut short at once), no requeue."""

    class EndedDuringStep(FakeEdge):
        def run_step(self, argv, env, leave=lambda: False):
            control[0].on_signal(signal.SIGTERM)
            return super().run_step(argv, env, leave)

    monkeypatch.setattr(jobend, "end_of_start", lambda run_dir, end, job_id, restart: road)
    monkeypatch.setattr(jobstart, "begin", lambda run_dir, job_id, requeues: Begun(Action.START, requeues))
    edge = EndedDuringStep([143], taken=TakenBack.ENDED)
    control = [Controller(JobSteps(tmp_path, nodes=2, srun=("srun",), task=("task",), requeue=True, port=PORT),
                          edge)]
    assert control[0].run() == 1
    assert len(edge.steps) == 1 and "requeue 4242" not in edge.commands
    assert f"Slurm is ending job 4242: no {road.road}" in capsys.readouterr().err


@pytest.mark.parametrize("first, busy, chosen", [
    (15000, set(), 15000),
    (15000, {15000}, 15001),
    (15000, {15000, 15001, 15002}, 15003),
    (29999, {29999}, 10000),                            # within the span: past its end is its start
    (15000, set(range(15000, 15016)), 15000),           # all PORT_TRIES taken: the derived one stands
    (15000, None, 15000),                               # another host's: not known, the derived one stands
    (9000, {9000}, 9000),                               # not a port of the span: left as it is
])
def test_the_port_after_those_in_use(first, busy, chosen):
    in_use = (lambda p: None) if busy is None else (lambda p: p in busy)
    assert port_not_in_use(first, PORT, in_use) == chosen


def test_a_port_is_in_use_where_this_host_listens_on_it_and_unknown_on_another_host():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        taken = listener.getsockname()[1]
        assert controller.SlurmEdge.port_in_use("127.0.0.1", taken) is True
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        free = closed.getsockname()[1]
    assert controller.SlurmEdge.port_in_use("127.0.0.1", free) is False
    if Path("/proc/sys/net/ipv4/ip_nonlocal_bind").read_text().strip() == "0":
        assert controller.SlurmEdge.port_in_use("192.0.2.1", free) is None  # TEST-NET-1: no address of this host
    assert controller.SlurmEdge.port_in_use("a" * 64, free) is None        # a name no resolver takes (UnicodeError)


def test_a_restart_runs_the_next_step_on_the_nodes_the_end_names(job_env, monkeypatch, tmp_path, capsys):
    code, edge, ends = run_job(monkeypatch, tmp_path, [NextRoad("restart", ("n2", "n3")), NextRoad("done")], [1, 0])
    assert code == 0
    # Training on the first two nodes of three; then on the second and the spare, as start 1,
    # whose rendezvous host and port are its own.
    assert edge.steps == [f"n1,n2 0 n1 {port(0)}", f"n2,n3 1 n2 {port(1)}"]
    assert [(e.status, e.step_nodes, e.allocation, r) for e, r in ends] == [
        (1, ("n1", "n2"), ("n1", "n2", "n3"), 0), (0, ("n2", "n3"), ("n1", "n2", "n3"), 1)]
    assert edge.commands == []
    out = capsys.readouterr().out
    # Each start's part of the batch log begins with its line (jobend.this_start): what
    # slurmstepd wrote of the start before (its requeue) is not read as this one's.
    assert out.startswith("glaunch: start 0 of job 4242 begins\n"), out
    assert "glaunch: start 1: a new step on n2,n3" in out
    # The watchdog watched each step, with the allocation to find a spare in.
    assert edge.watched == [(("n1", "n2", "n3"), ("n1", "n2")), (("n1", "n2", "n3"), ("n2", "n3"))]


def test_a_step_the_watchdog_ended_for_outliving_its_ranks_is_said_so_to_its_end_only(job_env, monkeypatch,
                                                                                      tmp_path):
    """The first step outlives its ranks (a node's slurmstepd gone): the watchdog ends it,
    and its end knows; the next step, ended by itself, is not said to be."""
    code, edge, ends = run_job(monkeypatch, tmp_path, [NextRoad("restart", ("n2", "n3")), NextRoad("done")],
                               [1, 0], outlive=frozenset({1}))
    assert code == 0 and edge.commands == ["step ended"]
    assert [(e.status, e.outlived) for e, _ in ends] == [(1, True), (0, False)]


def test_a_watchdog_that_fails_leaves_the_step_running_and_says_so(job_env, monkeypatch, tmp_path, capsys):
    from launcher.rundir import registry
    from launcher.rundir.records import RunRecord

    registry.write(tmp_path, RunRecord(run_id="r"))
    code, edge, ends = run_job(monkeypatch, tmp_path, [NextRoad("done")], [0], watch_fails=True)
    assert code == 0 and [e.status for e, _ in ends] == [0]
    err = capsys.readouterr().err
    assert "glaunch: the watchdog failed, and this start is no longer watched: TypeError: a defect" in err, err
    entry = registry.read(tmp_path).start("4242", 0).get("watchdog")
    assert entry["state"] == "off" and entry["why"].startswith("the watchdog failed (TypeError: a defect"), entry


def test_with_no_node_to_spare_the_job_requeues_without_it(job_env, monkeypatch, tmp_path):
    code, edge, _ = run_job(monkeypatch, tmp_path, [NextRoad("restart", ("n2", "n3")),
                                                    NextRoad("requeue", ("n1", "n2"))], [1, 1])
    assert code == 0 and len(edge.steps) == 2
    # The requeue's SIGTERM is ignored (by scontrol too) until the job is kept off the nodes.
    assert edge.commands == ["SIGTERM ignored", "requeue 4242", "update JobId=4242 ExcNodeList=n1,n2", "wait"]


def test_a_requeue_with_no_node_to_keep_off_ignores_no_signal(job_env, monkeypatch, tmp_path):
    code, edge, _ = run_job(monkeypatch, tmp_path, [NextRoad("requeue")], [1])
    # The requeue's SIGTERM ends the controller at once.
    assert (code, edge.commands) == (0, ["SIGTERM ends", "requeue 4242", "wait"])


def test_a_requeue_slurm_refuses_ends_the_job_with_status_1(job_env, monkeypatch, tmp_path):
    code, edge, _ = run_job(monkeypatch, tmp_path, [NextRoad("requeue", ("n1",))], [1], requeue_ok=False)
    assert code == 1 and edge.commands == ["SIGTERM ignored", "requeue 4242"]


def test_an_array_task_requeues_itself_by_its_own_id(job_env, monkeypatch, tmp_path):
    monkeypatch.setenv("GLAUNCH_JOB_ID", "4240_2")
    _, edge, _ = run_job(monkeypatch, tmp_path, [NextRoad("requeue")], [1])
    assert edge.commands == ["SIGTERM ends", "requeue 4240_2", "wait"]


def test_a_requeued_job_numbers_its_start_past_the_steps_restarted_before(job_env, monkeypatch, tmp_path):
    _, edge, ends = run_job(monkeypatch, tmp_path, [NextRoad("done")], [0], begun=Begun(Action.START, 3))
    assert edge.steps == [f"n1,n2 3 n1 {port(3)}"]
    assert ends[0][1] == 3


def test_a_start_of_a_run_that_has_ended_runs_nothing_and_exits_0(job_env, monkeypatch, tmp_path):
    code, edge, ends = run_job(monkeypatch, tmp_path, [], [], begun=Begun(Action.END))
    assert code == 0
    assert edge.steps == [] and ends == [] and edge.commands == []     # nothing requeues the job


def test_a_start_that_is_not_the_runs_runs_nothing_and_fails(job_env, monkeypatch, tmp_path):
    code, edge, ends = run_job(monkeypatch, tmp_path, [], [], begun=Begun(Action.REFUSE))
    assert code == 1
    assert edge.steps == [] and ends == [] and edge.commands == []


def test_the_time_limit_submits_the_next_job_after_this_one(job_env, monkeypatch, tmp_path, capsys):
    code, edge, _ = run_job(monkeypatch, tmp_path, [NextRoad("resubmit", ("n3",))], [0], resubmit=True)
    assert code == 0 and edge.commands == ["SIGTERM ignored", "sbatch job.sbatch after 4242 exclude n3"]
    assert "glaunch: the next start is job 5000" in capsys.readouterr().err


def test_a_successor_of_a_run_that_ended_meanwhile_is_cancelled(job_env, monkeypatch, tmp_path):
    _, edge, _ = run_job(monkeypatch, tmp_path, [NextRoad("resubmit")], [0], resubmit=True, carried=False)
    assert edge.commands == ["SIGTERM ignored", "sbatch job.sbatch after 4242 exclude ", "scancel 5000"]


def test_a_refused_resubmission_ends_the_job_with_status_1(job_env, monkeypatch, tmp_path):
    code, edge, _ = run_job(monkeypatch, tmp_path, [NextRoad("resubmit")], [0], resubmit=True, successor=None)
    assert code == 1 and len(edge.commands) == 2


def test_a_preempted_step_says_so_to_the_end_of_its_start(job_env, monkeypatch, tmp_path):
    _, edge, ends = run_job(monkeypatch, tmp_path, [NextRoad("requeue")], [143], taken=TakenBack.PREEMPTED)
    assert ends[0][0].preempted and ends[0][0].status == 143
    # Preempted, not requeued: on 22.05 the job goes back to the queue because the controller asks.
    assert edge.commands == ["SIGTERM ends", "requeue 4242", "wait"]


@pytest.mark.parametrize("release, mode, kind, requeues, requeued", [
    ((22, 5), "REQUEUE", "preempt/partition_prio", "0", True), ((23, 11), "REQUEUE", "preempt/partition_prio", "0", True),
    ((24, 11), "CANCEL", "preempt/partition_prio", "0", True), ((24, 11), "OFF", "preempt/partition_prio", "0", True),
    (None, "REQUEUE", "preempt/partition_prio", "0", True),
    ((24, 11), "REQUEUE", "preempt/qos", "0", True),            # the job's QOS may say CANCEL: not shown
    ((24, 11), "REQUEUE", "", "0", True),                       # not known
    ((24, 11), "REQUEUE", "preempt/partition_prio", "4", True),  # a 5th requeue at the script's end: held
    ((24, 11), "REQUEUE", "preempt/partition_prio", "", True),
    ((24, 5), "REQUEUE", "preempt/partition_prio", "0", False), ((24, 11), "REQUEUE", "preempt/partition_prio", "3", False),
    ((25, 11), "GANG,REQUEUE", "preempt/partition_prio", "1", False),
])
def test_a_preempted_job_is_left_to_slurm_where_slurm_requeues_it_as_the_start_ends(
        job_env, monkeypatch, tmp_path, capsys, release, mode, kind, requeues, requeued):
    """From Slurm 24.05 on, a job preempted in a partition that requeues is requeued by Slurm
    as its batch script ends; requeued by the controller too, its next start would be
    requeued once more at its end, with nothing preempting it (recorded on 24.11.5). Not
    where a QOS may decide the mode, nor where Slurm would hold the job (MaxBatchRequeue 5)."""
    monkeypatch.setenv("SLURM_RESTART_COUNT", requeues)
    code, edge, _ = run_job(monkeypatch, tmp_path, [NextRoad("requeue", ("n2",))], [143], taken=TakenBack.PREEMPTED,
                            release=release, preempt_mode=mode, preempt_type=kind)
    assert code == 0
    asked = ["show partition"] if (release and release >= (24, 5) and kind == "preempt/partition_prio"
                                   and requeues.isdigit() and int(requeues) <= 3) else []
    if requeued:
        assert edge.commands == [*asked, "SIGTERM ignored", "requeue 4242", "update JobId=4242 ExcNodeList=n2", "wait"]
    else:
        assert edge.commands == ["show partition"]
        err = capsys.readouterr().err
        assert f"job 4242 was preempted: Slurm {release[0]}.{release[1]} requeues it as this start ends" in err
        assert "the next start may run on n2 again" in err


@pytest.mark.parametrize("config, release", [
    ("Configuration data as of 2026-12-07T14:40:02\nPreemptMode             = REQUEUE\n"
     "SLURM_VERSION           = 24.11.5\nKillWait                = 10 sec\n", (24, 11)),   # recorded on 24.11
    ("SLURM_VERSION           = 22.05.8\n", (22, 5)), ("SLURM_VERSION = 25.11.0-0rc1\n", (25, 11)),
    ("", None), ("SLURM_VERSION = unknown\n", None), ("X_SLURM_VERSION = 24.11.5\n", None),
])
def test_slurm_s_release_is_read_from_its_config(config, release):
    assert SlurmConfig.parse(config).release == release


def test_the_preemption_type_and_requeue_limit_are_read_from_slurm_s_config():
    recorded = (Path(__file__).parent.parent / "recorded" / "slurm-24.11" / "scontrol.txt").read_text()
    config = SlurmConfig.parse(recorded)
    assert (config.release, config.preempt_type, config.max_batch_requeue) == ((24, 11), "preempt/partition_prio", 5)
    bare = SlurmConfig.parse("MaxBatchRequeue = lots\n")
    assert (bare.preempt_type, bare.max_batch_requeue) == ("", 5)
    other = SlurmConfig.parse("MaxBatchRequeue         = 1\nPreemptType             = preempt/qos\n")
    assert (other.preempt_type, other.max_batch_requeue) == ("preempt/qos", 1)


@pytest.mark.parametrize("partition, requeues", [
    ("   OverTimeLimit=NONE PreemptMode=REQUEUE\n", True), ("PreemptMode=GANG,REQUEUE", True),
    ("PreemptMode=CANCEL", False), ("PreemptMode=OFF", False), ("", False),      # "": not answered
    ("PreemptMode=requeue", False), ("NoPreemptMode=REQUEUE", False),
])
def test_whether_a_partition_s_preemption_requeues(partition, requeues):
    assert preemption_requeues(partition) is requeues


@pytest.mark.parametrize("taken", [TakenBack.PREEMPTED, TakenBack.REQUEUED])
def test_a_run_that_ended_in_a_start_slurm_took_back_cancels_the_job_slurm_would_start_again(
        job_env, monkeypatch, tmp_path, capsys, taken):
    """requeue.max reached (or the run done) as a preemption came: Slurm requeues the job
    (PreemptMode=REQUEUE), which would start only to find the run ended. Cancelled at once."""
    code, edge, ends = run_job(monkeypatch, tmp_path, [NextRoad("done", exit_code=1)], [143], taken=taken)
    assert code == 1 and ends[0][0].preempted
    assert edge.commands == ["scancel 4242"]
    assert "job 4242, which Slurm would start again, is cancelled" in capsys.readouterr().err


@pytest.mark.parametrize("taken", [None, TakenBack.PREEMPTED, TakenBack.REQUEUED])
def test_a_run_that_ended_well_cancels_nothing(job_env, monkeypatch, tmp_path, taken):
    """Done as a preemption came: the job ends COMPLETED (its requeued start, if any, ends
    at once), which a dependent's afterok takes as the run's success; a cancel would leave
    the dependent waiting for ever."""
    code, edge, _ = run_job(monkeypatch, tmp_path, [NextRoad("done")], [0], taken=taken)
    assert code == 0 and edge.commands == []


def test_a_job_slurm_requeued_itself_is_not_requeued_again(job_env, monkeypatch, tmp_path, capsys):
    """`scontrol requeue` by an admin (or a preemption by requeue): the job is back in the
    queue already; asking again fails ("Job is pending execution"). The nodes to keep off
    are set on the pending job; the controller ends at once."""
    code, edge, ends = run_job(monkeypatch, tmp_path, [NextRoad("requeue", ("n2",))], [143],
                               taken=TakenBack.REQUEUED)
    assert code == 0 and ends[0][0].preempted
    assert edge.commands == ["update JobId=4242 ExcNodeList=n2"]
    assert "Slurm requeued job 4242 itself" in capsys.readouterr().err


def test_a_step_the_time_limit_ended_is_a_timeout_the_controller_requeues(job_env, monkeypatch, tmp_path):
    """A script without glaunch's runtime at the limit: no stop, no preemption; the job's
    record says the limit ended it (Reason=TimeLimit), and the controller requeues it."""
    _, edge, ends = run_job(monkeypatch, tmp_path, [NextRoad("requeue")], [143], taken=TakenBack.TIMED_OUT)
    assert ends[0][0].timed_out and not ends[0][0].preempted
    assert edge.commands == ["SIGTERM ends", "requeue 4242", "wait"]


def test_a_step_a_cancel_ended_is_neither_a_timeout_nor_a_preemption(job_env, monkeypatch, tmp_path):
    """`scancel` of the job: Slurm ends it (JobState=COMPLETING, no TimeLimit, no
    PreemptTime); the start's end is the batch log's to read (the cancel), not a time limit's."""
    _, _, ends = run_job(monkeypatch, tmp_path, [NextRoad("done", exit_code=1)], [143], taken=TakenBack.ENDED)
    assert not ends[0][0].timed_out and not ends[0][0].preempted


@pytest.mark.parametrize("taken, ending, limit", [(TakenBack.TIMED_OUT, True, True), (TakenBack.ENDED, True, False),
                                                   (TakenBack.REQUEUED, True, False),
                                                   (TakenBack.PREEMPTED, False, False), (None, False, False)])
def test_the_time_limit_s_sigterm_leaves_the_step_kill_wait_less_the_reserve(tmp_path, taken, ending, limit):
    """At the limit, at a cancel and at a requeue (`scontrol requeue`: Slurm 24.11 under load
    SIGKILLed a controller still waiting for its step, and the start's end went unrecorded),
    the step is waited for KillWait less the controller's reserve (10 s: 5 s each); a
    preemption's SIGTERM (GraceTime) leaves the step its time.
    The handler only notes the SIGTERM; the step's wait asks Slurm, once."""
    edge = FakeEdge([], taken=taken)
    control = Controller(JobSteps(tmp_path, 1, ("srun",), ("task",), requeue=True), edge)
    control.slurm_config = SlurmConfig(kill_wait_s=10.0)
    assert not control.past_time_limit()
    before = time.monotonic()
    control.on_signal(signal.SIGTERM)
    assert edge.signals == [signal.SIGTERM] and control.term_at is not None
    assert not control.past_time_limit()          # within the grace, or no limit at all
    assert control.at_time_limit is limit and control.being_ended is ending and control.term_at is None
    if ending:
        assert before + 5 <= control.leave_at <= time.monotonic() + 5
        control.leave_at = time.monotonic()
        assert control.past_time_limit()


class EndedWhileRunning(FakeEdge):
    """Slurm ends the job while the step runs (SIGTERM; `taken`: its time limit, a requeue);
    with `silent_after`, Slurm then no longer answers."""

    def __init__(self, control_of, *args, taken: TakenBack, silent_after: bool = False, **kwargs):
        super().__init__(*args, taken=taken, **kwargs)
        self.control_of = control_of
        self.silent_after = silent_after

    def run_step(self, argv, env, leave=lambda: False):
        control = self.control_of()
        control.on_signal(signal.SIGTERM)
        assert not leave() and control.being_ended
        control.leave_at = time.monotonic()
        assert leave()          # the step is left before KillWait's SIGKILL, and the end recorded
        if self.silent_after:
            self.taken = None
        return super().run_step(argv, env, leave)


def run_ended_while_running(monkeypatch, tmp_path, **edge_args) -> tuple[Controller, FakeEdge, list[StepEnd]]:
    ends: list[StepEnd] = []
    monkeypatch.setattr(jobend, "end_of_start", lambda run_dir, end, job_id, restart: ends.append(end)
                        or NextRoad("requeue"))
    monkeypatch.setattr(jobstart, "begin", lambda run_dir, job_id, requeues: Begun(Action.START, requeues))
    job = JobSteps(tmp_path, nodes=2, srun=("srun",), task=("task",), requeue=True, port=PORT)
    control: list[Controller] = []
    edge = EndedWhileRunning(lambda: control[0], [143], **edge_args)
    control.append(Controller(job, edge))
    assert control[0].run() == 0
    return control[0], edge, ends


def test_a_step_left_at_the_limit_is_a_timeout_though_slurm_no_longer_answers(job_env, monkeypatch, tmp_path):
    control, edge, ends = run_ended_while_running(monkeypatch, tmp_path, taken=TakenBack.TIMED_OUT, silent_after=True)
    assert control.slurm_config.kill_wait_s == 10.0
    assert ends[0].timed_out and ends[0].status == 143 and "requeue 4242" in edge.commands


@pytest.mark.parametrize("silent_after", [False, True])
def test_a_step_left_at_a_requeue_is_recorded_and_the_job_not_requeued_again(job_env, monkeypatch, tmp_path, capsys,
                                                                             silent_after):
    """`scontrol requeue` while the step runs: SIGTERM, and the job back in the queue; what
    Slurm said at the SIGTERM stands where it no longer answers at the step's end."""
    _, edge, ends = run_ended_while_running(monkeypatch, tmp_path, taken=TakenBack.REQUEUED,
                                            silent_after=silent_after)
    assert ends[0].preempted and not ends[0].timed_out and edge.commands == []
    err = capsys.readouterr().err
    assert "Slurm requeued job 4242 itself" in err and "Slurm is ending" not in err


def test_inside_an_allocation_nothing_restarts_or_requeues(job_env, monkeypatch, tmp_path, capsys):
    code, edge, ends = run_job(monkeypatch, tmp_path, [NextRoad("requeue", ("n1",), 0)], [1], requeue=False,
                               begun=Begun(Action.START, 3))
    assert code == 0 and edge.commands == [] and len(edge.steps) == 1
    # No allocation for the end (no restart in it), no renumbering, no spare for the watchdog.
    assert ends[0][0].allocation == () and ends[0][1] == 0 and edge.watched == [((), ("n1", "n2"))]
    assert "glaunch: this start ended: requeue n1" in capsys.readouterr().out


def test_the_end_s_status_is_the_job_s(job_env, monkeypatch, tmp_path):
    code, _, _ = run_job(monkeypatch, tmp_path, [NextRoad("done", (), 3)], [3])
    assert code == 3


def test_signals_to_the_controller_reach_the_step(tmp_path):
    edge = FakeEdge([])
    control = Controller(JobSteps(tmp_path, 1, ("srun",), ("task",), requeue=True), edge)
    control.on_signal(signal.SIGTERM)
    control.on_signal(signal.SIGUSR2)
    assert edge.signals == [signal.SIGTERM, signal.SIGUSR2]


def test_an_ignored_sigterm_is_ignored_by_the_commands_run_after_it(tmp_path):
    """Slurm sends a requeue's SIGTERM to every process of the job: scontrol update, run
    after the requeue, must outlive it, as under bash's `trap '' TERM`."""
    code = ("import os, signal, subprocess, sys\n"
            "from launcher.jobcontrol.controller import SlurmEdge\n"
            "SlurmEdge().ignore_term()\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import os, signal, time; "
            "os.kill(os.getpid(), signal.SIGTERM); time.sleep(0.2); print(\"outlived\")'])\n"
            "sys.exit(child.wait())\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == "outlived", proc.stderr


# --- the decisions, as tables -------------------------------------------------------------------

BATCH = JobSteps(Path("/r"), 2, ("srun",), ("task",), requeue=True)
RESUBMITTING = JobSteps(Path("/r"), 2, ("srun",), ("task",), requeue=True, resubmit=True)
IN_ALLOCATION = JobSteps(Path("/r"), 2, ("srun",), ("task",))


@pytest.mark.parametrize("road, job, action", [
    (NextRoad("restart", ("n2", "n3")), BATCH, "restart"),
    (NextRoad("restart", ()), BATCH, "end"),                                 # no nodes to run on
    (NextRoad("restart", ("$(touch PWNED)",)), BATCH, "end"),                # no node's name
    (NextRoad("requeue"), BATCH, "requeue"),
    (NextRoad("requeue", ("n1",)), RESUBMITTING, "requeue"),
    (NextRoad("resubmit", ("n1",)), RESUBMITTING, "resubmit"),
    (NextRoad("resubmit"), BATCH, "end"),                                    # no script to resubmit
    (NextRoad("done"), RESUBMITTING, "end"),
    (NextRoad("restart", ("n2",)), IN_ALLOCATION, "end"),                    # never inside an allocation
    (NextRoad("requeue"), IN_ALLOCATION, "end"),
    (NextRoad("resubmit"), IN_ALLOCATION, "end"),
])
def test_what_follows_a_step(road, job, action):
    assert after_step(road, job) == action


@pytest.mark.parametrize("begun, requeues, requeue, number", [
    (Begun(Action.START, 3), 1, True, 3),       # past the steps restarted in earlier allocations
    (Begun(Action.START, 1), 1, True, 1),
    (Begun(Action.START, 3), 0, False, 0),      # inside an allocation: Slurm's count as it is
])
def test_a_start_s_number(begun, requeues, requeue, number):
    assert start_number(begun, requeues, requeue=requeue) == number


def test_the_port_is_env_sh_s_for_each_start():
    assert master_port("4242", 0, PORT) == 10000 + 4242 * 1329 % 20000
    assert master_port("4242", 1, PORT) == 10000 + (4242 * 1329 + 1) % 20000
    assert master_port("12_3", 0, PORT) == 10000 + 123 * 1329 % 20000    # only the digits count
    assert master_port("9" * 18, 3, PORT) == 10000 + (int("9" * 18) * 1329 + 3) % 20000
    assert all(10000 <= master_port(str(job), 0, PORT) < 30000 for job in range(19990, 20010))


def test_a_job_s_later_starts_never_take_a_neighbouring_job_s_port():
    # With a stride of 1, job N's second start rendezvoused on job N+1's first start's port:
    # two jobs on one host (a shared node, or the local clusters' nodes) then collided.
    for job in (1, 6316, 19999, 500000, 123456789):
        mine = {master_port(str(job), start, PORT) for start in range(64)}
        assert len(mine) == 64
        for near in range(job - 300, job + 301):
            if near != job and near > 0:
                assert mine.isdisjoint(master_port(str(near), start, PORT) for start in range(64)), (job, near)


# --- job.sbatch's command line --------------------------------------------------------------------

# The step's words as job.sbatch ran srun before the controller (its --nodelist the batch
# script's choice): the controller runs the same.
SRUN_BEFORE = ("srun --unbuffered --output={d}/logs/%j_%t_log.out --error={d}/logs/%j_%t_log.err --open-mode=append "
               "--kill-on-bad-exit=1 --nodes=2 --ntasks-per-node=2 --ntasks=4 --cpus-per-task=2 --nodelist=n1,n2 "
               "/usr/bin/python3 -u -m submitit.core._submit {d}/logs")


def controller_words(name: str) -> list[str]:
    text = (GOLDEN / name).read_text()
    line = text[text.index("exec "):].replace("\\\n", " ")
    words = shlex.split(line)
    return words[words.index("launcher.jobcontrol.controller") + 1:]


def test_job_sbatch_runs_the_same_step_through_the_controller():
    job = parse(controller_words("local-slurm.srun.job.sbatch"))
    run_dir = "/home/alice/exp/runs/torch-ddp-20260101-000000-abcd"
    assert job.command(["n1", "n2"]) == SRUN_BEFORE.format(d=run_dir).split()
    assert (job.run_dir, job.nodes, job.requeue, job.resubmit, job.port) == (Path(run_dir), 2, True, True, PORT)


@pytest.mark.parametrize("argv", [
    [], ["/r"], ["/r", "--", "srun"], ["/r", "--", "--", "task"], ["--nodes", "2", "--", "s", "--", "t"],
    ["/r", "--nodes", "0", "--", "s", "--", "t"], ["/r", "--nodes", "x", "--", "s", "--", "t"],
    ["/r", "--master-port", "10000", "--", "s", "--", "t"],
    ["/r", "--master-port", "10000,20000", "--", "s", "--", "t"], ["/r", "--master-port", "1,2,3,4", "--", "s", "--", "t"],
    ["/r", "--bogus", "--", "s", "--", "t"],
])
def test_a_command_line_that_is_not_job_sbatch_s_is_refused(argv, capsys):
    assert controller.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("glaunch: job controller: ") and err.count("\n") == 1


# --- Slurm's commands, with stand-ins on PATH ------------------------------------------------------


@pytest.fixture
def stand_ins(tmp_path, monkeypatch):
    """Write a stand-in for a command: its body runs under bash, with its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")

    def write(name: str, body: str) -> None:
        (bin_dir / name).write_text("#!/bin/bash\n" + body)
        (bin_dir / name).chmod(0o755)
    return write


def test_the_allocation_s_nodes_are_node_names_or_nothing(stand_ins):
    stand_ins("scontrol", 'printf "n1\\nn2\\n"\n')
    assert controller.SlurmEdge().hostnames("n[1-2]") == ["n1", "n2"]
    stand_ins("scontrol", "printf '%s\\n' n1 '$(touch x)' -n2\n")
    assert controller.SlurmEdge().hostnames("n[1-2]") is None
    stand_ins("scontrol", "exit 1\n")
    assert controller.SlurmEdge().hostnames("n[1-2]") is None


@pytest.mark.parametrize("shown, taken", [
    ("JobId=7 JobState=RUNNING PreemptEligibleTime=2026-12-05T10:00:00 PreemptTime=None", None),
    ("JobId=7 JobState=RUNNING PreemptTime=2026-12-05T10:00:00 SuspendTime=None", TakenBack.PREEMPTED),
    ("JobId=7 JobState=COMPLETING Restarts=1 PreemptTime=None", TakenBack.REQUEUED),
    ("", None),
])
def test_a_preemption_is_read_from_slurm_s_record_of_the_job(stand_ins, shown, taken):
    stand_ins("scontrol", f'printf "%s\\n" "{shown}"\n')
    assert controller.SlurmEdge().taken_back("7") is taken


def test_the_next_job_is_submitted_without_this_job_s_slurm_variables(stand_ins, tmp_path, monkeypatch):
    seen = tmp_path / "seen"
    stand_ins("sbatch", f'printf "%s\\n" "$*" "${{SLURM_JOB_ID:-unset}}" "${{SLURM_CONF:-unset}}" '
                        f'"${{SBATCH_TIMELIMIT:-unset}}" > {seen}\necho "5001;cluster"\n')
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_CONF", "/etc/slurm/x.conf")
    monkeypatch.setenv("SBATCH_TIMELIMIT", "5")
    assert controller.SlurmEdge().submit_next(tmp_path / "job.sbatch", "4242", ["n1", "n3"]) == "5001"
    assert seen.read_text().splitlines() == [
        f"--parsable --dependency=afterany:4242 --exclude=n1,n3 {tmp_path / 'job.sbatch'}", "unset",
        "/etc/slurm/x.conf", "unset"]
    stand_ins("sbatch", 'echo "Submitted batch job 5001"\n')
    assert controller.SlurmEdge().submit_next(tmp_path / "job.sbatch", "4242", []) is None


@pytest.mark.parametrize("kill_wait, grace", [(10, 5), (30, 20), (120, 110), (1, 0.5), (0, 0)])
def test_the_step_s_grace_at_the_limit(kill_wait, grace):
    assert controller.step_grace_s(kill_wait) == grace


@pytest.mark.parametrize("config, kill_wait", [
    ("Configuration data as of 2026-12-06T09:50:20\nJobAcctGatherType       = (null)\n"
     "KillWait                = 10 sec\nKillOnBadExit           = 0\n", 10),     # recorded on 22.05
    ("KillOnBadExit = 0\nKillWait = 120 sec\n", 120),
    ("", 30), ("KillWait = unlimited\n", 30), ("XKillWait = 5 sec\n", 30),
])
def test_kill_wait_is_read_from_slurm_s_config(config, kill_wait):
    assert controller.kill_wait_s(config) == kill_wait


def test_a_step_left_ends_the_wait_with_sigterm_s_status():
    edge = controller.SlurmEdge()
    began = time.monotonic()
    leave = lambda: time.monotonic() > began + 0.5    # noqa: E731
    assert edge.run_step(["sleep", "3"], {"PATH": "/usr/bin:/bin"}, leave) == 128 + signal.SIGTERM
    assert time.monotonic() - began < 2.5
    assert edge.run_step(["bash", "-c", "exit 4"], {"PATH": "/usr/bin:/bin"}, lambda: False) == 4


def test_a_step_ended_by_a_signal_has_a_shell_s_status(stand_ins):
    assert controller.SlurmEdge().run_step(["bash", "-c", "kill -KILL $$"], {"PATH": "/usr/bin:/bin"}) == 128 + 9
    assert controller.SlurmEdge().run_step(["bash", "-c", "exit 3"], {"PATH": "/usr/bin:/bin"}) == 3
    assert controller.SlurmEdge().run_step(["/no/such/srun"], {}) == 127

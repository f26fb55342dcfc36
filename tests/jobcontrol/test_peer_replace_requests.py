"""The job controller's part in peer recovery of a lost rank's process (recovery.peer): a
request the ranks wrote into the run directory starts, once, a step of one task on the lost
rank's node in that rank's place (launcher.jobcontrol.replace), rank 0's too; a request of
another start, or not as the ranks write it starts nothing; the step's status is 0 where only
the tasks started again failed and their new processes ended well; job.sbatch's step keeps
the survivors running (--kill-on-bad-exit=0) only for such a run."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import threading

import pytest

from launcher.jobcontrol import jobend, replace
from launcher.runtime import peer
from launcher.jobcontrol.controller import Controller, JobSteps, SlurmEdge
from launcher.jobcontrol.replace import Replacement, Replacements, failed_tasks, replacement_for, step_status
from launcher.rundir.layout import RunDir
from launcher.rundir.records import State
from launcher.schedulers.slurm.script import srun_words
from test_golden import plan_case
from test_step_loop import FakeEdge, controller_words, job_env  # noqa: F401
from launcher.jobcontrol.controller import parse

NODES = ("n1", "n2")
REQUEST = {"job_id": "4242", "restart": 0, "generation": 1, "rank": 3, "node": "n2", "pid": 777}


def wanted(request, **where):
    return replacement_for(request, **{"job_id": "4242", "restart": 0, "world_size": 4, "ranks_per_node": 2,
                                       "step_nodes": NODES, **where})


def test_a_request_of_this_start_names_the_lost_rank_s_place_and_node():
    assert wanted(REQUEST) == Replacement(rank=3, generation=1, node="n2", node_index=1, local_rank=1, lost_pid=777)
    # A node its heartbeat did not give, or not one of the step's: the rank's under srun's blocks.
    assert wanted({**REQUEST, "node": None, "rank": 2}).node == "n2"
    assert wanted({**REQUEST, "node": "n9", "rank": 1, "pid": "x"}) == Replacement(1, 1, "n1", 0, 1, None)
    # Rank 0 too: the rendezvous store is not in its process (launcher.runtime.peerstore).
    assert wanted({**REQUEST, "node": "n1", "rank": 0}) == Replacement(0, 1, "n1", 0, 0, 777)


@pytest.mark.parametrize("change", [
    {"job_id": "4243"}, {"restart": 1}, {"restart": "0"}, {"rank": 4}, {"rank": -1}, {"rank": "3"},
    {"rank": True}, {"generation": 0}, {"generation": None},
])
def test_a_request_of_another_start_or_not_the_ranks_starts_nothing(change):
    assert wanted({**REQUEST, **change}) is None


def test_the_new_step_runs_the_same_task_in_the_lost_rank_s_place_and_log():
    job = parse(controller_words("local-slurm.srun.job.sbatch"))
    new = wanted(REQUEST)
    words = replace.replacement_words(job.srun, job.task, new, 4)
    logs = "/home/alice/exp/runs/torch-ddp-20260101-000000-abcd/logs"
    # --mem=0: the job's memory on the node, which the running step holds where Slurm counts it;
    # --immediate: a step Slurm cannot create now is refused, not left waiting.
    assert words[:7] == ["srun", "--overlap", "--nodes=1", "--ntasks=1", "--nodelist=n2", "--mem=0",
                         f"--immediate={replace.STEP_CREATE_WAIT_S}"]
    assert replace.STEP_CREATE_WAIT_S < peer.REPORT_WAIT_S / 2
    assert f"--output={logs}/%j_3_log.out" in words and f"--error={logs}/%j_3_log.err" in words
    assert not [w for w in words if w.startswith(("--ntasks-per-node", "--kill-on-bad-exit", "--nodes=2"))]
    assert "--cpus-per-task=2" in words and "--open-mode=append" in words
    at = words.index("env")
    assert words[at + 1:at + 7] == ["SLURM_PROCID=3", "SLURM_NTASKS=4", "SLURM_LOCALID=1", "SLURM_NODEID=1",
                                    "GLAUNCH_PEER_JOIN=1", "GLAUNCH_PEER_LOST_PID=777"]
    assert tuple(words[at + 7:]) == job.task


def write_request(run_dir, request):
    path = RunDir(run_dir).peer_replace_request(request["job_id"], request["restart"], request["generation"],
                                                request["rank"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(request))


class Proc:
    def __init__(self, code):
        self.code = code

    def poll(self):
        return self.code

    def wait(self, timeout=None):
        return self.code


def serve_once(replacements, run_dir, **more):
    replacements.serve_once(run_dir, job_id="4242", restart=0, world_size=4, ranks_per_node=2, step_nodes=NODES,
                            srun=("srun", "--nodes=2"), task=("python", "-m", "task"), **more)


def test_each_request_starts_one_process_once_and_no_more_than_the_bound(tmp_path):
    started: list[list[str]] = []
    replacements = Replacements(lambda words, log: started.append(words) or Proc(0))
    write_request(tmp_path, REQUEST)
    write_request(tmp_path, {**REQUEST, "restart": 1})             # another start's: left alone
    serve_once(replacements, tmp_path)
    serve_once(replacements, tmp_path)                             # served already
    assert len(started) == 1 and "--nodelist=n2" in started[0] and replacements.statuses() == {3: 0}
    assert replacements.not_started() is None
    for generation in range(2, 2 + replace.MAX_REPLACEMENTS):     # lost again and again, one at a time
        write_request(tmp_path, {**REQUEST, "generation": generation})
        serve_once(replacements, tmp_path)
    assert len(started) == replace.MAX_REPLACEMENTS
    # Past the bound its peers would wait for it in vain: the step ends at once, saying why.
    assert replacements.not_started() == (3, "n2", replace.CAPPED)


def test_a_request_for_a_rank_whose_process_still_runs_waits_and_only_the_newest_is_served(tmp_path):
    """A peer asks for rank 3 while its report is only late (srun says nothing of its task):
    nothing starts; once its task has ended, the newest request for it starts one process."""
    started: list[list[str]] = []
    replacements = Replacements(lambda words, log: started.append(words) or Proc(None))
    write_request(tmp_path, {**REQUEST, "generation": 1})
    write_request(tmp_path, {**REQUEST, "generation": 2})
    serve_once(replacements, tmp_path, failed=set(), check_ended=True)
    serve_once(replacements, tmp_path, failed={1}, check_ended=True)        # another task ended
    assert started == [] and replacements.asked == {3}
    serve_once(replacements, tmp_path, failed={3}, check_ended=True)
    assert len(started) == 1 and "GLAUNCH_PEER_JOIN=2" in started[0]
    # Its new process runs: a new request for it waits again; the stale one is never served.
    write_request(tmp_path, {**REQUEST, "generation": 3})
    serve_once(replacements, tmp_path, failed={3}, check_ended=True)
    assert len(started) == 1


BATCH = """glaunch: start 0 ...
srun: error: n1: task 1: Killed
glaunch: start 1: a new step on n1,n2
srun: error: n2: task 3: Exited with exit code 3
"""


def test_the_step_s_status_is_0_only_where_every_failed_task_was_started_again_and_ended_well():
    assert failed_tasks(BATCH) == {3}                              # this start's lines only
    assert failed_tasks("srun: error: n2: tasks 1-2,3: Killed\n") == {1, 2, 3}
    assert step_status(3, {3}, {3: 0}) == 0
    assert step_status(3, {3}, {3: 1}) == 3 and step_status(3, {3}, {3: None}) == 3
    assert step_status(3, {2, 3}, {3: 0}) == 3 and step_status(3, set(), {3: 0}) == 3
    assert step_status(3, None, {3: 0}) == 3 and step_status(0, {3}, {}) == 0


class PeerEdge(FakeEdge):
    def __init__(self, statuses, answer):
        super().__init__(statuses)
        self.answer, self.asked = answer, []

    def replace(self, job, stop, nodes, env, spares):
        stop.wait(5)
        self.asked.append(tuple(nodes))
        return self.answer


@pytest.mark.parametrize("peer,answer,status", [("1", 0, 0), ("1", -1, 3), (None, 0, 3)])
def test_with_recovery_peer_the_step_s_status_is_the_replacements_answer(job_env, tmp_path, peer,  # noqa: F811
                                                                        answer, status):
    edge = PeerEdge([3], answer)
    env = dict(job_env, **({"GLAUNCH_RECOVERY_PEER": peer} if peer else {}))
    job = JobSteps(tmp_path, nodes=2, srun=("srun",), task=("task",))
    assert Controller(job, edge, env).step(NODES, ("n1", "n2", "n3")) == status
    assert edge.asked == ([NODES] if peer else [])
    assert not [t for t in threading.enumerate() if t.name == "glaunch-peer-replace"]


class StoreEdge(PeerEdge):
    """Serves the step's store here (a stand-in process); records what the ranks and the
    lost ranks' new processes read."""

    def __init__(self, statuses, answer):
        super().__init__(statuses, answer)
        self.served: list[tuple[str, int]] = []
        self.stores: list[subprocess.Popen] = []
        self.seen: list[str | None] = []

    def serve_store(self, host, world_size):
        self.served.append((host, world_size))
        self.stores.append(subprocess.Popen(["sleep", "60"]))
        return self.stores[-1], 4321

    def run_step(self, argv, env, leave=lambda: False):
        self.seen.append(env.get("GLAUNCH_PEER_STORE"))
        return super().run_step(argv, env, leave)

    def replace(self, job, stop, nodes, env, spares):
        self.seen.append(env.get("GLAUNCH_PEER_STORE"))
        return super().replace(job, stop, nodes, env, spares)


@pytest.mark.parametrize("launcher,per_node,served", [("srun", "1", True), ("srun", "2", True),
                                                      ("torchrun", "2", False), ("srun", "", False)])
def test_the_controller_serves_the_step_s_store_which_outlives_any_rank_and_ends_with_the_step(
        job_env, tmp_path, launcher, per_node, served):  # noqa: F811
    """Under recovery.peer with one task per rank, the step's store is served beside the
    step (outside it: a node whose only task ended loses every process the step started
    there, rank 0's own store too); the ranks and a lost rank's new process read where, and
    it ends with the step. Under torchrun (its agent's store) or without the ranks per node,
    rank 0 starts it as before."""
    edge = StoreEdge([0], 0)
    env = dict(job_env, GLAUNCH_RECOVERY_PEER="1", GLAUNCH_LAUNCHER=launcher, GLAUNCH_RANKS_PER_NODE=per_node)
    controller = Controller(JobSteps(tmp_path, nodes=2, srun=("srun",), task=("task",)), edge, env)
    assert controller.step(NODES, ("n1", "n2", "n3")) == 0
    if not served:
        assert edge.served == [] and edge.seen == [None, None]
        return
    assert edge.served == [("n1", 2 * int(per_node))]
    assert edge.seen == ["n1:4321", "n1:4321"]
    (store,) = edge.stores
    assert store.poll() is not None            # ended with the step
    assert "GLAUNCH_PEER_STORE" not in controller.env


def test_the_store_is_served_only_where_the_rendezvous_host_is_this_machine():
    assert SlurmEdge.serve_store("", 2) is None
    assert SlurmEdge.serve_store("192.0.2.1", 2) is None         # TEST-NET: no address of this machine


def test_only_a_run_with_recovery_peer_and_one_task_per_rank_keeps_its_ranks_running_when_one_ends():
    plan = plan_case("local-slurm", "srun")
    assert "--kill-on-bad-exit=1" in srun_words(plan)
    peer = dataclasses.replace(plan, recovery=dataclasses.replace(plan.recovery, peer=True))
    assert "--kill-on-bad-exit=0" in srun_words(peer)
    torchrun = dataclasses.replace(plan_case("local-slurm", "torchrun"), recovery=peer.recovery)
    assert "--kill-on-bad-exit=1" in srun_words(torchrun)


def test_a_lost_task_no_rank_asks_for_ends_the_step_once_the_bound_has_passed():
    seen: dict[int, float] = {}
    # Rank 3 lost inside the step loop: its peers ask for it; rank 1 lost where no peer is
    # in a recovery (before the loop): nobody asks.
    assert replace.unasked_losses({1, 3}, {3}, seen, now=100.0) == set()
    assert replace.unasked_losses({1, 3}, {3}, seen, now=100.0 + replace.UNASKED_LOSS_S - 1) == set()
    assert replace.unasked_losses({1, 3}, {3}, seen, now=100.0 + replace.UNASKED_LOSS_S) == {1}
    late: dict[int, float] = {}
    replace.unasked_losses({2}, set(), late, now=0.0)
    assert replace.unasked_losses({2}, {2}, late, now=1000.0) == set()     # asked for after all
    assert replace.unasked_losses(None, set(), {}, now=1000.0) == set()    # srun's words not read: no loss


def test_serving_ends_the_step_once_for_a_loss_nobody_asks_for(tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.setattr(replace, "UNASKED_LOSS_S", 0.0)
    monkeypatch.setattr(replace, "POLL_S", 0.01)
    monkeypatch.setattr(replace, "LOG_POLL_S", 0.0)
    spec = type("Spec", (), {"launcher": "srun", "world_size": 4, "ranks_per_node": 2})()
    monkeypatch.setattr("launcher.rundir.taskspec.read_task_spec", lambda path: spec)
    ended: list[int] = []
    polls = iter(range(5))
    replace.serve(run_dir, Replacements(lambda words, log: None), stop=lambda: next(polls, None) is None,
                  job_id="4242", restart=1, step_nodes=NODES, srun=("srun",), task=("python",),
                  batch_log=lambda: BATCH, end_step=lambda: ended.append(1))
    assert ended == [1]


def test_a_rank_lost_again_on_the_node_it_was_started_again_on_moves_to_a_spare(tmp_path):
    started: list[list[str]] = []
    replacements = Replacements(lambda words, log: started.append(words) or Proc(1), spares=("n3", "n4"))
    write_request(tmp_path, REQUEST)
    serve_once(replacements, tmp_path)
    write_request(tmp_path, {**REQUEST, "generation": 2})          # lost again on n2
    serve_once(replacements, tmp_path)
    write_request(tmp_path, {**REQUEST, "generation": 3, "node": "n3"})   # and again, on the spare
    serve_once(replacements, tmp_path)
    assert [next(w for w in words if w.startswith("--nodelist=")) for words in started] == \
        ["--nodelist=n2", "--nodelist=n3", "--nodelist=n4"]
    new = wanted(REQUEST)
    assert replace.node_for(new, [], ("n3",)) == new                          # lost once: its own node
    assert replace.node_for(new, ["n2"], ()) == new                           # no spare: its own node again
    assert replace.node_for(new, ["n2", "n3"], ("n3",)) == new                # every spare tried already


def test_the_local_step_serves_requests_as_slurm_s_does_newest_per_rank_once_its_task_ended(tmp_path, monkeypatch):
    """The local site's stand-in for srun chooses the same requests (replace.Requests): a
    stale one for a rank never starts a second process beside the newest's."""
    from launcher.localrun.jobstep import PeerReplacement

    steps = PeerReplacement(str(tmp_path), "4242", 0, 4)
    write_request(tmp_path, {**REQUEST, "generation": 1})
    write_request(tmp_path, {**REQUEST, "generation": 2})
    assert steps.serve([1], now=0.0) == []                          # rank 3 still runs: its requests wait
    assert steps.serve([3], now=1.0) == [(3, {"GLAUNCH_PEER_JOIN": "2", "GLAUNCH_PEER_LOST_PID": "777"})]
    assert steps.serve([3], now=2.0) == [] and steps.started == {3: 1}
    write_request(tmp_path, {**REQUEST, "generation": 3, "pid": None})
    assert steps.serve([3], now=3.0) == [(3, {"GLAUNCH_PEER_JOIN": "3"})]
    assert steps.capped is None
    for generation in range(4, 4 + replace.MAX_REPLACEMENTS - 2):  # lost again up to the bound
        write_request(tmp_path, {**REQUEST, "generation": generation, "pid": None})
        assert steps.serve([3], now=float(generation))
    # Past it the step ends (its first bad task is the one not started again), and why is kept.
    write_request(tmp_path, {**REQUEST, "generation": 9, "pid": None})
    assert steps.serve([3], now=9.0) == [] and steps.capped == 3
    note = json.loads(RunDir(tmp_path).peer_not_started_file.read_text())
    assert note == {"job_id": "4242", "restart": 0, "rank": 3, "node": "localhost", "error": replace.CAPPED}


# srun's own lines, as Slurm 22.05 wrote them for a step of one task inside a running job
# (`srun --overlap --nodes=1 --ntasks=1 --nodelist=... --mem=0`), recorded on the local cluster.
NOT_IN_JOB = "srun: error: Unable to create step for job 3687: Requested node configuration is not available\n"
GRES = ("srun: error: Step requested GRES but job doesn't have GRES\n"
        "srun: error: Unable to create step for job 3687: Invalid generic resource (gres) specification\n")
CPUS = "srun: error: Unable to create step for job 3687: More processors requested than permitted\n"
# --immediate's end of a step the node had no room for (another step holding its CPUs).
BUSY = "srun: error: Unable to create step for job 4693: Requested nodes are busy\n"
EXECVE = ("srun: error: node2: task 0: Exited with exit code 2\n"
          "slurmstepd-node2: error: execve(): /nonexistent/binary: No such file or directory\n")
TASK_FAILED = "srun: error: node2: task 0: Exited with exit code 3\n"


@pytest.mark.parametrize("output, why", [
    (NOT_IN_JOB, NOT_IN_JOB.strip()),
    (GRES, GRES.splitlines()[1]),                   # the refusal, not the line before it
    (CPUS, CPUS.strip()),
    (BUSY, BUSY.strip()),
    (EXECVE, EXECVE.splitlines()[1]),               # the task never ran: slurmstepd says why
    (TASK_FAILED, None),                            # the new process ran, and failed: its peers see it
    ("slurmstepd-node2: error: Detected 1 oom_kill event in StepId=3687.7. Some of the step tasks have been "
     "OOM Killed.\nsrun: error: node2: task 0: Out Of Memory\n", None),
    ("", None),
    ("srun: error: Unable to create step for job 1: \x1b]0;x\x07 reason\n", "srun: error: Unable to create step "
                                                                           "for job 1: ?]0;x? reason"),
])
def test_why_srun_did_not_start_a_new_process_is_read_from_its_own_lines(output, why):
    assert replace.not_started(output) == why


def own_log(run_dir):
    return lambda rank, n: run_dir / "logs" / f"4242_0_peer-replace_{rank}_{n}.log"


def test_each_new_process_is_judged_by_its_own_srun_s_lines(tmp_path):
    """Rank 1's new process ran and failed (its peers see that); rank 2's srun was refused
    after it. The refusal is rank 2's, never rank 1's: each srun writes its own log."""
    (tmp_path / "logs").mkdir()
    outputs = {1: (TASK_FAILED, 1), 2: (NOT_IN_JOB, 1)}

    def start(words, log):
        rank = int(next(w for w in words if w.startswith("SLURM_PROCID=")).split("=")[1])
        log.write_text(outputs[rank][0])
        return Proc(outputs[rank][1])

    replacements = Replacements(start, logs=own_log(tmp_path))
    for rank in (1, 2):
        write_request(tmp_path, {**REQUEST, "rank": rank, "node": "n1"})
        serve_once(replacements, tmp_path)
    assert replacements.not_started() == (2, "n1", NOT_IN_JOB.strip())
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["4242_0_peer-replace_1_1.log",
                                                                     "4242_0_peer-replace_2_1.log"]


@pytest.mark.parametrize("output, status, ends", [
    (NOT_IN_JOB, 1, True), (EXECVE, 2, True), (TASK_FAILED, 3, False), (NOT_IN_JOB, 0, False),
    (NOT_IN_JOB, None, False),
])
def test_a_new_process_srun_could_not_start_ends_the_step_at_once_and_the_start_s_end_says_why(
        tmp_path, monkeypatch, output, status, ends):
    """Rank 3 is lost; its peers ask for it; the new step's srun fails before its task runs
    (Slurm refused the step, or the task could not exec): its peers would wait for it to the
    watchdog's bound and the start end as a hang. The step ends at once, and the start's end
    (a crash) names srun's line. A new process that ran and failed, or runs on, ends nothing."""
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    write_request(run_dir, REQUEST)
    monkeypatch.setattr(replace, "POLL_S", 0.01)
    spec = type("Spec", (), {"launcher": "srun", "world_size": 4, "ranks_per_node": 2})()
    monkeypatch.setattr("launcher.rundir.taskspec.read_task_spec", lambda path: spec)

    def start(words, log):
        log.write_text(output)
        return Proc(status)

    ended: list[int] = []
    polls = iter(range(20))
    replace.serve(run_dir, Replacements(start, logs=own_log(run_dir)), stop=lambda: next(polls, None) is None,
                  job_id="4242",
                  restart=0, step_nodes=NODES, srun=("srun",), task=("python",),
                  batch_log=lambda: "glaunch: start 0\n" + TASK_FAILED.replace("task 0", "task 3").replace(
                      "node2", "n2"), end_step=lambda: ended.append(1))
    assert ended == ([1] if ends else [])
    crash = jobend.Outcome(State.FAILED.value, "crash", False, 1, "exit status 1")
    detail = jobend.with_crash_note(crash, run_dir, 0, "4242").detail
    if ends:
        assert detail == (f"exit status 1; rank 3 lost its process and could not be started again on n2: "
                          f"{replace.not_started(output)}")
        # The other ranks, stopped as the step ended, are not the first failure.
        RunDir(run_dir).crash_file.write_text(json.dumps({"restart": 0, "task": 2, "node": "n2",
                                                          "error": "KeyboardInterrupt"}))
        assert jobend.with_crash_note(crash, run_dir, 0, "4242").detail == detail
        assert jobend.with_crash_note(crash, run_dir, 1, "4242").detail == "exit status 1"     # another start's
        # A resumed run's new job numbers its starts from 0 again: its crash is its own.
        assert jobend.with_crash_note(crash, run_dir, 0, "5000").detail == "exit status 1; task 2 on n2: KeyboardInterrupt"
    else:
        assert detail == "exit status 1" and not RunDir(run_dir).peer_not_started_file.exists()


def test_a_task_s_own_failure_before_the_new_step_was_refused_stays_the_first(tmp_path, monkeypatch):
    """A rank's own crash (crash.json of this start) came first; the step was ending for it
    when Slurm refused the new step ("already completing"): the end names the crash."""
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    RunDir(run_dir).crash_file.write_text(json.dumps({"restart": 0, "task": 1, "node": "n1",
                                                      "error": "ValueError: bad batch"}))
    write_request(run_dir, REQUEST)
    monkeypatch.setattr(replace, "POLL_S", 0.01)
    spec = type("Spec", (), {"launcher": "srun", "world_size": 4, "ranks_per_node": 2})()
    monkeypatch.setattr("launcher.rundir.taskspec.read_task_spec", lambda path: spec)

    def start(words, log):
        log.write_text("srun: error: Unable to create step for job 4242: Job/step already completing or completed\n")
        return Proc(1)

    ended: list[int] = []
    polls = iter(range(20))
    replace.serve(run_dir, Replacements(start, logs=own_log(run_dir)), stop=lambda: next(polls, None) is None,
                  job_id="4242", restart=0, step_nodes=NODES, srun=("srun",), task=("python",),
                  batch_log=lambda: "glaunch: start 0\nsrun: error: n2: task 3: Killed\n",
                  end_step=lambda: ended.append(1))
    assert ended == [1] and not RunDir(run_dir).peer_not_started_file.exists()
    crash = jobend.Outcome(State.FAILED.value, "crash", False, 1, "exit status 1")
    assert jobend.with_crash_note(crash, run_dir, 0, "4242").detail == "exit status 1; task 1 on n1: ValueError: bad batch"

"""Every Slurm call bounded, retried only when the controller failed, never queueing a run
twice; the submitting shell's SLURM_*/SBATCH_* variables kept from the job; pending
reasons that never clear said in the profile's terms.

The policy is tested with a fake clock on recorded error texts (tests/recorded_cluster/
errors/). What cannot be made to fail for real on a shared cluster (sbatch timing out after
queueing the job, squeue losing the controller) is played by fake `sbatch`/`squeue`
scripts first on PATH: the tests that use them are named fake_*.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from launcher import api
from launcher.errors import SchedulerError
from launcher.rundir.records import RunRecord
from launcher.schedulers.slurm import client as slurm_client, recording as slurm_records, submit as slurm_submit
from launcher.schedulers.slurm.client import (
    Client,
    RetryPolicy,
    Unreachable,
    clean_env,
    describe_controller,
    is_transient,
    parse_controller,
)
from launcher.schedulers.slurm.state import parse_squeue, parse_squeue_reason, pending_verdict

REPO = Path(__file__).resolve().parents[2]
ERRORS = Path(__file__).parent.parent / "recorded_cluster" / "errors"


def error_text(name: str) -> str:
    return (ERRORS / f"{name}.txt").read_text(encoding="utf-8").partition("\n")[2]


@pytest.fixture(autouse=True)
def fresh_client():
    """The process's client remembers a controller it found down: each test starts afresh."""
    slurm_client.CLIENT.forget_down()
    yield
    slurm_client.CLIENT.forget_down()


# --- which errors are worth another try -----------------------------------------------------------

TRANSIENT = ["squeue-unreachable", "sbatch-unreachable", "scancel-unreachable", "scontrol-unreachable",
             "sbatch-socket-timeout", "squeue-socket-timeout", "squeue-zero-bytes", "scontrol-zero-bytes",
             "sbatch-busy", "sacctmgr-dbd-down"]
PERMANENT = ["squeue-invalid-job", "sbatch-invalid-account", "sbatch-invalid-partition"]


def test_every_recorded_error_is_classified():
    assert sorted(TRANSIENT + PERMANENT) == sorted(p.stem for p in ERRORS.glob("*.txt"))


@pytest.mark.parametrize("name", TRANSIENT)
def test_a_controller_failure_is_transient(name):
    assert is_transient(error_text(name))


@pytest.mark.parametrize("name", PERMANENT)
def test_a_refusal_is_not_transient(name):
    assert not is_transient(error_text(name))


# --- the retry policy, on a fake clock --------------------------------------------------------------


class FakeSlurm:
    """Stands in for subprocess.run and the clock: each call takes `seconds` of fake time
    and answers with (exit status, stderr, stdout); past its timeout it raises as run does."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.now = 0.0
        self.calls: list[tuple[float, list[str], float]] = []
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds

    def run(self, cmd, *, timeout, **_):
        self.calls.append((self.now, cmd, timeout))
        seconds, rc, stderr, stdout = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if seconds > timeout:
            self.now += timeout
            raise subprocess.TimeoutExpired(cmd, timeout)
        self.now += seconds
        return subprocess.CompletedProcess(cmd, rc, stdout, stderr)


@pytest.fixture
def slurm_conf(tmp_path) -> Path:
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=gpufarm\nSlurmctldHost=ctl01(10.1.0.10)\nSlurmctldHost=ctl02\n"
                    "SlurmctldPort=6817\n")
    return conf


def client(fake: FakeSlurm, conf: Path) -> Client:
    return Client(runner=fake.run, clock=fake.clock, sleep=fake.sleep, environ={"SLURM_CONF": str(conf)})


def test_a_transient_error_is_retried_after_a_backoff(slurm_conf):
    fake = FakeSlurm((1.0, 1, error_text("squeue-socket-timeout"), ""), (0.1, 0, "", "RUNNING|None\n"))
    proc = client(fake, slurm_conf).call("squeue", "-h", "-j", "7")
    assert proc.returncode == 0 and proc.stdout == "RUNNING|None\n"
    assert len(fake.calls) == 2 and fake.sleeps == [1.0]


def test_a_refusal_is_answered_at_once(slurm_conf):
    fake = FakeSlurm((0.1, 1, error_text("squeue-invalid-job"), ""))
    proc = client(fake, slurm_conf).call("squeue", "-h", "-j", "7")
    assert proc.returncode == 1 and len(fake.calls) == 1 and fake.sleeps == []


def test_controller_down_ends_within_the_bound_and_names_the_controller(slurm_conf):
    # A client that cannot connect retries on its own for about MessageTimeout (19 s here).
    fake = FakeSlurm((19.0, 1, error_text("squeue-unreachable"), ""))
    with pytest.raises(Unreachable) as err:
        client(fake, slurm_conf).call("squeue", "-h", "-j", "7")
    assert fake.now <= 40.0 and len(fake.calls) == 2
    assert err.value.exit_code == 3
    assert str(err.value) == (
        f"cannot reach the Slurm controller, slurmctld on ctl01 (10.1.0.10) or ctl02 port 6817 (SlurmctldHost in "
        f"{slurm_conf}): squeue said: slurm_load_jobs error: Unable to contact slurm controller (connect failure) "
        "(2 attempt(s) in 39 s)")


def test_a_hanging_client_is_cut_at_each_attempt_timeout(slurm_conf):
    fake = FakeSlurm((1000.0, 0, "", ""))
    with pytest.raises(Unreachable, match="scontrol did not answer within 14 s"):
        client(fake, slurm_conf).call("scontrol", "-a", "-o")
    assert [timeout for _, _, timeout in fake.calls] == [25.0, 14.0]
    assert fake.now == 40.0


def test_once_found_down_the_controller_is_not_asked_again_for_a_while(slurm_conf):
    fake = FakeSlurm((19.0, 1, error_text("scontrol-unreachable"), ""))
    c = client(fake, slurm_conf)
    with pytest.raises(Unreachable):
        c.call("scontrol", "-a", "-o")
    calls = len(fake.calls)
    start = fake.now
    with pytest.raises(Unreachable, match="cannot reach the Slurm controller"):
        c.call("squeue", "-h")
    assert len(fake.calls) == calls and fake.now == start       # at once, nothing run
    fake.now += 61
    fake.answers = [(0.1, 0, "", "PENDING|Priority\n")]
    assert c.call("squeue", "-h").returncode == 0


def test_accounting_failures_do_not_mark_the_controller_down(slurm_conf):
    fake = FakeSlurm((0.5, 1, error_text("sacctmgr-dbd-down"), ""))
    c = client(fake, slurm_conf)
    with pytest.raises(Unreachable, match=r"sacctmgr could not reach Slurm's accounting \(slurmdbd\)"):
        c.call("sacctmgr", "-n", "show", "qos", policy=slurm_client.ACCOUNTING_POLICY, controller=False)
    fake.answers = [(0.1, 0, "", "RUNNING|None\n")]
    assert c.call("squeue", "-h").returncode == 0


def test_a_deadline_shortens_the_budget(slurm_conf):
    fake = FakeSlurm((1000.0, 0, "", ""))
    with pytest.raises(Unreachable):
        client(fake, slurm_conf).call("squeue", "-h", deadline=12.0)
    assert [timeout for _, _, timeout in fake.calls] == [12.0]


@pytest.mark.parametrize("done, elapsed, delay", [
    (1, 0.0, 1.0), (1, 19.0, 1.0), (2, 20.0, 3.0), (2, 29.0, None),   # 40 - 29 - 3 < 10: no time left for it
    (3, 1.0, None),                                                      # three attempts at most
    (1, 31.0, None),
])
def test_retry_policy_next_delay(done, elapsed, delay):
    assert RetryPolicy().next_delay(done, elapsed) == delay


# --- submission: looked up before any retry -----------------------------------------------------------


def test_sbatch_timed_out_but_queued_is_found_not_resubmitted(slurm_conf):
    fake = FakeSlurm((1000.0, 0, "", ""))
    looked: list[float] = []
    out = client(fake, slurm_conf).submit(["sbatch", "job.sh"], lookup=lambda d: looked.append(d) or "4242")
    assert out == "Submitted batch job 4242"
    assert len(fake.calls) == 1 and looked == [40.0]


def test_sbatch_failing_transiently_is_retried_once_the_job_is_known_absent(slurm_conf):
    fake = FakeSlurm((1.0, 1, error_text("sbatch-socket-timeout"), ""), (0.2, 0, "", "Submitted batch job 77\n"))
    looked = []
    out = client(fake, slurm_conf).submit(["sbatch", "job.sh"], lookup=lambda d: looked.append(d))
    assert out == "Submitted batch job 77\n"
    assert len(fake.calls) == 2 and len(looked) == 1 and fake.sleeps == [1.0]


def test_sbatch_refusing_the_job_is_not_retried(slurm_conf):
    fake = FakeSlurm((0.2, 1, error_text("sbatch-invalid-account"), ""))
    with pytest.raises(SchedulerError, match="sbatch refused the job: allocation failure: Invalid account"):
        client(fake, slurm_conf).submit(["sbatch", "job.sh"], lookup=lambda d: pytest.fail("looked up"))
    assert len(fake.calls) == 1


def test_sbatch_with_the_controller_down_gives_up_within_the_bound(slurm_conf):
    fake = FakeSlurm((19.0, 1, error_text("sbatch-unreachable"), ""))
    looked = []
    with pytest.raises(Unreachable, match="cannot reach the Slurm controller, slurmctld on ctl01"):
        client(fake, slurm_conf).submit(["sbatch", "job.sh"], lookup=lambda d: looked.append(d))
    assert fake.now <= 40.0 and len(fake.calls) == 2 and len(looked) == 2


def test_a_lookup_that_cannot_tell_stops_the_submission(slurm_conf):
    fake = FakeSlurm((1000.0, 0, "", ""))

    def lookup(deadline):
        raise SchedulerError("cannot tell")

    with pytest.raises(SchedulerError, match="cannot tell"):
        client(fake, slurm_conf).submit(["sbatch", "job.sh"], lookup=lookup)
    assert len(fake.calls) == 1


# --- the controller, named from the client's slurm.conf --------------------------------------------------


@pytest.mark.parametrize("text, hosts, port", [
    ("SlurmctldHost=vm(127.0.0.1)\nSlurmctldPort=16817\n", ["vm (127.0.0.1)"], "16817"),
    ("# SlurmctldHost=old\nslurmctldhost=ctl01 # primary\nSlurmctldHost=ctl02\n", ["ctl01", "ctl02"], "6817"),
    ("ControlMachine=head\nControlAddr=10.0.0.1\nBackupController=head2\nSlurmctldPort=6817-6818\n",
     ["head (10.0.0.1)", "head2"], "6817-6818"),
    ("ClusterName=x\n", [], "6817"),
])
def test_parse_controller(text, hosts, port):
    assert parse_controller(text) == (hosts, port)


def test_a_configless_client_says_so(monkeypatch):
    monkeypatch.setattr("launcher.schedulers.slurm.client.DEFAULT_CONF", "/nonexistent/slurm.conf")
    assert describe_controller({}) == ("the Slurm controller (no readable /nonexistent/slurm.conf: a configless "
                                       "client finds it through DNS)")


def test_an_unreadable_slurm_conf_is_named_as_the_variable_that_set_it(tmp_path):
    absent = tmp_path / "absent.conf"
    assert describe_controller({"SLURM_CONF": str(absent)}) == \
        f"the Slurm controller (SLURM_CONF names {str(absent)!r}, which cannot be read)"


# --- the environment Slurm's commands get -------------------------------------------------------------


def test_clean_env_keeps_the_allocation_and_input_variables_from_slurm():
    environ = {"PATH": "/usr/bin", "HOME": "/home/a", "SLURM_CONF": "/etc/slurm-b/slurm.conf",
               "SLURM_JOB_ID": "1", "SLURM_NTASKS": "1", "SLURM_NNODES": "1", "SLURM_CPUS_PER_TASK": "3",
               "SLURM_TIME_FORMAT": "relative", "SBATCH_TIMELIMIT": "1", "SBATCH_PARTITION": "other",
               "SALLOC_ACCOUNT": "x", "SRUN_CPUS_PER_TASK": "3", "SQUEUE_STATES": "RUNNING",
               "SQUEUE_FORMAT": "%i", "SACCT_FORMAT": "jobid", "MY_SLURM_NOTE": "kept"}
    env, ignored = clean_env(environ)
    assert env == {"PATH": "/usr/bin", "HOME": "/home/a", "SLURM_CONF": "/etc/slurm-b/slurm.conf",
                   "SLURM_TIME_FORMAT": "standard", "MY_SLURM_NOTE": "kept"}
    assert ignored == ["SALLOC_ACCOUNT", "SBATCH_PARTITION", "SBATCH_TIMELIMIT", "SRUN_CPUS_PER_TASK"]
    warning = slurm_client.ignored_inputs_warning(ignored)
    assert warning.startswith("ignoring SALLOC_ACCOUNT, SBATCH_PARTITION, SBATCH_TIMELIMIT, SRUN_CPUS_PER_TASK "
                              "from the environment")
    assert slurm_client.ignored_inputs_warning([]) is None


# --- pending reasons ------------------------------------------------------------------------------------

REQUEST = {"partition": "gpu", "nodes": 4, "gpus_per_node": 4, "time": "2-00:00:00", "account": "proj1",
           "qos": "normal", "constraint": None, "max_time": None, "max_nodes": None}

NEVER = {
    "PartitionTimeLimit": "resources.time 2-00:00:00 is over the time limit of partition gpu on the cluster (the "
                          "profile's partitions.gpu.max_time: (not set)) (Reason=PartitionTimeLimit)",
    "PartitionNodeLimit": "resources.nodes 4 is outside the node limits of partition gpu",
    "QOSMaxWallDurationPerJobLimit": "resources.time 2-00:00:00 is over a per-job maximum of QOS normal on the "
                                     "cluster (Reason=QOSMaxWallDurationPerJobLimit)",
    "QOSMaxNodePerJobLimit": "resources.nodes 4 is over a per-job maximum of QOS normal",
    "QOSMaxGRESPerJob": "resources.gpus_per_node 4 x resources.nodes 4 is over a per-job maximum of QOS normal",
    "QOSMaxGRESPerNode": "resources.gpus_per_node 4 is over a per-node maximum of QOS normal",
    "QOSMaxCpuPerJobLimit": "resources.cpus_per_task is over a per-job maximum of QOS normal",
    "QOSMinGRES": "is under a per-job minimum of QOS normal",
    "AssocMaxWallDurationPerJobLimit": "resources.time 2-00:00:00 is over a per-job maximum of the association "
                                       "of account proj1",
    "AssocMaxNodePerJobLimit": "resources.nodes 4 is over a per-job maximum of the association of account proj1",
    "AssocMaxNodesPerJobLimit": "resources.nodes 4 is over a per-job maximum of the association of account proj1",
    "InvalidAccount": "account proj1 is not valid for this user on the cluster",
    "InvalidQOS": "QOS normal is not valid for this user and account on the cluster",
    "AccountNotAllowed": "account proj1 may not use partition gpu",
    "BadConstraints": "no node of partition gpu has the features asked (partitions.gpu.constraint: (not set))",
    "DependencyNeverSatisfied": "the run it waits for ended in a way its dependency excludes",
    "PartitionConfig": "the request (resources.nodes 4, resources.time 2-00:00:00) is outside what partition gpu "
                       "allows on the cluster",
    "PartitionDown": "partition gpu is DOWN on the cluster",
    "PartitionInactive": "partition gpu is INACTIVE",
    "JobHeldAdmin": "an administrator holds it",
    # Slurm 24.11's squeue after `scontrol requeuehold` of a running job
    "job_requeued_in_held_state": "it was requeued held (scontrol requeuehold, or the cluster's RequeueExitHold)",
    "ReqNodeNotAvail, UnavailableNodes:g[001-004]": "node(s) g[001-004] it needs are down, drained or reserved",
}
CLEARS = ["Priority", "Resources", "BeginTime", "Dependency", "JobHeldUser", "None", "Reservation",
          "QOSMaxGRESPerUser", "QOSMaxNodePerUserLimit", "QOSMaxJobsPerUserLimit", "AssocGrpGRES",
          "AssocGrpNodeLimit", "QOSGrpCpuLimit", "AssocMaxJobsLimit", "JobArrayTaskLimit", "Licenses",
          "ReqNodeNotAvail, Reserved for maintenance", "", None]


@pytest.mark.parametrize("reason", sorted(NEVER))
def test_a_reason_that_never_clears_is_said_in_profile_terms(reason):
    verdict = pending_verdict(reason, REQUEST)
    assert verdict is not None and NEVER[reason] in verdict, verdict


@pytest.mark.parametrize("reason", CLEARS)
def test_a_reason_that_clears_by_itself_has_no_verdict(reason):
    assert pending_verdict(reason, REQUEST) is None


@pytest.mark.parametrize("text, state, reason", [
    ("PENDING|PartitionTimeLimit\n", "PENDING", "PartitionTimeLimit"),
    ("PENDING|ReqNodeNotAvail, UnavailableNodes:node[1-2]\n", "PENDING", "ReqNodeNotAvail, UnavailableNodes:node[1-2]"),
    ("RUNNING|None\n", "RUNNING", None),
    ("PENDING\n", "PENDING", None),
    ("", None, None),
])
def test_parse_squeue_state_and_reason(text, state, reason):
    assert parse_squeue(text) == state and parse_squeue_reason(text) == reason


@pytest.mark.parametrize("name, reason, never", [
    ("squeue-begin-time.txt", "BeginTime", False),
    ("squeue-never-satisfied.txt", "DependencyNeverSatisfied", True),
    ("squeue-partition-config.txt", "PartitionConfig", True),        # at submission, EnforcePartLimits=NO
    ("squeue-partition-time-limit.txt", "PartitionTimeLimit", True),  # once the scheduler looked
])
def test_recorded_squeue_reasons(name, reason, never):
    text = (ERRORS.parent / name).read_text(encoding="utf-8").partition("\n")[2]
    assert parse_squeue(text) == "PENDING" and parse_squeue_reason(text) == reason
    assert (pending_verdict(reason, REQUEST) is not None) == never


def test_refresh_marks_a_job_that_never_starts_and_clears_it_once_it_runs():
    record = RunRecord(run_id="r1", job_id="9", state="PENDING", extra={"request": REQUEST})
    slurm_records.record_pending_reason(record, "PENDING", "PartitionTimeLimit")
    assert record.extra["blocked"] is True and record.reason == "never starts"
    assert record.detail.startswith("job 9 never starts: resources.time 2-00:00:00 is over the time limit of "
                                    "partition gpu")
    assert record.detail.endswith("It stays queued until cancelled (glaunch cancel r1)")
    assert record.to_dict()["blocked"] is True and record.to_dict()["pending_reason"] == "PartitionTimeLimit"
    slurm_records.record_pending_reason(record, "RUNNING", None)
    assert "blocked" not in record.extra and record.reason is None and record.detail is None
    slurm_records.record_pending_reason(record, "PENDING", "Priority")
    assert "blocked" not in record.extra and record.extra["pending_reason"] == "Priority"


def test_a_hold_glaunch_could_not_release_never_clears_and_a_hold_on_another_job_does_not_count():
    # A job's own hold (sbatch --hold) while glaunch puts its record in place clears by the release.
    record = RunRecord(run_id="r1", job_id="9", state="PENDING", extra={"request": REQUEST})
    slurm_records.record_pending_reason(record, "PENDING", "JobHeldUser")
    assert "blocked" not in record.extra and record.reason is None
    # The release failed (and the cancel): the hold stays until someone acts.
    record.extra[slurm_records.LEFT_HELD] = "9"
    slurm_records.record_pending_reason(record, "PENDING", "JobHeldUser")
    assert record.extra["blocked"] is True and record.detail == (
        "job 9 never starts: glaunch queued it held and could not release it (`scontrol release 9` lets it start). "
        "It stays queued until cancelled (glaunch cancel r1)")
    # Released by hand: it waits like any job.
    slurm_records.record_pending_reason(record, "PENDING", "Priority")
    assert "blocked" not in record.extra
    # A mark of an earlier job (before a resume) says nothing of this one.
    record.job_id = "12"
    slurm_records.record_pending_reason(record, "PENDING", "JobHeldUser")
    assert "blocked" not in record.extra


# --- effects, with fakes of what cannot fail for real on a shared cluster ------------------------------------

FAKE_SBATCH = """\
#!/bin/bash
# A fake sbatch: {behaviour}
echo "$*" >> "$FAKE_DIR/sbatch.calls"
env > "$FAKE_DIR/sbatch.env"
n=$(wc -l < "$FAKE_DIR/sbatch.calls")
script="${{@: -1}}"
comment=$(printf '%s\\n' "$@" | sed -n 's/^--comment=//p')
{body}
"""
FAKE_SQUEUE = """\
#!/bin/bash
# A fake squeue: {behaviour}
echo "$*" >> "$FAKE_DIR/squeue.calls"
{body}
"""
# A fake scontrol and scancel: each call recorded; at a release, the run.json named in
# $FAKE_DIR/watch (when there is one) copied as it stands then.
FAKE_SCONTROL = """\
#!/bin/bash
# A fake scontrol: {behaviour}
echo "$*" >> "$FAKE_DIR/scontrol.calls"
if [ "$1" = release ] && [ -e "$FAKE_DIR/watch" ]; then cp "$(cat "$FAKE_DIR/watch")" "$FAKE_DIR/at_release.json"; fi
{body}
"""
FAKE_SCANCEL = """\
#!/bin/bash
# A fake scancel: {behaviour}
echo "$*" >> "$FAKE_DIR/scancel.calls"
{body}
"""
RELEASES = ("releases", "exit 0")
CANCELS = ("cancels", "exit 0")


def _fakes(tmp_path, monkeypatch, *, sbatch: tuple[str, str], squeue: tuple[str, str],
           scontrol: tuple[str, str] = RELEASES, scancel: tuple[str, str] = CANCELS) -> Path:
    fakes = tmp_path / "fakes"
    fakes.mkdir(exist_ok=True)
    for name, template, (behaviour, body) in (("sbatch", FAKE_SBATCH, sbatch), ("squeue", FAKE_SQUEUE, squeue),
                                              ("scontrol", FAKE_SCONTROL, scontrol),
                                              ("scancel", FAKE_SCANCEL, scancel)):
        (fakes / name).write_text(template.format(behaviour=behaviour, body=textwrap.dedent(body)))
        (fakes / name).chmod(0o755)
    if not (fakes / "srun").exists():
        (fakes / "srun").write_text("#!/bin/bash\nexit 0\n")
        (fakes / "srun").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fakes}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_DIR", str(fakes))
    return fakes


def _calls(fakes: Path, name: str) -> list[str]:
    path = fakes / f"{name}.calls"
    return path.read_text().splitlines() if path.exists() else []


# Short enough for the fakes that hang (they sleep 30 s), long enough that a fake answering
# at once is never cut off on a loaded machine (a bash start-up can take a second there).
QUICK = RetryPolicy(attempts=3, attempt_timeout_s=8.0, budget_s=25.0, backoff_s=(0.2,), min_attempt_s=4.0)


def _prepared(tmp_path):
    return api.prepare(str(REPO / "examples" / "torch_ddp.yaml"), site="local-slurm",
                       runs_dir=str(tmp_path / "runs"))


def _record(run) -> dict:
    return json.loads((Path(run.run_dir) / "run.json").read_text())


def test_fake_sbatch_timing_out_after_queueing_is_found_not_resubmitted(tmp_path, monkeypatch, isolated_env):
    monkeypatch.setattr(slurm_client, "DEFAULT_POLICY", QUICK)
    fakes = _fakes(tmp_path, monkeypatch,
                   sbatch=("queues the job, then hangs past glaunch's timeout",
                           'echo "4242|$comment|$script" >> "$FAKE_DIR/queue"\nexec sleep 30'),
                   squeue=("lists the queue it was given",
                           'case "$*" in *--states=all*) cat "$FAKE_DIR/queue" 2>/dev/null;; '
                           '*) echo "PENDING|Priority";; esac'))
    run = api.launch(_prepared(tmp_path), check=False)
    assert run.job_id == "4242" and run.state == "PENDING"
    assert len(_calls(fakes, "sbatch")) == 1                 # never a second sbatch
    assert f"--comment=glaunch:{run.run_id}" in _calls(fakes, "sbatch")[0]
    record = _record(run)
    assert record["job_id"] == "4242" and record["state"] == "PENDING"
    assert record["request"]["partition"] == "debug" and record["request"]["time"] == "00:20:00"


def test_fake_sbatch_failing_transiently_is_retried_once_squeue_shows_no_job(tmp_path, monkeypatch, isolated_env):
    monkeypatch.setattr(slurm_client, "DEFAULT_POLICY", QUICK)
    fakes = _fakes(tmp_path, monkeypatch,
                   sbatch=("times out on the first call, accepts the second",
                           f"""if [ "$n" -eq 1 ]; then echo '{error_text("sbatch-socket-timeout").strip()}' >&2; exit 1; fi
                           echo "Submitted batch job 4243\"""".replace("                           ", "")),
                   squeue=("has no job", "true"))
    run = api.launch(_prepared(tmp_path), check=False)
    assert run.job_id == "4243"
    assert len(_calls(fakes, "sbatch")) == 2
    lookups = [c for c in _calls(fakes, "squeue") if "--states=all" in c]
    assert len(lookups) == 1 and "-o %i|%k|%o" in lookups[0]


def test_fake_sbatch_gets_no_allocation_or_input_variables(tmp_path, monkeypatch, isolated_env, caplog):
    fakes = _fakes(tmp_path, monkeypatch, sbatch=("accepts", 'echo "Submitted batch job 5"'),
                   squeue=("has no job", "true"))
    for key, value in {"SLURM_JOB_ID": "1", "SLURM_NTASKS": "1", "SLURM_NNODES": "1", "SBATCH_TIMELIMIT": "1",
                       "SRUN_CPUS_PER_TASK": "3", "SLURM_CONF": "/etc/slurm/slurm.conf"}.items():
        monkeypatch.setenv(key, value)
    with caplog.at_level(logging.WARNING):
        run = api.launch(_prepared(tmp_path), check=False)
    assert run.job_id == "5"
    env = dict(line.split("=", 1) for line in (fakes / "sbatch.env").read_text().splitlines() if "=" in line)
    assert not {"SLURM_JOB_ID", "SLURM_NTASKS", "SLURM_NNODES", "SBATCH_TIMELIMIT", "SRUN_CPUS_PER_TASK"} & set(env)
    assert env["SLURM_CONF"] == "/etc/slurm/slurm.conf" and env["PATH"] == os.environ["PATH"]
    warned = [r.getMessage() for r in caplog.records if "ignoring" in r.getMessage()]
    assert warned == ["glaunch: warning: ignoring SBATCH_TIMELIMIT, SRUN_CPUS_PER_TASK from the environment: "
                      "Slurm input variables would override the site profile and the experiment (set those "
                      "values there instead)"]
    assert _record(run)["warnings"] == [warned[0].removeprefix("glaunch: warning: ")]


def test_fake_sbatch_hanging_with_squeue_unreachable_records_an_uncertain_submission(tmp_path, monkeypatch,
                                                                                      isolated_env):
    monkeypatch.setattr(slurm_client, "DEFAULT_POLICY", QUICK)
    fakes = _fakes(tmp_path, monkeypatch,
                   sbatch=("hangs (the controller got the job, or not)", "exec sleep 30"),
                   squeue=("cannot reach the controller until $FAKE_DIR/back exists",
                           f"""if [ ! -e "$FAKE_DIR/back" ]; then echo '{error_text("squeue-unreachable").strip()}' >&2; exit 1; fi
                           case "$*" in *--states=all*) echo "4244|glaunch:$(cat "$FAKE_DIR/run_id")|x";;
                           *) echo "RUNNING|None";; esac""".replace("                           ", "")))
    prepared = _prepared(tmp_path)
    (fakes / "run_id").write_text(prepared.plan.run_id)
    with pytest.raises(slurm_submit.SubmissionUncertain) as err:
        api.launch(prepared, check=False)
    assert err.value.exit_code == 3 and "`glaunch status` looks for the job again" in err.value.message
    assert len(_calls(fakes, "sbatch")) == 1
    run_dir = Path(prepared.plan.run_dir)
    record = json.loads((run_dir / "run.json").read_text())
    assert record["state"] == "UNKNOWN" and record["reason"] == "submission uncertain" and record["job_id"] is None
    # The controller answers again: status finds the job the first sbatch queued.
    (fakes / "back").touch()
    (fakes / "watch").write_text(str(run_dir / "run.json"))
    slurm_client.CLIENT.forget_down()
    summary = api.status(str(run_dir))
    assert summary["job_id"] == "4244" and summary["state"] == "RUNNING"
    assert len(_calls(fakes, "sbatch")) == 1
    # It was queued held: found, it gets its task (submitit's loader reads it) and is released.
    assert _calls(fakes, "scontrol") == ["release 4244"]
    assert json.loads((fakes / "at_release.json").read_text())["job_id"] == "4244"
    assert slurm_submit.submitted_pickle(run_dir / "logs", "4244").is_file()


# What a sweep's fake scontrol answers besides a release: the cluster's settings, of a
# slurm.conf with MaxArraySize alone (plan_sweep reads it).
SWEEP_SETTINGS = 'echo "PartitionName=debug\nClusterName=fake\nMaxArraySize=1001"'


def _sweep_scontrol(release: str) -> tuple[str, str]:
    """A fake scontrol for a sweep: `release` (shell) answers a release, the settings the rest."""
    return (f"answers a release with `{release}`; the cluster's settings otherwise",
            f'if [ "$1" = release ]; then {release}; fi\n{SWEEP_SETTINGS}')


def _sweep(tmp_path, *values: str):
    return api.prepare_sweep(str(REPO / "examples" / "torch_ddp.yaml"), list(values), site="local-slurm",
                             runs_dir=str(tmp_path / "runs"))


@pytest.fixture
def default_sigint():
    """Ctrl-C as it reaches glaunch's command: Python's own SIGINT handler (KeyboardInterrupt),
    whatever an earlier test in this process installed (torchrun's agent installs its own)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _watched(fakes: Path, prepared) -> Path:
    """The run's run.json, which the fake scontrol copies as it stands at the release."""
    run_json = Path(prepared.plan.run_dir) / "run.json"
    (fakes / "watch").write_text(str(run_json))
    return run_json


def test_fake_sbatch_queues_the_job_held_and_releases_it_once_its_record_names_it(tmp_path, monkeypatch,
                                                                                  isolated_env):
    fakes = _fakes(tmp_path, monkeypatch, sbatch=("accepts", 'echo "Submitted batch job 7"'),
                   squeue=("has no job", "true"))
    prepared = _prepared(tmp_path)
    _watched(fakes, prepared)
    run = api.launch(prepared, check=False)
    assert run.job_id == "7" and run.state == "PENDING"
    assert _calls(fakes, "sbatch")[0].startswith("--hold ")
    assert _calls(fakes, "scontrol") == ["release 7"] and _calls(fakes, "scancel") == []
    at_release = json.loads((fakes / "at_release.json").read_text())
    assert at_release["job_id"] == "7" and at_release["state"] == "PENDING"
    assert slurm_submit.submitted_pickle(Path(run.run_dir) / "logs", "7").is_file()


def test_fake_release_refused_cancels_the_held_job_and_records_the_refusal(tmp_path, monkeypatch, isolated_env):
    fakes = _fakes(tmp_path, monkeypatch, sbatch=("accepts", 'echo "Submitted batch job 8"'),
                   squeue=("has no job", "true"),
                   scontrol=("refuses", "echo 'scontrol: error: Access/permission denied' >&2; exit 1"))
    prepared = _prepared(tmp_path)
    with pytest.raises(SchedulerError) as err:
        api.launch(prepared, check=False)
    assert err.value.exit_code == 3 and "scontrol release 8 failed: scontrol: error: Access/permission denied" \
        in err.value.message
    assert _calls(fakes, "scancel") == ["8"]
    record = json.loads((Path(prepared.plan.run_dir) / "run.json").read_text())
    assert record["state"] == "REFUSED" and record["job_id"] is None and record["starts"] == []
    assert record["detail"].endswith("its held job 8 was cancelled"), record["detail"]


def test_fake_release_and_cancel_failing_leave_the_held_job_named_in_the_record_and_the_error(
        tmp_path, monkeypatch, isolated_env):
    fakes = _fakes(tmp_path, monkeypatch, sbatch=("accepts", 'echo "Submitted batch job 9"'),
                   squeue=("has no job", "true"),
                   scontrol=("refuses", "echo 'scontrol: error: Access/permission denied' >&2; exit 1"),
                   scancel=("refuses", "echo 'scancel: error: Access/permission denied' >&2; exit 1"))
    prepared = _prepared(tmp_path)
    with pytest.raises(SchedulerError) as err:
        api.launch(prepared, check=False)
    assert (f"job 9 is left held, never released (scancel failed too): glaunch cancel {prepared.plan.run_id} "
            "removes it") in err.value.message
    assert _calls(fakes, "scancel") == ["9"]
    record = json.loads((Path(prepared.plan.run_dir) / "run.json").read_text())
    assert record["job_id"] == "9" and record["state"] == "PENDING" and record["left_held"] == "9"


def test_fake_ctrl_c_during_the_release_cancels_the_held_job_and_leaves_nothing(tmp_path, monkeypatch,
                                                                               isolated_env, default_sigint):
    fakes = _fakes(tmp_path, monkeypatch, sbatch=("accepts", 'echo "Submitted batch job 10"'),
                   squeue=("has no job", "true"),
                   scontrol=("is interrupted: the user's Ctrl-C reaches glaunch", "kill -INT $PPID; sleep 5"))
    prepared = _prepared(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        api.launch(prepared, check=False)
    assert _calls(fakes, "scancel") == ["10"]
    assert not Path(prepared.plan.run_dir).exists()
    assert prepared.plan.run_id not in [row.get("run_id") for row in api.list_runs()]


def test_fake_squeue_unreachable_status_exits_3_naming_the_controller(tmp_path, monkeypatch, isolated_env):
    fakes = _fakes(tmp_path, monkeypatch, sbatch=("accepts", 'echo "Submitted batch job 6"'),
                   squeue=("cannot reach the controller",
                           f"echo '{error_text('squeue-unreachable').strip()}' >&2; exit 1"))
    conf = tmp_path / "slurm.conf"
    conf.write_text("SlurmctldHost=ctl01(10.1.0.10)\nSlurmctldPort=6817\n")
    run = api.launch(_prepared(tmp_path), check=False)
    env = dict(os.environ, SLURM_CONF=str(conf))
    # Bounded by the retry policy's attempts (three squeue calls, counted below), not by the clock.
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "status", str(run.run_dir)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 3
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("glaunch: error: cannot reach the Slurm controller, slurmctld on ctl01 (10.1.0.10) "
                                  f"port 6817 (SlurmctldHost in {conf}): squeue said: slurm_load_jobs error: "
                                  "Unable to contact slurm controller (connect failure)"), proc.stderr
    record = _record(run)
    assert record["state"] == "PENDING"           # the last state Slurm gave; what is new is said beside it
    assert record["unreachable"]["message"] in proc.stderr
    assert len([c for c in _calls(fakes, "squeue") if "-j 6" in c]) == 3


def test_fake_ctrl_c_while_sbatch_queues_the_job_finds_and_cancels_it(tmp_path, monkeypatch, isolated_env, default_sigint):
    fakes = _fakes(tmp_path, monkeypatch,
                   sbatch=("queues the job held, then the user's Ctrl-C reaches glaunch before the answer",
                           'echo "4250|$comment|$script" >> "$FAKE_DIR/queue"\nkill -INT $PPID; sleep 5'),
                   squeue=("lists the queue it was given", 'cat "$FAKE_DIR/queue" 2>/dev/null'))
    prepared = _prepared(tmp_path)
    with pytest.raises(KeyboardInterrupt):
        api.launch(prepared, check=False)
    assert _calls(fakes, "scancel") == ["4250"]
    assert not Path(prepared.plan.run_dir).exists()


def test_fake_sweep_release_refused_cancels_its_held_array_and_records_each_element_refused(
        tmp_path, monkeypatch, isolated_env):
    fakes = _fakes(tmp_path, monkeypatch, sbatch=("accepts", 'echo "Submitted batch job 11"'),
                   squeue=("has no job", "true"),
                   scontrol=_sweep_scontrol('echo "scontrol: error: Access/permission denied" >&2; exit 1'))
    prepared = _sweep(tmp_path, "hparams.lr=0.1,0.2")
    sweep = api.launch(prepared, check=False)
    releases = [call for call in _calls(fakes, "scontrol") if call.startswith("release")]
    assert _calls(fakes, "sbatch")[0].startswith("--hold ") and releases == ["release 11"]
    assert _calls(fakes, "scancel") == ["11"]
    records = [json.loads((Path(run.run_dir) / "run.json").read_text()) for run in sweep.runs]
    assert [(r["state"], r["job_id"]) for r in records] == [("REFUSED", None)] * 2, records
    assert all(r["detail"].endswith(f"its held job 11_{i} was cancelled") for i, r in enumerate(records))
    assert [a["job_id"] for a in sweep.arrays] == [None] and "scontrol release 11 failed" in sweep.arrays[0]["error"]



def _left_by_a_killed_submit(tmp_path) -> Path:
    """The run directory a `glaunch submit` killed before sbatch answered leaves: its bundle,
    run.json SUBMITTING with no job, registered; last written long ago."""
    from launcher.rundir import registry
    from launcher.runner import bundle

    prepared = _prepared(tmp_path)
    written = bundle.write_bundle(prepared.plan, prepared.files, dry_run=False,
                                  runs_root=prepared.runs_root_from, checkpoint=prepared.checkpoint_from)
    registry.register(prepared.plan.run_id, str(written.path))
    stale = time.time() - 3600
    os.utime(written.path / "run.json", (stale, stale))
    return written.path


@pytest.mark.parametrize("queued", [True, False], ids=["its held job queued", "no job queued"])
def test_fake_a_submission_killed_midway_is_settled_by_the_next_status(tmp_path, monkeypatch, isolated_env, queued):
    fakes = _fakes(tmp_path, monkeypatch, sbatch=("is never called", "exit 1"),
                   squeue=("lists the queue it was given", 'cat "$FAKE_DIR/queue" 2>/dev/null; true'))
    run_dir = _left_by_a_killed_submit(tmp_path)
    run_id = json.loads((run_dir / "run.json").read_text())["run_id"]
    (fakes / "watch").write_text(str(run_dir / "run.json"))
    if queued:
        (fakes / "queue").write_text(f"4260|glaunch:{run_id}|/x/.submission_file_1.sh\n")
    summary = api.status(str(run_dir))
    record = json.loads((run_dir / "run.json").read_text())
    if queued:
        # Found by its marker: its task put in place, its record naming it, then released.
        assert record["job_id"] == "4260" and _calls(fakes, "scontrol") == ["release 4260"]
        assert json.loads((fakes / "at_release.json").read_text())["job_id"] == "4260"
        assert slurm_submit.submitted_pickle(run_dir / "logs", "4260").is_file()
        assert summary["job_id"] == "4260"
    else:
        assert record["state"] == "REFUSED" and record["reason"] == "interrupted", record
        assert "stopped before Slurm queued a job" in record["detail"]
        assert _calls(fakes, "scontrol") == []
    assert _calls(fakes, "sbatch") == []


KILLED_SUBMIT = """\
import sys
from launcher import api
site, runs, values = sys.argv[1], sys.argv[2], sys.argv[3:]
experiment = "examples/torch_ddp.yaml"
prepared = (api.prepare_sweep(experiment, values, site=site, runs_dir=runs) if values
            else api.prepare(experiment, site=site, runs_dir=runs))
api.launch(prepared, check=False)
"""


def _killed_submit(tmp_path, site: str, *values: str) -> list[Path]:
    """A real submission whose process is killed (SIGKILL: no cleanup runs) by a fake Slurm
    command; its run directories, last written an hour ago."""
    proc = subprocess.run([sys.executable, "-c", KILLED_SUBMIT, site, str(tmp_path / "runs"), *values], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    run_files = sorted((tmp_path / "runs").rglob("run.json"))
    stale = time.time() - 3600
    for path in run_files:
        os.utime(path, (stale, stale))
    return [path.parent for path in run_files]


def test_fake_a_killed_submission_whose_comment_is_the_user_s_own_is_found_by_its_script(
        tmp_path, monkeypatch, isolated_env):
    """The profile sets the job's --comment (with a "|" in it), so the job carries no marker:
    the next status finds it by the script sbatch was given, and releases it."""
    fakes = _fakes(tmp_path, monkeypatch,
                   sbatch=("queues the job held, then glaunch is killed",
                           'echo "4261|team budget|b|$script" >> "$FAKE_DIR/queue"\nkill -KILL $PPID; sleep 5'),
                   squeue=("lists the queue it was given", 'cat "$FAKE_DIR/queue" 2>/dev/null; true'))
    site = tmp_path / "commented.yaml"
    site.write_text(f"extends: {REPO / 'site_configs' / 'local-slurm.yaml'}\nname: commented\n"
                    "sbatch: {comment: 'team budget|b'}\n")
    [run_dir] = _killed_submit(tmp_path, str(site))
    assert "--comment" not in _calls(fakes, "sbatch")[0]
    api.status(str(run_dir))
    record = json.loads((run_dir / "run.json").read_text())
    assert record["job_id"] == "4261" and _calls(fakes, "scontrol") == ["release 4261"], record
    assert slurm_submit.submitted_pickle(run_dir / "logs", "4261").is_file()


def test_fake_a_sweep_killed_during_its_first_array_settles_every_element(tmp_path, monkeypatch, isolated_env):
    """Killed while sbatch queued the first of two arrays: its element is found (by the
    array's marker) and released as its task; the second array's, never queued, is refused."""
    fakes = _fakes(tmp_path, monkeypatch,
                   sbatch=("queues the array held, then glaunch is killed",
                           'echo "4270_[0]|$comment|$script" >> "$FAKE_DIR/queue"\nkill -KILL $PPID; sleep 5'),
                   squeue=("lists the queue it was given",
                           'case "$*" in *--states=all*) cat "$FAKE_DIR/queue" 2>/dev/null;; '
                           '*) echo "PENDING|Priority";; esac'),
                   scontrol=_sweep_scontrol("exit 0"))
    run_dirs = _killed_submit(tmp_path, "local-slurm", "resources.nodes=1,2")
    assert len(_calls(fakes, "sbatch")) == 1
    sweep_dir = run_dirs[0].parent
    api.status(str(sweep_dir))
    records = sorted((json.loads((d / "run.json").read_text()) for d in run_dirs), key=lambda r: r["nodes"])
    assert [(r["state"], r["job_id"]) for r in records] == [("PENDING", "4270_0"), ("REFUSED", None)], records
    assert "queueing" not in records[0] and records[1]["reason"] == "interrupted"
    assert [c for c in _calls(fakes, "scontrol") if c.startswith("release")] == ["release 4270_0"]
    first = next(d for d in run_dirs if json.loads((d / "run.json").read_text())["job_id"])
    assert slurm_submit.submitted_pickle(first / "logs", "4270_0").is_file()


@pytest.mark.parametrize("values", [(), ("hparams.lr=0.1,0.2",)], ids=["a run", "a sweep"])
def test_fake_a_submission_killed_during_the_release_is_released_by_the_next_status(
        tmp_path, monkeypatch, isolated_env, values):
    """Killed once run.json named the held job, before Slurm released it: the job would wait
    held forever; the next status (once no submission can still be under way) releases it."""
    fakes = _fakes(tmp_path, monkeypatch, sbatch=("accepts", 'echo "Submitted batch job 4280"'),
                   squeue=("lists the job held", 'echo "PENDING|JobHeldUser"'),
                   scontrol=_sweep_scontrol('if [ ! -e "$FAKE_DIR/killed" ]; then touch "$FAKE_DIR/killed"; '
                                            'kill -KILL $PPID; sleep 5; fi'))
    run_dirs = _killed_submit(tmp_path, "local-slurm", *values)
    jobs = ["4280"] if not values else ["4280_0", "4280_1"]
    before = [json.loads((d / "run.json").read_text()) for d in run_dirs]
    assert sorted((r["state"], r["job_id"], r["releasing"]) for r in before) == [("PENDING", j, j) for j in jobs]
    api.status(str(run_dirs[0].parent if values else run_dirs[0]))
    releases = [c for c in _calls(fakes, "scontrol") if c.startswith("release")]
    assert sorted(releases) == sorted(["release 4280", *(f"release {j}" for j in jobs)])  # killed, then again
    after = [json.loads((d / "run.json").read_text()) for d in run_dirs]
    assert all("releasing" not in r and "left_held" not in r for r in after), after
    assert _calls(fakes, "scancel") == []


def test_fake_a_submission_still_within_its_bounds_is_left_to_finish(tmp_path, monkeypatch, isolated_env):
    fakes = _fakes(tmp_path, monkeypatch, sbatch=("is never called", "exit 1"),
                   squeue=("lists the queue it was given", 'cat "$FAKE_DIR/queue" 2>/dev/null; true'))
    run_dir = _left_by_a_killed_submit(tmp_path)
    os.utime(run_dir / "run.json")          # written just now: its submission may still be under way
    api.status(str(run_dir))
    record = json.loads((run_dir / "run.json").read_text())
    assert record["state"] == "SUBMITTING" and record["job_id"] is None and "submission" not in record
    assert _calls(fakes, "squeue") == [] and _calls(fakes, "scontrol") == []


def test_fake_ctrl_c_at_a_sweep_s_second_array_keeps_the_first_and_refuses_the_rest(tmp_path, monkeypatch,
                                                                                  isolated_env, default_sigint):
    fakes = _fakes(tmp_path, monkeypatch,
                   sbatch=("queues the first array; the user's Ctrl-C reaches glaunch during the second",
                           'if [ "$n" -eq 1 ]; then echo "Submitted batch job 12"; exit 0; fi\n'
                           'kill -INT $PPID; sleep 5'),
                   squeue=("has no job", "true"),
                   scontrol=_sweep_scontrol("exit 0"))
    prepared = _sweep(tmp_path, "resources.nodes=1,2")
    with pytest.raises(KeyboardInterrupt):
        api.launch(prepared, check=False)
    assert len(_calls(fakes, "sbatch")) == 2 and "release 12" in _calls(fakes, "scontrol")
    records = sorted((json.loads(p.read_text()) for p in Path(prepared.sweep_dir).glob("*/run.json")),
                     key=lambda r: r["nodes"])
    assert [(r["state"], r["job_id"]) for r in records] == [("PENDING", "12_0"), ("REFUSED", None)], records
    assert records[1]["reason"] == "interrupted" and "before its array was queued" in records[1]["detail"]
    assert _calls(fakes, "scancel") == []           # the second sbatch queued nothing


def test_fake_sweep_array_is_released_once_every_element_names_its_task(tmp_path, monkeypatch, isolated_env):
    fakes = _fakes(tmp_path, monkeypatch, sbatch=("accepts", 'echo "Submitted batch job 13"'),
                   squeue=("has no job", "true"),
                   scontrol=_sweep_scontrol("exit 0"))
    prepared = _sweep(tmp_path, "hparams.lr=0.1,0.2")
    last = Path(prepared.prepared[-1].plan.run_dir)       # its record and task are put in place last
    (fakes / "watch").write_text(str(last / "run.json"))
    sweep = api.launch(prepared, check=False)
    assert [r.job_id for r in sweep.runs] == ["13_0", "13_1"] and _calls(fakes, "scancel") == []
    assert _calls(fakes, "sbatch")[0].startswith("--hold ")
    assert json.loads((fakes / "at_release.json").read_text())["job_id"] == "13_1"
    assert slurm_submit.submitted_pickle(last / "logs", "13_1").is_file()


def test_fake_a_release_answered_as_failed_that_went_through_counts_as_released(tmp_path, monkeypatch,
                                                                                isolated_env):
    """A release whose first answer was lost, asked again: Slurm refuses (the job is no longer
    held) while squeue shows it released; the job is not cancelled."""
    fakes = _fakes(tmp_path, monkeypatch, sbatch=("accepts", 'echo "Submitted batch job 14"'),
                   squeue=("lists the job released, waiting for resources", 'echo "14|Resources"'),
                   scontrol=("says the job is not held", "echo 'Job is no longer pending execution for job 14' >&2; "
                                                         "exit 1"))
    run = api.launch(_prepared(tmp_path), check=False)
    assert run.job_id == "14" and run.state == "PENDING"
    assert _calls(fakes, "scancel") == [] and "-j 14 -o %i|%r" in _calls(fakes, "squeue")[-1]


def test_the_refusal_names_the_profile_as_sites_check_finds_it(tmp_path, monkeypatch, isolated_env):
    """`glaunch sites check X` in a refusal's advice: the name where the search path finds
    this very file by it, else the file's path, quoted (a profile given as a file)."""
    from launcher.config.sites import find_site
    from launcher.schedulers.slurm.scheduler import site_reference

    monkeypatch.chdir(tmp_path)
    shipped = find_site("local-slurm", tmp_path, os.environ)
    assert site_reference("local-slurm", str(shipped)) == "local-slurm"
    mine = tmp_path / "my site's.yaml"
    mine.write_text("name: badacct\nextends: local-slurm\naccount: nosuch\n")
    assert site_reference("badacct", str(mine)) == shlex.quote(str(mine))
    # Named like a shipped profile, but another file: the name would check the shipped one.
    assert site_reference("local-slurm", str(mine)) == shlex.quote(str(mine))

"""Helpers for the tests that run on the local Slurm clusters (scripts/local-slurm up [NAME]).

Two clusters run side by side: `main` (site local-slurm, the default) and `defaults` (site
local-slurm-defaults, Slurm's defaults). A client command reaches one through SLURM_CONF
(`scripts/local-slurm env NAME`). The helpers take `cluster=`; without it they use the
environment as it is, which tests/conftest.py points at `main` and the `slurm_defaults_env`
fixture at `defaults`."""

from __future__ import annotations

import contextlib
import fcntl
import functools
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, Mapping

from launcher.jobcontrol.controller import kill_wait_s
from launcher.schedulers.slurm.client import is_transient
from launcher.schedulers.slurm.state import SACCT_FORMAT, base_state, parse_sacct, parse_squeue

REPO = Path(__file__).resolve().parent.parent
LOCAL_SLURM = REPO / "scripts" / "local-slurm"
MAIN = "main"
DEFAULTS = "defaults"
SITES = {MAIN: "local-slurm", DEFAULTS: "local-slurm-defaults"}
SITE = SITES[MAIN]


@functools.cache
def cluster_env(cluster: str = MAIN) -> dict[str, str]:
    """The variables (SLURM_CONF) that point Slurm's commands at one local cluster, as
    `scripts/local-slurm env NAME` prints them."""
    text = subprocess.run(["bash", str(LOCAL_SLURM), "env", cluster], capture_output=True, text=True,
                          timeout=30, check=True).stdout
    variables = {}
    for line in text.splitlines():
        words = shlex.split(line)
        if words[:1] == ["export"]:
            variables.update(word.split("=", 1) for word in words[1:])
    return variables


def with_cluster(env: Mapping[str, str] | None, cluster: str | None) -> dict[str, str]:
    """`env` (default: this process's environment) pointed at `cluster`; unchanged for None."""
    env = dict(os.environ if env is None else env)
    if cluster is not None:
        env.update(cluster_env(cluster))
    return env


def slurm_up(cluster: str = MAIN) -> bool:
    """The cluster's controller answers and a node can take jobs."""
    try:
        proc = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20,
                              env=with_cluster(None, cluster))
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and any(state in proc.stdout for state in ("idle", "mixed", "allocated"))


# One test at a time on a cluster, whoever runs it: xdist's groups keep a session's tests of
# one cluster on one worker, and this lock holds them apart where groups do not reach (a
# `-n 2` run without `--dist loadgroup`, two pytest sessions at once, a group marker lost).
# The lock lives in /tmp because the clusters are the machine's, not a checkout's. The lock
# is not fair: a test outside a cluster's group (the tests that need no cluster but one
# sbatch call) may wait out that group's whole stage, which CI bounds at 45 minutes.
TURN_WAIT_S = 2700.0


def turn_lock_path(cluster: str) -> Path:
    """GLAUNCH_TEST_TURN_DIR moves the locks (the tests of the locks themselves use their own)."""
    return Path(os.environ.get("GLAUNCH_TEST_TURN_DIR", "/tmp")) / f"glaunch-tests-cluster-{cluster}.lock"


@contextlib.contextmanager
def cluster_turn(cluster: str, holder: str, wait_s: float = TURN_WAIT_S) -> Iterator[float]:
    """Hold the cluster for one test: wait for the test before it to let go (up to wait_s),
    then for its jobs to leave the queue, so a test starts on free nodes. Yields how long it
    waited for the lock (0.0 where nobody held it)."""
    path = turn_lock_path(cluster)
    with open(path, "a+") as lock:
        waited = take_turn(lock, cluster, wait_s)
        lock.seek(0)
        lock.truncate()
        lock.write(f"{os.getpid()} {holder}\n")
        lock.flush()
        try:
            wait_queue_drained(cluster, limit_s=120.0)
            yield waited
        finally:
            lock.seek(0)
            lock.truncate()
            fcntl.flock(lock, fcntl.LOCK_UN)


def take_turn(lock, cluster: str, wait_s: float) -> float:
    started = time.monotonic()
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return time.monotonic() - started
        except BlockingIOError:
            if time.monotonic() - started > wait_s:
                lock.seek(0)
                raise TimeoutError(f"cluster {cluster} held for over {wait_s:.0f} s by {lock.read().strip()!r}") from None
            time.sleep(0.5)


def wait_queue_drained(cluster: str, limit_s: float) -> None:
    """Wait until the cluster's queue holds no job (the test before may have left one ending)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            queued = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=20,
                                    env=with_cluster(None, cluster)).stdout.split()
        except (OSError, subprocess.TimeoutExpired):
            return
        if not queued:
            return
        time.sleep(1.0)


def glaunch(*args, env, cwd=REPO, timeout=600, cluster: str | None = None) -> subprocess.CompletedProcess:
    """The CLI in a subprocess with `env`, pointed at `cluster` when given."""
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], cwd=cwd, env=with_cluster(env, cluster),
                          capture_output=True, text=True, timeout=timeout)


def submit(example: str, runs: Path, env, *overrides, wait: bool = True, site: str | None = None,
           timeout: int = 600, cluster: str | None = None,
           console: bool = False) -> tuple[subprocess.CompletedProcess, dict]:
    """`glaunch submit --json` on the cluster (site: the cluster's profile); returns the
    process and its JSON (or {}). With `console`, no --json: stdout is what a user sees
    (with --wait, the run's console) and the dict holds run_id, job_id and state from the
    run.json of the one run under `runs`."""
    site = site or SITES[cluster or MAIN]
    args = ["submit", example, "--site", site, "--runs-dir", str(runs), *([] if console else ["--json"]), *overrides]
    if wait:
        args.insert(1, "--wait")
    proc = glaunch(*args, env=env, timeout=timeout, cluster=cluster)
    if console:
        records = [read_json(p) for p in runs.glob("*/run.json")]
        return proc, ({k: records[0].get(k) for k in ("run_id", "job_id", "state")} if len(records) == 1 else {})
    try:
        info = json.loads(proc.stdout)
    except ValueError:
        info = {}
    return proc, info


# A test whose point is not how ranks share a node runs one rank per node: each rank
# process costs this CPU-bound machine about 9 CPU-seconds to start (torch, then DDP's
# torch._dynamo), and every test's runs compete for the same two cores.
ONE_RANK_PER_NODE = "resources.gpus_per_node=1"


def assert_completed_on_two_nodes(run_dir: Path, job_id: str, steps: int, tasks_per_rank: bool = True,
                                  ranks_per_node: int = 2) -> None:
    """A run of `ranks_per_node` ranks on each of `main`'s two nodes ended as it should:
    accounting, the bytes sbatch received, the result and a checkpoint, each rank on the
    node Slurm put it on (one task per rank: `tasks_per_rank`), run.json's start."""
    world = 2 * ranks_per_node
    assert final_sacct_state(job_id) == "COMPLETED"
    assert out("sacct", "-n", "-P", "-X", "-j", job_id, "-o", "NodeList").split() == ["node[1-2]"]
    # The script sbatch received is job.sbatch, byte for byte.
    assert out("scontrol", "write", "batch_script", job_id, "-") == (run_dir / "job.sbatch").read_text()
    result = read_json(run_dir / "result.json")
    assert result["world_size"] == world and result["final_step"] == steps
    assert any(p.name.startswith("step-") for p in (run_dir / "checkpoints").iterdir())
    if tasks_per_rank:
        logs = {p.name: p.read_text() for p in (run_dir / "logs").glob(f"{job_id}_*_log.err")}
        assert len(logs) == world
        # Slurm places ranks block-wise: node1's first, then node2's.
        for rank in range(world):
            node = f"node{rank // ranks_per_node + 1}"
            assert f"rank {rank}/{world} on {node}:" in logs[f"{job_id}_{rank}_log.err"], rank
    record = read_json(run_dir / "run.json")
    assert record["job_id"] == job_id and record["state"] == "COMPLETED"
    assert record["starts"][0]["state"] == "COMPLETED" and record["starts"][0]["nodes"] == "node[1-2]"


def out(*cmd: str, cluster: str | None = None) -> str:
    """A Slurm command's stdout; retried while the controller is busy or restarting (a
    loaded CI machine makes it time out now and then), an error otherwise."""
    for attempt in range(4):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=with_cluster(None, cluster))
        if proc.returncode == 0 or not is_transient(proc.stderr) or attempt == 3:
            break
        time.sleep(2 + 3 * attempt)
    proc.check_returncode()
    return proc.stdout


def sacct_rows(job_id: str, cluster: str | None = None) -> list[dict[str, str]]:
    """One row per start of the job (requeues included), allocation lines only, as
    launcher.schedulers.slurm.state reads them (job_id, state, exit_code, nodes, ...)."""
    return parse_sacct(out("sacct", "-n", "-P", "-D", "-X", "-j", job_id, "-o", ",".join(SACCT_FORMAT),
                           cluster=cluster))


def final_sacct_state(job_id: str, timeout: float = 300, cluster: str | None = None) -> str:
    """sacct's state of the job's last start, once accounting has it (slurmdbd lags a little)."""
    deadline = time.monotonic() + timeout
    state = ""
    while time.monotonic() < deadline:
        rows = sacct_rows(job_id, cluster)
        state = base_state(rows[-1]["state"]) if rows else ""
        if state and state not in ("PENDING", "RUNNING", "REQUEUED"):
            return state
        time.sleep(1)
    return state


def squeue_state(job_id: str, cluster: str | None = None) -> str:
    """squeue's state of the job; "" once squeue no longer lists it (or, MinJobAge after its
    end, answers "Invalid job id specified")."""
    try:
        return parse_squeue(out("squeue", "-h", "-j", job_id, "-o", "%T", cluster=cluster)) or ""
    except subprocess.CalledProcessError as exc:
        if "invalid job id" in (exc.stderr or "").lower():
            return ""
        raise


def wait_until(predicate, timeout: float, what: str, interval: float = 1.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


_pending_since: dict[str, float] = {}
_settle_s: dict[str | None, float] = {}
SETTLE_MARGIN_S = 5.0


def settle_s(cluster: str | None = None) -> float:
    """How long a requeued job waits before its hold is released: the cluster's KillWait and
    a margin. Released sooner, its new start can begin on a node where the previous start is
    still being ended, under the same job id. (Waiting this long did not prevent the step
    cancel Slurm 22.05 once sent a new start 8 s in: test_slurm_requeue.py allows for it.)"""
    if cluster not in _settle_s:
        _settle_s[cluster] = kill_wait_s(out("scontrol", "show", "config", cluster=cluster)) + SETTLE_MARGIN_S
    return _settle_s[cluster]


def release_requeue_hold(job_id: str, cluster: str | None = None) -> None:
    """A requeued job waits ~120 s (its BeginTime moves ahead); let it start sooner, but only
    once it has waited settle_s: started while its previous start is still being torn down,
    Slurm kills it at launch ("Job credential revoked"), or ends it as it ends that start."""
    if squeue_state(job_id, cluster) != "PENDING":
        _pending_since.pop(job_id, None)
        return
    since = _pending_since.setdefault(job_id, time.monotonic())
    if time.monotonic() - since >= settle_s(cluster):
        subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], capture_output=True,
                       timeout=30, env=with_cluster(None, cluster))
        _pending_since.pop(job_id, None)


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes that contain ``text`` (the tasks name their run dir)."""
    found = []
    for proc_dir in Path("/proc").iterdir():
        if not proc_dir.name.isdigit():
            continue
        try:
            cmdline = (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and "pytest" not in cmdline:
            found.append(f"{proc_dir.name}: {cmdline}")
    return found


def kill_step_daemons(job_id: str, step: int, run_dir: Path) -> int:
    """SIGKILL the slurmstepd of job step JOB.STEP whose tasks are those of `run_dir` (by
    their GLAUNCH_RUN_DIR: another cluster's job may have the same number), as the OOM killer
    or an administrator may take a node's: the tasks run on, orphaned, and srun waits for
    word of them that never comes. How many daemons were killed."""
    title, wanted = f"slurmstepd: [{job_id}.{step}]", f"GLAUNCH_RUN_DIR={run_dir}".encode()
    killed = 0
    for proc_dir in Path("/proc").iterdir():
        try:
            if not proc_dir.name.isdigit() or (proc_dir / "cmdline").read_bytes().rstrip(b"\0") != title.encode():
                continue
            children = (proc_dir / "task" / proc_dir.name / "children").read_text().split()
            if any(wanted in Path(f"/proc/{child}/environ").read_bytes().split(b"\0") for child in children):
                os.kill(int(proc_dir.name), signal.SIGKILL)
                killed += 1
        except (OSError, ProcessLookupError):
            continue
    return killed


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def start_submit(example: str, runs: Path, env, *overrides, site: str | None = None,
                 cluster: str | None = None) -> subprocess.Popen:
    """`glaunch submit --wait --json` in the background (the test acts on the job meanwhile)."""
    site = site or SITES[cluster or MAIN]
    return subprocess.Popen([sys.executable, "-m", "launcher.cli", "submit", "--wait", example, "--site", site,
                             "--runs-dir", str(runs), "--json", *overrides], cwd=REPO,
                            env=with_cluster(env, cluster), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def the_run_dir(runs: Path) -> Path:
    return wait_until(lambda: next((p for p in Path(runs).glob("*") if (p / "run.json").exists()), None),
                      300, "the run directory")


def job_id_of(run_dir: Path) -> str:
    return wait_until(lambda: read_json(run_dir / "run.json").get("job_id"), 300, "the job id")


def rank0_steps(run_dir: Path, job_id: str) -> list[int]:
    """Steps rank 0 has logged so far (its log is appended across starts)."""
    log = Path(run_dir) / "logs" / f"{job_id}_0_log.out"
    if not log.exists():
        return []
    return [int(m) for m in re.findall(r"^step (\d+)/", log.read_text(errors="replace"), re.M)]


def finish(proc: subprocess.Popen, job_id: str | None, timeout: float,
           cluster: str | None = None) -> tuple[int, str, str]:
    """Wait for a background submit, releasing requeue holds meanwhile."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        if time.monotonic() > deadline:
            proc.kill()
            if job_id:
                subprocess.run(["scancel", job_id], capture_output=True, timeout=30, env=with_cluster(None, cluster))
            stdout, stderr = proc.communicate()
            raise AssertionError(f"the run did not end within {timeout}s\n{stdout[-2000:]}\n{stderr[-2000:]}")
        if job_id:
            release_requeue_hold(job_id, cluster)
        time.sleep(2)
    stdout, stderr = proc.communicate()
    return proc.returncode, stdout, stderr


def preempt(nodes: int = 2, seconds: int = 3) -> str:
    """A high-priority job on main's `urgent` partition over the same nodes: Slurm preempts
    (requeues) what runs on `debug`."""
    text = out("sbatch", "--parsable", "-p", "urgent", f"-N{nodes}", "--exclusive", "-t", "2",
               "-o", "/dev/null", "--wrap", f"sleep {seconds}", cluster=MAIN)
    return text.strip().split(";")[0]

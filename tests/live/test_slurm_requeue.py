"""Time limits, preemption and crashes on the real local Slurm cluster: the run checkpoints,
requeues itself, resumes from the newest complete checkpoint and ends with bitwise the
parameters of a run that was never interrupted; restarts are bounded. (Two preemptions of
one run: tests/live/test_status_slurm.py, which also checks what `status` says of them.)

Slurm holds a requeued job about 120 s before it may start again; the tests release that
hold (scontrol update StartTime=now) so they take minutes, not quarters of an hour."""

from __future__ import annotations

import json
import re
import subprocess
import textwrap
import time
from datetime import datetime
from pathlib import Path

import pytest

from conftest import requires_slurm
from slurmkit import (DEFAULTS, ONE_RANK_PER_NODE, REPO, SITE, assert_completed_on_two_nodes, final_sacct_state, finish, glaunch, job_id_of, preempt, rank0_steps, read_json,
                      release_requeue_hold, sacct_rows, squeue_state, start_submit, submit, the_run_dir,
                      wait_until)

pytestmark = [requires_slurm, pytest.mark.slurm, pytest.mark.slow]

_baselines: dict[tuple, tuple[str, Path, str]] = {}


def baseline_run(example: str, steps: int, tmp_path_factory, env, nodes: int = 2,
                 cluster: str | None = None) -> tuple[str, Path, str]:
    """An uninterrupted run on `nodes` nodes, one rank each (ONE_RANK_PER_NODE, as the runs
    compared with it), one per example, length, size and cluster: its param_sha256, run
    directory and job id."""
    key = (example, steps, nodes, cluster)
    if key not in _baselines:
        runs = tmp_path_factory.mktemp("baseline")
        proc, info = submit(example, runs, env, f"resources.nodes={nodes}", ONE_RANK_PER_NODE,
                            f"entrypoint.args=[--steps,{steps}]",
                            cluster=cluster)
        assert proc.returncode == 0, proc.stderr[-3000:]
        run_dir = runs / info["run_id"]
        _baselines[key] = (read_json(run_dir / "result.json")["param_sha256"], run_dir, info["job_id"])
    return _baselines[key]


def baseline_hash(example: str, steps: int, tmp_path_factory, env, nodes: int = 2,
                  cluster: str | None = None) -> str:
    """param_sha256 of an uninterrupted run on `nodes` nodes (baseline_run)."""
    return baseline_run(example, steps, tmp_path_factory, env, nodes, cluster)[0]


def assert_resumed_without_loss(record: dict, reason: str, min_requeues: int) -> None:
    starts = record["starts"]
    assert len(starts) >= min_requeues + 1, starts
    for before, after in zip(starts, starts[1:]):
        assert before["state"] == "REQUEUED" and before["reason"] == reason, before
        # The step it stopped at is the step the next start resumed from: nothing lost.
        assert before["stopped_at"] is not None and after["resumed_from"] == before["stopped_at"], (before, after)
    assert starts[-1]["state"] == "COMPLETED", starts[-1]
    assert [s["restart"] for s in starts] == list(range(len(starts)))
    assert record["state"] == "COMPLETED"


def stalled_start(record: dict) -> dict | None:
    """A start that ended without getting past the step its predecessor stopped at."""
    starts = record.get("starts", [])
    for before, after in zip(starts, starts[1:]):
        if after.get("stopped_at") is not None and after["stopped_at"] <= (before.get("stopped_at") or 0):
            return after
    return None


def finish_while_progressing(proc, job_id: str, run_dir, timeout: float) -> tuple[int, str, str]:
    """Wait for the run to end for as long as every start gets further than the one
    before it; how many starts that takes depends on the machine, not on this test."""
    deadline = time.monotonic() + timeout
    while proc.poll() is None:
        stalled = stalled_start(read_json(run_dir / "run.json"))
        if stalled is not None or time.monotonic() > deadline:
            proc.kill()
            # The run's current job: a start after a time limit may be a new job.
            subprocess.run(["scancel", job_id, str(read_json(run_dir / "run.json").get("job_id"))],
                           capture_output=True, timeout=60)
            stdout, stderr = proc.communicate()
            why = f"start {stalled} made no progress" if stalled else f"the run did not end within {timeout}s"
            raise AssertionError(f"{why}\n{stdout[-2000:]}\n{stderr[-2000:]}")
        release_requeue_hold(job_id)
        time.sleep(2)
    stdout, stderr = proc.communicate()
    return proc.returncode, stdout, stderr


@pytest.mark.release_only     # on Slurm 24.11; on 22.05 the plain Lightning script's test meets the time limit
def test_time_limit_resubmits_and_resumes_bitwise(tmp_path, tmp_path_factory, slurm_defaults_env):
    # 120 s of steps against a 2-minute limit warned 10 s ahead. slurmctld checks time limits
    # every 30 s and sends the warning at the first check that is within lead + 30 s of the
    # limit: 80 to 110 s into each start, so no start can finish the run and two or more
    # do. (A 1-minute limit left a start on a loaded machine no time to train: its warning
    # came while its ranks were still importing torch, 20 s in, one step a start.)
    # The test is bounded by progress (every start must get further), not by a count of
    # starts that the machine's speed decides. requeue.mode is the default, resubmit: each
    # start after a time limit is a new job, chained after the one before it (the requeue
    # road is the preemption tests' below). On `defaults`: a time limit needs no preemption,
    # and this cluster's tests run beside `main`'s.
    steps = 480
    env = slurm_defaults_env
    expected = baseline_hash("examples/torch_ddp.yaml", steps, tmp_path_factory, env, cluster=DEFAULTS)
    proc = start_submit("examples/torch_ddp.yaml", tmp_path / "runs", env, "resources.nodes=2", ONE_RANK_PER_NODE,
                        "resources.time=2", "requeue.signal_lead_s=10", "requeue.max=100",
                        "checkpoint.every_steps=1000", f"entrypoint.args=[--steps,{steps},--seconds-per-step,0.25]",
                        cluster=DEFAULTS)
    run_dir = the_run_dir(tmp_path / "runs")
    job_id = job_id_of(run_dir)
    code, stdout, stderr = finish_while_progressing(proc, job_id, run_dir, timeout=1500)
    assert code == 0, stdout[-2000:] + stderr[-2000:]

    record = read_json(run_dir / "run.json")
    assert_resumed_without_loss(record, "timeout", min_requeues=1)
    assert read_json(run_dir / "result.json")["param_sha256"] == expected
    # One job per start, each ended COMPLETED with one start of its own; run.json's job is the last.
    jobs = [s["job_id"] for s in record["starts"]]
    assert jobs[0] == job_id and len(set(jobs)) == len(jobs) and record["job_id"] == jobs[-1], jobs
    # --wait returns once the job recorded its end; accounting has it a little later.
    assert final_sacct_state(jobs[-1], cluster=DEFAULTS) == "COMPLETED"
    # Each job one row of its own. A start stopped at the warning ends COMPLETED; on a busy
    # machine its save and the next job's sbatch may outlast the 10 s lead, and the limit
    # then ends it (TIMEOUT) with nothing lost: the run's record and result say so above.
    states = [[r["state"] for r in sacct_rows(job, DEFAULTS)] for job in jobs]
    assert all(len(rows) == 1 and rows[0] in ("COMPLETED", "TIMEOUT") for rows in states[:-1]), states
    assert states[-1] == ["COMPLETED"], states
    # Each job's rank 0 log tells its start's story.
    logs = [(run_dir / "logs" / f"{job}_0_log.out").read_text() for job in jobs]
    assert ["resumed from" in log for log in logs] == [False] + [True] * (len(jobs) - 1)
    status = json.loads(glaunch("status", record["run_id"], "--json", env=env, cluster=DEFAULTS).stdout)
    assert status["state"] == "COMPLETED" and status["restarts"] == len(record["starts"]) - 1


def run_with_preemptions(example: str, steps: int, times: int, tmp_path, env, *, every: int,
                         seconds_per_step: float, min_progress: int = 5, timeout: float = 900) -> tuple[dict, str]:
    """Submit, and each time the run has made progress in its current start, preempt it."""
    proc = start_submit(example, tmp_path / "runs", env, "resources.nodes=2", ONE_RANK_PER_NODE, "resources.time=15",
                        f"checkpoint.every_steps={every}", "requeue.max=5",
                        f"entrypoint.args=[--steps,{steps},--seconds-per-step,{seconds_per_step},--log-every,1]")
    run_dir = the_run_dir(tmp_path / "runs")
    job_id = job_id_of(run_dir)
    for n in range(times):
        seen = len(rank0_steps(run_dir, job_id))

        def making_progress():
            release_requeue_hold(job_id)
            return squeue_state(job_id) == "RUNNING" and len(rank0_steps(run_dir, job_id)) >= seen + min_progress

        wait_until(making_progress, 600, f"progress before preemption {n + 1}", interval=0.5)
        preempt()
        wait_until(lambda: any(s["restart"] == n and s["state"] == "REQUEUED"
                               for s in read_json(run_dir / "run.json")["starts"]),
                   300, f"preemption {n + 1} to requeue the job")
    code, stdout, stderr = finish(proc, job_id, timeout=timeout)
    assert code == 0, stdout[-2000:] + stderr[-2000:]
    return read_json(run_dir / "run.json"), job_id


# Lightning's FSDP strategy stops and resumes bitwise in tests/runtime/test_lightning_strategies.py (local site).
# FSDP and Lightning on Slurm 24.11 (which requeues the preempted job itself), DeepSpeed here:
# each preemption road on both releases (on 22.05 also the sweep's, the twice-preempted status
# test's and the plain Lightning script's warning), and this host's `main` free for its other
# tests. (DeepSpeed builds its CPU communication extension on first use, which the 24.11
# sandbox cannot.)
@pytest.mark.parametrize("example,steps", [
    ("examples/deepspeed_zero2.yaml", 40),
    pytest.param("examples/lightning_ddp.yaml", 60, marks=pytest.mark.release_only),
    pytest.param("examples/fsdp.yaml", 40, marks=pytest.mark.release_only)])
def test_framework_preempted_once_resumes_bitwise(example, steps, tmp_path, tmp_path_factory, isolated_env):
    # The uninterrupted run it is compared with: the example on two nodes, as the torch
    # example's own test checks it (tests/live/test_slurm_submit.py).
    expected, base_dir, base_job = baseline_run(example, steps, tmp_path_factory, isolated_env)
    assert_completed_on_two_nodes(base_dir, base_job, steps, ranks_per_node=1)
    record, _ = run_with_preemptions(example, steps, 1, tmp_path, isolated_env, every=1000, seconds_per_step=0.3,
                                     min_progress=5)
    assert_resumed_without_loss(record, "preemption", min_requeues=1)
    run_dir = tmp_path / "runs" / record["run_id"]
    assert read_json(run_dir / "result.json")["param_sha256"] == expected
    if "fsdp" in example:
        assert "export GLAUNCH_STRATEGY=fsdp\n" in (run_dir / "env.sh").read_text()
    if example == "examples/fsdp.yaml":
        # The checkpoint the preemption left is sharded: a torch.distributed.checkpoint file from every rank.
        stopped = record["starts"][0]["stopped_at"]
        manifest = read_json(run_dir / "checkpoints" / f"step-{stopped:08d}" / "manifest.json")
        assert manifest["layout"]["state"] == "dcp"
        writers = {s["rank"] for s in manifest["shards"] if s["path"].endswith(".distcp")}
        assert writers == set(range(read_json(run_dir / "result.json")["world_size"]))


# --- crashes ------------------------------------------------------------------------------------

def _site_with(tmp_path, body: str, base: str = SITE):
    path = tmp_path / "site.yaml"
    path.write_text(f"name: retrying\nextends: {base}\n{body}")
    return path


KILLER = textwrap.dedent("""\
    # torch_ddp, except that on the first start rank 1 is SIGKILLed right after it wrote its
    # shard of the checkpoint at step KILL_STEP: the checkpoint is left half-written.
    import os, runpy, signal, sys
    import torch
    from launcher import runtime as rt

    KILL_STEP = int(os.environ["KILL_STEP"])
    _save = torch.save

    def save(obj, f, *args, **kwargs):
        _save(obj, f, *args, **kwargs)
        ctx = rt.context()
        if ctx.restart == 0 and ctx.rank == 1 and isinstance(obj, dict) and obj.get("step") == KILL_STEP:
            os.kill(os.getpid(), signal.SIGKILL)

    torch.save = save
    sys.argv[0] = {script!r}
    runpy.run_path({script!r}, run_name="__main__")
""")


def test_rank_killed_mid_checkpoint_resumes_from_the_previous_one(tmp_path, tmp_path_factory, slurm_defaults_env):
    # On `defaults` (no preemption needed), beside `main`'s tests; 40 steps, as the spare's
    # test below: one uninterrupted run to compare with for both.
    steps, every, kill_step = 40, 10, 30
    expected = baseline_hash("examples/torch_ddp.yaml", steps, tmp_path_factory, slurm_defaults_env,
                             cluster=DEFAULTS)
    (tmp_path / "killer.py").write_text(KILLER.format(script=str(REPO / "examples" / "torch_ddp.py")))
    exp = tmp_path / "exp.yaml"
    exp.write_text(f"name: killed\nentrypoint: {{script: killer.py, args: ['--steps', '{steps}']}}\n"
                   f"resources: {{nodes: 2, gpus_per_node: 1, time: '10'}}\ncheckpoint: {{every_steps: {every}, keep: 5}}\n")
    env = dict(slurm_defaults_env, KILL_STEP=str(kill_step))
    # crash_retries 2: the kill takes one; the other is for a start that something outside the
    # run ends as it begins (a CI run saw Slurm 22.05 cancel the requeued job's new step 8 s
    # in, on the nodes its previous start had just left).
    proc = start_submit(str(exp), tmp_path / "runs", env, cluster=DEFAULTS,
                        site=str(_site_with(tmp_path, "crash_retries: 2\n", "local-slurm-defaults")))
    run_dir = the_run_dir(tmp_path / "runs")
    code, stdout, stderr = finish(proc, job_id_of(run_dir), timeout=600, cluster=DEFAULTS)
    assert code == 0, stdout[-2000:] + stderr[-2000:]
    record = read_json(run_dir / "run.json")
    first, *later = record["starts"]
    assert first["state"] == "REQUEUED" and first["reason"] == "crash", first
    assert later and later[-1]["state"] == "COMPLETED" and len(later) <= 2, later
    # The half-written step-30 was never loaded: the first start that loaded a checkpoint loaded step 20.
    loaded = [s["resumed_from"] for s in later if s["resumed_from"] is not None]
    assert loaded and loaded[0] == kill_step - every, later
    err = "".join(p.read_text() for p in (run_dir / "logs").glob("*_0_log.*"))
    previous = run_dir / "checkpoints" / f"step-{kill_step - every:08d}"
    assert f"resumed from {previous}" in err
    assert read_json(run_dir / "result.json")["param_sha256"] == expected


CRASH = "import sys\nprint('about to fail', flush=True)\nsys.exit(3)\n"


# requeue.max reached before crash_retries: the same road, decided in tests/jobcontrol/test_requeue_decision.py.
@pytest.mark.parametrize("retries,requeue_max,starts,detail", [
    # srun's status is that of whichever task it reports (1, or 143 for one it terminated).
    (2, 5, 3, r"exit status \d+; crash_retries \(2\) used up; task \d on dnode\d: RuntimeError: glaunch: the "
              r"entry point exited with status 3"),
])
def test_crash_fails_after_bounded_retries(retries, requeue_max, starts, detail, tmp_path, slurm_defaults_env):
    # On `defaults`, beside `main`'s tests: 2 nodes of its 3, so no step can restart in the
    # allocation without the crashed node, and each crash requeues.
    (tmp_path / "boom.py").write_text(CRASH)
    exp = tmp_path / "exp.yaml"
    exp.write_text(f"name: boom\nentrypoint: {{script: boom.py}}\nresources: {{nodes: 2, time: '5'}}\n"
                   f"requeue: {{max: {requeue_max}}}\n")
    proc = start_submit(str(exp), tmp_path / "runs", slurm_defaults_env, cluster=DEFAULTS,
                        site=str(_site_with(tmp_path, f"crash_retries: {retries}\n", "local-slurm-defaults")))
    run_dir = the_run_dir(tmp_path / "runs")
    code, stdout, _ = finish(proc, job_id_of(run_dir), timeout=600, cluster=DEFAULTS)
    assert code == 1
    record = read_json(run_dir / "run.json")
    assert [s["reason"] for s in record["starts"]] == ["crash"] * starts
    assert [s["state"] for s in record["starts"]] == ["REQUEUED"] * (starts - 1) + ["FAILED"]
    assert record["state"] == "FAILED"
    status = glaunch("status", record["run_id"], env=slurm_defaults_env, cluster=DEFAULTS).stdout
    assert re.search(f"reason: crash; {detail}", status) and f"{starts - 1} restart(s)" in status, status


# torch_ddp, except that rank 0 raises in start N at step CRASH_STEPS[N] (its first starts).
CRASHER = textwrap.dedent("""\
    import os, runpy, sys
    from launcher import runtime as rt

    CRASH_STEPS = [int(s) for s in os.environ["CRASH_STEPS"].split(",")]
    should_stop = rt.should_stop

    def crashing_should_stop(step=None, total=None):
        restart = rt.context().restart
        if os.environ.get("RANK") == "0" and restart < len(CRASH_STEPS) and step == CRASH_STEPS[restart]:
            raise RuntimeError("injected failure on this node")
        return should_stop(step=step, total=total)

    rt.should_stop = crashing_should_stop
    sys.argv[0] = {script!r}
    runpy.run_path({script!r}, run_name="__main__")
""")


def crash_to_resumed_step_s(before: dict, after: dict) -> float:
    """From the failed start's last step to the next start's first: what the crash cost in
    time, besides the steps it lost."""
    return (datetime.fromisoformat(after["first_step_at"]).timestamp()
            - datetime.fromisoformat(before["last_step_at"]).timestamp())


# On 22.05 a spare swapped in the same job is the peer-recovery, slow-node and hang tests' road.
@pytest.mark.release_only
def test_a_crash_swaps_in_the_spare_then_with_none_left_requeues(tmp_path, tmp_path_factory, slurm_defaults_env):
    """2 nodes + 1 spare (all of `defaults`): rank 0 crashes in start 0; a new job step of
    the same job runs on the other two nodes (the spare in place of the crashed one) and
    resumes from the newest checkpoint. Rank 0 crashes again there: no node is left to
    spare, so the job requeues, and its next allocation trains to the end. Final parameters
    equal an uninterrupted run's; crash -> first resumed step by both roads, same run."""
    steps, every, crash_steps = 40, 10, (15, 25)
    env = slurm_defaults_env
    expected = baseline_hash("examples/torch_ddp.yaml", steps, tmp_path_factory, env, nodes=2, cluster=DEFAULTS)
    (tmp_path / "crasher.py").write_text(CRASHER.format(script=str(REPO / "examples" / "torch_ddp.py")))
    exp = tmp_path / "exp.yaml"
    exp.write_text(f"name: spare\nentrypoint: {{script: crasher.py, args: ['--steps', '{steps}']}}\n"
                   f"resources: {{nodes: 2, spare_nodes: 1, gpus_per_node: 1, time: '10'}}\n"
                   f"checkpoint: {{every_steps: {every}, keep: 2}}\n")
    site = tmp_path / "site.yaml"
    site.write_text("name: retrying\nextends: local-slurm-defaults\ncrash_retries: 2\n")
    proc = start_submit(str(exp), tmp_path / "runs", dict(env, CRASH_STEPS=",".join(map(str, crash_steps))),
                        site=str(site), cluster=DEFAULTS)
    run_dir = the_run_dir(tmp_path / "runs")
    job_id = job_id_of(run_dir)
    # Slurm's hold of the requeued job (about 120 s) is left alone: it is what that road costs.
    try:
        code, stdout, stderr = finish(proc, None, timeout=900, cluster=DEFAULTS)
    finally:
        subprocess.run(["scancel", job_id], capture_output=True, timeout=30)
    assert code == 0, stdout[-2000:] + stderr[-2000:]
    record = read_json(run_dir / "run.json")
    first, second, third = record["starts"]
    allocation = {"dnode1", "dnode2", "dnode3"}
    assert (first["state"], first["reason"], first["job_id"], first["spare_nodes"]) == (
        "RESTARTED", "crash", job_id, 1), first
    bad = first["bad_node"]
    assert first["left_out"] == bad and bad in first["nodes"].split(","), first
    # The new step: the crashed step's healthy node and the spare, never the crashed node.
    assert set(second["nodes"].split(",")) == allocation - {bad} and second["restart"] == 1, second
    assert (second["state"], second["reason"], second["resumed_from"]) == ("REQUEUED", "crash", every), second
    assert "not excluded" in second["exclusion"], second        # 3 nodes exist; the job asks for 3
    assert (third["state"], third["restart"], third["job_id"], third["resumed_from"]) == (
        "COMPLETED", 2, job_id, 2 * every), third
    assert record["state"] == "COMPLETED"
    # Slurm's accounting: two allocations (one requeue), not three.
    assert len([r for r in sacct_rows(job_id, DEFAULTS) if r["job_id"] == job_id]) == 2
    assert read_json(run_dir / "result.json")["param_sha256"] == expected
    status = glaunch("status", record["run_id"], env=env, cluster=DEFAULTS).stdout
    spare = next(iter(set(second["nodes"].split(",")) - set(first["nodes"].split(","))))
    assert f"{bad} left out of the next step in the allocation; {spare} took its place" in status, status
    assert "1 restart(s) in the allocation, not through the queue (1 on a spare node)" in status, status
    in_allocation, requeue = crash_to_resumed_step_s(first, second), crash_to_resumed_step_s(second, third)
    print(f"crashed on {bad}: the spare {spare} took its place in the same allocation, crash -> first resumed step "
          f"{in_allocation:.1f} s; the second crash requeued: {requeue:.1f} s ({in_allocation / requeue:.3f}x)")

"""The hang watchdog on the local Slurm cluster (`defaults`): one rank of a 1-node job
sleeps inside its loop on the first start; the watchdog beside the job step (job.sbatch)
finds the stall, gets every rank's stack through Slurm (scancel --signal), ends the step;
jobend records the hang and, the hang pointing at no one node, starts a new job step on
the same node in the same allocation (no requeue); the run resumes and ends bitwise like an
uninterrupted run. That new step loses its slurmstepd as its ranks train (SIGKILL): the
ranks run on to their end and exit, and srun, waiting for word from the lost daemon, would
hold the allocation to its time limit; the watchdog ends the step once it has outlived
every rank's exit, and the run completes, saying why its step was ended. And a slow rank with `watchdog.slow_node: exclude` and a spare node:
the watchdog stops the start as soon as it names the rank, and the run goes on on the spare."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

import pytest

from launcher.jobcontrol.jobend import OUTLIVED
from launcher.jobcontrol.watchdog import OUTLIVED_S
from launcher.rundir.layout import read_heartbeat
from slurmkit import DEFAULTS, finish, job_id_of, kill_step_daemons, read_json, start_submit, the_run_dir, wait_until
from test_watchdog_local import EXPERIMENT, HANGING_SCRIPT, status_of, submit

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

STALL_S = 20
SITE = """
name: slurm-retry
extends: local-slurm-defaults
crash_retries: 1
"""


def test_a_hung_rank_on_slurm_is_found_dumped_and_the_run_resumes_bitwise(tmp_path, slurm_defaults_env,
                                                                          isolated_env):
    (tmp_path / "hang_ddp.py").write_text(HANGING_SCRIPT)
    (tmp_path / "hang.yaml").write_text(EXPERIMENT)
    (tmp_path / "site.yaml").write_text("name: local-retry\nextends: local\ncrash_retries: 1\n")
    (tmp_path / "slurm-site.yaml").write_text(SITE)
    local_env = {k: v for k, v in slurm_defaults_env.items() if k != "SLURM_CONF"}
    base_dir, base, _ = submit(tmp_path, "base", local_env)       # the same run, uninterrupted, on this machine
    assert base.returncode == 0, base.stdout[-3000:] + base.stderr[-3000:]

    began = time.time()
    proc = start_submit(str(tmp_path / "hang.yaml"), tmp_path / "runs", slurm_defaults_env,
                        f"watchdog.stall_s={STALL_S}", "env.HANG_RANK=1",
                        site=str(tmp_path / "slurm-site.yaml"), cluster=DEFAULTS)
    run_dir = the_run_dir(tmp_path / "runs")
    job_id = job_id_of(run_dir)
    # Start 1's step (the allocation's second, JOB.1) loses its slurmstepd once its ranks train.
    wait_until(lambda: _stepped_in_start(run_dir, 1), 600, "start 1's first step", interval=0.2)
    assert kill_step_daemons(job_id, 1, run_dir) == 1, _batch_log(run_dir)
    code, stdout, stderr = finish(proc, job_id, timeout=900, cluster=DEFAULTS)
    assert code == 0, stdout[-2000:] + stderr[-3000:] + _batch_log(run_dir)
    record = read_json(run_dir / "run.json")
    first, last = record["starts"][0], record["starts"][-1]
    assert (first["state"], first["reason"]) == ("RESTARTED", "hang"), (first, _batch_log(run_dir))
    assert last["job_id"] == job_id and last["restart"] == 1 and last["nodes"] == first["nodes"], last
    assert (last["state"], last["reason"]) == ("COMPLETED", None), last
    assert last["detail"] == OUTLIVED, (last, _batch_log(run_dir))
    outlived = datetime.fromisoformat(last["ended"]).timestamp() - (run_dir / "result.json").stat().st_mtime
    # The grace after the last exit, a poll, and srun's own wait for the lost daemon (KillWait).
    assert OUTLIVED_S <= outlived < OUTLIVED_S + 60, outlived

    hang = first["hang"]
    assert hang["kind"] == "stall" and {s["rank"] for s in hang["silent"]} >= {1}
    # The watchdog beside the job step recorded the bound it held the start to.
    assert (first["watchdog"]["bound_s"], first["watchdog"]["basis"]) == (STALL_S, "fixed"), first
    assert last["watchdog"]["stall_s"] == STALL_S and last["watchdog"]["slow"] == [], last
    assert all(s["node"] and s["node"].startswith("dnode") for s in hang["silent"])
    latency = (datetime.fromisoformat(hang["detected_at"]).timestamp()
               - max(s["last_step_at"] for s in hang["silent"]))
    # detected_at is cut to the millisecond; the upper bound is the step's time limit.
    assert STALL_S - 1e-3 <= latency < 600, latency
    stacks = {Path(p).name: (run_dir / p).read_text() for p in hang["stacks"]}
    assert set(stacks) == {f"stack-{job_id}_0_0.txt", f"stack-{job_id}_0_1.txt"}, (stacks, _batch_log(run_dir))
    assert "hang_here" in stacks[f"stack-{job_id}_0_1.txt"]

    result, expected = read_json(run_dir / "result.json"), read_json(base_dir / "result.json")
    assert result["resumed_from"] == 10 and result["final_step"] == 30
    assert result["param_sha256"] == expected["param_sha256"]
    print(f"detection latency {latency:.1f} s (stall_s {STALL_S}); step outlived its ranks' results by "
          f"{outlived:.0f} s; Slurm run {time.time() - began:.0f} s")


def _stepped_in_start(run_dir: Path, restart: int) -> bool:
    beat = read_heartbeat(run_dir / "heartbeats" / "rank-00000.json")
    return beat is not None and beat.get("restart") == restart and beat.get("step") is not None


SLOW_STEPS = 120
SLOW_EXTRA_S = 0.1          # half the example's 0.2 s of work a step


def test_a_slow_rank_s_node_is_swapped_for_the_spare_at_once_and_the_run_ends_bitwise(
        tmp_path, slurm_defaults_env, isolated_env):
    """1 training node + 1 spare, 2 ranks: rank 1 does half as much work again a step in
    start 0. The watchdog names it with its node, records the swap and asks the ranks to
    save and stop; the next step runs on the spare in the same job, from the step the stop
    saved (nothing lost), no longer slow, and ends bitwise like an uninterrupted run."""
    (tmp_path / "hang_ddp.py").write_text(HANGING_SCRIPT)
    (tmp_path / "hang.yaml").write_text(EXPERIMENT)
    (tmp_path / "site.yaml").write_text("name: local-retry\nextends: local\ncrash_retries: 1\n")
    (tmp_path / "slurm-site.yaml").write_text(SITE)
    shape = [f"hparams.steps={SLOW_STEPS}", "checkpoint.every_steps=1000", "watchdog.slow_node=exclude",
             "watchdog.auto_floor_s=1"]
    # Heartbeats every second (the job inherits the submitting environment): windows close sooner.
    env = dict(slurm_defaults_env, GLAUNCH_HEARTBEAT_S="1")
    local_env = {k: v for k, v in env.items() if k != "SLURM_CONF"}
    base_dir, base, _ = submit(tmp_path, "base", local_env, *shape)
    assert base.returncode == 0, base.stdout[-3000:] + base.stderr[-3000:]

    proc = start_submit(str(tmp_path / "hang.yaml"), tmp_path / "runs", env, *shape, "resources.spare_nodes=1", "env.SLOW_RANK=1", f"env.SLOW_EXTRA_S={SLOW_EXTRA_S}",
                        "env.SLOW_STARTS=0", site=str(tmp_path / "slurm-site.yaml"), cluster=DEFAULTS)
    run_dir = the_run_dir(tmp_path / "runs")
    job_id = job_id_of(run_dir)
    code, stdout, stderr = finish(proc, job_id, timeout=600, cluster=DEFAULTS)
    assert code == 0, stdout[-2000:] + stderr[-3000:] + _batch_log(run_dir)
    record = read_json(run_dir / "run.json")
    first, last = record["starts"]
    assert (first["state"], first["reason"], first["job_id"]) == ("RESTARTED", "slow node", job_id), (
        first, _batch_log(run_dir))
    (named,) = first["watchdog"]["slow"]
    swap = first["watchdog"]["swap"]
    assert named["rank"] == 1 and named["node"] == first["nodes"] == first["left_out"] == swap["node"], first
    assert swap["spare"] == last["nodes"] != first["nodes"], (first, last)
    assert (last["state"], last["job_id"], last["restart"]) == ("COMPLETED", job_id, 1), last
    assert last["watchdog"]["slow"] == [] and "swap" not in last["watchdog"], last
    # A graceful stop: the new step resumed from the step the stop saved.
    assert first["stopped_at"] == last["resumed_from"] and first["stopped_at"] < SLOW_STEPS, (first, last)
    text = status_of(run_dir, isolated_env)
    assert f"slow node {first['nodes']} to leave for the spare {last['nodes']}" in text, text
    assert "1 restart(s) in the allocation, not through the queue (1 on a spare node)" in text, text

    result, expected = read_json(run_dir / "result.json"), read_json(base_dir / "result.json")
    assert result["final_step"] == SLOW_STEPS and result["param_sha256"] == expected["param_sha256"]
    named_after = _epoch(named["named_at"]) - _epoch(first["first_step_at"])
    swapped_in = _epoch(last["first_step_at"]) - _epoch(swap["asked_at"])
    print(f"slow rank named {named_after:.1f} s after the first step; swap asked -> first step on the spare "
          f"{swapped_in:.1f} s")


def _epoch(when: str) -> float:
    return datetime.fromisoformat(when).timestamp()


def _batch_log(run_dir: Path) -> str:
    return "\n".join(p.read_text(errors="replace")[-3000:] for p in (run_dir / "logs").glob("*_batch.log"))


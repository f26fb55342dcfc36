"""The hang watchdog on the local Slurm cluster (`defaults`): one rank of a 1-node job
sleeps inside its loop on the first start; the watchdog beside the job step (job.sbatch)
finds the stall, gets every rank's stack through Slurm (scancel --signal), ends the step;
jobend records the hang and, the hang pointing at no one node, starts a new job step on
the same node in the same allocation (no requeue); the run resumes and ends bitwise like an
uninterrupted run."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

import pytest

from slurmkit import DEFAULTS, finish, job_id_of, read_json, start_submit, the_run_dir
from test_watchdog_local import EXPERIMENT, HANGING_SCRIPT, submit

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
    code, stdout, stderr = finish(proc, job_id, timeout=900, cluster=DEFAULTS)
    assert code == 0, stdout[-2000:] + stderr[-3000:] + _batch_log(run_dir)
    record = read_json(run_dir / "run.json")
    first, last = record["starts"][0], record["starts"][-1]
    assert (first["state"], first["reason"]) == ("RESTARTED", "hang"), (first, _batch_log(run_dir))
    assert last["job_id"] == job_id and last["restart"] == 1 and last["nodes"] == first["nodes"], last
    assert (last["state"], last["reason"]) == ("COMPLETED", None), last

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
    print(f"detection latency {latency:.1f} s (stall_s {STALL_S}); Slurm run {time.time() - began:.0f} s")


def _batch_log(run_dir: Path) -> str:
    return "\n".join(p.read_text(errors="replace")[-3000:] for p in (run_dir / "logs").glob("*_batch.log"))


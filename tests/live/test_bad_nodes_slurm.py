"""requeue.exclude_bad_nodes on the local Slurm cluster (`defaults`, nodes dnode1 to
dnode3): the first start of a 1-node job crashes; jobend blames the node of the first
failing task, the batch script requeues the job and keeps it off that node (scontrol
update ExcNodeList after the requeue: Slurm 22.05 refuses it for a running job), and the
next start runs on another node and completes."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from slurmkit import DEFAULTS, finish, job_id_of, out, read_json, start_submit, the_run_dir

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]

CRASHING_SCRIPT = f'''
import os, sys
sys.path.insert(0, {str(REPO / "examples")!r})
import torch_ddp
from launcher import runtime as rt

should_stop = rt.should_stop


def crashing_should_stop(step=None, total=None):
    if os.environ.get("RANK") == "0" and os.environ.get("GLAUNCH_RESTART") == "0" and step == 5:
        raise RuntimeError("injected failure on this node")
    return should_stop(step=step, total=total)


rt.should_stop = crashing_should_stop
sys.exit(torch_ddp.main())
'''

EXPERIMENT = """
name: badnode
entrypoint:
  script: crash_ddp.py
  args: ["--steps", "20", "--seconds-per-step", "0.1"]
launcher: srun
resources: {nodes: 1, gpus_per_node: 1, time: "00:10:00"}
strategy: {name: ddp}
precision: fp32
batch: {micro_size: 8}
checkpoint: {every_steps: 10, keep: 2}
requeue: {max: 3, signal_lead_s: 30}
"""

SITE = """
name: slurm-retry
extends: local-slurm-defaults
crash_retries: 1
"""


def test_a_crash_on_one_node_requeues_the_job_without_it(tmp_path, slurm_defaults_env):
    (tmp_path / "crash_ddp.py").write_text(CRASHING_SCRIPT)
    (tmp_path / "badnode.yaml").write_text(EXPERIMENT)
    (tmp_path / "site.yaml").write_text(SITE)
    began = time.time()
    proc = start_submit(str(tmp_path / "badnode.yaml"), tmp_path / "runs", slurm_defaults_env,
                        site=str(tmp_path / "site.yaml"), cluster=DEFAULTS)
    run_dir = the_run_dir(tmp_path / "runs")
    job_id = job_id_of(run_dir)
    code, stdout, stderr = finish(proc, job_id, timeout=900, cluster=DEFAULTS)
    assert code == 0, stdout[-2000:] + stderr[-3000:]

    record = read_json(run_dir / "run.json")
    first, last = record["starts"][0], record["starts"][-1]
    assert (first["state"], first["reason"]) == ("REQUEUED", "crash"), first
    bad = first["bad_node"]
    assert bad in ("dnode1", "dnode2", "dnode3") and first["nodes"] == bad, first
    assert first["exclusion"] == f"{bad} excluded from later starts"
    assert record["excluded_nodes"] == [bad]
    assert (last["state"], last["reason"]) == ("COMPLETED", None), last
    assert last["nodes"] != bad and last["excluded_nodes"] == [bad], last
    assert read_json(run_dir / "result.json")["final_step"] == 20
    shown = out("scontrol", "show", "job", job_id, cluster=DEFAULTS)
    assert f"ExcNodeList={bad}" in shown
    print(f"crashed on {bad}, completed on {last['nodes']}; {time.time() - began:.0f} s")

"""--after on the real local Slurm cluster: a run waits for another (a Slurm dependency)
although a node is free, and a dependency on a run that then fails is reported as never
able to start."""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import requires_slurm
from slurmkit import final_sacct_state, glaunch, out, read_json, submit, wait_until
from launcher.schedulers.slurm.state import parse_sacct

pytestmark = [requires_slurm, pytest.mark.slurm, pytest.mark.slow]


def sacct_times(job_id: str) -> tuple[str, str]:
    rows = parse_sacct(out("sacct", "-n", "-P", "-X", "-j", job_id, "-o",
                           "JobID,State,ExitCode,Start,End,Elapsed,NodeList,Reason"))
    return rows[-1]["start"], rows[-1]["end"]


@pytest.mark.release_only     # Slurm's dependencies read alike on both releases; 24.11's clusters are idle
def test_second_run_starts_only_after_the_first_ended(tmp_path, isolated_env):
    # Long enough that the first is seen running however quickly the machine starts it.
    args = "entrypoint.args=[--steps,60,--seconds-per-step,0.5]"
    proc, first = submit("examples/torch_ddp.yaml", tmp_path / "runs", isolated_env, args, wait=False)
    assert proc.returncode == 0, proc.stderr
    proc, second = submit("examples/torch_ddp.yaml", tmp_path / "runs", isolated_env, "entrypoint.args=[--steps,10]",
                          "--after", first["run_id"], wait=False)
    assert proc.returncode == 0, proc.stderr
    job = out("scontrol", "show", "job", second["job_id"])
    assert f"Dependency=afterok:{first['job_id']}" in job
    # While the first runs on one node the other node is free, and the second waits for it.
    wait_until(lambda: json.loads(glaunch("status", first["run_id"], "--json", env=isolated_env).stdout)["state"]
               == "RUNNING", 300, "the first run to start")
    sinfo = out("sinfo", "-h", "-N", "-p", "debug", "-o", "%N %t")
    assert "idle" in sinfo or "mix" in sinfo, sinfo
    status = json.loads(glaunch("status", second["run_id"], "--json", env=isolated_env).stdout)
    assert status["state"] == "PENDING" and status["after"][0]["job_ids"] == [first["job_id"]]
    wait_until(lambda: read_json(tmp_path / "runs" / second["run_id"] / "run.json")["state"] == "COMPLETED"
               or json.loads(glaunch("status", second["run_id"], "--json", env=isolated_env).stdout)["state"]
               in ("COMPLETED", "FAILED", "CANCELLED"), 600, "the second run to end")
    # Accounting can lag the end of a job: read the times once it has each one's final state.
    assert final_sacct_state(first["job_id"]) == "COMPLETED"
    assert final_sacct_state(second["job_id"]) == "COMPLETED"
    first_start, first_end = sacct_times(first["job_id"])
    second_start, _ = sacct_times(second["job_id"])
    assert second_start >= first_end > first_start, (first_start, first_end, second_start)
    assert read_json(tmp_path / "runs" / second["run_id"] / "run.json")["state"] == "COMPLETED"


FAIL = "import sys, time\ntime.sleep(8)\nsys.exit(1)\n"


def test_after_ok_on_a_run_that_fails_never_starts(tmp_path, isolated_env):
    (tmp_path / "fail.py").write_text(FAIL)
    exp = tmp_path / "fail.yaml"
    exp.write_text("name: fails\nentrypoint: {script: fail.py}\nresources: {nodes: 1, time: '5'}\n"
                   "requeue: {max: 0, signal_lead_s: 10}\n")
    proc, failing = submit(str(exp), tmp_path / "runs", isolated_env, wait=False)
    assert proc.returncode == 0, proc.stderr
    proc, waiting = submit("examples/torch_ddp.yaml", tmp_path / "runs", isolated_env, "--after",
                           f"{failing['run_id']}:ok", wait=False)
    assert proc.returncode == 0, proc.stderr
    try:
        def blocked():
            summary = json.loads(glaunch("status", waiting["run_id"], "--json", env=isolated_env).stdout)
            return summary if summary.get("reason") == "never starts" else None

        summary = wait_until(blocked, 300, "the dependent run to be reported as never starting")
        assert summary["state"] == "PENDING"
        assert "the run it waits for ended in a way its dependency excludes (--after)" in summary["detail"]
        assert "Reason=DependencyNeverSatisfied" in summary["detail"]
        assert read_json(tmp_path / "runs" / failing["run_id"] / "run.json")["state"] == "FAILED"
        assert "never starts" in glaunch("status", waiting["run_id"], env=isolated_env).stdout
        # Submitting again now that the failure is known is refused at once, nothing queued.
        proc, _ = submit("examples/torch_ddp.yaml", tmp_path / "runs2", isolated_env, "--after", failing["run_id"],
                         wait=False)
        assert proc.returncode == 2 and "could never start" in proc.stderr
        assert not (tmp_path / "runs2").exists()
    finally:
        cancelled = glaunch("cancel", waiting["run_id"], env=isolated_env)
        if cancelled.returncode != 0:
            subprocess.run(["scancel", waiting["job_id"]], capture_output=True, timeout=30)
    assert f"cancelled job {waiting['job_id']}" in cancelled.stdout


def test_after_a_sweep_waits_for_its_array(tmp_path, isolated_env):
    site = tmp_path / "site.yaml"
    site.write_text("name: later\nextends: local-slurm\nsbatch: {begin: now+300}\n")
    proc = glaunch("submit", "examples/torch_ddp.yaml", "--site", str(site), "--runs-dir", str(tmp_path / "runs"),
                   "--json", "--sweep", "entrypoint.args=[--steps,5],[--steps,6]", env=isolated_env)
    assert proc.returncode == 0, proc.stderr
    sweep = json.loads(proc.stdout)
    array_id = sweep["arrays"][0]["job_id"]
    waiting = None
    try:
        proc, waiting = submit("examples/torch_ddp.yaml", tmp_path / "runs", isolated_env, "--after",
                               f"{sweep['sweep_id']}:any", wait=False, site=str(site))
        assert proc.returncode == 0, proc.stderr
        assert f"Dependency=afterany:{array_id}" in out("scontrol", "show", "job", waiting["job_id"])
    finally:
        glaunch("cancel", sweep["sweep_id"], env=isolated_env)
        if waiting:
            glaunch("cancel", waiting["run_id"], env=isolated_env)

"""glaunch status of a resumed run (text and --json): each resume (when, the overrides,
how the run had ended, from which start on its job runs), the starts grouped by job, and
goodput without the time the run spent ended; the planner's fsdp row beside an fsdp run's
peak; and a local run resumed end to end, its console and its status."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from launcher import api
from launcher.rundir import registry
from launcher.runner.goodput import epoch
from launcher.views.status_text import format_status
from launcher.runner.status import summarize

REPO = Path(__file__).resolve().parents[2]
DDP = str(REPO / "examples" / "torch_ddp.yaml")
T0 = "2025-03-01T10:00:00+00:00"


def at(seconds: int) -> str:
    hours, rest = divmod(seconds, 3600)
    return f"2025-03-01T{10 + hours:02d}:{rest // 60:02d}:{rest % 60:02d}+00:00"


def resumed_run(tmp_path: Path) -> Path:
    """A run whose first job timed out after a requeue, left ended for an hour, then
    resumed on 1 node with new steps: its job's start resumed from step 240."""
    run = api.submit(DDP, dry_run=True, runs_dir=str(tmp_path / "runs"))
    with registry.updating(run.run_dir) as record:
        record.dry_run, record.state, record.job_id = False, "COMPLETED", "200"
        record.created = T0
        record.starts += [
            registry.new_start("100", 0, submitted=T0, started=at(10), ended=at(100), state="REQUEUED",
                               reason="timeout", stopped_at=120, first_step=1, first_step_at=at(20),
                               last_step=120, last_step_at=at(80), step_time_s={"median": 0.5}),
            registry.new_start("100", 1, started=at(130), ended=at(220), state="TIMEOUT", reason="timeout",
                               resumed_from=120, stopped_at=240, first_step=121, first_step_at=at(140),
                               last_step=240, last_step_at=at(200), step_time_s={"median": 0.5}),
            registry.new_start("200", 0, started=at(3850), ended=at(3930), state="COMPLETED", resumed_from=240,
                               first_step=241, first_step_at=at(3860), last_step=360, last_step_at=at(3920),
                               step_time_s={"median": 0.5})]
        record.extra["resumes"] = [{
            "number": 1, "at": at(3820), "overrides": ["entrypoint.args=[--steps,360]"],
            "previous_files": "resumes/1", "first_start": 2, "nodes": 1, "world_size": 2, "partition": "local",
            "ended": {"state": "TIMEOUT", "reason": "timeout", "detail": "out of requeues", "job_id": "100",
                      "nodes": 1, "world_size": 2, "partition": "local", "scheduler_history": ["x"]}}]
    return run.run_dir


def test_status_shows_each_resume_and_groups_the_starts_by_job(tmp_path, isolated_env):
    run_dir = resumed_run(tmp_path)
    summary = summarize(run_dir, registry.read(run_dir), now=1e10)
    (resume,) = summary["resumes"]
    assert resume == {
        "number": 1, "at": at(3820), "overrides": ["entrypoint.args=[--steps,360]"],
        "ended": {"state": "TIMEOUT", "reason": "timeout", "detail": "out of requeues", "job_id": "100",
                  "nodes": 1, "world_size": 2, "partition": "local"},
        "previous_files": "resumes/1", "nodes": 1, "world_size": 2, "partition": "local",
        "first_start": 2, "started": True, "resumed_from": 240}
    assert summary["restarts"] == 1                # the resumed job's first start is no restart
    good = summary["goodput"]
    assert good["idle_s"] == 3820 - 220 and good["wall_s"] == (3930 - 10) - (3820 - 220)
    assert good["ettr"] == round(360 * 0.5 / 320, 4)
    assert good["starts"][2]["queue_wait_s"] == 30 and [r["resume"] for r in good["starts"]] == [0, 0, 1]

    text = format_status(summary)
    lines = text.splitlines()
    assert lines[0].endswith("(site local, job 200, 1 restart(s), 1 resume(s))")
    opened = [i for i, line in enumerate(lines) if line.startswith(("  submitted", "  resume 1 at"))]
    starts = [i for i, line in enumerate(lines) if re.match(r"  start \d: job", line)]
    assert len(opened) == 2 and len(starts) == 3
    assert opened[0] < starts[0] < starts[1] < opened[1] < starts[2]
    assert lines[opened[0]] == f"  submitted at {T0}:"
    assert lines[opened[1]] == (
        f"  resume 1 at {at(3820)}: the run had ended TIMEOUT (timeout; out of requeues) as job 100; "
        "overrides: entrypoint.args=[--steps,360]; now 1 node(s), world size 2, partition local; "
        "its job runs from starts[2] on, resumed from step 240:")
    assert "1h00m ended before a resume left out" in text
    assert "    resume 1, start 0: queue 30.0 s" in text


def test_a_resume_whose_job_has_not_started(tmp_path, isolated_env):
    run_dir = resumed_run(tmp_path)
    with registry.updating(run_dir) as record:
        del record.starts[2]
        record.state, record.job_id = "PENDING", "200"
    summary = summarize(run_dir, registry.read(run_dir), now=epoch(at(3830)))
    assert summary["resumes"][0]["started"] is False and summary["resumes"][0]["resumed_from"] is None
    text = format_status(summary)
    lines = text.splitlines()
    (head,) = [i for i, line in enumerate(lines) if line.startswith("  resume 1 at")]
    assert lines[head].endswith("partition local; its job has not started yet:")
    assert max(i for i, line in enumerate(lines) if re.match(r"  start \d: job", line)) < head
    assert summary["goodput"]["wall_s"] == (3830 - 10) - (3820 - 220)


def test_status_compares_an_fsdp_run_s_peak_with_the_planner_s_fsdp_row(tmp_path, isolated_env):
    from launcher.config.load import load_experiment
    from launcher.config.sites import load_site
    from launcher.resolution.strategy import plan_for

    # bf16: in fp32 Adam zero3's DeepSpeed count and fsdp's are the same, 16 sharded bytes each
    overrides = ["model.params=2e8", "precision=bf16"]
    # A dry run on local-slurm (its partitions say their GPUs' memory, as the planner needs; no Slurm asked).
    run = api.submit(str(REPO / "examples" / "fsdp.yaml"), site="local-slurm", overrides=overrides, dry_run=True,
                     runs_dir=str(tmp_path / "runs"))
    with registry.updating(run.run_dir) as record:
        record.starts.append(registry.new_start("1", 0, state="COMPLETED", peak_memory_gb=1.5,
                                                memory={"kind": "cuda"}))
    planned = plan_for(load_experiment(REPO / "examples" / "fsdp.yaml", overrides),
                       load_site("local-slurm", REPO, dict(isolated_env)))
    fsdp, zero3 = planned.row("fsdp").total_gb, planned.row("zero3").total_gb
    assert round(fsdp, 3) != round(zero3, 3)
    memory = summarize(run.run_dir, registry.read(run.run_dir), now=0)["memory"]
    assert memory["planned"] == {"strategy": "fsdp", "estimate_gb": round(fsdp, 3), "from": "planner"}
    assert memory["ratio"] == round(1.5 / round(fsdp, 3), 3)


def glaunch(*args: str, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def test_a_local_run_resumed_end_to_end(tmp_path, isolated_env):
    runs = tmp_path / "runs"
    first = glaunch("submit", DDP, "--runs-dir", str(runs), "--json", "entrypoint.args=[--steps,20]",
                    env=isolated_env)
    assert first.returncode == 0, first.stderr
    run_id = json.loads(first.stdout)["run_id"]

    again = glaunch("resume", run_id, "entrypoint.args=[--steps,30]", env=isolated_env)
    assert again.returncode == 0, again.stderr
    events = [line for line in again.stdout.splitlines() if line.startswith("[glaunch] ") and " | " not in line]
    assert events[0] == "[glaunch] resumed (resume 1) from step 20", again.stdout
    assert re.findall(r"^step (\d+)/", again.stdout, re.M) == ["30"]     # the new job's log only
    assert re.search(rf"\[glaunch\] run {run_id} COMPLETED at step 30 after 1 start\(s\) of resume 1 in ",
                     again.stdout), again.stdout

    status = glaunch("status", run_id, "--json", env=isolated_env)
    assert status.returncode == 0, status.stderr
    summary = json.loads(status.stdout)
    (resume,) = summary["resumes"]
    assert resume["overrides"] == ["entrypoint.args=[--steps,30]"] and resume["ended"]["state"] == "COMPLETED"
    assert resume["first_start"] == 1 and resume["resumed_from"] == 20
    record = json.loads((runs / run_id / "run.json").read_text())
    # Times in run.json are whole seconds: the resume may come in the second the first job ended.
    idle = max(0.0, epoch(resume["at"]) - epoch(record["starts"][0]["ended"]))
    span = epoch(record["starts"][1]["ended"]) - epoch(record["starts"][0]["started"])
    # goodput rounds to the millisecond; the epochs carry float noise below it.
    assert summary["goodput"]["idle_s"] == pytest.approx(idle, abs=1e-3)
    assert summary["goodput"]["wall_s"] == pytest.approx(span - idle, abs=2e-3)
    text = glaunch("status", run_id, env=isolated_env)
    assert text.returncode == 0, text.stderr
    assert "  resume 1 at " in text.stdout and "its job runs from starts[1] on, resumed from step 20:" in text.stdout


@pytest.mark.parametrize("strategy, expected", [
    ({"name": "deepspeed", "zero_stage": 2, "offload_optimizer": "cpu", "offload_params": "none"}, "zero2_offload"),
    ({"name": "deepspeed", "zero_stage": 3, "offload_optimizer": "cpu", "offload_params": "cpu"}, "zero3_offload"),
    # ZeRO-3 with the optimizer alone on the host: the planner has no such row, so no comparison.
    ({"name": "deepspeed", "zero_stage": 3, "offload_optimizer": "cpu", "offload_params": "none"}, None),
    ({"name": "deepspeed", "zero_stage": 3, "offload_optimizer": "none", "offload_params": "none"}, "zero3"),
    ({"name": "deepspeed", "zero_stage": 0}, "ddp"),
    ({"name": "fsdp"}, "fsdp"),
])
def test_the_planner_row_a_run_is_compared_with(strategy, expected):
    from launcher.runner.status import planner_strategy

    derived = {"strategy": strategy["name"], "zero_stage": strategy.get("zero_stage")}
    assert planner_strategy(derived, {"strategy": strategy}) == expected

"""glaunch resume without Slurm: which runs it refuses (nothing written), the recorded
configuration with the new overrides on top, run.json's earlier starts kept and the new
ones appended, a local-site run trained further in its own run directory, and a DeepSpeed
ZeRO-2 checkpoint loaded at another world size through its verified universal copy."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from launcher import api
from launcher.errors import ConfigError
from launcher.rundir import registry
from launcher.rundir.layout import RunDir
from launcher.schedulers.local import hold_job_lock

REPO = Path(__file__).resolve().parents[2]
DDP = str(REPO / "examples" / "torch_ddp.yaml")


def glaunch(*args, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def snapshot(run_dir: Path) -> dict[str, bytes]:
    """Every file of the run directory with its bytes."""
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*")) if p.is_file()}


def ended_run(tmp_path: Path, state: str = "CANCELLED", *overrides: str) -> Path:
    """A rendered run whose record says it was submitted and ended in `state` (no job ran)."""
    run = api.submit(DDP, overrides=list(overrides), dry_run=True, runs_dir=str(tmp_path / "runs"))
    with registry.updating(run.run_dir) as record:
        record.dry_run = False
        record.state = state
        record.job_id = "4711"
        record.starts.append(registry.new_start("4711", 0, state=state))
    return run.run_dir


@pytest.mark.parametrize("state", ["PENDING", "RUNNING", "REQUEUED", "SUBMITTING"])
def test_a_run_still_queued_or_running_is_refused_and_nothing_written(tmp_path, isolated_env, state):
    run_dir = ended_run(tmp_path, state)
    lock = hold_job_lock(RunDir(run_dir))       # its local job is alive (a record whose job has gone ends)
    try:
        before = snapshot(run_dir)
        proc = glaunch("resume", str(run_dir), "entrypoint.args=[--steps,80]", env=isolated_env)
    finally:
        os.close(lock)
    assert proc.returncode == 2, proc.stderr
    assert f"is {state} (job 4711): only a run that ended can be resumed" in proc.stderr
    assert "glaunch cancel" in proc.stderr and "Traceback" not in proc.stderr
    assert snapshot(run_dir) == before


def test_a_dry_run_is_refused(tmp_path, isolated_env):
    run = api.submit(DDP, dry_run=True, runs_dir=str(tmp_path / "runs"))
    proc = glaunch("resume", run.run_id, env=isolated_env)
    assert proc.returncode == 2 and "is a dry run: nothing ran to continue" in proc.stderr, proc.stderr


@pytest.mark.parametrize(("override", "message"), [
    ("resources.nodes=2", "partitions.local.max_nodes"),
    ("resources.gpus=3", "resources.gpus: unknown key"),
    ("checkpoint.dir=/elsewhere", "a resumed run keeps its checkpoint directory"),
    ("nokey", "is not KEY=VALUE"),
    ("site=other", "site: the run ran on site 'local'; a resumed run keeps its site"),
])
def test_bad_overrides_exit_2_and_write_nothing(tmp_path, isolated_env, override, message):
    run_dir = ended_run(tmp_path)
    before = snapshot(run_dir)
    proc = glaunch("resume", str(run_dir), override, env=isolated_env)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert snapshot(run_dir) == before


def test_one_override_string_is_one_override_and_the_runs_own_site_may_be_named(tmp_path, isolated_env):
    run_dir = ended_run(tmp_path)
    prepared = api.prepare_resume(run_dir, overrides="batch.micro_size=4", dry_run=True)
    assert prepared.overrides == ("batch.micro_size=4",) and prepared.plan.training.global_batch == 8
    assert api.prepare_resume(run_dir, overrides=["site=local"], dry_run=True).plan.site_name == "local"
    with pytest.raises(ConfigError) as info:
        api.prepare_resume(run_dir, overrides=5, dry_run=True)
    assert info.value.key == "overrides"


def test_overrides_go_on_top_of_the_recorded_configuration(tmp_path, isolated_env):
    # requeue.max=1 was the submission's own override: the resume keeps it, and changes only what it names.
    run_dir = ended_run(tmp_path, "COMPLETED", "requeue.max=1", "entrypoint.args=[--steps,20]")
    prepared = api.prepare_resume(run_dir, overrides=["entrypoint.args=[--steps,80]", "batch.micro_size=4"],
                                  dry_run=True)
    resolved = yaml.safe_load(prepared.files["resolved.yaml"])
    assert resolved["experiment"]["entrypoint"]["args"] == ["--steps", "80"]
    assert resolved["experiment"]["batch"]["micro_size"] == 4
    assert resolved["experiment"]["requeue"]["max"] == 1
    assert resolved["experiment"]["checkpoint"]["every_steps"] == 10
    assert resolved["derived"]["run_dir"] == str(run_dir) and resolved["run_id"] == run_dir.name
    assert resolved["derived"]["checkpoint_dir"] == str(run_dir / "checkpoints")
    assert prepared.plan.launch.entry_args == ("--steps", "80") and prepared.plan.training.global_batch == 8
    assert any("no complete checkpoint" in w for w in prepared.warnings)
    # A dry run writes nothing.
    before = snapshot(run_dir)
    proc = glaunch("resume", str(run_dir), "entrypoint.args=[--steps,80]", "--dry-run", "--json", env=isolated_env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["dry_run"] is True
    assert snapshot(run_dir) == before


def test_local_run_trained_further_in_its_run_directory(tmp_path, isolated_env):
    runs = tmp_path / "runs"
    first = glaunch("submit", DDP, "--runs-dir", str(runs), "--json", "entrypoint.args=[--steps,20]",
                    env=isolated_env)
    assert first.returncode == 0, first.stderr
    run_id = json.loads(first.stdout)["run_id"]
    run_dir = runs / run_id
    old_script = (run_dir / "job.sbatch").read_bytes()
    old_result = json.loads((run_dir / "result.json").read_text())
    assert old_result["final_step"] == 20

    again = glaunch("resume", run_id, "entrypoint.args=[--steps,40]", "--json", env=isolated_env)
    assert again.returncode == 0, again.stderr
    info = json.loads(again.stdout)
    assert info["run_dir"] == str(run_dir) and info["state"] == "COMPLETED"

    record = json.loads((run_dir / "run.json").read_text())
    assert record["state"] == "COMPLETED" and len(record["starts"]) == 2
    before, after = record["starts"]
    assert before["state"] == "COMPLETED" and before["resumed_from"] is None
    assert after["state"] == "COMPLETED" and after["resumed_from"] == 20 and after["job_id"] != before["job_id"]
    (entry,) = record["resumes"]
    assert entry["number"] == 1 and entry["overrides"] == ["entrypoint.args=[--steps,40]"]
    assert entry["ended"]["state"] == "COMPLETED" and entry["first_start"] == 1
    # The previous submission's files, and its start's result, are kept in resumes/1/.
    aside = run_dir / "resumes" / "1"
    assert (aside / "job.sbatch").read_bytes() == old_script
    assert json.loads((aside / "result.json").read_text()) == old_result
    result = json.loads((run_dir / "result.json").read_text())
    assert result["final_step"] == 40 and result["resumed_from"] == 20
    assert result["final_loss"] < 1.0 and result["param_sha256"] != old_result["param_sha256"]
    log = (run_dir / "logs" / f"{after['job_id']}_0_log.out").read_text()
    assert re.findall(r"^step (\d+)/40", log, re.M) == ["30", "40"]

    # Ended again: a second resume is numbered 2; a run resumed to where it is runs no step.
    third = glaunch("resume", run_id, "--json", env=isolated_env)
    assert third.returncode == 0, third.stderr
    record = json.loads((run_dir / "run.json").read_text())
    assert [r["number"] for r in record["resumes"]] == [1, 2] and len(record["starts"]) == 3
    assert (run_dir / "resumes" / "2" / "job.sbatch").exists()


def test_resume_of_a_sweep_names_its_elements(tmp_path, isolated_env):
    sweep = api.submit(DDP, dry_run=True, runs_dir=str(tmp_path / "runs"), sweep=["batch.micro_size=4,8"])
    with pytest.raises(ConfigError, match="is a sweep: resume its elements one by one"):
        api.prepare_resume(sweep.sweep_dir, dry_run=True)


def _ds(example: str, env, steps: int, ranks: int = 1) -> subprocess.CompletedProcess:
    launcher = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks)] if ranks > 1 else []
    proc = subprocess.run([sys.executable, *launcher, example, "--steps", str(steps), "--log-every", "5"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _sha(proc: subprocess.CompletedProcess, step: int) -> str:
    return re.search(rf"done: step {step} param_sha256 (\w+)", proc.stdout)[1]


def test_deepspeed_zero2_checkpoint_loads_at_another_world_size(tmp_path):
    pytest.importorskip("deepspeed")
    env = dict(os.environ, GLAUNCH_CHECKPOINT_DIR=str(tmp_path / "ckpt"), GLAUNCH_RUN_DIR=str(tmp_path / "run"),
               GLAUNCH_CHECKPOINT_EVERY="5", OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    example = str(REPO / "examples" / "deepspeed_zero2.py")
    sha_at_2 = _sha(_ds(example, env, 10, ranks=2), 10)

    # Loaded by one rank (no steps left): the very parameters the two ranks saved.
    loaded = _ds(example, env, 10)
    assert _sha(loaded, 10) == sha_at_2
    copy = tmp_path / "ckpt" / "universal" / "step-00000010"
    manifest = json.loads((copy / "manifest.json").read_text())
    assert manifest["framework"] == "deepspeed-universal" and manifest["extra"]["source"] == "step-00000010"
    assert manifest["extra"]["source_world_size"] == 2 and manifest["world_size"] == 1
    assert any(s["path"].startswith("deepspeed/zero/") for s in manifest["shards"])
    assert loaded.stderr.count("per-rank RNG streams are not restored") == 1
    assert ("resumed at world size 1 from a checkpoint saved at world size 2: per-rank RNG streams are not "
            "restored; the run is no longer bitwise reproducible") in loaded.stderr

    # A restart before the next save takes the verified copy as it is ...
    assert _sha(_ds(example, env, 10), 10) == sha_at_2
    assert json.loads((copy / "manifest.json").read_text())["created"] == manifest["created"]
    # ... unless it is damaged: then it is converted again.
    shard = next((copy / "deepspeed" / "zero").rglob("fp32.pt"))
    shard.write_bytes(b"\0" * shard.stat().st_size)
    again = _ds(example, env, 10)
    assert _sha(again, 10) == sha_at_2 and "converting again" in again.stderr
    assert json.loads((copy / "manifest.json").read_text())["created"] != manifest["created"]

    # Trained further at world size 1: a finite loss that goes on from where the two ranks stopped.
    further = _ds(example, env, 20)
    losses = [float(x) for x in re.findall(r"^step \d+/20 loss ([\d.]+)", further.stdout, re.M)]
    assert len(losses) == 2 and all(0 < v < 1.0 for v in losses), further.stdout
    assert "resumed from" in further.stdout and "(step 10)" in further.stdout


def test_the_experiment_file_is_recorded_whole_so_a_resume_from_another_folder_finds_it(tmp_path, isolated_env,
                                                                                      monkeypatch):
    """Submitted as `examples/exp.yaml` from the project's folder: resolved.yaml records the
    file's whole path. A resume reads the experiment again from the folder it runs from
    (over SSH, the code tree's root: here `examples/`), where the relative path named
    examples/examples/exp.yaml, and the entry script with it."""
    project = tmp_path / "project"
    (project / "examples").mkdir(parents=True)
    (project / "examples" / "train.py").write_text("print('ok')\n")
    (project / "examples" / "exp.yaml").write_text("name: exp\nentrypoint: {script: train.py}\n"
                                                   "resources: {nodes: 1, gpus_per_node: 0}\n")
    monkeypatch.chdir(project)
    run = api.submit("examples/exp.yaml", site="local", runs_dir=str(tmp_path / "runs"), dry_run=True)
    resolved = yaml.safe_load((Path(run.run_dir) / "resolved.yaml").read_text())
    assert resolved["experiment_file"] == str(project / "examples" / "exp.yaml")
    monkeypatch.chdir(project / "examples")
    from launcher.runner.resumable import RecordedConfig

    exp, _ = RecordedConfig.read(Path(run.run_dir)).load(())
    assert Path(exp.path) == project / "examples" / "exp.yaml"

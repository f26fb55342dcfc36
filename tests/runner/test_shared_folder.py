"""Two runs whose ranks work in one folder: a submission is warned when another live or
resumable run works where it would, and neither keeps its outputs in its own run
(launcher.runner.shared_folder); never when the folder is the run's own (over SSH), a
run-scoped value gives it one, or the script uses glaunch's runtime."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import time
from pathlib import Path

import pytest

from badinput import run_cli
from launcher import api
from launcher.rundir import registry
from launcher.rundir.records import RunRecord
from launcher.runner import shared_folder, submission
from launcher.runner.shared_folder import FolderUse, imports_runtime, names_own_folder, sharing, standing

REPO = Path(__file__).resolve().parents[2]
PLAIN = "import os\nos.makedirs('out', exist_ok=True)\nopen('out/ckpt.pt', 'w').write('step 3')\n"
RUNTIME = "import launcher.runtime as rt\n" + PLAIN
EXP = "name: {name}\nentrypoint:\n  script: {script}\n  args: {args}\nresources: {{nodes: 1, gpus_per_node: 0}}\n"


# --- the pure parts ---------------------------------------------------------------------------


@pytest.mark.parametrize("words, own", [
    ([], False),
    (["--out_dir=out", "--steps=3"], False),
    (["--out_dir=${run:dir}/out"], True),
    (["--ckpt", "${run:checkpoint_dir}"], True),
    (["--out_dir=out/${run:id}"], True),
    (["--seed=${run:restart}"], False),            # the same in every run: no folder of its own
    (["--lr=${hparams.lr}", "$HOME/out"], False),
])
def test_a_run_scoped_value_that_differs_between_runs_gives_a_run_its_own_outputs(words, own):
    assert names_own_folder(words) is own


def test_a_script_that_imports_the_runtime_keeps_its_checkpoints_in_its_run():
    assert imports_runtime(RUNTIME)
    assert imports_runtime("from launcher.runtime import device\n")
    assert not imports_runtime(PLAIN)
    assert not imports_runtime("# import launcher\nimport torch\n")
    assert not imports_runtime(None)                  # a module: not known


def record(state, starts=1, dry_run=False):
    return RunRecord.from_dict({"run_id": "r", "state": state, "dry_run": dry_run, "requeue_max": 3,
                                "starts": [{"job_id": str(100 + i), "restart": i} for i in range(starts)]})


@pytest.mark.parametrize("state, starts, dry_run, expected", [
    ("RUNNING", 1, False, "RUNNING"),
    ("PENDING", 1, False, "PENDING"),
    ("SUBMITTING", 0, False, "SUBMITTING"),
    ("REQUEUED", 2, False, "REQUEUED"),
    ("FAILED", 1, False, "FAILED, resumable"),
    ("CANCELLED", 1, False, "CANCELLED, resumable"),
    ("TIMEOUT", 3, False, "TIMEOUT, resumable"),
    ("COMPLETED", 1, False, None),
    ("REFUSED", 0, False, None),                       # never started: nothing of it to resume
    ("RENDERED", 0, True, None),
])
def test_only_a_live_or_resumable_run_is_named(state, starts, dry_run, expected):
    assert standing(record(state, starts, dry_run)) == expected


def test_sharing_needs_the_same_folder_and_neither_run_owning_its_outputs():
    this = FolderUse("new", "/work/exp", False)
    others = [FolderUse("a", "/work/exp/", False, "RUNNING"), FolderUse("b", "/work/other", False, "RUNNING"),
              FolderUse("c", "/work/exp", True, "FAILED, resumable"), FolderUse("new", "/work/exp", False, "RUNNING")]
    assert [o.run_id for o in sharing(this, others)] == ["a"]
    assert sharing(dataclasses.replace(this, own_outputs=True), others) == []


# --- through run records ----------------------------------------------------------------------


@pytest.fixture
def folder(tmp_path, isolated_env, monkeypatch):
    """A submit folder with a plain script that writes out/ckpt.pt, made the working directory."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text(PLAIN)
    (work / "runtime_train.py").write_text(RUNTIME)
    monkeypatch.chdir(work)
    return work


def experiment(folder: Path, name: str, script: str = "train.py", args: str = "[--out_dir=out]") -> str:
    path = folder / f"{name}.yaml"
    path.write_text(EXP.format(name=name, script=script, args=args))
    return str(path)


def earlier_run(folder: Path, state: str, *, name: str = "first", overrides=(), **kwargs) -> str:
    """A run submitted from `folder` as it stands once it ran to `state` (a dry run's bundle,
    its record moved on as a job would have moved it)."""
    run = api.submit(experiment(folder, name, **kwargs), site="local", overrides=list(overrides), dry_run=True)
    with registry.updating(run.run_dir) as rec:
        rec.dry_run, rec.state, rec.job_id = False, state, "1000"
        rec.starts = [registry.new_start("1000", 0, state=state)]
    return run.run_id


def warning_for(exp: str, overrides=()) -> str | None:
    prepared = submission.prepare(exp, site="local", overrides=list(overrides), dry_run=True)
    return shared_folder.warning(prepared.plan)


@pytest.mark.parametrize("state", ["RUNNING", "FAILED", "CANCELLED"])
def test_a_second_run_from_the_folder_of_a_live_or_resumable_run_is_warned(folder, state):
    first = earlier_run(folder, state)
    warning = warning_for(experiment(folder, "second"))
    assert warning is not None
    assert first in warning and str(folder) in warning
    assert "--out_dir=${run:dir}/out" in warning
    assert "\n" not in warning


def test_no_warning_beside_a_completed_run_or_a_dry_run(folder):
    earlier_run(folder, "COMPLETED")
    api.submit(experiment(folder, "dry"), site="local", dry_run=True)
    assert warning_for(experiment(folder, "second")) is None


def test_no_warning_when_this_run_keeps_its_outputs_in_its_own_run(folder):
    earlier_run(folder, "RUNNING")
    assert warning_for(experiment(folder, "second", args='["--out_dir=${run:dir}/out"]')) is None
    assert warning_for(experiment(folder, "third"), ["env.OUT=${run:checkpoint_dir}"]) is None
    assert warning_for(experiment(folder, "fourth", script="runtime_train.py")) is None


def test_no_warning_when_the_other_run_keeps_its_outputs_in_its_own_run(folder):
    earlier_run(folder, "RUNNING", args='["--out_dir=${run:dir}/out"]')
    earlier_run(folder, "FAILED", name="other", script="runtime_train.py")
    assert warning_for(experiment(folder, "second")) is None


def test_no_warning_for_a_run_submitted_from_another_folder(folder, monkeypatch):
    earlier_run(folder, "RUNNING")
    elsewhere = folder.parent / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert warning_for(experiment(folder, "second")) is None


def test_a_code_snapshot_does_not_give_the_ranks_a_folder_of_their_own(folder):
    """With a snapshot submitted here, the script runs from its copy but the ranks still
    begin in the submit folder: the warning stands. Over SSH they begin in the run's own
    copy (launcher.runner.remote.on_cluster): no warning."""
    first = earlier_run(folder, "RUNNING", overrides=["code.snapshot=true"])
    prepared = submission.prepare(experiment(folder, "second"), site="local", overrides=["code.snapshot=true"],
                                  dry_run=True)
    plan = prepared.plan
    assert plan.code is not None and plan.workdir == str(folder)
    warning = shared_folder.warning(plan)
    assert warning is not None and first in warning
    on_cluster = dataclasses.replace(plan, workdir=plan.code.import_path or plan.run_dir)
    assert shared_folder.warning(on_cluster) is None


def test_a_folder_whose_name_yaml_quotes_is_found_too(tmp_path, isolated_env, monkeypatch):
    work = tmp_path / "my work: 'v2' #1"
    work.mkdir()
    (work / "train.py").write_text(PLAIN)
    monkeypatch.chdir(work)
    first = earlier_run(work, "RUNNING")
    warning = warning_for(experiment(work, "second"))
    assert warning is not None and first in warning and str(work) in warning


def test_several_runs_are_named_a_few_at_most(folder):
    ids = [earlier_run(folder, "FAILED", name=f"r{i}") for i in range(5)]
    warning = warning_for(experiment(folder, "second"))
    assert warning is not None
    assert sum(run_id in warning for run_id in ids) == shared_folder.NAMED
    assert f"and {5 - shared_folder.NAMED} more" in warning


def test_only_the_newest_runs_of_the_index_are_read(folder, monkeypatch):
    first = earlier_run(folder, "RUNNING")
    monkeypatch.setattr(shared_folder, "RECENT_RUNS", 3)
    for i in range(3):
        earlier_run(folder, "COMPLETED", name=f"later{i}")
    assert warning_for(experiment(folder, "second")) is None        # the live run is out of reach
    monkeypatch.setattr(shared_folder, "RECENT_RUNS", 4)
    assert first in (warning_for(experiment(folder, "second")) or "")


def test_a_damaged_record_or_bundle_is_left_out(folder):
    broken = earlier_run(folder, "RUNNING", name="broken")
    (Path(registry.find_run(broken)) / "resolved.yaml").write_text("derived: [\n")
    unreadable = earlier_run(folder, "RUNNING", name="unreadable")
    (Path(registry.find_run(unreadable)) / "run.json").write_text("{")
    good = earlier_run(folder, "FAILED", name="good")
    warning = warning_for(experiment(folder, "second"))
    assert warning is not None and good in warning and broken not in warning and unreadable not in warning


def test_the_check_stays_cheap_with_a_full_index(folder):
    """RECENT_RUNS resumable runs in the folder: the warning's reading of their records
    stays a small part of a dry run. Timed in this process's CPU time, which the other
    processes of a busy machine do not stretch as they stretch the wall clock."""
    for i in range(shared_folder.RECENT_RUNS):
        earlier_run(folder, "FAILED", name=f"r{i}")
    plan = submission.prepare(experiment(folder, "second"), site="local", dry_run=True).plan
    began = time.process_time()
    warning = shared_folder.warning(plan)
    took = time.process_time() - began
    assert warning is not None
    assert took < 0.5, f"{took:.3f} s of CPU"


# --- the submission shows it (launcher.runner.submission._prepare) ------------------------------


def test_a_real_failed_run_warns_the_next_submission_from_its_folder(folder, isolated_env):
    """A plain script that fails on the local site leaves a resumable run; the dry run of the
    next one from the same folder prints the warning, naming it."""
    (folder / "fail.py").write_text("import sys\nsys.exit(3)\n")
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", experiment(folder, "failing", "fail.py"),
                           "--site", "local", "requeue.max=0"], cwd=folder, env=dict(isolated_env, PYTHONPATH=str(REPO)),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    (failed,) = [e["run_id"] for e in registry.indexed_runs()]
    dry = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", experiment(folder, "second"), "--site",
                          "local", "--dry-run"], cwd=folder, env=dict(isolated_env, PYTHONPATH=str(REPO)),
                         capture_output=True, text=True, timeout=300)
    assert dry.returncode == 0, dry.stderr
    lines = [line for line in dry.stderr.splitlines() if failed in line]
    assert len(lines) == 1 and lines[0].startswith("glaunch: warning: the ranks run in "), dry.stderr


def test_the_warning_is_among_the_submissions_warnings(folder, monkeypatch, capsys):
    first = earlier_run(folder, "RUNNING")
    prepared = api.prepare(experiment(folder, "second"), site="local", dry_run=True)
    assert any(first in w for w in prepared.warnings), prepared.warnings
    code, _, err = run_cli(monkeypatch, capsys, ["glaunch", "submit", experiment(folder, "third"), "--site",
                                                 "local", "--dry-run"])
    assert code == 0, err
    assert f"glaunch: warning: the ranks run in {folder}" in err and first in err

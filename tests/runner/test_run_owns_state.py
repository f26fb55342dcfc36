"""Every run owns its state: a checkpoint directory outside the run directory belongs to
the run that claimed it (sweep elements get one each), a copied run directory is refused by
the commands that change a run, and a resume that cannot start leaves the run as it was."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from launcher import api
from launcher.errors import ConfigError, RunError
from launcher.rundir import claims, registry
from launcher.rundir.layout import RunDir
from launcher.runner.sweep_submission import prepare_sweep
from launcher.schedulers.local import LocalScheduler, hold_job_lock

REPO = Path(__file__).resolve().parents[2]
DDP = str(REPO / "examples" / "torch_ddp.yaml")


def glaunch(*args: str, env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def files_of(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


# --- the claim ------------------------------------------------------------------------------


def test_a_checkpoint_directory_another_run_owns_is_refused(tmp_path, isolated_env):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    claims.claim(ckpt, "first-run", str(tmp_path / "runs" / "first-run"))
    for dry in ([], ["--dry-run"]):
        proc = glaunch("submit", DDP, *dry, "--runs-dir", str(tmp_path / "runs"), f"checkpoint.dir={ckpt}",
                       env=isolated_env)
        assert proc.returncode == 2, proc.stderr
        assert "checkpoint.dir" in proc.stderr and "holds the checkpoints of run first-run" in proc.stderr
        assert "glaunch resume first-run" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()
    assert claims.owner_of(ckpt).run_id == "first-run"


def test_a_checkpoint_directory_holding_files_no_run_claims_is_refused(tmp_path, isolated_env):
    ckpt = tmp_path / "ckpt"
    (ckpt / "step-00000040").mkdir(parents=True)
    proc = glaunch("submit", DDP, "--dry-run", "--runs-dir", str(tmp_path / "runs"), f"checkpoint.dir={ckpt}",
                   env=isolated_env)
    assert proc.returncode == 2
    assert "holds files that no run claims (step-00000040)" in proc.stderr


@pytest.mark.parametrize("attempt", range(10))
def test_of_two_runs_claiming_at_once_one_gets_the_directory(tmp_path, attempt):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    won, lost, failed = [], [], []
    barrier = threading.Barrier(8)

    def one(number: int) -> None:
        barrier.wait()
        try:
            claims.claim(ckpt, f"run-{number}", f"/runs/run-{number}")
            won.append(number)
        except claims.ClaimTaken as exc:
            lost.append(str(exc))
        except Exception as exc:          # any other end is the defect shown
            failed.append(repr(exc))

    threads = [threading.Thread(target=one, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (len(won), len(lost), failed) == (1, 7, [])
    assert claims.owner_of(ckpt).run_id == f"run-{won[0]}"
    assert all(f"holds the checkpoints of run run-{won[0]}" in message for message in lost), lost


def test_a_claim_is_released_when_the_submission_fails(tmp_path, isolated_env, monkeypatch):
    def refuse(*_args, **_kwargs):
        raise RuntimeError("the scheduler broke")

    monkeypatch.setattr(LocalScheduler, "launch", refuse)
    ckpt = tmp_path / "ckpt"
    with pytest.raises(RuntimeError):
        api.submit(DDP, runs_dir=str(tmp_path / "runs"), overrides=[f"checkpoint.dir={ckpt}"])
    assert claims.owner_of(ckpt) is None if ckpt.exists() else True


@pytest.mark.parametrize("text, problem", [
    ("[]", "a JSON list, not an object"), ('{"run_id": "../x", "run_dir": "/r", "claimed": "t"}', "run_id: not a run id"),
    ('{"run_id": "a", "run_dir": 5, "claimed": "t"}', "run_dir: not a path"),
])
def test_a_damaged_claim_is_named(tmp_path, isolated_env, text, problem):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / claims.OWNER_FILE).write_text(text)
    proc = glaunch("submit", DDP, "--dry-run", "--runs-dir", str(tmp_path / "runs"), f"checkpoint.dir={ckpt}",
                   env=isolated_env)
    assert proc.returncode == 2 and problem in proc.stderr and claims.OWNER_FILE in proc.stderr


# --- sweeps ---------------------------------------------------------------------------------


def test_sweep_elements_never_share_a_fixed_checkpoint_directory(tmp_path, isolated_env):
    """Each element trains from step 0 in a directory of its own below checkpoint.dir."""
    ckpt = tmp_path / "ckpt"
    sweep = api.submit(DDP, runs_dir=str(tmp_path / "runs"), sweep=["checkpoint.every_steps=5,10"],
                       overrides=[f"checkpoint.dir={ckpt}", "entrypoint.args=[--steps,10]"])
    said = prepare_sweep(DDP, ["checkpoint.every_steps=5,10"], runs_dir=str(tmp_path / "other"),
                         overrides=[f"checkpoint.dir={tmp_path / 'ckpt2'}"], dry_run=True).warnings
    assert any("would be shared by the sweep's elements" in w for w in said)
    dirs = set()
    for run in sweep.runs:
        record = registry.read(run.run_dir)
        assert record.state == "COMPLETED", record
        assert record.starts[0].resumed_from is None          # it did not load the other's steps
        own = ckpt / run.run_id
        assert claims.owner_of(own).run_id == run.run_id
        assert json.loads(RunDir(run.run_dir).result_file.read_text())["resumed_from"] is None
        dirs.add(own)
    assert len(dirs) == 2


# --- copies ---------------------------------------------------------------------------------


def ended_run(tmp_path: Path) -> Path:
    run = api.submit(DDP, dry_run=True, runs_dir=str(tmp_path / "runs"))
    with registry.updating(run.run_dir) as record:
        record.dry_run = False
        record.state = "CANCELLED"
        record.job_id = "4711"
        record.starts.append(registry.new_start("4711", 0, state="CANCELLED"))
    return run.run_dir


def test_a_copied_run_directory_is_refused_by_resume_and_cancel(tmp_path, isolated_env):
    original = ended_run(tmp_path)
    copy = tmp_path / "runs" / "copy"
    shutil.copytree(original, copy)
    before = (files_of(original), files_of(copy))
    for command in ("resume", "cancel"):
        proc = glaunch(command, str(copy), env=isolated_env)
        assert proc.returncode == 2, proc.stderr
        assert f"it is a copy of run {registry.read(original).run_id}" in proc.stderr
        assert f"glaunch {command} {original}" in proc.stderr
    assert (files_of(original), files_of(copy)) == before


def test_a_moved_run_directory_says_where_it_was_submitted(tmp_path, isolated_env):
    original = ended_run(tmp_path)
    moved = tmp_path / "elsewhere"
    shutil.move(original, moved)
    with pytest.raises(ConfigError, match=f"was submitted in {original}, and was moved or copied here"):
        api.resume(str(moved))


# --- a resume that cannot start --------------------------------------------------------------


def test_resume_of_a_run_whose_job_is_still_ending_is_refused(tmp_path, isolated_env):
    run_dir = ended_run(tmp_path)
    lock = hold_job_lock(RunDir(run_dir))       # cancelled, and its ranks still saving
    try:
        before = files_of(run_dir)
        with pytest.raises(ConfigError, match="still ending"):
            api.resume(str(run_dir))
        assert files_of(run_dir) == before
    finally:
        os.close(lock)


def test_a_resume_that_never_starts_leaves_the_run_as_it_was(tmp_path, isolated_env, monkeypatch):
    run_dir = ended_run(tmp_path)
    before = files_of(run_dir)

    def cannot_start(*_args, **_kwargs):
        raise RunError("another process is running this run's job")

    monkeypatch.setattr(LocalScheduler, "launch", cannot_start)
    with pytest.raises(RunError, match=r"the resume did not start .* the run is as it was"):
        api.resume(str(run_dir))
    after = files_of(run_dir)
    assert json.loads(after.pop("run.json")) == json.loads(before.pop("run.json"))
    assert after == before
    assert registry.read(run_dir).state == "CANCELLED"


def test_resume_of_a_run_whose_checkpoints_another_run_took_over_is_refused(tmp_path, isolated_env):
    ckpt = tmp_path / "ckpt"
    run = api.submit(DDP, dry_run=True, runs_dir=str(tmp_path / "runs"), overrides=[f"checkpoint.dir={ckpt}"])
    with registry.updating(run.run_dir) as record:
        record.dry_run, record.state, record.job_id = False, "TIMEOUT", "4711"
    ckpt.mkdir()
    claims.claim(ckpt, run.run_id, str(run.run_dir))
    claims.claim(ckpt, "successor", "/runs/successor", take_over=run.run_id)
    before = files_of(run.run_dir)
    with pytest.raises(ConfigError, match="it belongs to run successor now"):
        api.resume(str(run.run_dir))
    assert files_of(run.run_dir) == before
    owner = claims.owner_of(ckpt)
    assert (owner.run_id, [p.run_id for p in owner.previous]) == ("successor", [run.run_id])
    claims.release(ckpt, "successor")             # a take-over that never ran gives it back
    assert claims.owner_of(ckpt).run_id == run.run_id


# --- taking a run's checkpoints over, by its name ---------------------------------------------


def test_a_run_takes_over_an_ended_runs_checkpoints_by_name_and_says_so(tmp_path, isolated_env):
    ckpt = tmp_path / "ckpt"
    runs = str(tmp_path / "runs")
    first = api.submit(DDP, runs_dir=runs, overrides=[f"checkpoint.dir={ckpt}", "entrypoint.args=[--steps,10]",
                                                     "checkpoint.every_steps=5"])
    assert first.state == "COMPLETED"
    refused = glaunch("submit", DDP, "--runs-dir", runs, f"checkpoint.dir={ckpt}", env=isolated_env)
    assert refused.returncode == 2 and f"holds the checkpoints of run {first.run_id}" in refused.stderr
    proc = glaunch("submit", DDP, "--runs-dir", runs, f"checkpoint.dir={ckpt}", "entrypoint.args=[--steps,20]",
                   "checkpoint.every_steps=5", f"checkpoint.take_over={first.run_id}", env=isolated_env)
    assert proc.returncode == 0, proc.stderr
    assert f"taken over from run {first.run_id}: this run starts from its newest checkpoint" in proc.stderr
    owner = claims.owner_of(ckpt)
    assert [p.run_id for p in owner.previous] == [first.run_id]
    second = registry.read(Path(runs) / owner.run_id)
    assert second.state == "COMPLETED" and second.starts[0].resumed_from == 10
    with pytest.raises(ConfigError, match=f"it belongs to run {owner.run_id} now"):
        api.resume(first.run_id)


def test_a_default_checkpoint_directory_is_its_runs_without_a_claim(tmp_path, isolated_env):
    first = ended_run(tmp_path)
    proc = glaunch("submit", DDP, "--dry-run", "--runs-dir", str(tmp_path / "runs"),
                   f"checkpoint.dir={first / 'checkpoints'}", env=isolated_env)
    assert proc.returncode == 2 and f"holds the checkpoints of run {first.name}" in proc.stderr


def _other_runs_default_reached(how: str, first: Path, tmp_path: Path) -> Path:
    """A path that names `first`'s default checkpoint directory without spelling it."""
    if how == "link":
        (tmp_path / "link").symlink_to(first / "checkpoints")
        return tmp_path / "link"
    if how == "link with ..":
        (tmp_path / "hop").symlink_to(os.path.relpath(first / "logs" / ".." / "checkpoints", tmp_path))
        return tmp_path / "hop"
    if how == ".. after a link":
        (tmp_path / "logs-link").symlink_to(first / "logs")
        return tmp_path / "logs-link" / ".." / "checkpoints"
    (tmp_path / "run-link").symlink_to(first)            # a symlinked parent
    return tmp_path / "run-link" / "checkpoints"


@pytest.mark.parametrize("how", ["link", "link with ..", ".. after a link", "symlinked parent"])
def test_another_runs_default_checkpoint_directory_reached_through_a_link_is_its(tmp_path, isolated_env, how):
    first = ended_run(tmp_path)
    path = _other_runs_default_reached(how, first, tmp_path)
    assert claims.owner_of(path).run_id == first.name
    assert "holds the checkpoints of run " + first.name in claims.claim_problem(path, "second-run")
    with pytest.raises(claims.ClaimTaken):
        claims.claim(path, "second-run", str(tmp_path / "runs" / "second-run"))
    assert not (first / "checkpoints" / claims.OWNER_FILE).exists()


def test_a_checkpoint_dir_linked_to_another_runs_default_one_is_refused_at_submit(tmp_path, isolated_env):
    first = ended_run(tmp_path)
    (tmp_path / "link").symlink_to(first / "checkpoints")
    before = files_of(tmp_path / "runs")
    for dry in (["--dry-run"], []):
        proc = glaunch("submit", DDP, *dry, "--runs-dir", str(tmp_path / "runs"), f"checkpoint.dir={tmp_path / 'link'}",
                       env=isolated_env)
        assert proc.returncode == 2, proc.stderr
        assert f"holds the checkpoints of run {first.name}" in proc.stderr and "checkpoint.dir" in proc.stderr
        assert "Traceback" not in proc.stderr
    assert files_of(tmp_path / "runs") == before


# Started three times at once: each submits through the CLI, its claim held back until all
# three are about to claim, so the race is the one at the exclusive claim itself.
_RACER = """
import os, sys, time
from launcher import cli
from launcher.rundir import claims

gate, real = sys.argv[1], claims.claim


def together(*args, **kwargs):
    open(os.path.join(gate, str(os.getpid())), "w").close()
    deadline = time.monotonic() + 60
    while len(os.listdir(gate)) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    return real(*args, **kwargs)


claims.claim = together
sys.argv = ["glaunch", *sys.argv[2:]]
cli.run()
"""


def test_of_three_submits_racing_for_one_checkpoint_directory_two_get_one_line(tmp_path, isolated_env):
    (tmp_path / "quick.py").write_text("print('trained')\n")
    (tmp_path / "exp.yaml").write_text("name: quick\nentrypoint: {script: quick.py}\n"
                                       "resources: {nodes: 1, time: '00:05:00'}\n")
    (tmp_path / "racer.py").write_text(_RACER)
    (tmp_path / "gate").mkdir()
    ckpt = tmp_path / "ckpt"
    words = [sys.executable, str(tmp_path / "racer.py"), str(tmp_path / "gate"), "submit", str(tmp_path / "exp.yaml"),
             "--site", "local", "--runs-dir", str(tmp_path / "runs"), f"checkpoint.dir={ckpt}"]
    procs = [subprocess.Popen(words, cwd=REPO, env=isolated_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(3)]
    ends = [(p.wait(timeout=300), *p.communicate()) for p in procs]
    assert sorted(code for code, _, _ in ends) == [0, 2, 2], ends
    owner = claims.owner_of(ckpt).run_id
    for code, _, err in ends:
        if code == 2:
            assert err.count("\n") == 1 and "Traceback" not in err, err
            assert err.startswith("glaunch: error: ") and f"holds the checkpoints of run {owner}" in err, err
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [owner]


@pytest.mark.parametrize("overrides, message", [
    (["checkpoint.take_over=no-such-run", "checkpoint.dir=CKPT"], "no run 'no-such-run'"),
    (["checkpoint.take_over=../x", "checkpoint.dir=CKPT"], "'../x' is not a run id"),
    (["checkpoint.take_over=RUN"], "name it in checkpoint.dir too"),
])
def test_a_take_over_that_names_no_ended_run_is_refused(tmp_path, isolated_env, overrides, message):
    first = ended_run(tmp_path)
    ckpt = str(tmp_path / "ckpt")
    words = [o.replace("CKPT", ckpt).replace("RUN", first.name) for o in overrides]
    proc = glaunch("submit", DDP, "--dry-run", "--runs-dir", str(tmp_path / "runs"), *words, env=isolated_env)
    assert proc.returncode == 2, proc.stderr
    assert "checkpoint.take_over" in proc.stderr and message in proc.stderr and "Traceback" not in proc.stderr


def test_a_run_still_writing_its_checkpoints_cannot_be_taken_over(tmp_path, isolated_env):
    first = ended_run(tmp_path)
    with registry.updating(first) as record:
        record.state = "RUNNING"
    lock = hold_job_lock(RunDir(first))
    try:
        proc = glaunch("submit", DDP, "--runs-dir", str(tmp_path / "runs"), f"checkpoint.dir={first / 'checkpoints'}",
                       f"checkpoint.take_over={first.name}", env=isolated_env)
    finally:
        os.close(lock)
    assert proc.returncode == 2
    assert f"run {first.name} is RUNNING and writes its checkpoints there" in proc.stderr
    assert f"--after {first.name}" in proc.stderr
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [first.name]


def test_a_sweep_cannot_take_over_one_runs_checkpoints(tmp_path, isolated_env):
    first = ended_run(tmp_path)
    proc = glaunch("submit", DDP, "--dry-run", "--runs-dir", str(tmp_path / "runs"), "--sweep",
                   "checkpoint.keep=1,2", f"checkpoint.dir={first / 'checkpoints'}",
                   f"checkpoint.take_over={first.name}", env=isolated_env)
    assert proc.returncode == 2 and "a sweep's elements cannot take them over" in proc.stderr

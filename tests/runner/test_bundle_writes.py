"""Writing a run: nothing is written until every path is checked, a failure after that
takes back everything written, a dry run writes nothing outside its run directory, and an
unusable directory is a ConfigError (exit 2) naming the option or key that chose it."""

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from launcher import api
from launcher.errors import ConfigError, RunError, SchedulerError
from launcher.runner import bundle
from launcher.runner.submission import Prepared
from launcher.rundir import registry

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def project(tmp_path, isolated_env, monkeypatch):
    """An experiment on the local site with a script that ends at once."""
    (tmp_path / "train.py").write_text("print('hello', flush=True)\n")
    (tmp_path / "exp.yaml").write_text("name: tiny\nentrypoint: {script: train.py}\n"
                                       "resources: {time: '5'}\nrequeue: {signal_lead_s: 10}\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def glaunch(*args, cwd, env, **kwargs):
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120, **kwargs)


def tree(path: Path) -> set[str]:
    return {str(p.relative_to(path)) for p in path.rglob("*")}


def index_lines(env) -> list[str]:
    path = Path(env["GLAUNCH_STATE_DIR"]) / "runs.jsonl"
    return path.read_text().splitlines() if path.exists() else []


def assert_refused_cleanly(proc, before: set[str], root: Path, env, *fragments, absent=()):
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    for fragment in fragments:
        assert fragment in proc.stderr, (fragment, proc.stderr)
    for fragment in absent:
        assert fragment not in proc.stderr, (fragment, proc.stderr)
    assert tree(root) == before, tree(root) ^ before
    assert index_lines(env) == []


# --- checkpoint.dir ----------------------------------------------------------------------


def test_dry_run_creates_no_checkpoint_dir_outside_the_run_directory(project, isolated_env):
    outside = project / "elsewhere" / "ckpt"
    proc = glaunch("submit", "exp.yaml", "--dry-run", "--runs-dir", "runs", f"checkpoint.dir={outside}",
                   cwd=project, env=isolated_env)
    assert proc.returncode == 0, proc.stderr
    assert not (project / "elsewhere").exists()
    (run_dir,) = (project / "runs").iterdir()
    assert (run_dir / "run.json").is_file()


def test_real_submission_creates_the_checkpoint_dir_outside(project, isolated_env):
    outside = project / "elsewhere" / "ckpt"
    proc = glaunch("submit", "exp.yaml", "--runs-dir", "runs", f"checkpoint.dir={outside}",
                   cwd=project, env=isolated_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert outside.is_dir()


@pytest.mark.parametrize("where", ["a-file", "a-file/below"])
def test_checkpoint_dir_that_cannot_be_a_directory(project, isolated_env, where):
    (project / "a-file").write_text("")
    before = tree(project)
    proc = glaunch("submit", "exp.yaml", "--runs-dir", "runs", f"checkpoint.dir={project / where}",
                   cwd=project, env=isolated_env)
    assert_refused_cleanly(proc, before, project, isolated_env, "checkpoint.dir", "is a file")


def test_checkpoint_dir_in_the_experiment_file_is_blamed_on_it(project, isolated_env):
    (project / "a-file").write_text("")
    with open(project / "exp.yaml", "a") as f:
        f.write(f"checkpoint: {{dir: {project / 'a-file'}}}\n")
    before = tree(project)
    proc = glaunch("submit", "exp.yaml", "--dry-run", "--runs-dir", "runs", cwd=project, env=isolated_env)
    assert_refused_cleanly(proc, before, project, isolated_env, "exp.yaml", "checkpoint.dir")


# --- the runs directory -------------------------------------------------------------------


@pytest.mark.parametrize("where", ["a-file", "a-file/below"])
def test_runs_dir_option_that_cannot_be_a_directory_is_blamed_on_the_option(project, isolated_env, where):
    (project / "a-file").write_text("")
    site = project / "site.yaml"
    site.write_text((REPO / "site_configs" / "local.yaml").read_text() + f"runs_root: {project / 'ok'}\n")
    before = tree(project)
    proc = glaunch("submit", "exp.yaml", "--site", str(site), "--dry-run", "--runs-dir", where,
                   cwd=project, env=isolated_env)
    assert_refused_cleanly(proc, before, project, isolated_env, "--runs-dir", "is a file", absent=["runs_root"])


def test_site_runs_root_that_cannot_be_a_directory_is_blamed_on_the_site(project, isolated_env):
    (project / "a-file").write_text("")
    site = project / "site.yaml"
    site.write_text((REPO / "site_configs" / "local.yaml").read_text() + f"runs_root: {project / 'a-file'}\n")
    before = tree(project)
    proc = glaunch("submit", "exp.yaml", "--site", str(site), "--dry-run", cwd=project, env=isolated_env)
    assert_refused_cleanly(proc, before, project, isolated_env, str(site), "runs_root", "is a file")


def test_runs_dir_that_fails_after_the_checks_leaves_nothing(project, isolated_env):
    """/proc passes the look-only check (a directory root may write to) but refuses mkdir."""
    before = tree(project)
    proc = glaunch("submit", "exp.yaml", "--dry-run", "--runs-dir", "/proc/glaunch-runs",
                   cwd=project, env=isolated_env)
    assert_refused_cleanly(proc, before, project, isolated_env, "--runs-dir", "/proc/glaunch-runs")
    assert not os.path.exists("/proc/glaunch-runs")


def test_file_too_large_while_writing_leaves_no_run_directory(project, isolated_env):
    """A real write failure: RLIMIT_FSIZE makes writes past 1200 bytes fail (EFBIG) part way
    through the bundle (its files are about 0.5-2 KB each)."""
    def limit_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (1200, 1200))

    before = tree(project)
    proc = glaunch("submit", "exp.yaml", "--dry-run", "--runs-dir", "runs/deeper", cwd=project,
                   env=isolated_env, preexec_fn=limit_file_size)
    assert_refused_cleanly(proc, before, project, isolated_env, "--runs-dir", "File too large")


# --- the state directory --------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["state-dir-is-a-file", "index-is-a-directory", "index-is-a-fifo"])
def test_unusable_state_directory_writes_nothing(project, isolated_env, damage):
    env = dict(isolated_env)
    if damage == "state-dir-is-a-file":
        env["GLAUNCH_STATE_DIR"] = str(project / "state-file")
        (project / "state-file").write_text("")
    else:
        state = Path(env["GLAUNCH_STATE_DIR"])
        state.mkdir()
        if damage == "index-is-a-directory":
            (state / "runs.jsonl").mkdir()
        else:
            os.mkfifo(state / "runs.jsonl")
    before = tree(project)
    proc = glaunch("submit", "exp.yaml", "--dry-run", "--runs-dir", "runs", cwd=project, env=env)
    assert proc.returncode == 2, proc.stderr
    assert "GLAUNCH_STATE_DIR" in proc.stderr and "Traceback" not in proc.stderr
    assert tree(project) == before


# --- failures part way through, injected ----------------------------------------------------


def prepared(project):
    return api.prepare(project / "exp.yaml", runs_dir=str(project / "runs" / "deeper"))


class FailAfter:
    """fake_disk_full: the writes after the first `n` fail."""

    def __init__(self, n: int) -> None:
        self.n, self.count = n, 0

    def wrap(self, real, error: Exception):
        def write(*args, **kwargs):
            self.count += 1
            if self.count > self.n:
                raise error
            return real(*args, **kwargs)
        return write


def test_each_write_failing_leaves_nothing(project, monkeypatch):
    """The n-th write of the bundle fails (n over every file and run.json)."""
    files = len(prepared(project).files)
    real_write_file = bundle.write_file
    real_registry_write = registry.write
    for n in range(files + 1):
        fail = FailAfter(n)
        monkeypatch.setattr(bundle, "write_file", fail.wrap(real_write_file, OSError(28, "No space left on device")))
        monkeypatch.setattr(registry, "write", fail.wrap(real_registry_write, RunError(
            "cannot write the run record: No space left on device")))
        with pytest.raises(ConfigError, match="No space left on device") as caught:
            api.launch(prepared(project), dry_run=True)
        assert caught.value.key == "--runs-dir"
        assert not (project / "runs").exists(), n
        assert not (project / "state").exists() or index_lines({"GLAUNCH_STATE_DIR": str(project / "state")}) == []


def test_interrupt_while_writing_leaves_nothing(project, monkeypatch):
    def fake_interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(registry, "write", fake_interrupt)
    with pytest.raises(KeyboardInterrupt):
        api.launch(prepared(project), dry_run=True)
    assert not (project / "runs").exists()


def test_failed_registration_removes_the_bundle(project, monkeypatch):
    def fake_register(*args):
        raise ConfigError("cannot add to runs.jsonl", key="GLAUNCH_STATE_DIR")

    monkeypatch.setattr(registry, "register", fake_register)
    with pytest.raises(ConfigError, match=r"runs\.jsonl"):
        api.launch(prepared(project), dry_run=True)
    assert not (project / "runs").exists()


class RefusingScheduler:
    """Stands in for Slurm refusing at preflight (no Slurm here): records REFUSED as the
    Slurm scheduler does, then raises."""

    def require(self):
        pass

    def launch(self, plan, run_dir, *, check, echo):
        with registry.updating(run_dir) as record:
            record.state = "REFUSED"
            record.reason = "preflight: partition 'gpu' does not exist"
        raise SchedulerError("preflight: partition 'gpu' does not exist")


class CrashingScheduler:
    """Stands in for a scheduler whose submission fails before it queued anything."""

    def require(self):
        pass

    def launch(self, plan, run_dir, *, check, echo):
        raise OSError(5, "Input/output error")


class QueuedThenCrashingScheduler:
    """Stands in for a scheduler that queued a job, then failed."""

    def require(self):
        pass

    def launch(self, plan, run_dir, *, check, echo):
        with registry.updating(run_dir) as record:
            record.job_id = "777"
        raise OSError(5, "Input/output error")


def with_scheduler(project, scheduler):
    prep = prepared(project)
    return Prepared(prep.plan, prep.files, scheduler, prep.runs_root_from, prep.checkpoint_from)


def test_refused_run_keeps_its_directory_as_the_record_of_the_refusal(project):
    with pytest.raises(SchedulerError):
        api.launch(with_scheduler(project, RefusingScheduler()))
    (run_dir,) = (project / "runs" / "deeper").iterdir()
    assert registry.read(run_dir).state == "REFUSED"
    assert len(index_lines({"GLAUNCH_STATE_DIR": os.environ["GLAUNCH_STATE_DIR"]})) == 1


def test_submission_failing_before_anything_was_queued_takes_back_the_run(project):
    with pytest.raises(RunError, match="Input/output error"):
        api.launch(with_scheduler(project, CrashingScheduler()))
    assert not (project / "runs").exists()
    assert index_lines({"GLAUNCH_STATE_DIR": os.environ["GLAUNCH_STATE_DIR"]}) == []


def test_submission_failing_after_a_job_was_queued_keeps_the_run(project):
    with pytest.raises(RunError, match="Input/output error"):
        api.launch(with_scheduler(project, QueuedThenCrashingScheduler()))
    (run_dir,) = (project / "runs" / "deeper").iterdir()
    assert registry.read(run_dir).job_id == "777"


def test_unregister_removes_only_that_run(isolated_env):
    registry.register("a", "/runs/a")
    registry.register("b", "/runs/b")
    registry.register("a", "/runs/a")
    registry.unregister("a", "/runs/a")
    assert [json.loads(line)["run_id"] for line in index_lines(isolated_env)] == ["b"]

"""The run carries the part of glaunch the nodes run: lib/ holds glaunch's job side and
submitit as installed here, env.sh puts it first on PYTHONPATH, and an interpreter with
torch and nothing else (no glaunch, no submitit) runs the job from it."""

import importlib.metadata
import io
import importlib.util
import json
import re
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

import pytest

from launcher.runner import carried

REPO = Path(__file__).resolve().parents[2]
JOB_SIDE = ("launcher.runtime.task", "launcher.jobcontrol.jobend", "launcher.jobcontrol.jobstart",
            "launcher.jobcontrol.watchdog", "launcher.localrun.jobstep", "launcher.runtime",
            "launcher.runtime.checkpoint", "submitit.core._submit")


def glaunch(*args, cwd, env, timeout=120):
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def project(tmp_path, isolated_env):
    (tmp_path / "train.py").write_text("print('hello', flush=True)\n")
    (tmp_path / "exp.yaml").write_text("name: tiny\nentrypoint: {script: train.py}\n"
                                       "resources: {time: '5'}\nrequeue: {signal_lead_s: 10}\n")
    return tmp_path


def dry_run(project, env) -> Path:
    proc = glaunch("submit", "exp.yaml", "--dry-run", "--runs-dir", "runs", cwd=project, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = (project / "runs").iterdir()
    return run_dir


def test_the_bundle_carries_the_job_side_as_installed_and_env_sh_puts_it_first(project, isolated_env):
    run_dir = dry_run(project, isolated_env)
    lib = run_dir / "lib"
    for name in ("launcher/runtime/task.py", "launcher/jobcontrol/jobend.py", "launcher/runtime/checkpoint/save.py",
                 "launcher/rundir/layout.py", "launcher/errors.py", "submitit/core/_submit.py",
                 "cloudpickle/__init__.py"):
        assert (lib / name).is_file(), name
    installed = {"launcher": REPO / "launcher", "submitit": carried.package_dir("submitit")}
    for name in ("launcher/runtime/task.py", "submitit/core/submission.py"):
        top, _, rest = name.partition("/")
        assert (lib / name).read_bytes() == (installed[top] / rest).read_bytes()
    files = [p for p in lib.rglob("*") if p.is_file()]
    metadata = {name for name, _ in carried.carried_metadata()}
    assert {p.relative_to(lib).as_posix() for p in files if p.suffix != ".py"} == metadata
    assert not any(p.name.startswith("test_") for p in files)
    # What the submitting side alone uses stays home.
    assert not (lib / "launcher/cli.py").exists() and not (lib / "launcher/runner").exists()
    assert sum(p.stat().st_size for p in files) < 2_000_000

    env_sh = (run_dir / "env.sh").read_text()
    line = f'export PYTHONPATH={lib}"${{PYTHONPATH:+:$PYTHONPATH}}"'
    assert line in env_sh
    shown = subprocess.run(["bash", "-c", 'source "$1" >/dev/null 2>&1; printf %s "$PYTHONPATH"', "_",
                            str(run_dir / "env.sh")], env={"PATH": "/usr/bin:/bin", "PYTHONPATH": "/elsewhere"},
                           capture_output=True, text=True, timeout=30)
    assert shown.stdout == f"{lib}:/elsewhere"


def tar_names(data: bytes) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return tar.getnames()


def test_the_tree_sent_to_the_cluster_holds_the_lib(project, isolated_env):
    from launcher.schedulers.ssh.transfer import archive

    run_dir = dry_run(project, isolated_env)
    names = set(tar_names(archive(run_dir)))
    assert {f"lib/{name}" for _, name in carried.carried_files()} <= names
    assert {f"lib/{name}" for name, _ in carried.carried_metadata()} <= names


def test_the_carried_parts_of_glaunch_are_the_layers_the_job_side_may_import():
    spec = importlib.util.spec_from_file_location("layers", REPO / "tests" / "test_layers.py")
    layers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layers)
    graph = layers.import_graph()
    job_side = {m for m in graph if layers.layer_of(m) in ("floor", "runtime", "jobcontrol", "localrun")}
    carried_modules = set()
    for _, relative in carried.carried_files():
        if relative.startswith("launcher/"):
            parts = Path(relative).with_suffix("").parts
            carried_modules.add(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    assert carried_modules == job_side
    assert all(graph[m] <= job_side for m in job_side)


def _requirements(dist: importlib.metadata.Distribution) -> list[str]:
    names = []
    for requirement in dist.requires or []:
        if "extra ==" not in requirement:
            names.append(re.match(r"[A-Za-z0-9._-]+", requirement).group(0))
    return names


def torch_only_python(root: Path) -> Path:
    """A virtual environment (no system site packages) whose one addition is torch and
    what torch requires, linked from this interpreter's site-packages: no glaunch, no
    submitit, no cloudpickle."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True, timeout=120)
    farm = root / "torch-site"
    farm.mkdir()
    site = Path(sysconfig.get_paths()["purelib"])
    todo, seen = ["torch"], set()
    while todo:
        name = todo.pop()
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        if dist.metadata["Name"].lower() in seen:
            continue
        seen.add(dist.metadata["Name"].lower())
        todo += _requirements(dist)
        for top in {f.parts[0] for f in dist.files or [] if f.parts and f.parts[0] not in ("..", "bin")}:
            if (site / top).exists() and not (farm / top).exists():
                (farm / top).symlink_to(site / top)
    assert not {"glaunch", "submitit", "cloudpickle"} & seen
    python = root / "venv" / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    (Path(purelib) / "torch-only.pth").write_text(f"{farm}\n")
    return python


IMPORTS = """
import importlib, json, sys
found = {}
for name in sys.argv[1:]:
    importlib.import_module(name)
import torch
print(json.dumps({n: getattr(m, "__file__", None) for n, m in sys.modules.items()
                  if n.split(".")[0] in ("launcher", "submitit", "cloudpickle")}))
"""


def test_an_interpreter_with_torch_alone_imports_the_job_side_from_the_lib(tmp_path, project, isolated_env):
    python = torch_only_python(tmp_path / "node")
    bare = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    without = subprocess.run([str(python), "-c", "import torch, launcher"], cwd=tmp_path, env=bare,
                             capture_output=True, text=True, timeout=120)
    assert without.returncode != 0 and "No module named 'launcher'" in without.stderr
    lib = dry_run(project, isolated_env) / "lib"
    proc = subprocess.run([str(python), "-c", IMPORTS, *JOB_SIDE], cwd=tmp_path, env={**bare, "PYTHONPATH": str(lib)},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    files = json.loads(proc.stdout)
    assert set(JOB_SIDE) <= set(files)
    assert all(path is None or path.startswith(f"{lib}/") for path in files.values()), files


ENTRY_POINTS = """
import importlib.metadata, json
points = [(e.group, e.name, e.value, e.load()()) for group in ("lightning.pytorch.callbacks_factory",
          "pytorch_lightning.callbacks_factory") for e in importlib.metadata.entry_points(group=group)]
print(json.dumps(points))
"""


def test_the_lib_offers_lightning_the_entry_points_glaunch_s_distribution_declares_once(tmp_path, project,
                                                                                          isolated_env):
    """Lightning adds the callbacks of these entry points to every Trainer: from the lib on a
    node without glaunch, once on a node with it (importlib.metadata takes the lib's, first
    on the path), and the same ones glaunch's own distribution declares (pyproject.toml)."""
    declared = sorted((e.group, e.name, e.value) for e in importlib.metadata.distribution("glaunch").entry_points
                      if e.group != "console_scripts")
    assert sorted(carried.ENTRY_POINTS) == declared
    lib = dry_run(project, isolated_env) / "lib"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "PYTHONPATH": str(lib)}
    for python in (torch_only_python(tmp_path / "node"), Path(sys.executable)):
        proc = subprocess.run([str(python), "-c", ENTRY_POINTS], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        points = json.loads(proc.stdout)
        # Outside a glaunch run (no GLAUNCH_RUN_DIR) each factory offers no callback.
        assert sorted(tuple(p) for p in points) == sorted((*point, []) for point in declared), python


def test_a_run_on_a_local_site_whose_python_has_torch_but_no_glaunch_completes(tmp_path, project, isolated_env):
    python = torch_only_python(tmp_path / "node")
    (project / "train.py").write_text(
        "import launcher.runtime as rt, sys, torch\n"
        "print('runtime from', rt.__file__, flush=True)\n"
        "print('python', sys.executable, flush=True)\n")
    site = project / "bare.yaml"
    site.write_text(f"name: bare\nextends: local\npython: {python}\n")
    proc = glaunch("submit", "exp.yaml", "--site", str(site), "--runs-dir", "runs", cwd=project, env=isolated_env,
                   timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (run_dir,) = (project / "runs").iterdir()
    assert json.loads((run_dir / "run.json").read_text())["state"] == "COMPLETED"
    out = "".join(p.read_text() for p in (run_dir / "logs").glob("*_0_log.out"))
    assert f"runtime from {run_dir}/lib/launcher/runtime/__init__.py" in out
    assert f"python {python}" in out


# --- resume: the new job.sbatch runs the job side of the glaunch that renders it ----------


def ended_run(project: Path) -> Path:
    from launcher import api
    from launcher.rundir import registry

    run = api.submit(str(project / "exp.yaml"), dry_run=True, runs_dir=str(project / "runs"))
    with registry.updating(run.run_dir) as record:
        record.dry_run = False
        record.state = "FAILED"
        record.job_id = "4711"
        record.starts.append(registry.new_start("4711", 0, state="FAILED"))
    return Path(run.run_dir)


def test_a_resume_carries_the_lib_afresh_and_an_undone_resume_puts_the_old_one_back(project, isolated_env):
    from launcher import api
    from launcher.runner import resume

    run_dir = ended_run(project)
    task = run_dir / "lib" / "launcher" / "runtime" / "task.py"
    task.write_text("# the job side of an older glaunch\n")
    prepared = api.prepare_resume(str(run_dir), dry_run=False)
    _, switch = resume._switch_bundle(prepared)
    assert task.read_bytes() == (REPO / "launcher" / "runtime" / "task.py").read_bytes()
    assert (run_dir / "resumes" / "1" / "lib" / "launcher" / "runtime" / "task.py").read_text().startswith(
        "# the job side of an older glaunch")
    assert resume._revert_switch(prepared, switch)
    assert task.read_text() == "# the job side of an older glaunch\n"
    assert not (run_dir / "resumes" / "1").exists()


def test_a_resume_over_ssh_sends_the_lib_afresh_and_sets_the_old_one_aside(project, isolated_env, monkeypatch):
    from launcher import api
    from launcher.errors import SchedulerError
    from launcher.runner import remote
    from launcher.runner.resumable import MOVED_ASIDE

    prepared = api.prepare_resume(str(ended_run(project)), dry_run=False)
    sent = {}

    def set_aside(conn, run_dir, aside, names, archive):
        sent.update(names=names, members=tar_names(archive))
        raise SchedulerError("the link dropped")

    monkeypatch.setattr(remote.on_login, "slurm_client", lambda conn, cwd=None: object())
    monkeypatch.setattr(remote.on_login, "set_aside", set_aside)
    monkeypatch.setattr(remote.on_login, "put_back", lambda *args, **kwargs: None)
    monkeypatch.setattr(remote.on_login, "write_bytes", lambda *args: None)
    monkeypatch.setattr(remote.on_login, "run_checked", lambda *args: None)
    remote.records_dir().mkdir(parents=True)
    with pytest.raises(SchedulerError):
        remote.queue_resume(prepared, object(), "resumes/1", MOVED_ASIDE, "{}", check=False)
    assert "lib" in sent["names"]
    assert {f"lib/{name}" for _, name in carried.carried_files()} <= set(sent["members"])

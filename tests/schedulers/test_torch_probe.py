"""`glaunch sites check`'s answer to which torch a profile's environment gives: the probe's
output read and said (pure), its script (bash), and the probe run against a profile whose
`python:` is a second interpreter with a fake torch, here, with no cluster."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from badinput import run_cli
from launcher import shell
from launcher.config.sites import load_site
from launcher.processes import run_bounded
from launcher.runner import site_tools
from launcher.schedulers.cluster import torchprobe
from launcher.schedulers.cluster.report import CheckReport
from launcher.schedulers.cluster.torchprobe import ANSWER, NOT_HERE, TorchProbe, read_answer
from launcher.schedulers.slurm.client import CLIENT
from launcher.schedulers.ssh import on_login
from launcher.schedulers.ssh.connection import NoAnswer

PROFILE = """\
name: fakesite
scheduler: slurm
default_partition: gpu
partitions:
  gpu: {gpus_per_node: 1, max_nodes: 1}
"""


# --- the answer read -------------------------------------------------------------------------


def test_the_answer_line_is_read_past_what_the_environment_step_printed():
    found = {"python": "3.11.7", "executable": "/opt/py/bin/python", "torch": "2.5.1+cu124", "cuda": "12.4",
             "nccl": "2.21.5"}
    out = "Loading PyTorch/2.5.1\nsome banner\n" + ANSWER + json.dumps(found) + "\n"
    assert read_answer(0, out, "module: note\n") == (found, None)


def test_a_step_that_cannot_run_here_says_why():
    assert read_answer(3, NOT_HERE + "the container image /x.sif is not on this host\n", "") == (
        {}, "the container image /x.sif is not on this host")


def test_no_answer_within_the_bound_is_not_checked_and_says_so():
    versions, reason = read_answer(None, "", "", timeout_s=60)
    assert versions == {} and "did not answer within 60 s" in reason


def test_a_failing_setup_names_its_exit_and_last_error_line():
    assert read_answer(2, "", "source: /opt/venv/bin/activate: No such file or directory\n") == (
        {}, "the environment step ended with exit 2: source: /opt/venv/bin/activate: No such file or directory")


def test_an_answer_on_a_failing_exit_or_no_answer_at_all_is_not_taken():
    assert read_answer(1, ANSWER + '{"torch": "1"}\n', "Segmentation fault")[1] == (
        "the environment step ended with exit 1: Segmentation fault")
    assert read_answer(0, "hello\n", "")[1] == "the interpreter printed no versions (hello)"
    assert read_answer(0, ANSWER + "{not json\n", "")[1].startswith("the interpreter printed no versions")


# --- what sites check prints -----------------------------------------------------------------


def test_the_line_for_each_case():
    cuda = {"python": "3.11.7", "executable": "/opt/py/bin/python", "torch": "2.5.1+cu124", "cuda": "12.4",
            "nccl": "2.21.5"}
    assert TorchProbe("python", versions=cuda).line() == (
        "torch: 2.5.1+cu124 (CUDA 12.4, NCCL 2.21.5, python 3.11.7) from /opt/py/bin/python")
    cpu = {"python": "3.11.7", "executable": "/usr/bin/python3", "torch": "2.13.0+cpu"}
    assert TorchProbe("python", versions=cpu).line() == "torch: 2.13.0+cpu (python 3.11.7) from /usr/bin/python3"
    assert TorchProbe("python", where="alice@login1", versions=cpu).line().endswith(
        "from /usr/bin/python3 on alice@login1")
    missing = {"python": "3.12.1", "executable": "/usr/bin/python3", "error": "ModuleNotFoundError: No module named "
                                                                              "'torch'"}
    assert TorchProbe("python", versions=missing).line() == (
        "torch: none: python 3.12.1 at /usr/bin/python3 cannot import it (ModuleNotFoundError: No module named "
        "'torch')")
    assert TorchProbe("modules", reason="no module system").line() == "torch: not checked: no module system"
    assert TorchProbe("modules", where="login1", reason="x").line() == "torch: not checked (asked on login1): x"


def test_the_report_prints_the_line_last_and_carries_it_in_json():
    report = CheckReport("s", "c", torch=TorchProbe("python", reason="why"))
    assert report.lines() == ["site s matches Slurm cluster c", "  torch: not checked: why"]
    assert report.to_json()["torch"] == {"checked": False, "where": "here", "key": "python", "versions": {},
                                         "reason": "why", "problem": None}
    assert "torch" not in CheckReport("s", "c").to_json()


# --- what the probe runs ---------------------------------------------------------------------


def site_of(tmp_path: Path, extra: str = ""):
    path = tmp_path / "fakesite.yaml"
    path.write_text(PROFILE + extra)
    return load_site(str(path), tmp_path, {}).config


def test_a_pyxis_image_or_one_apptainer_must_fetch_is_not_run(tmp_path):
    pyxis = site_of(tmp_path, "container: {runtime: pyxis, image: 'nvcr.io#nvidia/pytorch:24.09-py3'}\n")
    reason = torchprobe.probe(CLIENT, pyxis, sys.executable).reason
    assert reason and "pyxis container nvcr.io#nvidia/pytorch:24.09-py3, which only srun starts" in reason
    remote = site_of(tmp_path, "container: {runtime: apptainer, image: 'docker://nvcr.io/nvidia/pytorch:24.09-py3'}\n")
    assert "apptainer would first fetch docker://" in torchprobe.probe(CLIENT, remote, sys.executable).reason


def test_an_apptainer_image_not_on_this_host_is_not_checked(tmp_path):
    site = site_of(tmp_path, f"container: {{runtime: apptainer, image: {tmp_path / 'no.sif'}}}\n")
    env = torchprobe.environment_of(site, sys.executable)
    assert env.command[:3] == ("apptainer", "exec", "--nv") and env.command[-1] == "python3"
    probe = torchprobe.probe(CLIENT, site, sys.executable)
    assert probe.reason == f"the container image {tmp_path / 'no.sif'} is not on this host"
    assert probe.key == "container.image"


def test_a_uenv_runs_the_interpreter_inside_it(tmp_path):
    site = site_of(tmp_path, "python: /users/me/venv/bin/python\nsbatch: {uenv: 'pytorch/v2.8.0:/user-environment', "
                             "view: default}\n")
    env = torchprobe.environment_of(site, sys.executable)
    assert env.command == ("uenv", "run", "--view=default", "pytorch/v2.8.0:/user-environment", "--",
                           "/users/me/venv/bin/python")
    assert env.key == "sbatch.uenv"


def test_modules_without_a_module_system_are_not_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", os.path.dirname(shutil.which("bash")))
    site = site_of(tmp_path, "modules: [PyTorch/2.1.2]\n")
    if any(Path(f).exists() for f in ("/etc/profile.d/lmod.sh", "/etc/profile.d/modules.sh",
                                      "/usr/share/lmod/lmod/init/bash", "/usr/share/Modules/init/bash")):
        pytest.skip("this host has a module system")
    assert torchprobe.probe(CLIENT, site, sys.executable).reason == torchprobe.NO_MODULES


def test_the_script_is_bash_and_module_names_reach_module_as_written(tmp_path, monkeypatch):
    """A fake `module` on PATH records its arguments: a module name arrives as one word, and
    an env value runs nothing."""
    record = tmp_path / "module.args"
    tools = tmp_path / "bin"
    tools.mkdir()
    executable(tools / "module", f"#!/bin/sh\nprintf '%s\\n' \"$@\" >> '{record}'\n")
    monkeypatch.setenv("PATH", f"{tools}{os.pathsep}{os.environ['PATH']}")
    odd = "cuda/12.4%=~x@y"
    hostile = "x'; touch pwned $(touch pwned) `touch pwned`"
    site = site_of(tmp_path, f"modules: [{json.dumps(odd)}]\nenv: {{TEST_VALUE: {json.dumps(hostile)}}}\n")
    script = torchprobe.probe_script(torchprobe.environment_of(site, sys.executable))
    assert subprocess.run(["bash", "-n", "-c", script], timeout=30).returncode == 0
    monkeypatch.chdir(tmp_path)
    probe = torchprobe.probe(CLIENT, site, sys.executable)
    assert probe.checked, probe.reason
    assert record.read_text().splitlines() == ["load", odd] and not (tmp_path / "pwned").exists()


def test_an_environment_that_hangs_is_cut_at_the_bound(tmp_path):
    site = site_of(tmp_path, "setup: ['sleep 30']\n")
    probe = torchprobe.probe(CLIENT, site, sys.executable, timeout_s=1)
    assert not probe.checked and "did not answer within 1 s" in probe.reason


def test_a_failing_setup_is_not_checked_with_its_error(tmp_path):
    site = site_of(tmp_path, "setup: ['source /nonexistent/venv/bin/activate']\n")
    probe = torchprobe.probe(CLIENT, site, sys.executable)
    assert probe.reason.startswith("the environment step ended with exit 1:") and "/nonexistent" in probe.reason


def test_an_interpreter_that_is_not_there_is_named(tmp_path):
    site = site_of(tmp_path, f"python: {tmp_path / 'nope' / 'python'}\n")
    assert torchprobe.probe(CLIENT, site, sys.executable).reason == (
        f"the interpreter {tmp_path / 'nope' / 'python'} is not an executable file on this host")
    # Asked on a login node: named, not "this host" (which reads as the machine glaunch runs on).
    assert torchprobe.probe(CLIENT, site, sys.executable, where="login1").reason == (
        f"the interpreter {tmp_path / 'nope' / 'python'} is not an executable file on login1")


# --- against a second interpreter with a fake torch --------------------------------------------


def executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def fake_torch_python(tmp_path) -> Path:
    """An interpreter (a wrapper of this one) whose `import torch` finds a fake torch built
    with CUDA 12.4 and NCCL 2.21.5, as a venv with another torch would."""
    packages = tmp_path / "fake-site-packages" / "torch"
    (packages / "cuda").mkdir(parents=True)
    (packages / "__init__.py").write_text(textwrap.dedent("""\
        __version__ = "9.9.0+cu124"
        from torch import cuda, version
    """))
    (packages / "version.py").write_text('cuda = "12.4"\n')
    (packages / "cuda" / "__init__.py").write_text("from torch.cuda import nccl\n")
    (packages / "cuda" / "nccl.py").write_text("def version():\n    return (2, 21, 5)\n")
    return executable(tmp_path / "venv-python", f"#!/bin/sh\nPYTHONPATH='{packages.parent}' exec "
                                                 f"'{sys.executable}' \"$@\"\n")


def test_the_probe_reports_the_fake_torch_of_the_profiles_python(tmp_path, fake_torch_python):
    site = site_of(tmp_path, f"python: {fake_torch_python}\n")
    probe = torchprobe.probe(CLIENT, site, "/not/the/submitting/python")
    assert probe.checked, probe.reason
    assert probe.line() == (f"torch: 9.9.0+cu124 (CUDA 12.4, NCCL 2.21.5, python {sys.version.split()[0]}) "
                            f"from {sys.executable}")


def test_sites_check_warns_when_the_profiles_torch_is_not_the_submitting_one(
        tmp_path, fake_torch_python, monkeypatch, capsys, isolated_env):
    (tmp_path / "fakesite.yaml").write_text(PROFILE + f"python: {fake_torch_python}\n")
    monkeypatch.setattr(site_tools, "read_cluster", lambda client: None)
    monkeypatch.setattr(site_tools, "check_against_cluster", lambda config, cluster: CheckReport(config.name, "main"))
    monkeypatch.setattr(site_tools, "package_versions", lambda names: {"torch": "2.13.0+cpu"})
    code, out, err = run_cli(monkeypatch, capsys, ["glaunch", "sites", "check", str(tmp_path / "fakesite.yaml")])
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "site fakesite against Slurm cluster main: 0 fatal difference(s), 1 warning(s)"
    assert lines[1].startswith("  warning  python: the profile's environment gives torch 9.9.0+cu124, not the "
                               "2.13.0+cpu this machine submits with")
    assert lines[2].startswith("  torch: 9.9.0+cu124 (CUDA 12.4, NCCL 2.21.5, python ")


def test_sites_check_does_not_fail_for_what_it_cannot_find_out(tmp_path, monkeypatch, capsys, isolated_env):
    (tmp_path / "fakesite.yaml").write_text(PROFILE + "container: {runtime: pyxis, image: 'img:1'}\n")
    monkeypatch.setattr(site_tools, "read_cluster", lambda client: None)
    monkeypatch.setattr(site_tools, "check_against_cluster", lambda config, cluster: CheckReport(config.name, "main"))
    code, out, err = run_cli(monkeypatch, capsys, ["glaunch", "sites", "check", str(tmp_path / "fakesite.yaml"),
                                                   "--json"])
    assert code == 0, err
    found = json.loads(out)
    assert found["ok"] and not found["warnings"] and found["torch"]["checked"] is False
    assert "only srun starts" in found["torch"]["reason"]


class LocalLogin:
    """A login node's connection that runs the words here, as ssh would run them there."""

    def run(self, words, *, input=None, timeout_s=None):
        done = run_bounded(["sh", "-c", shell.join(words)], timeout_s=timeout_s or 30, input=input)
        if done is None:
            raise NoAnswer("login1 did not answer")
        return done

    def where(self):
        return "login1"


def test_over_a_login_the_probe_runs_through_the_login_nodes_slurm_client(tmp_path, fake_torch_python):
    site = site_of(tmp_path, f"python: {fake_torch_python}\nsetup: ['echo loading; echo noise >&2']\n")
    probe = torchprobe.probe(on_login.slurm_client(LocalLogin()), site, sys.executable, where="alice@login1")
    assert probe.checked, probe.reason
    assert probe.line().startswith("torch: 9.9.0+cu124 (CUDA 12.4") and probe.line().endswith(" on alice@login1")
    slow = site_of(tmp_path, "setup: ['sleep 30']\n")
    assert "did not answer within 1 s" in torchprobe.probe(on_login.slurm_client(LocalLogin()), slow, sys.executable,
                                                           where="login1", timeout_s=1).line()


# --- an interpreter the nodes cannot run: sites check and submit fail, naming python: -------------


@pytest.mark.parametrize(("python", "said"), [
    ("{tmp}/nope/python", "{tmp}/nope/python is not an executable file on this host; the nodes run it"),
    ("{exe} -S", "cannot import torch (ModuleNotFoundError: No module named 'torch')"),
    ("{tmp}/broken-python", "did not start"),
])
def test_sites_check_fails_naming_python_when_the_nodes_interpreter_cannot_run_a_job(
        tmp_path, monkeypatch, capsys, isolated_env, python, said):
    executable(tmp_path / "broken-python", "#!/nonexistent/interpreter\n")
    python, said = (text.format(tmp=tmp_path, exe=sys.executable) for text in (python, said))
    (tmp_path / "fakesite.yaml").write_text(PROFILE + f"python: {python}\n")
    monkeypatch.setattr(site_tools, "read_cluster", lambda client: None)
    monkeypatch.setattr(site_tools, "check_against_cluster", lambda config, cluster: CheckReport(config.name, "main"))
    code, out, err = run_cli(monkeypatch, capsys, ["glaunch", "sites", "check", str(tmp_path / "fakesite.yaml")])
    assert code == 3, out + err
    fatal = [line for line in out.splitlines() if line.startswith("  FATAL")]
    assert len(fatal) == 1 and fatal[0].startswith("  FATAL    python: ") and said in fatal[0], out


def test_a_tilde_in_python_is_the_home_of_the_account_the_probe_runs_as(tmp_path, fake_torch_python, monkeypatch):
    (tmp_path / "home" / "venv").mkdir(parents=True)
    os.symlink(fake_torch_python, tmp_path / "home" / "venv" / "python")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    probe = torchprobe.probe(CLIENT, site_of(tmp_path, "python: ~/venv/python\n"), sys.executable)
    assert probe.checked and probe.versions["torch"] == "9.9.0+cu124", probe.reason


def test_submit_checks_that_the_nodes_interpreter_starts_and_finds_torch(tmp_path, fake_torch_python, monkeypatch):
    from launcher.errors import SchedulerError
    from launcher.schedulers.cluster import check
    from launcher.schedulers.slurm import scheduler as slurm_scheduler

    monkeypatch.setattr(check, "check_site", lambda *a, **k: CheckReport("fakesite", "main"))
    monkeypatch.setattr(slurm_scheduler.SlurmScheduler, "cluster", lambda self: None)
    launch = type("Launch", (), {"python": (str(fake_torch_python),)})
    plan = type("Plan", (), {"site": {"modules": [], "setup": [], "env": {}}, "site_file": "fakesite.yaml",
                             "allocation": type("Allocation", (), {"partition": "gpu"}), "launch": launch})
    monkeypatch.setattr(check.Request, "of_plan", staticmethod(lambda plan: None))
    assert slurm_scheduler.SlurmScheduler().check_cluster(plan) == []
    launch.python = (sys.executable, "-S")
    with pytest.raises(SchedulerError) as caught:
        slurm_scheduler.SlurmScheduler().check_cluster(plan)
    assert str(caught.value).startswith("fakesite.yaml: python: ") and "cannot import torch" in str(caught.value)

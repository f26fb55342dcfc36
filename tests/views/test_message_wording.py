"""What a newcomer reads when something is off, a row each: the input, and the fragments the
message must hold (and must not). A mistyped site or `extends` name gets the suggestion a
mistyped key gets; an error about a profile's value names the profile's file, line and key;
a shipped profile is changed through a copy that shadows it, never inside the installed
package; a Python that differs only in its patch version is one quiet note, not a warning
every status repeats; `submit` ends with the next command to type (over SSH naming the
cluster's directory); a tool's own prefix is quoted once. No scheduler is asked: the tool
output is recorded text."""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest

from badinput import run_cli, table
from launcher.config import sites
from launcher.errors import SchedulerError
from launcher.rundir.records import RunRecord
from launcher.runner import node_versions, remote
from launcher.runner.results import Run
from launcher.schedulers.cluster.report import CheckReport, Difference
from launcher.schedulers.slurm.client import Client
from launcher.schedulers.ssh.connection import failure_message
from launcher.views import submit_text

PLAN_EXP = "name: good\nentrypoint: {script: train.py}\nmodel: {params: 1.0e+9}\nresources: {nodes: 1}\n"
NO_GPU_MEM_SITE = """\
name: nomem
scheduler: slurm
default_partition: gpu
partitions:
  gpu:
    gpus_per_node: 4
    cpus_per_node: 32
"""


@dataclass
class Said:
    """`say(root, monkeypatch, capsys)` returns the message; it holds each fragment and none
    of `not_in`."""

    id: str
    say: Callable[..., str]
    fragments: Sequence[str] = ()
    not_in: Sequence[str] = ()


def cli(*argv: str, files: dict[str, str] | None = None) -> Callable[..., str]:
    """The CLI's stdout and stderr, run in the working directory with `files` written."""

    def say(root: Path, monkeypatch, capsys) -> str:
        for name, text in (files or {}).items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
        _, out, err = run_cli(monkeypatch, capsys, ["glaunch", *argv])
        return out + err

    return say


def shipped(name: str) -> str:
    return str(sites.SHIPPED_SITES / f"{name}.yaml")


def status_warnings(nodes_python: str) -> str:
    record = RunRecord.from_dict({
        "run_id": "r-1", "state": "COMPLETED", "requeue_max": 0, "crash_retries": 0,
        "provenance": {"python": "3.11.7", "packages": {"torch": "2.13.0"}},
        "starts": [{"job_id": "7", "restart": 0,
                    "versions": {"node1": {"python": nodes_python, "torch": "2.13.0"}}}]})
    return "\n".join(node_versions.version_warnings(record))


def sites_check_environment() -> str:
    planned, found = {"python": "3.11.7", "torch": "2.13.0"}, {"python": "3.11.2", "torch": "2.13.0"}
    return (f"warnings: {node_versions.environment_warnings(planned, found)}; "
            f"notes: {node_versions.environment_notes(planned, found)}")


def remote_python_warning() -> str:
    loaded = SimpleNamespace(config=SimpleNamespace(python=None), path=Path(shipped("local-slurm-remote")))
    return str(remote.python_warning(loaded, SimpleNamespace(launch=SimpleNamespace(container=None, python=("/usr/bin/python3",)))))


def refusal_of_shipped_profile() -> str:
    report = CheckReport("local-slurm", "main", fatal=[Difference("partitions.x.gpus_per_node", "4 > 2", True)])
    return str(report.error(shipped("local-slurm")))


def sbatch_refusal() -> str:
    said = "sbatch: error: Batch job submission failed: Invalid partition name specified\n"
    client = Client(runner=lambda cmd, **_: subprocess.CompletedProcess(cmd, 1, "", said),
                    sleep=lambda s: pytest.fail("retried a refusal"))
    with pytest.raises(SchedulerError) as caught:
        client.submit(["sbatch", "job.sh"], lookup=lambda d: pytest.fail("looked up"))
    return str(caught.value)


def submitted(**over_ssh: str) -> str:
    return submit_text.started(Run("r-1", Path("/home/u/.local/state/glaunch/runs/r-1"), "mysite", False, (),
                                   "PENDING", job_id="42", **over_ssh))


ROWS = [
    Said("site-name-typo", cli("submit", "exp.yaml", "--site", "loca", "--dry-run"),
         ["--site: unknown site 'loca' (searched: ", "did you mean 'local'?"]),
    Said("extends-name-typo",
         cli("submit", "exp.yaml", "--site", "child", "--dry-run",
             files={"site_configs/child.yaml": "name: child\nextends: mysit\n"}),
         ["child.yaml:2: extends: unknown site 'mysit'", "did you mean 'mysite'?"]),
    Said("plan-blames-the-profile",
         cli("plan", "exp.yaml", "--site", "nomem",
             files={"exp.yaml": PLAN_EXP, "site_configs/nomem.yaml": NO_GPU_MEM_SITE}),
         ["site_configs/nomem.yaml:5: partitions.gpu.gpu_mem_gb: site 'nomem' gives no gpu_mem_gb"],
         ["exp.yaml", "resources.partition"]),
    Said("plan-on-a-shipped-profile-says-how-to-shadow-it",
         cli("plan", "exp.yaml", "--site", "local", files={"exp.yaml": PLAN_EXP}),
         [shipped("local") + ":", "partitions.local.gpu_mem_gb",
          "copy it to ./site_configs/local.yaml or ~/.config/glaunch/sites/local.yaml"]),
    Said("remote-python-warning-on-a-shipped-profile", lambda *_: remote_python_warning(),
         ["set python: to the cluster's interpreter in your own copy of local-slurm-remote",
          "copy it to ./site_configs/local-slurm-remote.yaml"], [shipped("local-slurm-remote")]),
    Said("refusal-of-a-shipped-profile", lambda *_: refusal_of_shipped_profile(),
         ["fix the profile", "copy it to ./site_configs/local-slurm.yaml"]),
    Said("sites-check-python-patch-is-a-note", lambda *_: sites_check_environment(),
         ["warnings: []", "notes: ['python 3.11.2 on the nodes, 3.11.7 here: only the patch version differs']"]),
    Said("status-does-not-repeat-a-python-patch", lambda *_: status_warnings("3.11.2"), [], ["3.11.2"]),
    Said("status-warns-of-another-python-minor", lambda *_: status_warnings("3.10.12"),
         ["the ranks import python 3.10.12 on node1, not the 3.11.7"]),
    Said("submit-ends-with-the-next-command", lambda *_: submitted(),
         ["run r-1: submitted job 42\nrun directory: /home/u/.local/state/glaunch/runs/r-1\n"
          "next: glaunch logs -f r-1   |   glaunch status r-1"]),
    Said("submit-over-ssh-names-the-cluster-directory",
         lambda *_: submitted(cluster_host="login1", cluster_dir="/scratch/u/runs/r-1"),
         ["run directory on login1: /scratch/u/runs/r-1", "next: glaunch logs -f r-1"],
         ["run directory: /home"]),
    Said("dry-run-says-how-to-submit",
         cli("submit", "exp.yaml", "--site", "mysite", "--dry-run", "resources.nodes=1", "env.A=x y"),
         ["\nto submit it: glaunch submit exp.yaml --site mysite resources.nodes=1 'env.A=x y'\n"]),
    Said("ssh-prefix-once",
         lambda *_: failure_message("alice@login1", b"ssh: Could not resolve hostname nowhere.invalid: "
                                                    b"Name or service not known\n"),
         ["cannot reach alice@login1 (ssh: Could not resolve hostname nowhere.invalid"], ["ssh: ssh:"]),
    Said("sbatch-prefix-once", lambda *_: sbatch_refusal(),
         ["sbatch refused the job: Batch job submission failed: Invalid partition name specified"],
         ["sbatch: error"]),
]


@table(ROWS)
def test_message_wording(case, mysite_workdir, monkeypatch, capsys):
    said = case.say(mysite_workdir, monkeypatch, capsys)
    for fragment in case.fragments:
        assert fragment in said, f"{fragment!r} not in {said!r}"
    for fragment in case.not_in:
        assert fragment not in said, f"{fragment!r} in {said!r}"

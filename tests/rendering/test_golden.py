"""Golden files: rendered job.sbatch, env.sh and task.json for every shipped profile x
launch mode (examples/torch_ddp.yaml), and for other strategies' examples on one profile
(EXAMPLES: examples/fsdp.yaml, whose run bundle has no ds_config.json, and the ds_config.json
of examples/deepspeed_zero2.yaml, which turns bf16 on); the scripts also
clean under `bash -n` and plain `shellcheck` (no flags: each file names its shell).
`pytest --update-golden` rewrites them."""

import dataclasses
import difflib
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from launcher import schedulers
from launcher.config.load import load_experiment
from launcher.config.sites import load_site
from launcher.config.sites import SHIPPED_SITES
from launcher.rendering.task_json import task_file_text
from launcher.resolution.jobplan import JobPlan, SubmitContext
from launcher.resolution.resolve import resolve
from launcher.rundir.layout import DS_CONFIG_FILE, TASK_FILE

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent.parent / "golden"
ENVIRON = {"HOME": "/home/alice", "USER": "alice", "SCRATCH": "/scratch/alice", "WORK": "/work/alice",
           "SCRATCHDIR": "/scratchdir/alice", "PROJECT": "/project/p1"}
SITES = sorted(p.stem for p in SHIPPED_SITES.glob("*.yaml"))
CASES = [(site, launcher) for site in SITES for launcher in ("srun", "torchrun")]
# (example, site, launcher): other strategies' examples, golden as SITE.LAUNCHER.EXAMPLE.FILE.
EXAMPLES = [("fsdp", "local-slurm", "srun"), ("deepspeed_zero2", "local-slurm", "srun")]
GOLDEN_FILES = ("job.sbatch", "env.sh", TASK_FILE, DS_CONFIG_FILE)
# An example's golden files where only some differ from torch_ddp's in kind.
EXAMPLE_FILES = {"deepspeed_zero2": (DS_CONFIG_FILE,)}


def plan_case(site: str, launcher: str, example: str = "torch_ddp") -> JobPlan:
    exp = load_experiment(REPO / "examples" / f"{example}.yaml", [f"launcher={launcher}"])
    # A fixed experiment location so golden files do not depend on the checkout path.
    exp = dataclasses.replace(exp, path=Path(f"/home/alice/exp/{example}.yaml"))
    loaded = load_site(site, Path("/nonexistent"), ENVIRON)
    nodes = 1 if loaded.config.scheduler == "local" else 2
    exp = dataclasses.replace(exp, config=dataclasses.replace(
        exp.config, resources=dataclasses.replace(exp.config.resources, nodes=nodes)))
    ctx = SubmitContext(cwd="/home/alice/exp", python="/usr/bin/python3", environ=ENVIRON,
                        run_id=f"{example.replace('_', '-')}-20260101-000000-abcd")
    return resolve(exp, loaded, ctx)


def render_case(site: str, launcher: str, example: str = "torch_ddp") -> dict[str, str]:
    plan = plan_case(site, launcher, example)
    return schedulers.get(plan.scheduler).render(plan)


def task_text(site: str, launcher: str, example: str = "torch_ddp") -> str:
    """The run's task.json, as the bundle holds it."""
    return task_file_text(plan_case(site, launcher, example))


def test_every_shipped_profile_is_covered():
    assert {"local", "base-slurm", "local-slurm"} - set(SITES) <= {"local-slurm"}
    assert len([s for s in SITES if s not in ("local", "base-slurm", "local-slurm")]) >= 3


@pytest.mark.parametrize("site,launcher", CASES)
def test_golden(site, launcher, update_golden, tmp_path):
    if site == "base-slurm":
        pytest.skip("base-slurm has no partitions: it is only extended")
    files = dict(render_case(site, launcher), **{TASK_FILE: task_text(site, launcher)})
    compare_golden(files, f"{site}.{launcher}", update_golden)


@pytest.mark.parametrize("example,site,launcher", EXAMPLES)
def test_golden_example(example, site, launcher, update_golden):
    files = render_case(site, launcher, example)
    compare_golden(files, f"{site}.{launcher}.{example}", update_golden, EXAMPLE_FILES.get(example, GOLDEN_FILES))


def test_fsdp_bundle_names_its_strategy_and_has_no_deepspeed_config():
    files = render_case("local-slurm", "srun", "fsdp")
    assert "ds_config.json" not in files and "ds_config.json" in render_case("local-slurm", "srun", "deepspeed_zero2")
    assert re.search(r"^export GLAUNCH_STRATEGY='?fsdp'?$", files["env.sh"], re.M), files["env.sh"]


def compare_golden(files: dict[str, str], prefix: str, update_golden: bool, names=GOLDEN_FILES) -> None:
    failures = []
    for name in names:
        if name not in files:
            continue
        golden = GOLDEN / f"{prefix}.{name}"
        if update_golden or not golden.exists():
            golden.parent.mkdir(parents=True, exist_ok=True)
            golden.write_text(files[name])
            if not update_golden:
                failures.append(f"{golden} did not exist; written -- review and commit it")
            continue
        expected = golden.read_text()
        if files[name] != expected:
            diff = "".join(difflib.unified_diff(expected.splitlines(True), files[name].splitlines(True),
                                                str(golden), "rendered"))
            failures.append(diff + "\n(run `pytest --update-golden` if the change is intended)")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("site,launcher,example", [(*case, "torch_ddp") for case in CASES]
                         + [(site, launcher, example) for example, site, launcher in EXAMPLES])
def test_rendered_scripts_are_shell_clean(site, launcher, example, tmp_path):
    if site == "base-slurm":
        pytest.skip("base-slurm has no partitions: it is only extended")
    files = render_case(site, launcher, example)
    for name in ("job.sbatch", "env.sh"):
        path = tmp_path / name
        path.write_text(files[name])
        syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert syntax.returncode == 0, syntax.stderr
        if shutil.which("shellcheck"):
            check = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True)
            assert check.returncode == 0, f"{site}/{launcher}/{name}:\n{check.stdout}"


def test_shellcheck_is_available_in_ci():
    import os
    if os.environ.get("CI") == "true":
        assert shutil.which("shellcheck"), "CI must install shellcheck"

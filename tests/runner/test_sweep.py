"""Sweeps without a cluster: --sweep values into elements, elements into one job array per
allocation shape within MaxArraySize, the array script (golden, shellcheck, and run by real
bash: each task runs its own element), a bad element refusing the whole sweep with
nothing written, the dry run, sweep ids in status/list, and the local site running the
elements one after another or N at a time."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launcher import api
from launcher.errors import ConfigError
from launcher.resolution.sweep import expand, parse_axes, split_values
from launcher.schedulers.slurm import array as slurm_array
from launcher.schedulers.cluster.facts import parse_cluster
from launcher.schedulers.slurm.scheduler import SlurmScheduler

REPO = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent.parent / "golden"
RECORDED = Path(__file__).parent.parent / "recorded_cluster"


def glaunch(*args, env, cwd=REPO, timeout=300):
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


# --- values -> elements ------------------------------------------------------------------------


def test_values_split_at_top_level_commas_only():
    assert split_values("1e-4,3e-4") == ["1e-4", "3e-4"]
    assert split_values("[--lr,1],[--lr,2]") == ["[--lr,1]", "[--lr,2]"]
    assert split_values("{a: 1, b: 2},'x,y',\"p,q\"") == ["{a: 1, b: 2}", "'x,y'", '"p,q"']
    for bad in ("[a,b", "a]", "'open"):
        with pytest.raises(ValueError):
            split_values(bad)


def test_cartesian_product_first_axis_slowest():
    elements = expand(parse_axes(["hparams.lr=1e-4,3e-4", "resources.nodes=1,2,4"]))
    assert [e.label() for e in elements] == [
        "hparams.lr=1e-4 resources.nodes=1", "hparams.lr=1e-4 resources.nodes=2", "hparams.lr=1e-4 resources.nodes=4",
        "hparams.lr=3e-4 resources.nodes=1", "hparams.lr=3e-4 resources.nodes=2", "hparams.lr=3e-4 resources.nodes=4"]
    assert elements[4].overrides == ("hparams.lr=3e-4", "resources.nodes=2")
    assert [e.index for e in elements] == list(range(6))


@pytest.mark.parametrize("item,words", [
    ("hparams.lr", "not KEY=V1,V2"),
    ("hparams.lr=1,,2", "empty value"),
    ("site=a,b", "cannot be swept"),
    ("name=a,b", "cannot be swept"),
    ("hparams.lr=1,1", "repeats a value"),
    ("hparams.lr=[1,2", "cannot split"),
    ("9bad=1,2", "not KEY=VALUE"),
])
def test_bad_sweep_options_name_the_option(item, words):
    with pytest.raises(ConfigError) as err:
        parse_axes([item])
    assert words in str(err.value) and err.value.exit_code == 2 and "--sweep" in str(err.value.key)


def test_the_same_key_twice_or_nested_is_refused():
    with pytest.raises(ConfigError, match="swept twice"):
        parse_axes(["resources.nodes=1,2", "resources.nodes=4"])
    with pytest.raises(ConfigError, match="overlaps"):
        parse_axes(["resources=1", "resources.nodes=1,2"])


def test_too_many_elements_is_refused():
    with pytest.raises(ConfigError, match="split the sweep"):
        expand(parse_axes([f"hparams.a={','.join(map(str, range(100)))}",
                           f"hparams.b={','.join(map(str, range(100)))}"]))


# --- elements -> arrays -------------------------------------------------------------------------


def sweep_of(tmp_path, *sweep, site="local-slurm", overrides=(), max_parallel=None, runs="runs"):
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        return api.prepare_sweep("examples/torch_ddp.yaml", list(sweep), site=site, overrides=list(overrides),
                                 runs_dir=str(tmp_path / runs), max_parallel=max_parallel, dry_run=True)
    finally:
        os.chdir(cwd)


def test_one_array_per_allocation_shape(tmp_path, isolated_env):
    prepared = sweep_of(tmp_path, "entrypoint.args=[--steps,5],[--steps,6]", "resources.nodes=1,2",
                        max_parallel=1)
    plans = [p.plan for p in prepared.prepared]
    groups = slurm_array.group(plans)
    assert [g.elements for g in groups] == [(0, 2), (1, 3)]        # nodes=1, nodes=2
    assert groups[0].spec(1) == "0-1%1" and groups[0].spec(None) == "0-1" and groups[0].spec(5) == "0-1"
    assert "#SBATCH --nodes=2" in groups[1].shape and "#SBATCH --nodes=1" in groups[0].shape
    # Only the log path differs between elements of one shape.
    assert not any("--output" in line for g in groups for line in g.shape)


def test_max_array_size_splits_a_shape(tmp_path, isolated_env):
    prepared = sweep_of(tmp_path, "entrypoint.args=[--steps,1],[--steps,2],[--steps,3],[--steps,4],[--steps,5]")
    plans = [p.plan for p in prepared.prepared]
    groups = slurm_array.group(plans, max_array_size=2)
    assert [g.elements for g in groups] == [(0, 1), (2, 3), (4,)] and groups[2].spec(None) == "0"
    recorded = parse_cluster((RECORDED / "glaunch.scontrol.txt").read_text())
    assert slurm_array.max_array_size(recorded.settings) == 1001
    assert slurm_array.max_array_size({"MaxArraySize": "17"}) == 17
    assert slurm_array.max_array_size({}) == slurm_array.DEFAULT_MAX_ARRAY_SIZE


def test_array_script_golden_and_shell_clean(tmp_path, isolated_env, update_golden):
    prepared = sweep_of(tmp_path, "entrypoint.args=[--steps,5],[--steps,6]", "resources.nodes=1,2", max_parallel=1)
    plans = [p.plan for p in prepared.prepared]
    # Fixed names, so the golden file does not depend on the checkout or the clock.
    sweep_id = "torch-ddp-sweep-20260101-000000-abcd"
    plans = [dataclasses.replace(p, run_dir=f"/home/alice/exp/runs/{sweep_id}/{sweep_id}-{i}",
                                 workdir="/home/alice/exp") for i, p in enumerate(plans)]
    files = SlurmScheduler().plan_sweep(plans, sweep_id=sweep_id, sweep_dir=f"/home/alice/exp/runs/{sweep_id}",
                                        max_parallel=1, dry_run=True).files
    assert sorted(files) == ["array-0.sbatch", "array-1.sbatch"]
    golden = GOLDEN / "local-slurm.sweep.array-0.sbatch"
    if update_golden or not golden.exists():
        golden.write_text(files["array-0.sbatch"])
    assert files["array-0.sbatch"] == golden.read_text()
    for name, text in files.items():
        path = tmp_path / name
        path.write_text(text)
        assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
        if shutil.which("shellcheck"):
            check = subprocess.run(["shellcheck", str(path)], capture_output=True, text=True)
            assert check.returncode == 0, check.stdout
    assert "#SBATCH --array=0-1%1" in files["array-0.sbatch"]


def test_each_array_task_runs_its_own_element(tmp_path):
    """The array script, run by bash as Slurm would (SLURM_ARRAY_*), execs the job.sbatch of
    the element its task maps to, in that element's working folder (over SSH without a code
    snapshot each element's folder is its own: still one array, as --max-parallel needs),
    its output going to that element's batch log."""
    prepared = sweep_of(tmp_path, "entrypoint.args=[--steps,5],[--steps,6],[--steps,7]")
    plans = [p.plan for p in prepared.prepared]
    sweep_dir = tmp_path / "sweep"
    plans = [dataclasses.replace(p, run_dir=str(sweep_dir / f"e{i}"), workdir=str(sweep_dir / f"e{i}" / "code it's"))
             for i, p in enumerate(plans)]
    assert len(slurm_array.group(plans)) == 1
    for i, plan in enumerate(plans):
        (Path(plan.workdir)).mkdir(parents=True)
        (Path(plan.run_dir) / "logs").mkdir(parents=True)
        (Path(plan.run_dir) / "job.sbatch").write_text(f'echo "element {i} as $SLURM_ARRAY_JOB_ID in $PWD"\n')
    files = SlurmScheduler().plan_sweep(plans, sweep_id="s", sweep_dir=str(sweep_dir), max_parallel=None,
                                        dry_run=True).files
    assert sorted(files) == ["array-0.sbatch"]
    text = files["array-0.sbatch"]
    script = tmp_path / "array.sbatch"
    script.write_text(text)
    base = {"PATH": os.environ["PATH"], "SLURM_ARRAY_JOB_ID": "77"}
    for task in range(3):
        proc = subprocess.run(["bash", str(script)], env=dict(base, SLURM_ARRAY_TASK_ID=str(task)),
                              capture_output=True, text=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
        assert (sweep_dir / f"e{task}" / "logs" / f"77_{task}_batch.log").read_text() == \
            f"element {task} as 77 in {sweep_dir}/e{task}/code it's\n"
        # The task's own log (Slurm's --output) gets only the line each start begins with.
        assert proc.stdout == f"glaunch: start of array task 77_{task} begins (Slurm restart count 0)\n"
    proc = subprocess.run(["bash", str(script)], env=dict(base, SLURM_ARRAY_TASK_ID="0", SLURM_RESTART_COUNT="2$(x)"),
                          capture_output=True, text=True, timeout=30)
    assert proc.stdout == "glaunch: start of array task 77_0 begins (Slurm restart count 2)\n"
    proc = subprocess.run(["bash", str(script)], env=dict(base, SLURM_ARRAY_TASK_ID="3"), capture_output=True,
                          text=True, timeout=30)
    assert proc.returncode == 1 and "array task 3 has no element in sweep s" in proc.stderr
    proc = subprocess.run(["bash", str(script)], env=dict(base, SLURM_ARRAY_JOB_ID="1;x", SLURM_ARRAY_TASK_ID="0"),
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 1 and "not a task of a job array" in proc.stderr


def test_an_element_requeues_alone_and_keeps_its_array_id(tmp_path, isolated_env):
    prepared = sweep_of(tmp_path, "entrypoint.args=[--steps,5],[--steps,6]")
    files = prepared.prepared[1].files
    job = files["job.sbatch"]
    # The job controller requeues the job env.sh names: the element's own task of the array.
    assert " -m launcher.jobcontrol.controller " in job and " --requeue " in job
    run_dir = prepared.prepared[1].plan.run_dir
    assert f"--output={run_dir}/logs/%A_%a_%t_log.out" in job
    assert 'export GLAUNCH_JOB_ID="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"' in files["env.sh"]
    # Each element runs the sweep's one snapshot, and has its own checkpoints.
    sweep_dir = prepared.sweep_dir
    assert prepared.prepared[1].plan.launch.entry_script == str(sweep_dir / "code" / "examples" / "torch_ddp.py")
    assert prepared.prepared[1].plan.checkpoint_dir == f"{run_dir}/checkpoints"


def test_a_swept_key_the_job_never_sees_is_a_warning(tmp_path, isolated_env):
    """model.params only sizes `glaunch plan`: every element would run the same job."""
    warning = "sweeping {} changes nothing the job sees (not in its args, env or hparams)"
    prepared = sweep_of(tmp_path, "model.params=1e6,2e6", "hparams.lr=0.003,0.01", "requeue.max=1,2",
                        "precision=fp32,bf16")
    assert prepared.unseen == ("model.params",)
    assert warning.format("model.params") in prepared.warnings
    assert not any("hparams.lr" in w or "precision" in w for w in prepared.warnings)
    assert sweep_of(tmp_path, "model.params=1e6").unseen == ()       # one value: an override, nothing compared
    proc = glaunch("submit", "examples/torch_ddp.yaml", "--site", "local-slurm", "--dry-run", "--runs-dir",
                   str(tmp_path / "cli"), "--sweep", "model.activation_checkpointing=none,full", env=isolated_env)
    assert proc.returncode == 0, proc.stderr
    assert f"glaunch: warning: {warning.format('model.activation_checkpointing')}" in proc.stderr


def test_one_bad_element_refuses_the_sweep_naming_it(tmp_path, isolated_env):
    proc = glaunch("submit", "examples/torch_ddp.yaml", "--site", "local-slurm", "--dry-run", "--runs-dir",
                   str(tmp_path / "runs"), "--sweep", "resources.nodes=1,2,3", "--sweep", "resources.time=10,20",
                   env=isolated_env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "sweep element 4 (resources.nodes=3 resources.time=10)" in proc.stderr
    assert "resources.nodes" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "runs").exists()


def test_dry_run_renders_every_element_prints_the_array_script_once(tmp_path, isolated_env):
    proc = glaunch("submit", "examples/torch_ddp.yaml", "--site", "local-slurm", "--dry-run", "--runs-dir",
                   str(tmp_path / "runs"), "--sweep", "entrypoint.args=[--steps,5],[--steps,6]",
                   "--sweep", "requeue.max=1,2", "--max-parallel", "2", env=isolated_env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("#!/bin/bash") == 1 and "4 element(s) in 1 job array(s)" in proc.stdout
    assert "#SBATCH --array=0-3%2" in proc.stdout
    (sweep_dir,) = (tmp_path / "runs").iterdir()
    record = json.loads((sweep_dir / "sweep.json").read_text())
    assert [e["params"] for e in record["elements"]] == [
        {"entrypoint.args": "[--steps,5]", "requeue.max": "1"}, {"entrypoint.args": "[--steps,5]", "requeue.max": "2"},
        {"entrypoint.args": "[--steps,6]", "requeue.max": "1"}, {"entrypoint.args": "[--steps,6]", "requeue.max": "2"}]
    for element in record["elements"]:
        run_dir = Path(element["run_dir"])
        assert run_dir.parent == sweep_dir and (run_dir / "job.sbatch").is_file()
        run = json.loads((run_dir / "run.json").read_text())
        assert run["state"] == "RENDERED" and run["sweep"]["index"] == element["index"]
        assert not (run_dir / "code").exists()                     # one snapshot, the sweep's
    assert (sweep_dir / "code" / "examples" / "torch_ddp.py").is_file()
    assert "--steps 6" in (Path(record["elements"][3]["run_dir"]) / "job.sbatch").read_text()
    # The sweep id works where a run id does.
    status = glaunch("status", record["sweep_id"], "--json", env=isolated_env)
    summary = json.loads(status.stdout)
    assert summary["state"] == "RENDERED" and [r["params"]["requeue.max"] for r in summary["elements"]] == \
        ["1", "2", "1", "2"]
    text = glaunch("status", record["sweep_id"], env=isolated_env).stdout
    assert "4 element(s): 4 RENDERED" in text and "requeue.max" in text.splitlines()[3]
    listed = glaunch("list", env=isolated_env).stdout
    assert record["sweep_id"] in listed and f"{record['sweep_id']}-0" not in listed
    elements = glaunch("list", record["sweep_id"], "--json", env=isolated_env)
    assert len(json.loads(elements.stdout)["elements"]) == 4
    # `list SWEEP` prints the elements' table of `status SWEEP` (from the rows alone) and its count line.
    table = glaunch("list", record["sweep_id"], env=isolated_env).stdout.splitlines()
    assert [f"  {line}" for line in table[:-1]] == text.splitlines()[3:8] and table[-1] == "4 element(s): 4 RENDERED"
    assert "nothing to cancel" in glaunch("cancel", record["sweep_id"], env=isolated_env).stdout


SLEEPER = """\
import json, os, sys, time
hp = json.load(open(os.environ["GLAUNCH_HPARAMS"]))
start = time.time()
time.sleep(float(sys.argv[1]))
if os.environ.get("RANK", "0") == "0":
    with open(os.path.join(os.environ["GLAUNCH_RUN_DIR"], "result.json"), "w") as f:
        json.dump({"final_step": 1, "start": start, "end": time.time(), "arg": sys.argv[1]}, f)
"""


# Each element says it started, then waits (up to 120 s) until every element has: it ends
# only when all ran at the same time, however slowly each one starts.
TOGETHER = """\
import json, os, sys, time
here = os.path.join(os.path.dirname(os.environ["GLAUNCH_RUN_DIR"]), "started")
os.makedirs(here, exist_ok=True)
open(os.path.join(here, sys.argv[1]), "w").close()
deadline = time.monotonic() + 120
while len(os.listdir(here)) < 3:
    if time.monotonic() > deadline:
        sys.exit("the other elements never started beside this one")
    time.sleep(0.05)
with open(os.path.join(os.environ["GLAUNCH_RUN_DIR"], "result.json"), "w") as f:
    json.dump({"final_step": 1, "start": 0, "end": 0, "arg": sys.argv[1]}, f)
"""


def _local_sweep(tmp_path, env, *extra, script=SLEEPER):
    (tmp_path / "sleep.py").write_text(script)
    (tmp_path / "exp.yaml").write_text("name: nap\nentrypoint: {script: sleep.py, args: ['1']}\n"
                                       "resources: {gpus_per_node: 1, time: '5'}\nrequeue: {max: 0, signal_lead_s: 10}\n")
    proc = glaunch("submit", str(tmp_path / "exp.yaml"), "--runs-dir", str(tmp_path / "runs"),
                   "--sweep", "entrypoint.args=[1.5],[1.6],[1.7]", *extra, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (sweep_dir,) = (tmp_path / "runs").iterdir()
    record = json.loads((sweep_dir / "sweep.json").read_text())
    spans = [json.loads((Path(e["run_dir"]) / "result.json").read_text()) for e in record["elements"]]
    return proc, [(s["start"], s["end"], s["arg"]) for s in spans]


def test_local_site_runs_the_elements_one_after_another(tmp_path, isolated_env):
    proc, spans = _local_sweep(tmp_path, isolated_env)
    assert [a for _, _, a in spans] == ["1.5", "1.6", "1.7"]
    assert all(spans[i][1] <= spans[i + 1][0] for i in range(2)), spans
    assert "3 element(s): 3 COMPLETED" in proc.stdout


def test_local_site_runs_n_at_a_time(tmp_path, isolated_env):
    proc, spans = _local_sweep(tmp_path, isolated_env, "--max-parallel", "3", script=TOGETHER)
    assert sorted(a for _, _, a in spans) == ["1.5", "1.6", "1.7"]        # all three met while running
    assert "3 element(s): 3 COMPLETED" in proc.stdout


def test_wait_says_each_change_of_state_of_a_run_or_an_element_in_one_line():
    from launcher.runner.results import StateChange
    from launcher.views.submit_text import state_line

    assert state_line(StateChange("RUNNING", "123")) == "[glaunch] job 123: RUNNING"
    assert state_line(StateChange("PENDING", None, sweep=True, element=2)) == "[glaunch] element 2 (job None): PENDING"


def test_pending_array_rows_of_sacct_become_one_row_per_task():
    rows = [{"job_id": "572_[0-2]", "state": "CANCELLED by 0"}, {"job_id": "573_1", "state": "COMPLETED"},
            {"job_id": "573_[0,2-3%2]", "state": "PENDING"}]
    assert [(r["job_id"], r["state"]) for r in slurm_array.task_rows(rows)] == [
        ("572_0", "CANCELLED by 0"), ("572_1", "CANCELLED by 0"), ("572_2", "CANCELLED by 0"),
        ("573_1", "COMPLETED"), ("573_0", "PENDING"), ("573_2", "PENDING"), ("573_3", "PENDING")]
    assert slurm_array.array_job_id("573_[0,2-3%2]") == "573" and slurm_array.array_job_id("12") == "12"

"""The user contract of the Python API and the run commands (DESIGN.md, README): what
`api.wait(run, on_line=print)` hands on, what a RUN that names nothing exits with, and
what `glaunch sites check` does with a profile that has no cluster."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher import api
from launcher.errors import ConfigError
from launcher.rundir import registry
from launcher.rundir.layout import RunDir
from launcher.runner.logs import LogFollower

REPO = Path(__file__).resolve().parent.parent


def ended_run(tmp_path: Path, state: str = "COMPLETED", job_id: str = "1000") -> Path:
    """A local run's directory as its job leaves it at its end."""
    run_dir = tmp_path / "runs" / "r"
    (run_dir / "logs").mkdir(parents=True)
    record = {"run_id": "r", "site": "local", "scheduler": "local", "dry_run": False, "requeue_max": 0,
              "crash_retries": 0, "state": state, "job_id": job_id,
              "starts": [{"job_id": job_id, "restart": 0, "state": state}]}
    (run_dir / "run.json").write_text(json.dumps(record))
    registry.register("r", str(run_dir))
    return run_dir


def glaunch(*args, env, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


# --- the names the API exports (DESIGN.md "Python API") ---------------------------------------

DESIGN_NAMES = {"submit", "status", "wait", "cancel", "list_runs", "resume", "plan", "run", "logs", "sites",
                "check_site", "detect_site"}


def test_the_api_exports_the_names_design_lists_and_the_steps_and_results_of_submit():
    assert set(api.__all__) == DESIGN_NAMES | {"prepare", "prepare_sweep", "prepare_resume", "launch", "Run",
                                               "Sweep", "init"}
    assert all(callable(getattr(api, name)) for name in api.__all__)


def test_the_api_module_has_no_name_beyond_those_it_exports():
    """Formatting is launcher.views'; the API imports its names plainly (no lazy table)."""
    public = {name for name, value in vars(api).items()
              if not name.startswith("_") and getattr(value, "__module__", None) == api.__name__
              and callable(value)}
    assert public <= set(api.__all__), public - set(api.__all__)
    assert not hasattr(api, "__getattr__") and not hasattr(api, "format_status")


# --- api.wait(run, on_line=print) -----------------------------------------------------------


def test_wait_hands_on_line_one_whole_line_per_call(tmp_path, isolated_env):
    run_dir = ended_run(tmp_path)
    RunDir(run_dir).task_log("1000", 0).write_bytes("step 1\nstep 2 \u00e9\n\ndone".encode())
    lines: list[str] = []
    assert api.wait(str(run_dir), on_line=lines.append, poll_s=0) == "COMPLETED"
    assert lines == ["step 1", "step 2 \u00e9", "", "done"]


def test_a_character_cut_between_two_reads_of_a_growing_log_arrives_whole(tmp_path):
    path = tmp_path / "log"
    data = "caf\u00e9 \u2713\n".encode()
    got: list[str] = []
    follower = LogFollower(path, got.append)
    for cut in range(1, len(data) + 1):      # the file grows one byte at a time
        path.write_bytes(data[:cut])
        follower.poll()
    assert "".join(got) == "caf\u00e9 \u2713\n" and "\ufffd" not in "".join(got)


def test_logs_keep_the_rank_tag_on_an_unfinished_last_line(tmp_path, isolated_env):
    run_dir = ended_run(tmp_path)
    rd = RunDir(run_dir)
    rd.task_log("1000", 0).write_text("a\nb")
    rd.task_log("1000", 1, "err").write_text("boom")
    lines: list[str] = []
    api.logs(str(run_dir), echo=lines.append)
    assert sorted(lines) == ["[r0] a", "[r0] b", "[r1!] boom"]


# --- a RUN that names nothing is bad input ------------------------------------------------


@pytest.mark.parametrize("command", ["status", "logs", "cancel", "resume"])
def test_unknown_run_is_bad_input_exit_2(tmp_path, isolated_env, command):
    proc = glaunch(command, "no-such-run", env=isolated_env, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "RUN" in proc.stderr and "no-such-run" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_unknown_run_in_the_api_is_a_config_error(tmp_path, isolated_env, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as caught:
        api.status(str(tmp_path / "not-a-run"))
    assert caught.value.exit_code == 2 and caught.value.key == "RUN"


def test_a_failed_run_still_exits_1_and_an_after_on_a_missing_run_still_names_after(tmp_path, isolated_env):
    run_dir = ended_run(tmp_path, state="FAILED")
    proc = glaunch("status", str(run_dir), env=isolated_env)
    assert proc.returncode == 0 and "FAILED" in proc.stdout, proc.stderr
    proc = glaunch("submit", "examples/torch_ddp.yaml", "--dry-run", "--runs-dir", str(tmp_path / "out"),
                   "--after", "no-such-run", env=isolated_env)
    assert proc.returncode == 2 and "--after: no-such-run:ok: no run 'no-such-run'" in proc.stderr, proc.stderr
    assert not (tmp_path / "out").exists()


# --- sites check on a profile without a cluster ---------------------------------------------


def test_sites_check_of_a_local_profile_is_bad_input_and_asks_no_slurm(tmp_path, isolated_env):
    # A stand-in scontrol/sinfo/sacctmgr (mock: which Slurm command was called) first on PATH.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    called = tmp_path / "called"
    for name in ("scontrol", "sinfo", "sacctmgr", "squeue"):
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\necho {name} >> {called}\nexit 1\n")
        script.chmod(0o755)
    env = dict(isolated_env, PATH=f"{bin_dir}{os.pathsep}{isolated_env['PATH']}")
    proc = glaunch("sites", "check", "local", env=env)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "local.yaml" in proc.stderr and "scheduler" in proc.stderr and "Traceback" not in proc.stderr
    assert not called.exists(), called.read_text()


# --- the API takes one string where it takes a list of them ---------------------------------


def test_api_takes_a_single_override_sweep_and_after_as_one_item(tmp_path, isolated_env, monkeypatch):
    monkeypatch.chdir(REPO)
    runs = str(tmp_path / "runs")
    run = api.submit("examples/torch_ddp.yaml", site="local-slurm", overrides="resources.nodes=2", dry_run=True,
                     runs_dir=runs)
    assert run.job_id is None and registry.read(run.run_dir).nodes == 2
    sweep = api.submit("examples/torch_ddp.yaml", site="local-slurm", sweep="hparams.lr=1e-4,3e-4",
                       overrides="resources.nodes=2", dry_run=True, runs_dir=runs)
    assert [registry.read(Path(r.run_dir)).nodes for r in sweep.runs] == [2, 2]
    with pytest.raises(ConfigError, match="no run 'no-such-run'"):
        api.prepare("examples/torch_ddp.yaml", site="local-slurm", after="no-such-run", dry_run=True)
    plan = api.plan("examples/torch_ddp.yaml", site="local-slurm", overrides="model.params=1e6")
    assert plan.input.params == 1_000_000


def test_list_of_a_sweep_that_does_not_exist_is_bad_input(tmp_path, isolated_env, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as caught:
        api.list_runs(sweep="no-such-sweep")
    assert caught.value.exit_code == 2 and caught.value.key == "SWEEP"
    proc = glaunch("list", "no-such-sweep", env=isolated_env, cwd=tmp_path)
    assert proc.returncode == 2 and "no-such-sweep" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("limit", ["0", "-5"])
def test_list_of_no_or_fewer_than_no_runs_is_bad_input(tmp_path, isolated_env, limit):
    ended_run(tmp_path)
    proc = glaunch("list", "-n", limit, env=isolated_env, cwd=tmp_path)
    assert proc.returncode == 2 and "-n" in proc.stderr and "no runs yet" not in proc.stdout, proc.stdout
    with_sweep = glaunch("list", "-n", limit, "some-sweep", env=isolated_env, cwd=tmp_path)
    assert with_sweep.returncode == 2 and "'-n'" in with_sweep.stderr, with_sweep.stderr
    assert api.list_runs(1)[0]["run_id"] == "r"


def strict_json(text: str):
    """JSON as RFC 8259 has it (what jq reads): NaN and Infinity are not JSON."""
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_status_json_of_a_run_whose_loss_diverged_is_strict_json(tmp_path, isolated_env):
    run_dir = ended_run(tmp_path)
    (run_dir / "result.json").write_text(json.dumps({"final_step": 7, "final_loss": float("nan"),
                                                     "grad_norm": float("inf"), "world_size": 1}))
    proc = glaunch("status", str(run_dir), "--json", env=isolated_env)
    assert proc.returncode == 0, proc.stderr
    result = strict_json(proc.stdout)["result"]
    assert result["final_loss"] == "NaN" and result["grad_norm"] == "Infinity" and result["final_step"] == 7
    assert api.status(str(run_dir))["result"]["final_loss"] == "NaN"
    text = glaunch("status", str(run_dir), env=isolated_env).stdout
    assert "step 7 loss NaN" in text


def test_status_of_a_sweep_with_a_diverged_element_is_strict_json_and_names_it(tmp_path, isolated_env, monkeypatch):
    monkeypatch.chdir(REPO)
    sweep = api.submit("examples/torch_ddp.yaml", site="local-slurm", sweep=["hparams.lr=1,2"], dry_run=True,
                       runs_dir=str(tmp_path / "runs"))
    (Path(sweep.runs[0].run_dir) / "result.json").write_text(json.dumps({"final_step": 3, "final_loss": float("nan")}))
    proc = glaunch("status", sweep.sweep_id, "--json", env=isolated_env)
    assert proc.returncode == 0, proc.stderr
    assert strict_json(proc.stdout)["elements"][0]["result"]["final_loss"] == "NaN"
    text = glaunch("status", sweep.sweep_id, env=isolated_env).stdout
    assert "loss NaN" in text


def test_every_start_in_status_json_has_the_keys_the_contract_names(tmp_path, isolated_env):
    """peak_memory_gb and step_time_s per start (DESIGN), nodes (README): null until known,
    so a script reads them from a start that never measured anything."""
    run_dir = ended_run(tmp_path, state="FAILED")
    (start,) = api.status(str(run_dir))["starts"]
    assert {"job_id", "restart", "started", "ended", "state", "reason", "detail", "resumed_from", "stopped_at",
            "nodes", "peak_memory_gb", "step_time_s"} <= set(start)
    assert start["peak_memory_gb"] is None and start["step_time_s"] is None and start["nodes"] is None

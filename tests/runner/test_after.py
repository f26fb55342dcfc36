"""--after without a cluster: RUN[:ok|any] parsed, Slurm's dependency clause, a dependency
that can never hold refused at submit with nothing written, and the local site waiting
for a run still going (real runs, real processes)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.errors import ConfigError
from launcher.runner.dependencies import check_for, clause, never_satisfied, parse, wait
from launcher.runner.upstream import After, Upstream

REPO = Path(__file__).resolve().parents[2]


def glaunch(*args, env, cwd, timeout=300):
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def up(name, kind, states, job_ids=("1",), scheduler="slurm"):
    return Upstream(After(name, kind), name, scheduler, tuple(job_ids), tuple(states), ())


def test_parse_kinds():
    assert parse(["a", "b:ok", "c:any", "/runs/x:y"]) == [After("a", "ok"), After("b", "ok"), After("c", "any"),
                                                         After("/runs/x:y", "ok")]
    with pytest.raises(ConfigError):
        parse([":ok"])


def test_clause_waits_only_for_what_has_not_ended():
    ups = [up("a", "ok", ["RUNNING"], ["11"]), up("b", "any", ["PENDING"], ["12_0"]),
           up("c", "ok", ["COMPLETED"], ["13"]), up("s", "ok", ["PENDING", "RUNNING"], ["14", "15"])]
    assert clause(ups) == "afterok:11:14:15,afterany:12_0"
    assert clause([up("c", "ok", ["COMPLETED"])]) is None


def test_what_can_never_hold_is_refused():
    with pytest.raises(ConfigError, match="could never start"):
        check_for([up("a", "ok", ["FAILED"])], "slurm")
    check_for([up("a", "any", ["FAILED"])], "slurm")
    with pytest.raises(ConfigError, match="only wait for Slurm jobs"):
        check_for([up("a", "ok", ["RUNNING"], scheduler="local")], "slurm")
    with pytest.raises(ConfigError, match="has no Slurm job"):
        check_for([up("a", "ok", ["SUBMITTING"], job_ids=())], "slurm")
    assert "a ended FAILED" in never_satisfied([up("a", "ok", ["FAILED"])])
    assert never_satisfied([up("a", "any", ["FAILED"]), up("b", "ok", ["COMPLETED"])]) is None


def test_wait_polls_until_every_upstream_ended():
    states = iter([["RUNNING"], ["RUNNING"], ["COMPLETED"]])
    slept = []
    ended = wait([up("a", "ok", ["PENDING"])], lambda u: up("a", "ok", next(states)), sleep=slept.append, poll_s=0.5)
    assert ended[0].states == ("COMPLETED",) and slept == [0.5, 0.5]


NAP = "import sys, time\ntime.sleep(float(sys.argv[1]))\nsys.exit(int(sys.argv[2]))\n"


def _experiment(tmp_path):
    (tmp_path / "nap.py").write_text(NAP)
    (tmp_path / "exp.yaml").write_text("name: nap\nentrypoint: {script: nap.py, args: ['0', '0']}\n"
                                       "resources: {gpus_per_node: 1, time: '5'}\nrequeue: {max: 0, signal_lead_s: 10}\n")
    return str(tmp_path / "exp.yaml")


def _run(tmp_path, env, *args):
    proc = glaunch("submit", _experiment(tmp_path), "--runs-dir", str(tmp_path / "runs"), "--json", *args,
                   env=env, cwd=tmp_path)
    return proc, json.loads(proc.stdout) if proc.stdout.strip().startswith("{") else {}


def test_after_a_failed_run_ok_is_refused_any_runs(tmp_path, isolated_env):
    proc, failed = _run(tmp_path, isolated_env, "entrypoint.args=['0','3']")
    assert proc.returncode == 1 and failed["state"] == "FAILED"
    before = set((tmp_path / "runs").iterdir())
    proc, _ = _run(tmp_path, isolated_env, "--after", failed["run_id"])
    assert proc.returncode == 2 and "could never start" in proc.stderr and f"{failed['run_id']} ended FAILED" in proc.stderr
    assert set((tmp_path / "runs").iterdir()) == before                # nothing written
    proc, info = _run(tmp_path, isolated_env, "--after", f"{failed['run_id']}:any")
    assert proc.returncode == 0 and info["state"] == "COMPLETED"
    record = json.loads((Path(info["run_dir"]) / "run.json").read_text())
    assert record["after"] == [{"ref": failed["run_id"], "kind": "any", "name": failed["run_id"], "job_ids": [
        failed["job_ids"][0]]}]
    proc, _ = _run(tmp_path, isolated_env, "--after", "no-such-run")
    assert proc.returncode == 2 and "no run 'no-such-run'" in proc.stderr


def test_local_site_waits_for_a_run_still_going(tmp_path, isolated_env):
    first = subprocess.Popen([sys.executable, "-m", "launcher.cli", "submit", _experiment(tmp_path), "--runs-dir",
                              str(tmp_path / "runs"), "--json", "entrypoint.args=['4','0']"], cwd=tmp_path,
                             env=isolated_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    run_dir = None
    while run_dir is None and time.monotonic() < deadline:
        found = [p for p in (tmp_path / "runs").glob("*/run.json")] if (tmp_path / "runs").exists() else []
        if found and json.loads(found[0].read_text()).get("state") == "RUNNING":
            run_dir = found[0].parent
        time.sleep(0.2)
    assert run_dir is not None, first.communicate()
    proc, info = _run(tmp_path, isolated_env, "--after", run_dir.name)
    first.communicate(timeout=120)
    assert proc.returncode == 0, proc.stderr
    a = json.loads((run_dir / "run.json").read_text())["starts"][-1]
    b = json.loads((Path(info["run_dir"]) / "run.json").read_text())["starts"][0]
    assert a["state"] == "COMPLETED" and b["started"] >= a["ended"], (a, b)

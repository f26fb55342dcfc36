"""Remote submission: the profile's `login:` key, the decisions of the remote road, and
(live, over the login node of scripts/local-sshd to the local Slurm cluster) submit,
status, logs and cancel from a "laptop" without Slurm's commands."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from test_login_key import write_site
from launcher.config.login import Login
from launcher.errors import ConfigError, SchedulerError
from launcher.processes import Finished
from launcher.runner import remote

REPO = Path(__file__).resolve().parents[1]


def test_the_remote_road_is_taken_only_without_sbatch_and_without_GLAUNCH_DIRECT(tmp_path):
    login = Login("login1")
    (tmp_path / "sbatch").write_text("#!/bin/sh\n")
    (tmp_path / "sbatch").chmod(0o755)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert remote.goes_remote(login, "slurm", {"PATH": str(empty)})
    assert not remote.goes_remote(login, "slurm", {"PATH": str(tmp_path)})
    assert not remote.goes_remote(login, "slurm", {"PATH": str(empty), "GLAUNCH_DIRECT": "1"})
    assert not remote.goes_remote(None, "slurm", {"PATH": str(empty)})
    assert not remote.goes_remote(login, "local", {"PATH": str(empty)})


@pytest.mark.parametrize(("root", "runs_dir", "key"), [
    (None, None, "runs_root"), ("runs", None, "runs_root"), ("/scratch", "rel/dir", "--runs-dir")])
def test_a_remote_run_needs_a_cluster_path_for_its_runs(root, runs_dir, key):
    with pytest.raises(ConfigError) as caught:
        remote.check_runs_root(root, runs_dir, "far.yaml")
    assert caught.value.key == key


@pytest.mark.parametrize("root", ["/scratch/runs", "~/runs", "$HOME/runs", "/scratch/$USER"])
def test_cluster_paths_for_the_runs_are_taken(root):
    remote.check_runs_root(root, None, "far.yaml")


def test_the_bundle_is_staged_under_another_folder_and_its_record_names_the_cluster():
    record = {"provenance": {"snapshot": "/tmp/st/r1/code", "patch": "/tmp/st/r1/code.patch",
                             "source": "/tmp/st/r10", "files": ["/tmp/st/r1/a"]}, "n": 3}
    moved = remote.moved_paths(record, "/tmp/st/r1", "/scratch/runs/r1")
    assert moved == {"provenance": {"snapshot": "/scratch/runs/r1/code", "patch": "/scratch/runs/r1/code.patch",
                                    "source": "/tmp/st/r10", "files": ["/scratch/runs/r1/a"]}, "n": 3}


def logs_tar(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


class LocalConn:
    """A Connection whose remote commands run here (the login node's shell is this one)."""

    def run(self, words, *, input=None, timeout_s=None):
        return subprocess.run(list(words), input=input, capture_output=True, timeout=30)

    def where(self) -> str:
        return "here"


def test_logs_copied_from_the_cluster_grow_in_place_and_only_what_grew_travels(tmp_path):
    there, here = tmp_path / "cluster logs", tmp_path / "logs"
    there.mkdir()
    (there / "7_0_log.out").write_bytes(b"one\n")
    (there / "7_1_log.err").write_bytes(b"\x00\xff bytes\n")
    (there / "7_submitted.pkl").write_bytes(b"x")
    (there / "evil name_0_log.out").write_bytes(b"x")
    remote.mirror_logs(LocalConn(), str(there), here)
    assert sorted(p.name for p in here.iterdir()) == ["7_0_log.out", "7_1_log.err"]
    inode = (here / "7_0_log.out").stat().st_ino
    with open(there / "7_0_log.out", "ab") as f:
        f.write(b"two\n")
    from launcher.schedulers.ssh.on_login import log_tails

    assert log_tails(LocalConn(), str(there), {"7_0_log.out": 4, "7_1_log.err": 9}) == [
        ("7_0_log.out", 4, b"two\n"), ("evil name_0_log.out", 0, b"x"), ("7_1_log.err", 9, b"")]
    remote.mirror_logs(LocalConn(), str(there), here)
    assert (here / "7_0_log.out").read_bytes() == b"one\ntwo\n"
    assert (here / "7_0_log.out").stat().st_ino == inode
    (there / "7_0_log.out").write_bytes(b"new\n")          # cut shorter there: taken whole
    remote.mirror_logs(LocalConn(), str(there), here)
    assert (here / "7_0_log.out").read_bytes() == b"new\n"


def test_a_dry_run_with_a_login_contacts_nothing(tmp_path, isolated_env):
    write_site(tmp_path, "login: {host: 127.0.0.1, port: 1}")
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "exp.yaml").write_text("name: e\nentrypoint: {script: train.py}\nrequeue: {max: 0}\n")
    env = dict(isolated_env, PATH=str(tmp_path / "no-bin"), PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", "exp.yaml", "--site", "./far.yaml",
                           "--dry-run", "--runs-dir", str(tmp_path / "runs")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not (Path(isolated_env["GLAUNCH_STATE_DIR"]) / "ssh").exists()
    # Its record names the road its Slurm commands would take: through the login node.
    record = next((Path(isolated_env["GLAUNCH_STATE_DIR"]) / remote.RECORDS).glob("e-*/run.json"))
    assert json.loads(record.read_text())["transport"] == "ssh://127.0.0.1:1"


def test_a_run_submitted_where_slurm_answers_records_its_commands_run_here_though_the_profile_has_login(
        tmp_path, isolated_env):
    write_site(tmp_path, "login: {host: 127.0.0.1, port: 1}")
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "exp.yaml").write_text("name: e\nentrypoint: {script: train.py}\nrequeue: {max: 0}\n")
    env = dict(isolated_env, PATH=str(tmp_path / "no-bin"), PYTHONPATH=str(REPO), GLAUNCH_DIRECT="1")
    done = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", "exp.yaml", "--site", "./far.yaml",
                           "--dry-run", "--runs-dir", str(tmp_path / "runs")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    record = json.loads(next((tmp_path / "runs").glob("e-*/run.json")).read_text())
    assert record["transport"] == "local", record


def test_a_tilde_in_python_is_the_home_of_the_account_the_plan_is_resolved_for(tmp_path, isolated_env):
    write_site(tmp_path, "python: ~/venvs/torch/bin/python -X utf8")
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "exp.yaml").write_text("name: e\nentrypoint: {script: train.py}\nrequeue: {max: 0}\n")
    env = dict(isolated_env, HOME=str(tmp_path / "the home"), PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", "exp.yaml", "--site", "./far.yaml",
                           "--dry-run", "--runs-dir", str(tmp_path / "runs")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    job = next((tmp_path / "runs").glob("e-*/job.sbatch")).read_text()
    assert f"'{tmp_path}/the home/venvs/torch/bin/python' -X utf8" in job and "~/venvs" not in job, job


def test_a_slurm_profile_without_slurm_here_and_without_login_says_to_add_login(tmp_path, isolated_env):
    write_site(tmp_path, "")
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "exp.yaml").write_text("name: e\nentrypoint: {script: train.py}\nrequeue: {max: 0}\n")
    env = dict(isolated_env, PATH=str(tmp_path / "no-bin"), PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", "exp.yaml", "--site", "./far.yaml",
                           "--runs-dir", str(tmp_path / "runs")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 3 and "sbatch is not on PATH here" in done.stderr, done.stderr
    assert "login:" in done.stderr, done.stderr


def test_a_sweep_whose_login_cannot_be_reached_is_exit_3_and_writes_nothing(tmp_path, isolated_env):
    write_site(tmp_path, "login: {host: 127.0.0.1, port: 1}")
    (tmp_path / "train.py").write_text("print('hi')\n")
    (tmp_path / "exp.yaml").write_text("name: e\nentrypoint: {script: train.py}\nrequeue: {max: 0}\n")
    env = dict(isolated_env, PATH=str(tmp_path / "no-bin"), PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", "exp.yaml", "--site", "./far.yaml",
                           "--sweep", "hparams.lr=1,2"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 3 and "127.0.0.1:1" in done.stderr, done.stderr
    assert not (tmp_path / "runs").exists()
    assert not list((Path(isolated_env["GLAUNCH_STATE_DIR"]) / "remote-runs").glob("*"))


def run_tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("fail_at", [None, "unpack"])
def test_a_resume_sets_the_previous_files_aside_and_puts_them_back_whole(tmp_path, fail_at):
    from launcher.schedulers.ssh.on_login import PUT_BACK, SET_ASIDE

    run = tmp_path / "run"
    (run / "resumes").mkdir(parents=True)
    for name, text in {"job.sbatch": "old job", "result.json": "{}", "run.json": "old record", "keep": "k"}.items():
        (run / name).write_text(text)
    before = run_tree(run)
    new = logs_tar({"job.sbatch": b"new job", "ds_config.json": b"new"}) if fail_at is None else b"not a tar"
    names = ["ds_config.json", "job.sbatch", "result.json"]
    done = subprocess.run(["sh", "-c", SET_ASIDE, "x", str(run), "resumes/1", *names], input=new,
                          capture_output=True, timeout=30)
    if fail_at is None:
        assert done.returncode == 0, done.stderr
        assert run_tree(run) == {"keep": "k", "run.json": "old record", "job.sbatch": "new job", "ds_config.json": "new",
                                 "resumes/1/job.sbatch": "old job", "resumes/1/result.json": "{}"}
    else:
        assert done.returncode != 0
    whole = "1" if fail_at is None else "0"
    subprocess.run(["sh", "-c", PUT_BACK, "x", str(run), "resumes/1", whole, *names], check=True, timeout=30)
    assert run_tree(run) == before
    assert list((run / "resumes").iterdir()) == []


def test_slurm_commands_on_the_login_node_run_without_its_slurm_inputs(tmp_path):
    from launcher.schedulers.ssh.on_login import SLURM_ENV

    env = {"PATH": "/usr/bin:/bin", "SBATCH_ACCOUNT": "x", "SLURM_JOB_ID": "5", "SQUEUE_FORMAT": "%i",
           "SLURM_CONF": "/etc/slurm.conf", "KEEP": "a $(b)"}
    done = subprocess.run(["sh", "-c", SLURM_ENV, "glaunch-slurm", str(tmp_path), "sh", "-c", "pwd; env"],
                          env=env, capture_output=True, text=True, timeout=30)
    lines = done.stdout.splitlines()
    assert lines[0] == str(tmp_path)
    seen = {line.split("=", 1)[0] for line in lines[1:] if "=" in line}
    assert {"SLURM_CONF", "SLURM_TIME_FORMAT", "KEEP"} <= seen
    assert not seen & {"SBATCH_ACCOUNT", "SLURM_JOB_ID", "SQUEUE_FORMAT"}


def test_a_record_here_drops_what_the_run_s_directory_there_no_longer_holds(tmp_path):
    """A resume on the cluster sets the run's result, crash report and heartbeats aside:
    the next refresh here must not show the previous start's result as this one's."""
    from launcher.rundir.records import RunRecord

    there, here = tmp_path / "cluster" / "r1", tmp_path / "here" / "r1"
    (there / "heartbeats").mkdir(parents=True)
    here.mkdir(parents=True)
    record = RunRecord.from_dict({"run_id": "r1", "run_dir": str(there), "scheduler": "slurm", "state": "RUNNING"})
    (there / "run.json").write_text(json.dumps(record.to_dict()))
    (there / "result.json").write_text('{"step": 6}')
    (there / "heartbeats" / "rank-00000.json").write_text("{}")
    where = remote.Where(Login("login1"), str(there))
    remote.mirror_run(LocalConn(), here, where, record)
    assert (here / "result.json").read_text() == '{"step": 6}' and (here / "heartbeats" / "rank-00000.json").is_file()
    (there / "result.json").unlink()
    (there / "heartbeats" / "rank-00000.json").unlink()
    remote.mirror_run(LocalConn(), here, where, record)
    assert not (here / "result.json").exists() and not (here / "heartbeats" / "rank-00000.json").exists()
    assert json.loads((here / "run.json").read_text())["run_id"] == "r1"


def test_a_failed_run_s_first_failing_rank_s_error_log_comes_here_for_its_end_to_show(tmp_path):
    from launcher.rundir.records import RunRecord
    from launcher.views.console import outcome_lines
    from launcher.rundir.layout import RunDir

    there, here = tmp_path / "cluster" / "r1", tmp_path / "here" / "r1"
    (there / "logs").mkdir(parents=True)
    here.mkdir(parents=True)
    record = RunRecord.from_dict({"run_id": "r1", "run_dir": str(there), "scheduler": "slurm", "state": "FAILED",
                                  "job_id": "41", "reason": "crash",
                                  "starts": [{"job_id": "41", "restart": 0, "state": "FAILED", "reason": "crash",
                                              "ended": "2026-01-01T00:01:00+00:00"}]})
    (there / "run.json").write_text(json.dumps(record.to_dict()))
    (here / "run.json").write_text(json.dumps(record.to_dict()))       # the record here, as submitted
    (there / "crash.json").write_text(json.dumps({"restart": 0, "task": 1, "node": "node2",
                                                  "error": "ValueError: bad --steps"}))
    (there / "logs" / "41_1_log.err").write_text("Traceback (most recent call last):\nValueError: bad --steps\n")
    (there / "logs" / "41_0_log.err").write_text("rank 0 was fine\n")
    where = remote.Where(Login("login1"), str(there))
    ended = remote.refreshed_over(LocalConn(), here, where)
    assert ended.state == "FAILED"
    assert (here / "logs" / "41_1_log.err").read_text().endswith("ValueError: bad --steps\n")
    lines = outcome_lines(RunDir(here), ended, time.time())
    failing = lines.index(next(line for line in lines if "first failing rank: 1 on node2" in line))
    assert lines[failing + 1:] == ["    Traceback (most recent call last):", "    ValueError: bad --steps"], lines


def test_a_cancel_on_the_login_node_marks_each_run_where_it_lives_then_cancels_in_one_call(tmp_path):
    """The marks are appended to each run's cancel file, whatever its directory's name,
    before one scancel of the jobs; a mark that cannot be written cancels nothing."""
    from launcher.schedulers.ssh import on_login

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scancel").write_text(f"#!/bin/sh\nprintf '%s\\n' \"$@\" > {tmp_path / 'scancelled'}\n")
    (bin_dir / "scancel").chmod(0o755)
    hostile = tmp_path / "a 'b' $(touch pwned) `id`"
    plain = tmp_path / "plain"
    for run_dir in (hostile, plain):
        run_dir.mkdir()
    (plain / "cancel-requested").write_text("7\n")

    class Here:
        def run(self, words, *, input=None, timeout_s=None):
            done = subprocess.run(list(words), input=input, capture_output=True, timeout=30,
                                  env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
            return Finished(done.returncode, done.stdout, done.stderr)

        def where(self):
            return "here"

    (plain / "run.json").write_text('{"job_id": "43"}')
    done = on_login.cancel_marked(Here(), [(str(hostile), "41_0"), (str(plain), "42")], ["41", "42"],
                                  read_back=str(plain / "run.json"))
    assert done.returncode == 0 and done.stdout == b'{"job_id": "43"}', done
    assert (hostile / "cancel-requested").read_text() == "41_0\n"
    assert (plain / "cancel-requested").read_text() == "7\n42\n"
    assert (tmp_path / "scancelled").read_text() == "41\n42\n"
    assert not list(tmp_path.rglob("pwned"))
    (tmp_path / "scancelled").unlink()
    with pytest.raises(SchedulerError, match="nothing was cancelled"):
        on_login.cancel_marked(Here(), [(str(tmp_path / "gone"), "43")], ["43"])
    assert not (tmp_path / "scancelled").exists()


# --- live: a laptop without Slurm, the cluster behind the login node -----------------------


def glaunch(env, *args, cwd=REPO, timeout=90):
    return subprocess.run([sys.executable, "-m", "launcher.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def submitted(done) -> str:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["run_id"]


def wait_for(env, run_id, states, timeout_s=90.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        done = glaunch(env, "status", run_id, "--json")
        assert done.returncode == 0, done.stderr
        status = json.loads(done.stdout)
        if status["state"] in states or time.monotonic() > deadline:
            return status
        time.sleep(2)


HOSTILE_ARGS = ["a b", "it's", '"dq"', "$(touch /tmp/glaunch-pwned)", "`id`", "$HOME", ";|&", "*"]
# env values expand $VAR on the nodes by design ($$ is a literal $); command substitution never.
HOSTILE_VALUE = "x 'y' \"z\" $(touch /tmp/glaunch-pwned) `id` $$HOME"
SEEN_VALUE = "x 'y' \"z\" $(touch /tmp/glaunch-pwned) `id` $HOME"
# It stops as a script with glaunch's runtime does at a preemption: asked by SIGTERM (scancel),
# it records its stop, which the job's controller would take for a preemption to requeue.
HOSTILE_SCRIPT = """\
import json, os, sys, time
from launcher import runtime as rt
rt.install_stop_handler()
print("HOSTILE " + json.dumps({"args": sys.argv[1:], "env": os.environ.get("HOSTILE_VALUE")}), flush=True)
for step in range(1, 601):
    time.sleep(1)
    if rt.should_stop(step=step, total=600):
        rt.write_stop(step, None)
        sys.exit(0)
"""


@pytest.mark.slurm
@pytest.mark.requires_sshd
def test_a_laptop_submits_follows_and_cancels_runs_over_ssh(laptop, tmp_path):
    runs = tmp_path / "cluster runs"
    runs.mkdir()
    site = ["--site", "local-slurm-remote", "--runs-dir", str(runs)]
    ddp = submitted(glaunch(laptop, "submit", "examples/torch_ddp.yaml", *site, "resources.nodes=2", "--json"))
    work = tmp_path / "work"
    work.mkdir()
    (work / "hostile.py").write_text(HOSTILE_SCRIPT)
    (work / "hostile.yaml").write_text(json.dumps({
        "name": "hostile", "entrypoint": {"script": "hostile.py", "args": HOSTILE_ARGS},
        "resources": {"nodes": 1, "time": "00:05:00"}, "requeue": {"max": 2},
        "env": {"HOSTILE_VALUE": HOSTILE_VALUE}}))
    hostile = submitted(glaunch(laptop, "submit", "hostile.yaml", *site, "--json", cwd=work))
    try:
        follow_both(laptop, runs, ddp, hostile)
    finally:
        glaunch(laptop, "cancel", hostile)


def follow_both(laptop, runs: Path, ddp: str, hostile: str) -> None:
    assert not (Path(laptop["GLAUNCH_STATE_DIR"]) / "remote-runs" / ddp / "job.sbatch").exists()
    assert (runs / ddp / "job.sbatch").is_file()

    followed = glaunch(laptop, "logs", ddp, "-f", "--rank", "0", timeout=120)
    assert followed.returncode == 0 and "done: step 40" in followed.stdout, followed.stderr
    status = wait_for(laptop, ddp, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"})
    assert status["state"] == "COMPLETED", status
    assert status["cluster"] == {"host": "glaunch-login", "run_dir": str(runs / ddp)}
    logs = glaunch(laptop, "logs", ddp)
    assert logs.returncode == 0 and "Job completed successfully" in logs.stdout, logs.stderr
    assert {line.split(" ")[0] for line in logs.stdout.splitlines()} >= {"[r0]", "[r1]", "[r2]", "[r3]"}

    deadline = time.monotonic() + 60
    while "HOSTILE " not in (said := glaunch(laptop, "logs", hostile, "--rank", "0").stdout):
        assert time.monotonic() < deadline, said
        time.sleep(2)
    line = next(x for x in said.splitlines() if "HOSTILE " in x)
    assert json.loads(line.split("HOSTILE ", 1)[1]) == {"args": HOSTILE_ARGS, "env": SEEN_VALUE}
    assert not os.path.exists("/tmp/glaunch-pwned")
    # Cancelled while it runs: its start ends as cancelled, though its requeue.max would
    # requeue a start that Slurm ended (the job's controller reads the mark cancel made there).
    cancel = glaunch(laptop, "cancel", hostile)
    assert cancel.returncode == 0 and "cancelled job" in cancel.stdout, cancel.stderr
    status = wait_for(laptop, hostile, {"CANCELLED"}, 60)
    assert status["state"] == "CANCELLED", status
    assert [(s["state"], s["reason"]) for s in status["starts"]] == [("CANCELLED", "cancelled")], status["starts"]

    # Resumed from the laptop: the previous files set aside on the cluster, the run goes on
    # from its last checkpoint to the same parameters.
    resume = glaunch(laptop, "resume", ddp, "--wait")
    assert resume.returncode == 0, resume.stdout + resume.stderr
    assert {p.name for p in (runs / ddp / "resumes" / "1").iterdir()} >= {"job.sbatch", "result.json"}
    done = [line.split("param_sha256 ")[1] for line in glaunch(laptop, "logs", ddp, "--rank", "0").stdout.splitlines()
            if "param_sha256 " in line]
    assert len(done) == 2 and done[0] == done[1], done


def run_dir_appears(runs: Path, name: str, timeout_s: float = 60.0) -> Path:
    """The run directory of experiment `name` on the cluster, once its job is queued."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for run_dir in runs.glob(f"{name}-*"):
            record = run_dir / "run.json"
            if record.is_file() and json.loads(record.read_text()).get("job_id"):
                return run_dir
        time.sleep(1)
    raise AssertionError(f"no queued run of {name} in {runs}")


@pytest.mark.slurm
@pytest.mark.requires_sshd
def test_a_laptop_checks_the_cluster_sweeps_after_a_run_and_survives_a_dropped_link(laptop, tmp_path, isolated_env,
                                                                                   tmp_path_factory):
    """Over SSH: sites check and detect; the DeepSpeed example with --wait, preempted once
    and resumed bitwise; a sweep that waits (--after) for it through Slurm; a link dropped
    for a while during --wait is said, asked through, and the run followed to its end."""
    from slurmkit import ONE_RANK_PER_NODE, preempt, rank0_steps, release_requeue_hold, wait_until
    from test_slurm_requeue import baseline_hash

    check = glaunch(laptop, "sites", "check", "local-slurm-remote")
    assert check.returncode == 0 and "matches" in check.stdout, check.stdout + check.stderr
    detect = glaunch(laptop, "sites", "detect", "--login", "glaunch-login", "--name", "far", "-o", "-")
    assert detect.returncode == 0 and "login:\n  host: glaunch-login\n" in detect.stdout, detect.stderr

    zero2 = "examples/deepspeed_zero2.yaml"
    expected = baseline_hash(zero2, 40, tmp_path_factory, isolated_env)
    runs = tmp_path / "cluster runs"
    runs.mkdir()
    site = ["--site", "local-slurm-remote", "--runs-dir", str(runs)]
    waiting = subprocess.Popen([sys.executable, "-m", "launcher.cli", "submit", zero2, *site, "--wait",
                                "resources.nodes=2", ONE_RANK_PER_NODE, "checkpoint.every_steps=1000",
                                "requeue.max=5", "entrypoint.args=[--steps,40,--seconds-per-step,0.3,--log-every,1]"],
                               cwd=REPO, env=laptop, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        upstream = run_dir_appears(runs, "deepspeed-zero2")
        job = json.loads((upstream / "run.json").read_text())["job_id"]
        swept = glaunch(laptop, "submit", "examples/torch_ddp.yaml", *site, "--sweep", "hparams.lr=0.1,0.2",
                        "--after", upstream.name, "--json")
        assert swept.returncode == 0, swept.stderr
        wait_until(lambda: len(rank0_steps(upstream, job)) >= 5, 300, "progress before the preemption", interval=0.5)
        preempt()
        deadline = time.monotonic() + 300
        while waiting.poll() is None and time.monotonic() < deadline:
            release_requeue_hold(job)
            time.sleep(1)
        out, err = waiting.communicate(timeout=30)
    finally:
        waiting.kill()
    assert waiting.returncode == 0, out + err
    starts = json.loads((upstream / "run.json").read_text())["starts"]
    assert (starts[0]["state"], starts[0]["reason"]) == ("REQUEUED", "preemption"), starts
    assert json.loads((upstream / "result.json").read_text())["param_sha256"] == expected

    sweep = json.loads(swept.stdout)["sweep_id"]
    assert f"#SBATCH --dependency=afterok:{job}\n" in (runs / sweep / "array-0.sbatch").read_text()
    assert wait_for(laptop, sweep, {"COMPLETED", "FAILED", "CANCELLED", "ENDED"}, 300)["state"] == "COMPLETED"
    logs = glaunch(laptop, "logs", sweep, "--rank", "0")
    assert [line.split(" ")[0] for line in logs.stdout.splitlines()
            if "done: step 40" in line] == ["[0][r0]", "[1][r0]"], logs.stdout

    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "hostile.py").write_text(HOSTILE_SCRIPT)
    (tmp_path / "work" / "sleeper.yaml").write_text(json.dumps({
        "name": "sleeper", "entrypoint": {"script": "hostile.py"}, "resources": {"nodes": 1, "time": "00:05:00"},
        "requeue": {"max": 0}}))
    waiting = subprocess.Popen([sys.executable, "-m", "launcher.cli", "submit", "sleeper.yaml", *site, "--wait"],
                               cwd=tmp_path / "work", env=laptop, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    sleeper = None
    try:
        sleeper = run_dir_appears(runs, "sleeper").name
        # Queued and followed: the submission is over, --wait is polling.
        assert wait_for(laptop, sleeper, {"RUNNING"}, 180)["state"] == "RUNNING"
        # The link drops for a while (a VPN's blip): --wait says so, asks again, and goes on
        # following the run once the link is back, to its end (cancelled here).
        Path(laptop["GLAUNCH_TEST_CUT"]).touch()
        time.sleep(20)
        assert waiting.poll() is None
        Path(laptop["GLAUNCH_TEST_CUT"]).unlink()
        assert glaunch(laptop, "cancel", sleeper).returncode == 0
        out, err = waiting.communicate(timeout=120)
        assert waiting.returncode not in (0, 3), out + err
        assert "the run's state cannot be asked now (cannot reach glaunch-login" in out, out + err
        assert "the run's state can be asked again" in out and "CANCELLED" in out, out + err
    finally:
        waiting.kill()
        Path(laptop["GLAUNCH_TEST_CUT"]).unlink(missing_ok=True)
        if sleeper is not None:
            glaunch(laptop, "cancel", sleeper)
    assert wait_for(laptop, sleeper, {"CANCELLED"}, 60)["state"] == "CANCELLED"


@pytest.mark.requires_sshd
@pytest.mark.parametrize(("login", "said"), [
    ("login: {host: 127.0.0.1, port: 1}", "cannot reach root@127.0.0.1:1"),
    ("login: {host: glaunch-login, user: glaunch-nobody}", "refused the login"),
])
def test_an_unreachable_host_or_a_refused_login_is_exit_3_naming_it_and_writes_nothing(laptop, tmp_path, login,
                                                                                     said):
    profile = tmp_path / "far.yaml"
    profile.write_text(f"name: far\nextends: local-slurm\n{login}\nruns_root: {tmp_path / 'runs'}\n")
    done = glaunch(laptop, "submit", "examples/torch_ddp.yaml", "--site", str(profile))
    assert done.returncode == 3 and said in done.stderr, done.stderr
    assert not (tmp_path / "runs").exists()
    assert not list((Path(laptop["GLAUNCH_STATE_DIR"]) / "remote-runs").glob("*"))


@pytest.mark.requires_sshd
def test_a_missing_parent_of_the_runs_on_the_cluster_is_exit_3_and_leaves_nothing(laptop, tmp_path):
    done = glaunch(laptop, "submit", "examples/torch_ddp.yaml", "--site", "local-slurm-remote", "--runs-dir",
                   str(tmp_path / "missing" / "runs"))
    assert done.returncode == 3 and "glaunch-login" in done.stderr and "missing" in done.stderr, done.stderr
    assert not (tmp_path / "missing").exists()
    assert not list((Path(laptop["GLAUNCH_STATE_DIR"]) / "remote-runs").glob("*"))
    assert "torch-ddp" not in glaunch(laptop, "list").stdout


@pytest.mark.slurm
@pytest.mark.requires_sshd
@pytest.mark.parametrize("check", [[], ["--no-check"]])
def test_a_job_slurm_refuses_leaves_no_run_on_either_side(laptop, tmp_path, check):
    profile = tmp_path / "badacct.yaml"
    profile.write_text("name: badacct\nextends: local-slurm-remote\naccount: nosuch\n")
    runs = tmp_path / "runs"
    done = glaunch(laptop, "submit", "examples/torch_ddp.yaml", "--site", str(profile), "--runs-dir", str(runs),
                   *check)
    assert done.returncode == 3 and ("nosuch" in done.stderr or "Invalid account" in done.stderr), done.stderr
    assert list(runs.iterdir()) == []
    assert not list((Path(laptop["GLAUNCH_STATE_DIR"]) / "remote-runs").glob("*"))


# --- live: a link that drops at each round trip of a submit ---------------------------------

DROPPING_SSH = """#!/bin/sh
# Local calls (ssh -O to the master, ssh -G for the config) reach no host: never dropped.
for a; do
    [ "$a" = -- ] && break
    case "$a" in -O|-G) exec {ssh} "$@" ;; esac
done
# Builtins only: the laptop's PATH holds ssh, git and tar.
n=0; [ -e {state}/count ] && read -r n < {state}/count; n=$((n + 1)); echo "$n" > {state}/count
if [ -e {state}/from ] && read -r from < {state}/from && [ "$n" -ge "$from" ]; then
    echo 'Connection closed by 127.0.0.1 port 2222' >&2; exit 255
fi
if [ -e {state}/after ] && read -r after < {state}/after && [ "$n" = "$after" ]; then
    {ssh} "$@" >/dev/null 2>&1
    echo 'Connection reset by 127.0.0.1 port 2222' >&2; exit 255
fi
# The glaunch process itself killed (its laptop's power gone) once the command ran there:
# the Nth, or the first whose words hold those of killed_at.
killed=; [ -e {state}/killed ] && read -r killed < {state}/killed
at=; [ -e {state}/killed_at ] && read -r at < {state}/killed_at
case "$n|$*" in "$killed|"*|*"${{at:-no words}}"*)
    if [ -n "$killed$at" ]; then {ssh} "$@" >/dev/null 2>&1; kill -KILL "$PPID"; exit 255; fi ;;
esac
exec {ssh} "$@"
"""


@pytest.fixture
def dropping_laptop(laptop, tmp_path):
    """The laptop, whose link to the login node drops at the Nth round trip of a command:
    `after` (the command ran there, its answer is lost) or `from` (nothing reaches the host
    from then on)."""
    state = tmp_path / "link"
    state.mkdir()
    ssh = Path(laptop["PATH"]) / "ssh"
    real = ssh.read_text().splitlines()[-1].removeprefix("exec ").removesuffix(' "$@"')
    ssh.write_text(DROPPING_SSH.format(ssh=real, state=state))
    return laptop, state


def drop(state: Path, how: str | None = None, at: int = 0) -> None:
    for name in ("count", "after", "from", "killed", "killed_at"):
        (state / name).unlink(missing_ok=True)
    if how is not None:
        (state / how).write_text(f"{at}\n")


def held_jobs() -> list[str]:
    from slurmkit import cluster_env

    done = subprocess.run(["squeue", "-h", "-o", "%i|%k"], env=cluster_env("main"), capture_output=True, text=True,
                          timeout=30)
    return [line for line in done.stdout.splitlines() if "|glaunch:torch-ddp-" in line]


# A submit's round trips: the account (with the cluster's settings), the bundle sent, the
# checks, sbatch --hold, run.json and the task put in place with the release.
SUBMIT_ROUND_TRIPS = 5


@pytest.mark.slurm
@pytest.mark.requires_sshd
def test_a_submit_whose_link_drops_at_any_round_trip_leaves_nothing_it_does_not_name(dropping_laptop, tmp_path):
    laptop, state = dropping_laptop
    runs = tmp_path / "runs"
    runs.mkdir()
    records = Path(laptop["GLAUNCH_STATE_DIR"]) / "remote-runs"
    held = tmp_path / "held.yaml"       # every job held by --begin: nothing runs
    held.write_text("name: held\nextends: local-slurm-remote\nsbatch: {begin: now+600}\n")
    submit = ["submit", "examples/torch_ddp.yaml", "--site", str(held), "--runs-dir", str(runs), "--json"]
    # The answer of one round trip lost: the submission is whole (sbatch's lost answer is
    # looked up), or it ends exit 3 with nothing left on either side.
    outcomes = {}
    for at in range(1, SUBMIT_ROUND_TRIPS + 1):
        drop(state, "after", at)
        done = glaunch(laptop, *submit)
        drop(state)
        outcomes[at] = done.returncode
        if done.returncode == 0:
            run_id = json.loads(done.stdout)["run_id"]
            assert len(held_jobs()) == 1, (at, held_jobs())
            assert glaunch(laptop, "cancel", run_id).returncode == 0
            subprocess.run(["rm", "-rf", "--", str(runs / run_id), str(records / run_id)], timeout=30)
            wait_gone = time.monotonic() + 30
            while held_jobs() and time.monotonic() < wait_gone:
                time.sleep(1)
            continue
        assert done.returncode == 3 and "glaunch-login" in done.stderr, (at, done.stderr)
        assert "left on" not in done.stderr, (at, done.stderr)
        assert list(runs.iterdir()) == [] and not list(records.glob("*")), at
        assert held_jobs() == [], at
    assert outcomes == {1: 3, 2: 3, 3: 3, 4: 0, 5: 3}
    # The link gone for good from the bundle's arrival on: exit 3 naming what is left and
    # the command that removes it; status says so; cancel, once the link is back, removes it.
    for at in range(3, SUBMIT_ROUND_TRIPS + 1):
        drop(state, "from", at)
        done = glaunch(laptop, *submit)
        drop(state)
        assert done.returncode == 3 and "left on glaunch-login" in done.stderr, (at, done.stderr)
        run_id = re.search(r"glaunch cancel (\S+) removes", done.stderr).group(1)
        assert str(runs / run_id) in done.stderr, done.stderr
        status = json.loads(glaunch(laptop, "status", run_id, "--json").stdout)
        assert status["state"] == "FAILED" and "glaunch cancel" in status["detail"], status
        cancelled = glaunch(laptop, "cancel", run_id)
        assert cancelled.returncode == 0 and "removed what its interrupted submission left" in cancelled.stdout, \
            cancelled.stdout + cancelled.stderr
        assert list(runs.iterdir()) == [] and not list(records.glob("*")), at
        assert held_jobs() == [], at
    # The glaunch process killed once a round trip's command ran there: the record here,
    # journaled as the submission went, names what it left (status), and cancel removes it,
    # a held job whose answer never came found by its marker. Killed once the release was
    # made, the submission was whole: status finds its job released and follows it.
    for at in range(2, SUBMIT_ROUND_TRIPS + 1):
        drop(state, "killed", at)
        done = glaunch(laptop, *submit)
        drop(state)
        assert done.returncode == -9, (at, done.returncode, done.stderr)
        (run_id,) = [p.name for p in records.iterdir() if not p.name.startswith(".")]
        status = json.loads(glaunch(laptop, "status", run_id, "--json").stdout)
        if at == SUBMIT_ROUND_TRIPS:
            assert status["state"] == "PENDING" and status["job_id"], status
            assert not (records / run_id / "left.json").exists()
        else:
            assert status["state"] == "FAILED" and "submitting it stopped before the job was released" in \
                status["detail"] and f"glaunch cancel {run_id} removes" in status["detail"], (at, status)
            assert str(runs / run_id) in status["detail"], status
            assert ("a held job it may have queued" in status["detail"]) == (at == 4), (at, status)
            assert len(held_jobs()) == (at == 4), (at, held_jobs())
        cancelled = glaunch(laptop, "cancel", run_id)
        assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
        if at < SUBMIT_ROUND_TRIPS:
            assert "removed what its interrupted submission left" in cancelled.stdout, cancelled.stdout
            assert list(runs.iterdir()) == [] and [p.name for p in records.iterdir()
                                                   if not p.name.startswith(remote.STAGING_PREFIX)] == [], at
        subprocess.run(["rm", "-rf", "--", *map(str, runs.iterdir()), *map(str, records.iterdir())], timeout=30)
        wait_gone = time.monotonic() + 30
        while held_jobs() and time.monotonic() < wait_gone:
            time.sleep(1)
        assert held_jobs() == [], at
    # A sweep goes through the same undo: the link gone at its last round trip (the
    # release), its held array and its directory are named, kept under the sweep's id, and
    # removed by cancel.
    sweep = [*submit, "--sweep", "hparams.lr=1,2"]
    drop(state)
    whole = glaunch(laptop, *sweep)
    assert whole.returncode == 0, whole.stderr
    round_trips = int((state / "count").read_text())
    assert glaunch(laptop, "cancel", json.loads(whole.stdout)["sweep_id"]).returncode == 0
    subprocess.run(["rm", "-rf", "--", *map(str, runs.iterdir()), *map(str, records.iterdir())], timeout=30)
    drop(state, "from", round_trips)
    done = glaunch(laptop, *sweep)
    drop(state)
    assert done.returncode == 3 and "left on glaunch-login: held job" in done.stderr, done.stderr
    sweep_id = re.search(r"glaunch cancel (\S+) removes", done.stderr).group(1)
    assert len(held_jobs()) == 1 and str(runs / sweep_id) in done.stderr, done.stderr
    status = json.loads(glaunch(laptop, "status", sweep_id, "--json").stdout)
    assert status["state"] == "FAILED" and "glaunch cancel" in status["detail"], status
    cancelled = glaunch(laptop, "cancel", sweep_id)
    assert cancelled.returncode == 0 and "removed what its interrupted submission left" in cancelled.stdout, \
        cancelled.stdout + cancelled.stderr
    assert list(runs.iterdir()) == [] and not list(records.glob("*"))
    assert held_jobs() == []
    # The glaunch process submitting the sweep killed once its array's sbatch --hold ran:
    # the record under the sweep's id, journaled, names the array it may have queued and
    # the directory; cancel finds the array by its marker and removes both.
    (state / "killed_at").write_text("sbatch --hold\n")
    done = glaunch(laptop, *sweep)
    drop(state)
    assert done.returncode == -9, done.stdout + done.stderr
    (sweep_id,) = [p.name for p in records.iterdir() if not p.name.startswith(".")]
    status = json.loads(glaunch(laptop, "status", sweep_id, "--json").stdout)
    assert status["state"] == "FAILED" and "submitting it stopped before the job was released" in status["detail"]
    assert "a held job it may have queued" in status["detail"] and str(runs / sweep_id) in status["detail"], status
    assert len(held_jobs()) == 1
    cancelled = glaunch(laptop, "cancel", sweep_id)
    assert cancelled.returncode == 0 and "removed what its interrupted submission left" in cancelled.stdout, \
        cancelled.stdout + cancelled.stderr
    assert list(runs.iterdir()) == [] and [p.name for p in records.iterdir()
                                           if not p.name.startswith(remote.STAGING_PREFIX)] == []
    assert held_jobs() == []
    # A resume too: the link gone at its release (of the run's second resume), its held job
    # and the previous files it set aside are named; the run keeps its record, refuses
    # another resume until cancel has cancelled the job and put the files back as they were.
    run_id = submitted(glaunch(laptop, *submit))
    assert glaunch(laptop, "cancel", run_id).returncode == 0
    assert wait_for(laptop, run_id, {"CANCELLED"}, 60)["state"] == "CANCELLED"
    before = files_of(runs / run_id)
    drop(state)
    assert glaunch(laptop, "resume", run_id).returncode == 0
    round_trips = int((state / "count").read_text())
    # Resumed from its code snapshot's counterpart of the folder it was submitted from, as at submit.
    assert f"#SBATCH --chdir={runs / run_id / 'code'}\n" in (runs / run_id / "job.sbatch").read_text()
    assert glaunch(laptop, "cancel", run_id).returncode == 0
    assert wait_for(laptop, run_id, {"CANCELLED"}, 60)["state"] == "CANCELLED"
    resumed_once = files_of(runs / run_id)
    drop(state, "from", round_trips)
    done = glaunch(laptop, "resume", run_id)
    drop(state)
    assert done.returncode == 3 and "left on glaunch-login: held job" in done.stderr, done.stderr
    assert f"glaunch cancel {run_id} undoes them" in done.stderr and "resumes/2" in done.stderr, done.stderr
    status = json.loads(glaunch(laptop, "status", run_id, "--json").stdout)
    assert status["state"] == "CANCELLED" and "its resume's link dropped" in status["detail"], status
    resume_refused_until_cancel_undoes_it(laptop, run_id)
    assert held_jobs() == [] and files_of(runs / run_id) == resumed_once
    assert len(before) < len(resumed_once)      # the first resume set its previous files aside in resumes/1
    record = json.loads((runs / run_id / "run.json").read_text())
    assert record["state"] == "CANCELLED" and len(record["resumes"]) == 1, record
    # The glaunch process resuming it killed once its sbatch --hold ran (the answer never
    # came): the record here, journaled, is the run's as before the resume and names the
    # held job it may have queued and the files set aside; cancel finds the job by its
    # marker and puts the files back.
    (state / "killed_at").write_text("sbatch --hold\n")
    done = glaunch(laptop, "resume", run_id)
    drop(state)
    assert done.returncode == -9, done.stdout + done.stderr
    status = json.loads(glaunch(laptop, "status", run_id, "--json").stdout)
    assert status["state"] == "CANCELLED" and "the glaunch process resuming it stopped" in status["detail"], status
    assert "a held job it may have queued" in status["detail"] and "resumes/2" in status["detail"], status
    assert len(held_jobs()) == 1
    resume_refused_until_cancel_undoes_it(laptop, run_id)
    assert held_jobs() == [] and files_of(runs / run_id) == resumed_once


def resume_refused_until_cancel_undoes_it(laptop, run_id: str) -> None:
    """A run whose last resume left something on the cluster: another resume is refused
    (exit 2, naming cancel) until cancel has undone it."""
    again = glaunch(laptop, "resume", run_id)
    assert again.returncode == 2 and f"glaunch cancel {run_id}" in again.stderr, again.stderr
    cancelled = glaunch(laptop, "cancel", run_id)
    assert cancelled.returncode == 0 and "removed what its interrupted resume left" in cancelled.stdout, \
        cancelled.stdout + cancelled.stderr


def files_of(root: Path) -> dict[str, bytes]:
    """Every file under `root` but run.json (which the job's record keeps changing), with its bytes."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name != "run.json"}


# --- live: a cluster account whose login shell prints ----------------------------------------

# Connections from this address meet a login shell that prints; the tests of others, from
# 127.0.0.1, meet the account's shell as it was.
NOISY_FROM = "127.0.0.2"
NOISY_BASHRC = f"""
# glaunch tests: a login shell that prints, as on many clusters (connections from {NOISY_FROM} only)
case "$SSH_CONNECTION" in "{NOISY_FROM} "*)
  echo "Welcome to the cluster. Ran: $BASH_EXECUTION_STRING"
  echo "notice: your quota is 91% full" >&2
  trap 'echo "logout notice"; echo "logout warning" >&2' EXIT ;;
esac
"""
NOISE = ("Welcome", "quota", "logout")


@pytest.fixture
def noisy_laptop(laptop, local_sshd_env):
    """The laptop whose ssh reaches a login shell that prints on stdout and stderr, before
    and after each command: the cluster account's ~/.bashrc (which Debian's bash reads for a
    command sent by sshd), restored afterwards."""
    import pwd

    bashrc = Path(pwd.getpwnam(local_sshd_env["GLAUNCH_SSHD_USER"]).pw_dir) / ".bashrc"
    ssh = Path(laptop["PATH"]) / "ssh"
    ssh.write_text(ssh.read_text().replace("exec /usr/bin/ssh ", f"exec /usr/bin/ssh -b {NOISY_FROM} "))
    with open(bashrc, "a") as f:
        f.write(NOISY_BASHRC)
    try:
        yield laptop
    finally:
        bashrc.write_text(bashrc.read_text().replace(NOISY_BASHRC, ""))


def quiet(done) -> str:
    """What a command printed, once it is checked to hold nothing of the login shell's."""
    said = done.stdout + done.stderr
    assert not any(noise in said for noise in NOISE), said
    return said


def quiet_json(done) -> dict:
    """A --json command's answer (its stdout: its warnings go to stderr), once what it
    printed is checked to hold nothing of the login shell's."""
    quiet(done)
    return json.loads(done.stdout)


SLEEPER = {"name": "sleeper", "entrypoint": {"script": "hostile.py", "args": HOSTILE_ARGS},
           "resources": {"nodes": 1, "time": "00:05:00"}, "requeue": {"max": 2}, "env": {"HOSTILE_VALUE": HOSTILE_VALUE}}


@pytest.mark.slurm
@pytest.mark.requires_sshd
def test_a_login_shell_that_prints_reaches_no_parser_and_a_swapped_record_cancels_nothing(noisy_laptop, tmp_path):
    """Through a login shell that prints: sites detect and check, submit, status, logs, list,
    cancel, resume and a sweep's status answer as through a quiet one; a run whose record on
    the cluster was swapped for another's is refused by cancel, and the other job runs on."""
    laptop = noisy_laptop
    detect = glaunch(laptop, "sites", "detect", "--login", "glaunch-login", "--name", "far", "-o", "-")
    assert detect.returncode == 0 and "login:\n  host: glaunch-login\n" in quiet(detect), detect.stderr
    check = glaunch(laptop, "sites", "check", "local-slurm-remote")
    assert check.returncode == 0 and "matches" in quiet(check), check.stdout + check.stderr

    runs = tmp_path / "cluster runs"
    runs.mkdir()
    site = ["--site", "local-slurm-remote", "--runs-dir", str(runs)]
    work = tmp_path / "work"
    work.mkdir()
    (work / "hostile.py").write_text(HOSTILE_SCRIPT)
    (work / "sleeper.yaml").write_text(json.dumps(SLEEPER))
    sleeper = submitted(glaunch(laptop, "submit", "sleeper.yaml", *site, "--json", cwd=work))
    try:
        ddp_id = followed_to_its_end(laptop, site, runs)
        assert wait_for(laptop, sleeper, {"RUNNING"}, 120)["state"] == "RUNNING"
        listed = quiet_json(glaunch(laptop, "list", "--json"))
        assert {row["run_id"]: row["state"] for row in listed["runs"]}[sleeper] == "RUNNING", listed
        deadline = time.monotonic() + 60
        while "HOSTILE " not in (said := quiet(glaunch(laptop, "logs", sleeper, "--rank", "0"))):
            assert time.monotonic() < deadline, said
            time.sleep(2)
        swapped_cancel_refused(laptop, runs, ddp_id, sleeper)
        cancel = glaunch(laptop, "cancel", sleeper)
        assert cancel.returncode == 0 and "cancelled job" in quiet(cancel), cancel.stderr
        assert wait_for(laptop, sleeper, {"CANCELLED"}, 60)["state"] == "CANCELLED"
        resume = glaunch(laptop, "resume", sleeper)
        assert resume.returncode == 0, quiet(resume)
        assert (runs / sleeper / "resumes" / "1" / "job.sbatch").is_file()
    finally:
        glaunch(laptop, "cancel", sleeper)
    swept = glaunch(laptop, "submit", "sleeper.yaml", *site, "--sweep", "hparams.lr=1,2", "--json", cwd=work)
    sweep = quiet_json(swept)["sweep_id"]
    try:
        table = wait_for(laptop, sweep, {"RUNNING", "PENDING"}, 60)
        assert len(table["elements"]) == 2, table
    finally:
        cancel = glaunch(laptop, "cancel", sweep)
    assert cancel.returncode == 0, quiet(cancel)


def on_a_terminal(env, *args, timeout=300) -> tuple[int, str]:
    """glaunch run with its stdout on a terminal (the console redraws its status line there):
    its exit status and all it wrote."""
    import pty

    control, terminal = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "launcher.cli", *args], cwd=REPO, env=env, stdout=terminal,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    os.close(terminal)
    chunks, deadline = [], time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                chunk = os.read(control, 65536)
            except OSError:             # the terminal closed: the command ended
                break
            if not chunk:
                break
            chunks.append(chunk)
        return proc.wait(timeout=30), b"".join(chunks).decode(errors="replace")
    finally:
        proc.kill()
        os.close(control)


def followed_to_its_end(laptop, site, runs: Path) -> str:
    """The DDP example submitted with --wait: its console shows rank 0's lines and a status
    line with step/total and ETA; status shows its progress while it runs and its result
    and goodput projection after. Its run id."""
    import threading

    args = ["submit", "examples/torch_ddp.yaml", *site, "--wait",
            "entrypoint.args=[--steps,40,--seconds-per-step,0.4,--log-every,1]"]
    answer: list = []
    waiting = threading.Thread(target=lambda: answer.append(on_a_terminal(laptop, *args)))
    waiting.start()
    try:
        ddp_id = run_dir_appears(runs, "torch-ddp").name
        deadline = time.monotonic() + 120
        while not (status := quiet_json(glaunch(laptop, "status", ddp_id, "--json")))["progress"]:
            assert status["state"] in ("PENDING", "RUNNING") and time.monotonic() < deadline, status
            time.sleep(1)
        assert 0 < status["progress"]["step"] <= 40 and status["progress"]["total"] == 40, status
    finally:
        waiting.join(timeout=300)
    code, said = answer[0]
    assert code == 0 and not any(noise in said for noise in NOISE), said
    assert "done: step 40" in said and re.search(r"step \d+/40 \|[^\r\n]* \| ETA ", said), said
    status = quiet_json(glaunch(laptop, "status", ddp_id, "--json"))
    assert status["state"] == "COMPLETED" and status["result"], status
    assert status["goodput"]["projection"], status["goodput"]
    return ddp_id


def swapped_cancel_refused(laptop, runs: Path, ddp_id: str, sleeper: str) -> None:
    """The sleeper's run.json on the cluster swapped for the ended ddp run's: cancel of the
    ddp run refuses naming both, and the sleeper's job runs on."""
    mine, other = runs / ddp_id / "run.json", runs / sleeper / "run.json"
    kept = mine.read_bytes()
    mine.write_bytes(other.read_bytes())
    try:
        refused = glaunch(laptop, "cancel", ddp_id)
    finally:
        mine.write_bytes(kept)
    message = quiet(refused).strip()
    assert refused.returncode in (1, 3) and ddp_id in message and sleeper in message, message
    assert len(message.splitlines()) == 1, message
    assert wait_for(laptop, sleeper, {"RUNNING"}, 5)["state"] == "RUNNING"


@pytest.mark.slurm
@pytest.mark.requires_sshd
def test_a_python_the_cluster_account_cannot_run_fails_sites_check_and_submit_naming_it(noisy_laptop, tmp_path,
                                                                                       local_sshd_env):
    """`~` in python: is the cluster account's home; an interpreter not there, or without
    torch, fails `sites check` and `submit` (exit 3, naming python:), and nothing is left."""
    import pwd

    home = pwd.getpwnam(local_sshd_env["GLAUNCH_SSHD_USER"]).pw_dir
    runs = tmp_path / "runs"
    runs.mkdir()
    for python, said in ((f"~/no-such-venv-{os.getpid()}/bin/python", f"{home}/no-such-venv-{os.getpid()}/bin/python"),
                         (f"{sys.executable} -S", "cannot import torch")):
        profile = tmp_path / "far.yaml"
        profile.write_text(f"name: far\nextends: local-slurm-remote\npython: {python}\n")
        check = glaunch(noisy_laptop, "sites", "check", str(profile))
        assert check.returncode == 3 and "FATAL    python: " in check.stdout and said in check.stdout, \
            check.stdout + check.stderr
        done = glaunch(noisy_laptop, "submit", "examples/torch_ddp.yaml", "--site", str(profile), "--runs-dir",
                       str(runs))
        assert done.returncode == 3 and f"{profile}: python: " in done.stderr and said in done.stderr, done.stderr
        assert list(runs.iterdir()) == []
        assert not list((Path(noisy_laptop["GLAUNCH_STATE_DIR"]) / "remote-runs").glob("*-*"))

"""Every external tool glaunch runs is bounded and cannot crash it with its output.

- launcher.processes: a timeout kills the tool's whole process group, even a grandchild
  that still holds the pipes (or one that left the group) cannot hold the caller past
  the bound, input is fed while output is read, output over the limit is dropped.
- Slurm's clients through the real Client: a hanging client leaves nothing behind; bytes
  that are not UTF-8 (a node's Reason= in latin-1) reach `glaunch sites check` and
  `glaunch sites detect` as replacement characters, never as a traceback.
- The in-job tools (py-spy, nvidia-smi, sinfo at a job's end): the same.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from proctools import gone
from launcher import api, processes
from launcher.jobcontrol import jobend
from launcher.runtime import telemetry
from launcher.schedulers.slurm.client import Client, RetryPolicy, Unreachable

REPO = Path(__file__).resolve().parents[2]
RECORDED = REPO / "tests" / "recorded_cluster"
NEVER_S = 30                # how long a hanging stand-in takes: a test that waits for it fails
LATIN1 = "caf\xe9 d\xe9fectueux".encode("latin-1")     # not UTF-8


def pid_in(path: Path, within_s: float = 5.0) -> int:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        text = path.read_text() if path.exists() else ""
        if text.endswith("\n"):
            return int(text)
        time.sleep(0.05)
    raise AssertionError(f"no pid in {path}")


@pytest.fixture
def escaped(tmp_path):
    """Pids of processes a test's tool left running outside its group: ended afterwards."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def tool(tmp_path, monkeypatch):
    """tool(name, script): a shell script `name` first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def make(name: str, script: str) -> Path:
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{script}\n")
        path.chmod(0o755)
        return path

    return make


# --- launcher.processes ----------------------------------------------------------------------------


def test_a_timeout_kills_the_whole_group_grandchildren_included(tmp_path):
    pidfile = tmp_path / "pid"
    started = time.monotonic()
    done = processes.run_bounded(["sh", "-c", f'sleep {NEVER_S} & echo $! > {pidfile}; wait'], timeout_s=0.5)
    assert done is None
    assert time.monotonic() - started < NEVER_S / 3
    assert gone(pid_in(pidfile))


def test_a_grandchild_holding_the_pipes_does_not_hold_the_caller(tmp_path):
    """The tool ended at once, but its background child keeps stdout open: the call ends
    at its bound, and the child, in the tool's group, with it."""
    pidfile = tmp_path / "pid"
    started = time.monotonic()
    done = processes.run_bounded(["sh", "-c", f'sleep {NEVER_S} & echo $! > {pidfile}; echo started'],
                                 timeout_s=0.5)
    assert done is None and time.monotonic() - started < NEVER_S / 3
    assert gone(pid_in(pidfile))


def test_a_process_that_left_the_group_cannot_hold_the_caller_either(tmp_path, escaped):
    pidfile = tmp_path / "pid"
    started = time.monotonic()
    done = processes.run_bounded(
        [sys.executable, "-c", f"import os, time\nif os.fork() == 0:\n    os.setsid()\n"
                               f"    open({str(pidfile)!r}, 'w').write(f'{{os.getpid()}}\\n')\n"
                               f"    time.sleep({NEVER_S})\n"],
        timeout_s=1.0)
    escaped.append(pid_in(pidfile))
    assert done is None and time.monotonic() - started < NEVER_S / 3


class Interrupted(BaseException):
    pass


def test_an_interrupted_call_kills_the_group_before_it_returns(tmp_path):
    """Ctrl-C, or a signal handler's SystemExit, while a tool runs: no tool outlives the call."""
    pidfile = tmp_path / "pid"

    def interrupt(signum, frame):
        raise Interrupted()

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(Interrupted):
            processes.run_bounded(["sh", "-c", f'sleep {NEVER_S} & echo $! > {pidfile}; wait'], timeout_s=NEVER_S)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert gone(pid_in(pidfile))


def test_input_is_fed_while_output_is_read():
    data = os.urandom(1 << 20)          # far more than a pipe holds: written and read together
    done = processes.run_bounded(["cat"], timeout_s=30, input=data)
    assert done is not None and done.returncode == 0 and done.stdout == data and not done.truncated


def test_input_a_tool_does_not_read_is_no_error():
    done = processes.run_bounded(["true"], timeout_s=30, input=b"x" * (1 << 20))
    assert done is not None and done.returncode == 0


def test_output_over_the_limit_is_read_and_dropped():
    done = processes.run_bounded(["sh", "-c", "head -c 3000000 /dev/zero; echo said >&2; exit 3"],
                                 timeout_s=30, max_output=1 << 20)
    assert done is not None and done.returncode == 3
    assert done.stdout == b"\0" * (1 << 20) and done.truncated
    assert done.err == "said\n"


def test_output_is_decoded_without_failing():
    done = processes.run_bounded(["printf", "caf\\351\\n"], timeout_s=30)
    assert done is not None and done.stdout == b"caf\xe9\n"
    assert done.out == processes.shown(done.stdout) == "caf\ufffd\n"      # shown to a user
    assert os.fsencode(processes.fs_text(done.stdout)) == b"caf\xe9\n"   # a path: round-trips


def test_a_missing_tool_is_an_oserror():
    with pytest.raises(FileNotFoundError):
        processes.run_bounded(["glaunch-no-such-tool"], timeout_s=5)


# --- Slurm's clients -----------------------------------------------------------------------------


def test_a_hanging_slurm_client_leaves_nothing_behind(tool, tmp_path):
    pidfile = tmp_path / "pid"
    tool("squeue", f'sleep {NEVER_S} & echo $! > {pidfile}; wait')
    client = Client(sleep=lambda s: None)
    quick = RetryPolicy(attempts=1, attempt_timeout_s=1.0, budget_s=1.0, backoff_s=(), min_attempt_s=0.5)
    started = time.monotonic()
    with pytest.raises(Unreachable, match="squeue did not answer"):
        client.call("squeue", "-h", policy=quick)
    assert time.monotonic() - started < NEVER_S / 3
    assert gone(pid_in(pidfile))


def _scontrol_bytes(reason: bytes) -> bytes:
    """gpufarm's recording with a Reason= on its drained node g006."""
    lines = (RECORDED / "gpufarm.scontrol.txt").read_bytes().split(b"\n")[1:]
    return b"\n".join(line + b" Reason=" + reason + b" [root@2024-03-04T10:00:00]"
                      if line.startswith(b"NodeName=g006 ") else line for line in lines)


@pytest.fixture
def gpufarm(tool, tmp_path):
    """Fake scontrol and sacctmgr answering with gpufarm's recordings; scontrol's Reason
    and sacctmgr's error are set with `answers(reason, sacctmgr_error=None)`."""

    def answers(reason: bytes, sacctmgr_error: bytes | None = None) -> None:
        out = tmp_path / "scontrol.out"
        out.write_bytes(_scontrol_bytes(reason))
        tool("scontrol", f"cat > /dev/null\ncat '{out}'")
        if sacctmgr_error is not None:
            (tmp_path / "sacctmgr.err").write_bytes(sacctmgr_error + b"\n")
            tool("sacctmgr", f"cat '{tmp_path / 'sacctmgr.err'}' >&2\nexit 1")
            return
        assoc, qos = (RECORDED / "gpufarm.assoc.txt"), (RECORDED / "gpufarm.qos.txt")
        tool("sacctmgr", f"""case "$*" in
            *assoc*) tail -n +2 '{assoc}';;
            *qos*) tail -n +2 '{qos}';;
            *) echo proj1;;
        esac""")

    return answers


def test_a_latin1_reason_reaches_the_client_as_replacement_characters(gpufarm):
    gpufarm(LATIN1)
    proc = Client().call("scontrol", "-a", "-o", input="show node\n")
    assert proc.returncode == 0
    assert "Reason=caf\ufffd d\ufffdfectueux [root@2024-03-04T10:00:00]" in proc.stdout


def test_sites_check_with_a_latin1_reason_says_what_it_says_without_one(gpufarm):
    gpufarm(b"maintenance")
    clean = api.check_site(str(RECORDED / "gpufarm.yaml"))
    gpufarm(LATIN1)
    report = api.check_site(str(RECORDED / "gpufarm.yaml"))
    assert report.format() == clean.format() and report.to_json() == clean.to_json()


def test_sites_check_shows_a_latin1_sacctmgr_error_with_replacement_characters(gpufarm):
    gpufarm(b"maintenance", sacctmgr_error=b"sacctmgr: error: " + LATIN1)
    report = api.check_site(str(RECORDED / "gpufarm.yaml"))
    assert "account and QOS not checked: sacctmgr said: caf\ufffd d\ufffdfectueux" in report.format()


def test_sites_detect_with_a_latin1_reason_writes_the_profile_it_writes_without_one(gpufarm):
    gpufarm(b"maintenance")
    clean = api.detect_site("gpufarm")
    gpufarm(LATIN1)
    assert api.detect_site("gpufarm") == clean


@pytest.mark.parametrize("command", [["sites", "check", str(RECORDED / "gpufarm.yaml")],
                                     ["sites", "detect", "--name", "gpufarm", "-o", "-"]])
def test_glaunch_sites_with_latin1_from_slurm_prints_no_traceback(gpufarm, command):
    gpufarm(LATIN1, sacctmgr_error=b"sacctmgr: error: " + LATIN1)
    proc = subprocess.run([sys.executable, "-c", "from launcher.cli import main; main()", *command],
                          capture_output=True, timeout=120, cwd=REPO,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert b"Traceback" not in proc.stderr and proc.returncode in (0, 3), proc.stderr.decode(errors="replace")
    assert b"gpu" in proc.stdout


# --- the in-job tools ----------------------------------------------------------------------------


def test_sinfo_at_a_jobs_end_with_latin1_says_why_not(tool):
    tool("sinfo", r"printf 'sinfo: error: caf\351\n' >&2; exit 1")
    assert jobend.partition_nodes("gpu") == (None, "sinfo: exit status 1: sinfo: error: caf\ufffd")


def test_sinfo_at_a_jobs_end_that_hangs_leaves_nothing_behind(tool, tmp_path, monkeypatch):
    pidfile = tmp_path / "pid"
    tool("sinfo", f'sleep {NEVER_S} & echo $! > {pidfile}; echo "g001 idle"')
    monkeypatch.setattr(jobend, "SINFO_TIMEOUT_S", 0.5)
    started = time.monotonic()
    nodes, why = jobend.partition_nodes(None)
    assert nodes is None and "sinfo" in why and time.monotonic() - started < NEVER_S / 3
    assert gone(pid_in(pidfile))


def test_py_spy_output_in_latin1_is_kept_with_replacement_characters(tool):
    path = tool("py-spy", r"printf 'Thread 1 (idle): caf\351\n'")
    assert processes.run_command([str(path), "dump", "--pid", "1"]) == "Thread 1 (idle): caf\ufffd\n"


def test_a_hanging_py_spy_leaves_nothing_behind(tool, tmp_path, monkeypatch):
    pidfile = tmp_path / "pid"
    path = tool("py-spy", f'sleep {NEVER_S} & echo $! > {pidfile}; wait')
    monkeypatch.setattr(processes, "COMMAND_TIMEOUT_S", 0.5)
    started = time.monotonic()
    assert processes.run_command([str(path), "dump", "--pid", "1"]) is None
    assert time.monotonic() - started < NEVER_S / 3
    assert gone(pid_in(pidfile))


def test_stopping_the_gpu_sampler_ends_the_nvidia_smi_it_waits_on(tool, tmp_path, monkeypatch):
    pidfile = tmp_path / "pid"
    tool("nvidia-smi", f'sleep {NEVER_S} & echo $! > {pidfile}; wait')
    monkeypatch.setenv("GLAUNCH_GPU_SAMPLE_S", "1")
    monkeypatch.setattr(telemetry, "_sampler", None)
    sampler = telemetry.start_gpu_sampler(SimpleNamespace(run_dir=tmp_path, job_id="12"))
    assert sampler is not None
    try:
        smi_child = pid_in(pidfile, within_s=30)
        telemetry.stop_gpu_sampler()
        assert sampler.poll() is not None
        assert gone(smi_child)
    finally:
        if sampler.poll() is None:
            sampler.kill()
            sampler.wait()


def test_nvidia_smi_output_in_latin1_is_sampled_not_fatal(tool, tmp_path):
    # Answers once, then fails: the sampler gives up after GPU_FAILURES failures in a row.
    marker = tmp_path / "answered"
    smi = tool("nvidia-smi", f"[ -e '{marker}' ] && exit 1\ntouch '{marker}'\n"
                             r"printf '0, GPU-caf\351, 87, 40, 61234, 81559\n'")
    out = tmp_path / "logs" / "gpu.csv"
    assert telemetry.sample_gpus(out, 0.01, os.getppid(), str(smi)) == 1
    rows = out.read_text(encoding="utf-8").splitlines()
    assert rows[0] == telemetry.GPU_HEADER and rows[1].split(",")[1:] == [
        "0", "GPU-caf\ufffd", "87", "40", "61234", "81559"]

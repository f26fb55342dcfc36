"""The console of a local run on a terminal (a pty): one status line redrawn in place, an
event line per requeue, the failure's reason and first failing rank, no submitit INFO
lines; and Ctrl-C: the ranks stop and save, the stop is recorded, exit 130."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

from launcher.rundir.layout import read_heartbeat

REPO = Path(__file__).resolve().parents[2]
RECORDINGS = Path(__file__).resolve().parents[1] / "recorded_console"
CLEAR = "\r\x1b[K"


COLUMNS = 72


def in_pty(argv: list[str], env: dict, cwd: Path, timeout: float) -> tuple[str, int]:
    """Run `argv` on a pseudo-terminal COLUMNS wide; (everything it wrote, exit status)."""
    env = {k: v for k, v in env.items() if k not in ("COLUMNS", "LINES")}
    pid, fd = pty.fork()
    if pid == 0:      # the child: size its terminal, then exec
        fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 24, COLUMNS, 0, 0))
        os.chdir(cwd)
        os.execvpe(argv[0], argv, env)
    out = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                try:
                    data = os.read(fd, 65536)
                except OSError:        # EIO: the child closed the terminal
                    break
                if not data:
                    break
                out += data
        else:
            os.kill(pid, signal.SIGKILL)
    finally:
        os.close(fd)
    _, status = os.waitpid(pid, 0)
    return out.decode(errors="replace"), os.waitstatus_to_exitcode(status)


def glaunch(*args: str) -> list[str]:
    return [sys.executable, "-m", "launcher.cli", *args]


def as_seen(raw: str) -> str:
    """A recording a person can read: the lines that stay on the terminal as they are, and
    each state of the status line (drawn, then erased and drawn again) marked `~ `."""
    lines: list[str] = []
    current = ""
    for token in re.split(r"(\r\x1b\[K|\r?\n)", raw):
        if token == CLEAR:
            if current and (not lines or lines[-1] != "~ " + current):
                lines.append("~ " + current)
            current = ""
        elif token in ("\r\n", "\n"):
            lines.append(current)
            current = ""
        else:
            current += token
    if current:
        lines.append(current)
    return "\n".join(lines) + "\n"


def test_console_through_a_time_limit_requeue(tmp_path, isolated_env):
    runs = tmp_path / "runs"
    # 25 s of steps never fit in one start (warned 25 s after it began); requeue.max leaves
    # room for starts that get little done on a busy machine.
    raw, status = in_pty(glaunch("submit", "examples/torch_ddp.yaml", "--runs-dir", str(runs),
                                 "resources.time=0:45", "requeue.signal_lead_s=20", "requeue.max=8",
                                 "checkpoint.every_steps=100", "entrypoint.args=[--steps,50,--seconds-per-step,0.5]"),
                         isolated_env, REPO, timeout=600)
    assert status == 0, raw[-3000:]
    (run_dir,) = runs.iterdir()
    record = json.loads((run_dir / "run.json").read_text())
    requeued = [s for s in record["starts"] if s["state"] == "REQUEUED"]
    assert requeued and record["state"] == "COMPLETED"
    for start in requeued:
        following = record["starts"][start["restart"] + 1]
        line = (f"[glaunch] start {start['restart']}: time limit at step {start['stopped_at']} -> requeued -> "
                f"resumed from {following['resumed_from']}")
        assert line in raw, raw[-3000:]
        assert start["stopped_at"] == following["resumed_from"]
    assert re.search(re.escape(CLEAR) + r"\[glaunch\] RUNNING \| (start \d+ \| )?step \d+", raw)
    assert "step 10/50 loss" in raw                         # rank 0's log still streams
    assert "submitit INFO" not in raw and "Bypassing signal" not in raw
    assert f"[glaunch] run {record['run_id']} COMPLETED at step 50 after {len(record['starts'])} start(s)" in raw
    # Every status line fits the terminal's width (a wrapped line would break the redraw):
    # the text after each erase, past the log lines printed above it.
    shown = [part.rsplit("\n", 1)[-1] for part in raw.split(CLEAR)[1:]]
    assert max(len(line) for line in shown) <= COLUMNS - 1, max(shown, key=len)
    if os.environ.get("GLAUNCH_UPDATE_RECORDINGS") == "1":
        RECORDINGS.mkdir(exist_ok=True)
        (RECORDINGS / "local_requeue.txt").write_text(
            "# glaunch submit examples/torch_ddp.yaml resources.time=0:45 requeue.signal_lead_s=20 requeue.max=8 \\\n"
            "#     checkpoint.every_steps=100 'entrypoint.args=[--steps,50,--seconds-per-step,0.5]'\n"
            "# on a terminal (a pty); '~ ' marks each redraw of the status line in place.\n"
            + as_seen(raw.replace(str(runs), "runs")))


# Rank 1 fails once rank 0 is training (told by a file, whatever the machine's speed);
# rank 0 trains on until the job's end stops it.
FAILING = """\
import os, sys, time
rank = int(os.environ["RANK"])
up = os.path.join(os.environ["GLAUNCH_RUN_DIR"], "rank0-training")
print(f"rank {rank} training", flush=True)
if rank == 0:
    open(up, "w").close()
    time.sleep(600)
deadline = time.monotonic() + 120
while not os.path.exists(up) and time.monotonic() < deadline:
    time.sleep(0.05)
raise RuntimeError("boom on rank 1")
"""


def test_console_of_a_failing_run(tmp_path, isolated_env):
    (tmp_path / "fail.py").write_text(FAILING)
    exp = tmp_path / "fail.yaml"
    exp.write_text("name: fail\nentrypoint: {script: fail.py}\nresources: {time: '5'}\n"
                   "checkpoint: {every_steps: 10}\nrequeue: {signal_lead_s: 10}\n")
    raw, status = in_pty(glaunch("submit", str(exp), "--runs-dir", str(tmp_path / "runs")), isolated_env,
                         tmp_path, timeout=200)
    assert status == 1, raw[-3000:]                       # the run failed: 1, whatever the script's status
    (run_dir,) = (tmp_path / "runs").iterdir()
    record = json.loads((run_dir / "run.json").read_text())
    assert record["state"] == "FAILED"
    assert f"[glaunch] run {record['run_id']} FAILED" in raw
    assert "[glaunch] reason: crash; exit status" in raw
    assert re.search(r"\[glaunch\] first failing rank: 1 on \S+: RuntimeError: .*boom on rank 1", raw), raw[-3000:]
    assert "RuntimeError: boom on rank 1" in raw.split("first failing rank")[1]   # the end of its error log
    assert "rank 0 training" in raw and "submitit INFO" not in raw
    if os.environ.get("GLAUNCH_UPDATE_RECORDINGS") == "1":
        RECORDINGS.mkdir(exist_ok=True)
        (RECORDINGS / "local_failure.txt").write_text(
            "# glaunch submit fail.yaml (rank 1 raises RuntimeError once rank 0 trains)\n"
            "# on a terminal (a pty); '~ ' marks each redraw of the status line in place.\n"
            + as_seen(raw.replace(str(tmp_path), "/tmp/x")))


def _wait_for_step(runs: Path, step: int, proc: subprocess.Popen, timeout: float = 120) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        for path in runs.glob("*/heartbeats/rank-00000.json"):
            beat = read_heartbeat(path)
            if beat is not None and (beat.get("step") or 0) >= step:
                return path.parent.parent
        time.sleep(0.2)
    raise AssertionError("the run made no progress")


def _processes_of(run_dir: Path) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if str(run_dir).encode() in cmdline:
                found.append(int(entry))
    return found


def test_ctrl_c_stops_saves_and_records(tmp_path, isolated_env):
    runs = tmp_path / "runs"
    proc = subprocess.Popen(glaunch("submit", "examples/torch_ddp.yaml", "--runs-dir", str(runs),
                                    "checkpoint.every_steps=1000",
                                    "entrypoint.args=[--steps,400,--seconds-per-step,0.1]"),
                            cwd=REPO, env=isolated_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    run_dir = _wait_for_step(runs, 3, proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-2000:] + err[-2000:]
    record = json.loads((run_dir / "run.json").read_text())
    stop = json.loads((run_dir / "stop.json").read_text())
    (start,) = record["starts"]
    assert record["state"] == start["state"] == "CANCELLED"
    assert start["stopped_at"] == stop["step"] >= 3
    assert record["detail"] == f"interrupted (Ctrl-C): stopped at step {stop['step']} with a checkpoint"
    assert (run_dir / "checkpoints" / f"step-{stop['step']:08d}" / "manifest.json").is_file()
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"step-{stop['step']:08d}"
    assert start["peak_memory_gb"] > 0 and start["stop_checkpoint"]       # the start's record was completed
    assert "interrupted: the ranks stop and save a checkpoint" in out
    assert "CANCELLED" in out
    assert _processes_of(run_dir) == []


# A script that never asks whether to stop, and ignores SIGTERM (a plain script that does
# not ends on the first Ctrl-C's SIGTERM, as under torchrun alone).
STUBBORN = """\
import signal, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
while True:
    time.sleep(0.1)
"""


def test_second_ctrl_c_kills_at_once(tmp_path, isolated_env):
    (tmp_path / "stubborn.py").write_text(STUBBORN)
    exp = tmp_path / "stubborn.yaml"
    exp.write_text("name: stubborn\nentrypoint: {script: stubborn.py}\nresources: {time: '5'}\n"
                   "checkpoint: {every_steps: 10}\nrequeue: {signal_lead_s: 10}\n")
    runs = tmp_path / "runs"
    proc = subprocess.Popen(glaunch("submit", str(exp), "--runs-dir", str(runs)), cwd=tmp_path, env=isolated_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(runs.glob("*/logs/*_0_log.err")) or "rank 0/2" not in "".join(
            p.read_text() for p in runs.glob("*/logs/*_0_log.err")):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.2)
    (run_dir,) = runs.iterdir()
    proc.send_signal(signal.SIGINT)
    time.sleep(1.0)
    assert proc.poll() is None                          # waiting for ranks that do not stop
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out[-2000:] + err[-2000:]
    record = json.loads((run_dir / "run.json").read_text())
    assert record["state"] == "CANCELLED" and record["detail"].startswith("interrupted (Ctrl-C)")
    assert "killing the job" in out                     # the second Ctrl-C killed it, not localrun's own bound
    deadline = time.monotonic() + 60
    while _processes_of(run_dir) and time.monotonic() < deadline:     # SIGKILLed processes leave soon after
        time.sleep(0.2)
    assert _processes_of(run_dir) == []

"""Peer recovery (``recovery.peer: true``) of the torch DDP example, two ranks over gloo:
rank 1 (or 0) raises inside a step, in its data, in its backward pass (its peer waiting in
the gradient all-reduce) or after its optimizer step; the run goes on in the same
processes, the failed rank gets the state of its live peer, at most the step in flight is
redone, no checkpoint is read, and the final parameters are bitwise those of an
uninterrupted run. A step that fails again when redone ends the run as a crash; without
``recovery.peer`` the first failure does.

First the ranks started directly, then a run submitted to the local site end to end."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import RANK_VARS
from launcher.rundir.rankcontext import free_port
from test_watchdog_local import status_of

REPO = Path(__file__).resolve().parents[2]
STEPS = 20

# The example, made to raise once on FAIL_RANK (a rank, or several: "1,2") at FAIL_STEP (FAIL_WHERE: in its data, in its
# backward pass, after its optimizer step; "always": at every try of that step; "exit": its
# process lost; "exit_after": its process lost after its update; "kill_save": SIGKILL 5 ms into
# its save; "hang": its data never comes), its parameters and optimizer state damaged first. It notes when it failed
# and when the next step after the failure was done (should_stop's call).
SCRIPT = f'''
import json, os, signal, sys, threading, time
sys.path.insert(0, {str(REPO / "examples")!r})
import torch
import torch_ddp
from torch.optim.optimizer import register_optimizer_step_post_hook
from launcher import runtime as rt

WHERE = os.environ.get("FAIL_WHERE", "")
# A process started again in place of a lost one (GLAUNCH_PEER_JOIN: the generation it joins)
# fails again only while FAIL_TIMES (default 1) processes of the rank have not failed yet.
AGAIN = "-started-again" if os.environ.get("GLAUNCH_PEER_JOIN") else ""
FAILS = (os.environ.get("RANK") in os.environ.get("FAIL_RANK", "").split(",")
         and int(os.environ.get("GLAUNCH_PEER_JOIN") or 0) < int(os.environ.get("FAIL_TIMES") or 1))
STEP = int(os.environ.get("FAIL_STEP", "0"))
times = {{"failed_at": None, "next_step": None, "next_step_at": None, "step_ends": []}}
now = {{"step": None}}
batch, make_model, should_stop = torch_ddp.batch, torch_ddp.make_model, rt.should_stop
held = {{}}
register_optimizer_step_post_hook(lambda opt, args, kwargs: held.update(opt=opt))


def note(key, value):
    times[key] = value
    path = os.path.join(os.environ["GLAUNCH_RUN_DIR"], "peer-times-" + os.environ["RANK"] + AGAIN + ".json")
    with open(path, "w") as f:
        json.dump(times, f)


def fail_here(what):
    """Damage this rank's parameters and Adam moments (as an update cut short would), then raise:
    only the state of its peer brings the run back to an uninterrupted one's."""
    if WHERE != "always":
        globals()["FAILS"] = False
    with torch.no_grad():
        for p in held["model"].parameters():
            p.add_(1.0)
        for entry in held["opt"].state.values():
            entry["exp_avg"].add_(1.0)
    note("failed_at", time.time())
    raise ValueError(f"injected failure {{what}} at step {{now['step']}}")


def failing_batch(step, rank):
    now["step"] = step
    if FAILS and step == STEP and WHERE == "exit":
        note("failed_at", time.time())
        os._exit(3)                        # the process is lost, not an exception
    if FAILS and step == STEP and WHERE == "hang":
        note("failed_at", time.time())
        time.sleep(3600)                   # a data loader that never returns: nothing raises
    if FAILS and step == STEP and WHERE in ("data", "always"):
        fail_here("in its data")
    return batch(step, rank)


def failing_model(*args, **kwargs):
    model = held["model"] = make_model(*args, **kwargs)

    def in_backward(module, grad):
        if FAILS and now["step"] == STEP and WHERE == "backward":
            fail_here("in its backward pass")
    model[0].register_full_backward_pre_hook(in_backward)
    return model


def failing_should_stop(step=None, total=None):
    if FAILS and step == STEP and WHERE == "after":
        fail_here("after its optimizer step")
    if FAILS and step == STEP and WHERE == "exit_after":
        note("failed_at", time.time())
        os._exit(3)                        # the process lost once its update is done
    times["step_ends"].append(time.time())
    if times["failed_at"] is not None and times["next_step"] is None:
        times["next_step"] = step
        note("next_step_at", time.time())
    return should_stop(step=step, total=total)


save_torch_state = rt.save_torch_state


def failing_save(step, *args, **kwargs):
    if FAILS and step == STEP and WHERE == "kill_save":
        note("failed_at", time.time())
        # The process lost 5 ms into its save: its peer is inside the save's collectives.
        threading.Timer(0.005, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
    return save_torch_state(step, *args, **kwargs)


torch_ddp.batch, torch_ddp.make_model, rt.should_stop = failing_batch, failing_model, failing_should_stop
rt.save_torch_state = failing_save
code = torch_ddp.main()
note("step_ends", times["step_ends"])
sys.exit(code)
'''


def run_ranks(tmp_path: Path, name: str, *, peer: bool, fail_rank: int | None = None, fail_step: int = 0,
              where: str = "") -> tuple[Path, list[int], str]:
    """Two ranks of SCRIPT started directly; their run directory, exit statuses and output."""
    script = tmp_path / "failing_ddp.py"
    script.write_text(SCRIPT)
    run_dir = tmp_path / name
    run_dir.mkdir()
    port = free_port()
    procs = []
    for rank in range(2):
        env = {k: v for k, v in os.environ.items() if k not in RANK_VARS and not k.startswith("GLAUNCH_")}
        env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2",
                   LOCAL_WORLD_SIZE="2", GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   GLAUNCH_RUN_DIR=str(run_dir), GLAUNCH_CHECKPOINT_DIR=str(run_dir / "checkpoints"),
                   GLAUNCH_RECOVERY_PEER="1" if peer else "0", FAIL_RANK=str(fail_rank), FAIL_STEP=str(fail_step),
                   FAIL_WHERE=where)
        procs.append(subprocess.Popen([sys.executable, str(script), "--steps", str(STEPS), "--log-every", "5"],
                                      env=env, cwd=run_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    outputs, codes = [], []
    try:
        for proc in procs:
            text, _ = proc.communicate(timeout=300)
            outputs.append(text)
            codes.append(proc.returncode)
    finally:
        stop_all(procs, port)
    return run_dir, codes, "\n".join(outputs)


def stop_all(procs: list[subprocess.Popen[str]], port: int | None = None) -> None:
    """Kill the ranks that still run (a test that failed midway leaves them blocked in a collective),
    and with `port` the rendezvous store's process serving it: its ranks, started by this test, are
    the children of no step whose end would end it."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    for pid in store_processes(port) if port is not None else []:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def store_processes(port: int) -> list[int]:
    """The pids of the rendezvous store's processes serving `port` (launcher.runtime.peerstore)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            words = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"launcher.runtime.peerstore" in words and str(port).encode() in words:
            found.append(int(proc.name))
    return found


def param_sha256(run_dir: Path) -> str:
    return json.loads((run_dir / "result.json").read_text())["param_sha256"]


def recovery_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if "peer recovery: failed rank(s)" in line]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> str:
    """The final parameters of the same run without a failure and without recovery.peer."""
    run_dir, codes, text = run_ranks(tmp_path_factory.mktemp("plain"), "plain", peer=False)
    assert codes == [0, 0], text[-4000:]
    return param_sha256(run_dir)


@pytest.mark.parametrize("where,fail_rank,fail_step,resume_after", [
    ("data", 1, 7, 6),          # before its forward pass: the step in flight is redone
    ("backward", 1, 5, 4),      # its peer waits for it in the gradient all-reduce
    ("after", 1, 7, 7),         # after its update: its peer's state of that step, nothing redone
    ("data", 0, 5, 4),          # rank 0, which started the rendezvous store
])
def test_a_rank_that_raises_in_a_step_gets_its_peers_state_and_the_run_ends_bitwise(
        tmp_path, uninterrupted, where, fail_rank, fail_step, resume_after):
    run_dir, codes, text = run_ranks(tmp_path, "peer", peer=True, fail_rank=fail_rank, fail_step=fail_step,
                                     where=where)
    assert codes == [0, 0], text[-4000:]
    assert param_sha256(run_dir) == uninterrupted
    source = 1 - fail_rank
    lines = recovery_lines(text)
    assert len(lines) == 2, text[-4000:]          # one recovery, logged by each rank
    for line in lines:
        assert (f"failed rank(s) {fail_rank}; state of step {resume_after} from rank {source} to rank(s) "
                f"{fail_rank}; the ranks go on at step {resume_after + 1}") in line, line
        assert "no checkpoint read" in line
    assert fail_step - resume_after <= 1          # at most the step in flight is lost
    assert not (run_dir / "checkpoints").exists() and "resumed from" not in text
    times = json.loads((run_dir / f"peer-times-{fail_rank}.json").read_text())
    print(f"{where}, rank {fail_rank} at step {fail_step}: failure to the end of step {times['next_step']} "
          f"{times['next_step_at'] - times['failed_at']:.3f} s; {lines[0].rsplit(';', 1)[-1].strip()} to recover")


def test_a_step_that_fails_again_when_redone_ends_the_run_as_a_crash(tmp_path):
    _, codes, text = run_ranks(tmp_path, "again", peer=True, fail_rank=1, fail_step=5, where="always")
    assert 0 not in codes, text[-4000:]
    assert "peer recovery impossible: rank 1 failed again at the step redone" in text
    assert len(recovery_lines(text)) == 2        # the first failure was recovered, the second not


def test_without_recovery_peer_the_failure_ends_the_run(tmp_path):
    run_dir, codes, text = run_ranks(tmp_path, "off", peer=False, fail_rank=1, fail_step=7, where="data")
    assert codes[1] != 0 and codes[0] != 0, text[-4000:]
    assert "ValueError: injected failure in its data at step 7" in text
    assert not recovery_lines(text) and not (run_dir / "result.json").exists()


# --- on the local site, end to end ------------------------------------------------------------

EXPERIMENT = f"""
name: peer
entrypoint:
  script: failing_ddp.py
  args: ["--steps", "{STEPS}", "--log-every", "5"]
launcher: srun
resources: {{nodes: 1, time: "00:10:00"}}
strategy: {{name: ddp}}
precision: fp32
batch: {{micro_size: 8}}
checkpoint: {{every_steps: 5, keep: 4}}
"""


def submit(tmp_path: Path, runs: str, env: dict, *overrides: str,
           site: str = "local") -> tuple[Path, subprocess.CompletedProcess]:
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", str(tmp_path / "peer.yaml"),
                           "--site", site, "--runs-dir", str(tmp_path / runs), *overrides],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    (run_dir,) = (tmp_path / runs).iterdir()
    return run_dir, proc


def rank_logs(run_dir: Path) -> str:
    return "\n".join(p.read_text() for p in sorted((run_dir / "logs").glob("*_log.*")))


def test_on_the_local_site_a_failed_rank_is_restored_from_its_peer_in_the_same_start(tmp_path, isolated_env):
    (tmp_path / "failing_ddp.py").write_text(SCRIPT)
    (tmp_path / "peer.yaml").write_text(EXPERIMENT)
    plain_dir, plain = submit(tmp_path, "plain", isolated_env)
    assert plain.returncode == 0, plain.stdout[-3000:] + plain.stderr[-3000:]
    run_dir, proc = submit(tmp_path, "peer", isolated_env, "recovery.peer=true", "env.FAIL_RANK=1",
                           "env.FAIL_STEP=7", "env.FAIL_WHERE=data")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((run_dir / "run.json").read_text())
    (start,) = record["starts"]                          # the same start: no restart, no requeue
    assert record["state"] == "COMPLETED" and start["state"] == "COMPLETED", record
    assert start.get("resumed_from") is None
    assert param_sha256(run_dir) == param_sha256(plain_dir)
    logs = rank_logs(run_dir)
    lines = recovery_lines(logs)
    assert len(lines) == 2, logs[-4000:]
    assert all("state of step 6 from rank 0 to rank(s) 1; the ranks go on at step 7" in line for line in lines)
    assert "resumed from" not in logs
    # A checkpoint of step 5 was there when rank 1 failed at step 7 (all four are kept); none was read.
    assert (run_dir / "checkpoints" / "step-00000005").is_dir()
    assert "COMPLETED" in status_of(run_dir, isolated_env)
    times = json.loads((run_dir / "peer-times-1.json").read_text())
    ends = times["step_ends"]
    step_s = sorted(b - a for a, b in zip(ends, ends[1:]))[len(ends) // 2]
    took = re.search(r"no checkpoint read; ([0-9.]+) s", lines[0])
    print(f"local site: rank 1 failed at step 7; the end of step {times['next_step']} came "
          f"{times['next_step_at'] - times['failed_at']:.3f} s later (recovery {took.group(1) if took else '?'} s; "
          f"a step takes {step_s:.4f} s)")


def test_on_the_local_site_a_lost_process_is_started_again_and_gets_its_peers_state(tmp_path, isolated_env):
    """A rank's process lost (os._exit) inside the step loop: its peer asks for it, the local
    job step starts it again in the same start, and it joins with its peer's state; the
    final parameters equal an uninterrupted run's, and no checkpoint is read."""
    (tmp_path / "failing_ddp.py").write_text(SCRIPT)
    (tmp_path / "peer.yaml").write_text(EXPERIMENT)
    plain_dir, plain = submit(tmp_path, "plain", isolated_env)
    assert plain.returncode == 0, plain.stdout[-3000:] + plain.stderr[-3000:]
    run_dir, proc = submit(tmp_path, "lost", isolated_env, "recovery.peer=true", "env.FAIL_RANK=1",
                           "env.FAIL_STEP=7", "env.FAIL_WHERE=exit")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((run_dir / "run.json").read_text())
    (start,) = record["starts"]                          # the same start: no restart, no requeue
    assert record["state"] == "COMPLETED" and start["state"] == "COMPLETED", record
    assert start.get("resumed_from") is None
    assert param_sha256(run_dir) == param_sha256(plain_dir)
    logs = rank_logs(run_dir)
    assert "resumed from" not in logs
    (summary,) = [json.loads(p.read_text()) for p in (run_dir / "logs").glob("*_step.json")]
    assert summary["started_again"] == {"1": 1} and summary["status"] == 0, summary
    lost_at = json.loads((run_dir / "peer-times-1.json").read_text())["failed_at"]
    again = json.loads((run_dir / "peer-times-1-started-again.json").read_text())
    print(f"local site: rank 1's process lost at step 7; its new process ended its first step "
          f"{again['step_ends'][0] - lost_at:.3f} s later")


def test_on_the_local_site_two_ranks_hung_in_their_data_end_themselves_and_are_recovered_from_their_peer(
        tmp_path, isolated_env):
    """Ranks 1 and 2 of 3 hang in their data at step 7 (nothing raises) while rank 0 waits
    for them in the gradient all-reduce: once rank 0 has waited half the hang bound, each
    ends its own process (neither waits for the other: the step's collective needs them
    both), rank 0 asks for both, the local job step starts them again, and they join with
    rank 0's state. One start, no checkpoint read, the watchdog never ends the step, and
    the final parameters equal an uninterrupted run's. The bound's floor is lowered to 20 s
    (so 10 s of waiting) to keep the test short."""
    (tmp_path / "failing_ddp.py").write_text(SCRIPT)
    (tmp_path / "peer.yaml").write_text(EXPERIMENT)
    three = tmp_path / "three.yaml"
    three.write_text((REPO / "site_configs" / "local.yaml").read_text().replace("gpus_per_node: 2",
                                                                                "gpus_per_node: 3"))
    plain_dir, plain = submit(tmp_path, "plain", isolated_env, site=str(three))
    assert plain.returncode == 0, plain.stdout[-3000:] + plain.stderr[-3000:]
    run_dir, proc = submit(tmp_path, "hung", isolated_env, "recovery.peer=true", "watchdog.auto_floor_s=20",
                           "env.FAIL_RANK=1,2", "env.FAIL_STEP=7", "env.FAIL_WHERE=hang", site=str(three))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((run_dir / "run.json").read_text())
    (start,) = record["starts"]
    assert record["state"] == "COMPLETED" and start["state"] == "COMPLETED", record
    assert start.get("resumed_from") is None and "hang" not in start, start
    assert param_sha256(run_dir) == param_sha256(plain_dir)
    logs = rank_logs(run_dir)
    held = re.findall(r"rank\(s\) 0 have waited ([0-9]+) s for this rank in its step \(half the hang bound of "
                      r"([0-9.]+) s\)", logs)
    assert len(held) == 2 and all(float(waited) >= float(bound) / 2 for waited, bound in held), logs[-4000:]
    assert "resumed from" not in logs
    (summary,) = [json.loads(p.read_text()) for p in (run_dir / "logs").glob("*_step.json")]
    assert summary["started_again"] == {"1": 1, "2": 1} and summary["status"] == 0 and not summary["hung"], summary
    (entry,) = (json.loads(line) for line in (run_dir / "peer-recoveries.jsonl").read_text().splitlines())
    assert entry["replaced"] == [1, 2] and entry["source"] == 0 and entry["lost_steps"] == 1, entry
    hung_at = json.loads((run_dir / "peer-times-1.json").read_text())["failed_at"]
    again = [json.loads((run_dir / f"peer-times-{rank}-started-again.json").read_text()) for rank in (1, 2)]
    print(f"local site: ranks 1 and 2 of 3 hung in their data at step 7 (bound {held[0][1]} s); they ended "
          f"themselves after their peer waited {held[0][0]} s; their new processes ended step 7 "
          f"{max(a['step_ends'][0] for a in again) - hung_at:.1f} s after the hang began")

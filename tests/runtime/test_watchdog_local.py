"""The hang watchdog on the local scheduler, end to end: one rank of the torch DDP example
sleeps inside its loop on the first start; the watchdog finds the stall from the
heartbeats (under a fixed stall_s, and under auto after warm-up), writes every rank's
stack, ends the step; the start is recorded as a hang, retried within crash_retries,
resumes from its checkpoint and ends bitwise like an uninterrupted run. (Slow ranks on
this scheduler: tests/jobcontrol/test_slow_ranks_local.py.)"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
AUTO_FLOOR_S = 0.1

# The example, with one rank made to hang at HANG_STEP on restart 0 when HANG_RANK is set.
HANGING_SCRIPT = f'''
import os, sys, time
sys.path.insert(0, {str(REPO / "examples")!r})
import torch_ddp
from launcher import runtime as rt

should_stop = rt.should_stop
HANG_STEP = int(os.environ.get("HANG_STEP", "14"))


def hang_here():
    with open(os.path.join(os.environ["GLAUNCH_RUN_DIR"], "hang_began"), "w") as f:
        f.write(repr(time.time()))
    time.sleep(10**6)


def stalling_should_stop(step=None, total=None):
    if (os.environ.get("HANG_RANK") == os.environ.get("RANK") and os.environ.get("GLAUNCH_RESTART") == "0"
            and step == HANG_STEP):
        hang_here()
    # More of its own work than its peers: in the starts SLOW_STARTS names, else in every one.
    starts = os.environ.get("SLOW_STARTS")
    if os.environ.get("SLOW_RANK") == os.environ.get("RANK") and (
            starts is None or os.environ.get("GLAUNCH_RESTART") in starts.split(",")):
        time.sleep(float(os.environ["SLOW_EXTRA_S"]))
    return should_stop(step=step, total=total)


rt.should_stop = stalling_should_stop
sys.exit(torch_ddp.main())
'''

EXPERIMENT = """
name: hang
entrypoint:
  script: hang_ddp.py
  args: ["--steps", "${hparams.steps}", "--seconds-per-step", "0.2"]
launcher: srun
resources: {nodes: 1, time: "00:10:00"}
strategy: {name: ddp}
precision: fp32
batch: {micro_size: 8}
checkpoint: {every_steps: 10, keep: 2}
requeue: {max: 3, signal_lead_s: 30}
hparams: {steps: 30}
"""

SITE = """
name: local-retry
extends: local
crash_retries: 1
"""


def submit(tmp_path: Path, runs: str, env, *overrides) -> tuple[Path, subprocess.CompletedProcess, float]:
    began = time.time()
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", str(tmp_path / "hang.yaml"),
                           "--site", str(tmp_path / "site.yaml"), "--runs-dir", str(tmp_path / runs), *overrides],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    (run_dir,) = (tmp_path / runs).iterdir()
    return run_dir, proc, time.time() - began


def write_files(tmp_path: Path) -> None:
    (tmp_path / "hang_ddp.py").write_text(HANGING_SCRIPT)
    (tmp_path / "hang.yaml").write_text(EXPERIMENT)
    (tmp_path / "site.yaml").write_text(SITE)


def status_of(run_dir: Path, env, *options: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "status", str(run_dir), *options], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


# The bound derived from the run's steps (stall_s: auto): past warm-up
# (watchdog.AUTO_WARMUP_STEPS timed steps), a floor below the steps' own bound; rank 1 hangs
# at step 27, the retry resumes from step 20. A fixed stall_s is the Slurm test's
# (tests/live/test_watchdog_slurm.py), with the same assertions on the hang's record.
def test_a_hung_rank_is_found_dumped_and_the_run_resumes_bitwise(tmp_path, isolated_env):
    stall = ["watchdog.stall_s=auto", f"watchdog.auto_floor_s={AUTO_FLOOR_S}", "resources.time=00:03:00"]
    steps, hang_step, resumed = 40, 27, 20
    write_files(tmp_path)
    shape = [f"hparams.steps={steps}", f"env.HANG_STEP={hang_step}"]
    base_dir, base, _ = submit(tmp_path, "base", isolated_env, *shape)
    assert base.returncode == 0, base.stdout[-3000:] + base.stderr[-3000:]

    hung_dir, proc, seconds = submit(tmp_path, "hung", isolated_env, *stall, *shape, "env.HANG_RANK=1")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((hung_dir / "run.json").read_text())
    first, last = record["starts"][0], record["starts"][-1]
    assert (first["state"], first["reason"]) == ("REQUEUED", "hang"), first
    assert (last["state"], last["reason"]) == ("COMPLETED", None), last
    assert record["state"] == "COMPLETED" and len(record["starts"]) == 2

    hang = first["hang"]
    assert hang["kind"] == "stall"
    assert {s["rank"] for s in hang["silent"]} >= {1}
    assert all(s["node"] for s in hang["silent"])
    # Never before the bound, counted from the last step any rank reached.
    last_step_at = max(s["last_step_at"] for s in hang["silent"])
    latency = datetime.fromisoformat(hang["detected_at"]).timestamp() - last_step_at
    assert hang["bound_s"] - 1e-3 <= latency, latency          # detected_at is cut to the millisecond
    watch = first["watchdog"]
    # The bound came from the run's own steps: AUTO_STALL_FACTOR x p99, above the floor;
    # found within 3 x p99 + the heartbeat interval (the hung rank's: 5 s) of the moment
    # rank 1 stopped, with room for the 0.1 s poll of localrun's loop.
    p99 = hang["bound_s"] / 2.5
    assert watch["stall_s"] == "auto" and watch["basis"] == "steps" and hang["bound_s"] > AUTO_FLOOR_S
    since_hang = datetime.fromisoformat(hang["detected_at"]).timestamp() - float((hung_dir / "hang_began").read_text())
    assert since_hang <= 3 * p99 + 5.0 + 0.2, (since_hang, p99)
    print(f"auto: hang found {since_hang:.2f} s after rank 1 stopped; p99 step {p99:.3f} s, bound "
          f"{hang['bound_s']:.3f} s, heartbeat interval 5 s (rank 0: 1 s)")

    stacks = {Path(p).name: (hung_dir / p).read_text() for p in hang["stacks"]}
    job = first["job_id"]
    assert set(stacks) == {f"stack-{job}_0_0.txt", f"stack-{job}_0_1.txt"}, stacks.keys()
    assert "hang_here" in stacks[f"stack-{job}_0_1.txt"]
    assert "hang_here" not in stacks[f"stack-{job}_0_0.txt"]
    assert "the watchdog ended the step" in first["detail"] and "retry 1 of 1" in first["detail"]

    base_result = json.loads((base_dir / "result.json").read_text())
    hung_result = json.loads((hung_dir / "result.json").read_text())
    assert hung_result["final_step"] == base_result["final_step"] == steps
    assert hung_result["resumed_from"] == resumed
    assert hung_result["param_sha256"] == base_result["param_sha256"]

    shown = json.loads(status_of(hung_dir, isolated_env, "--json"))
    assert shown["starts"][0]["hang"]["stacks"] == hang["stacks"]
    assert shown["starts"][0]["watchdog"]["bound_s"] == watch["bound_s"]
    assert "    watchdog: hang after " in status_of(hung_dir, isolated_env)
    print(f"detection latency {latency:.1f} s (bound {hang['bound_s']:g} s); hung run {seconds:.0f} s")


# A script that knows nothing of glaunch: prints now and then, never a heartbeat.
PLAIN_SCRIPT = '''
import sys, time
for second in range(int(sys.argv[1])):
    print(f"still here after {second} s", flush=True)
    time.sleep(1)
'''

# A script that uses glaunch's runtime and hangs before its first step on the first start
# only; the retry steps and ends.
STUCK_SCRIPT = '''
import os, time
from launcher import runtime as rt

rt.install_stop_handler()
if os.environ["GLAUNCH_RESTART"] == "0":
    time.sleep(10**6)
for step in range(1, 4):
    rt.should_stop(step=step, total=3)
'''

UNWATCHED_S = 20
FIRST_STEP_S = 5


def submit_script(tmp_path: Path, name: str, script: str, args: list[str], env, *overrides):
    (tmp_path / f"{name}.py").write_text(script)
    (tmp_path / f"{name}.yaml").write_text(
        f"name: {name}\nentrypoint: {{script: {name}.py, args: {json.dumps(args)}}}\nlauncher: srun\n"
        'resources: {nodes: 1, time: "00:05:00"}\n'
        f"watchdog: {{first_step_s: {FIRST_STEP_S}}}\n")
    (tmp_path / "site.yaml").write_text(SITE)
    runs = tmp_path / f"runs-{name}"
    began = time.time()
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", str(tmp_path / f"{name}.yaml"),
                           "--site", str(tmp_path / "site.yaml"), "--runs-dir", str(runs), *overrides],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    (run_dir,) = runs.iterdir()
    return run_dir, proc, time.time() - began


@pytest.mark.parametrize("stall", ["auto", "0"])
def test_a_script_without_the_runtime_outlives_the_first_step_bound_and_completes(tmp_path, isolated_env, stall):
    run_dir, proc, seconds = submit_script(tmp_path, "plain", PLAIN_SCRIPT, [str(UNWATCHED_S)], isolated_env,
                                           f"watchdog.stall_s={stall}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((run_dir / "run.json").read_text())
    (start,) = record["starts"]
    assert record["state"] == "COMPLETED" and start["state"] == "COMPLETED", start
    assert "hang" not in start and not (run_dir / "hang.json").exists()
    assert seconds > UNWATCHED_S > 3 * FIRST_STEP_S
    text, shown = status_of(run_dir, isolated_env), json.loads(status_of(run_dir, isolated_env, "--json"))
    watch = shown["starts"][0]["watchdog"]
    if stall == "0":
        assert watch["state"] == "off" and "bound_s" not in watch, watch
        assert "    watchdog: off: watchdog.stall_s is 0" in text, text
    else:
        assert watch["state"] == "not watched" and "bound_s" not in watch, watch
        assert "    watchdog: not watched: no rank uses glaunch's runtime" in text, text
    assert "hang after" not in text
    print(f"stall_s {stall}: a {UNWATCHED_S} s script without the runtime, first_step_s {FIRST_STEP_S}: "
          f"COMPLETED in {seconds:.1f} s")


def test_a_runtime_script_that_hangs_before_its_first_step_is_still_caught(tmp_path, isolated_env):
    run_dir, proc, seconds = submit_script(tmp_path, "stuck", STUCK_SCRIPT, [], isolated_env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    record = json.loads((run_dir / "run.json").read_text())
    first, last = record["starts"][0], record["starts"][-1]
    assert (first["state"], first["reason"]) == ("REQUEUED", "hang"), first
    assert first["hang"]["kind"] == "first_step" and first["hang"]["bound_s"] == FIRST_STEP_S, first["hang"]
    assert {s["rank"] for s in first["hang"]["silent"]} == {0, 1}
    assert (last["state"], record["state"]) == ("COMPLETED", "COMPLETED"), last
    print(f"a runtime script stuck before its first step: hang found (first_step_s {FIRST_STEP_S}); run "
          f"COMPLETED on the retry in {seconds:.1f} s")


# A script that knows nothing of glaunch but prints its step; its first start hangs after
# step HANG_AT (as a stuck data loader would), and each start says what it was given.
PROGRESS_SCRIPT = '''
import os, sys, time
print("args", sys.argv[1:], flush=True)
for step in range(1, 21):
    if step == HANG_AT + 1 and "--init_from=resume" not in sys.argv:
        time.sleep(10**6)
    print(f"iter {step}: loss {1.0 / step:.3f}", flush=True)
    time.sleep(0.1)
'''
HANG_AT = 8
PROGRESS_STALL_S = 4


def test_a_script_s_own_log_lines_give_its_progress_and_a_hang_is_found_from_them(tmp_path, isolated_env):
    script = PROGRESS_SCRIPT.replace("HANG_AT", str(HANG_AT))
    (tmp_path / "progress.py").write_text(script)
    (tmp_path / "progress.yaml").write_text(
        "name: progress\n"
        "entrypoint:\n  script: progress.py\n  args: ['--out_dir=${run:dir}/out', '--start=${run:restart}']\n"
        "  resume_args: ['--init_from=resume']\n  progress: {pattern: '^iter (\\d+):', total: 20}\n"
        'launcher: srun\nresources: {nodes: 1, time: "00:05:00"}\n'
        f"watchdog: {{stall_s: {PROGRESS_STALL_S}}}\nrequeue: {{max: 1}}\n")
    (tmp_path / "site.yaml").write_text(SITE)
    runs = tmp_path / "runs"
    began = time.time()
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", str(tmp_path / "progress.yaml"),
                           "--site", str(tmp_path / "site.yaml"), "--runs-dir", str(runs)],
                          cwd=REPO, env=isolated_env, capture_output=True, text=True, timeout=600)
    seconds = time.time() - began
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run_dir,) = runs.iterdir()
    record = json.loads((run_dir / "run.json").read_text())
    first, last = record["starts"][0], record["starts"][-1]
    assert (first["reason"], first["hang"]["kind"]) == ("hang", "stall"), first
    assert first["watchdog"]["state"] == "watching", first["watchdog"]
    assert (last["state"], record["state"]) == ("COMPLETED", "COMPLETED"), last
    # Each start's own arguments: the run's directory, its start number, and resume_args after the first.
    logs = sorted((run_dir / "logs").glob("*_0_log.out"))
    said = [next(line for line in p.read_text().splitlines() if line.startswith("args")) for p in logs]
    assert said == [f"args ['--out_dir={run_dir}/out', '--start=0']",
                    f"args ['--out_dir={run_dir}/out', '--start=1', '--init_from=resume']"], said
    # The console and status read the script's step from its log lines.
    assert re.search(r"COMPLETED at step 20 after 2 start\(s\)", proc.stdout), proc.stdout[-3000:]
    text = status_of(run_dir, isolated_env)
    assert re.search(r"start 0: job \d+ REQUEUED reason=hang +last step 8\b", text), text
    assert f"silent: rank 0 on {first['hang']['silent'][0]['node']} at step 8" in text, text
    print(f"a script without the runtime, progress from its log: hang at step {HANG_AT} found "
          f"(stall_s {PROGRESS_STALL_S}); run COMPLETED on the retry, resume_args given, in {seconds:.1f} s")

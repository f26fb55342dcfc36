"""Failure -> the next step done, by each road a failure can take, in one run on a local
Slurm cluster: a peer recovery in the same processes (recovery.peer), a new job step on
the same nodes, a spare in place of the failed node, and a requeue through Slurm's queue.

    python bench/failure_road.py [--cluster main|defaults] [--runs 2] [--keep] [--tiny]

Each sample is one run of examples/torch_ddp.py with ``recovery.peer: true`` (1 training
node + 1 spare, 2 ranks, a step every 0.25 s, a checkpoint every 10 steps, crash_retries
3, a fixed stall bound of 15 s: 5 s took a loaded machine's pause for a hang) that fails
once in each of its first three starts, and once more before that in the first:

0. at step 5 rank 1 raises in its forward pass (rank 0 waits for it in the gradient
   all-reduce): rank 0's state goes to rank 1 and the step is done again, in the same
   start (a peer recovery: no restart, no checkpoint read);
1. at step 15 rank 1 hangs, stopped whole (SIGSTOP: no thread of it runs, so it cannot end
   itself for its peers as a rank hung in its own code does, launcher.runtime.peerhold, which
   would make this a second peer recovery): every rank of the job is on one node, so the
   hang points at no single node; the watchdog ends the step and the job starts a new step
   in its allocation on the same node;
2. at step 25 every rank's process exits (status 3: no peer is left to recover them): the
   failure points at their node, which the next step leaves out; the spare takes its place
   (a spare swap);
3. at step 35 they exit again: the allocation has no node left to spare, so the job
   requeues (Slurm holds a requeued job until its launch credential expires, about
   120 s, then it queues again); the fourth start trains to the end.

A failure's time is when it became known: the watchdog's ``detected_at`` for the hang,
the moment the rank raised or exited otherwise (the wrapper writes it just before). The
next step's time: for a restart, the next start's ``first_step_at`` in run.json (written
at its first step, after the checkpoint is loaded); for the peer recovery, the end of
the step after it as the run's ledger records it (``peer-recoveries.jsonl``:
``next_step_at``, read through ``glaunch status --json``). Figures: the median per road
over --runs samples, and each road as a ratio of the requeue's in the same samples.
--tiny: one sample (about 4 minutes, most of it the requeue's hold); the figures are
printed, no target is enforced: the hold is Slurm's, and a shared machine adds its own
waits. Every job the bench submitted is cancelled on exit.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import statistics
import sys
import tempfile
import textwrap
import time
from datetime import datetime
from pathlib import Path

from benchkit import BenchError, cluster_env, read_record, run_cmd, squeue_has, submit_json

REPO = Path(__file__).resolve().parent.parent
SITES = {"main": "local-slurm", "defaults": "local-slurm-defaults"}
ROADS = ("peer", "same nodes", "spare swap", "requeue")
RESTART_ROADS = ROADS[1:]           # the roads that end a start, one per start
EXPECTED = (("RESTARTED", False), ("RESTARTED", True), ("REQUEUED", False))
FAULT_STEPS = (15, 25, 35)
PEER_STEP = 5
STEPS, EVERY, SECONDS_PER_STEP, STALL_S = 45, 10, 0.25, 15
LIMIT_S = 900

# torch_ddp, except that in its first start rank 1 raises in a step (once) and later hangs,
# and in the next two every rank's process exits.
WRAPPER = textwrap.dedent("""\
    import json, os, runpy, signal, sys, time
    import torch
    from launcher import runtime as rt

    FAULTS = {fault_steps!r}
    PEER_STEP = {peer_step!r}
    RESTART = rt.context().restart
    should_stop = rt.should_stop
    seen = {{"step": 0, "raised": False}}

    def note(road):
        with open({faults!r}, "a") as f:
            f.write(json.dumps({{"road": road, "restart": RESTART, "at": time.time()}}) + "\\n")

    def failing_forward(module, args):
        if (RESTART == 0 and os.environ.get("RANK") == "1" and seen["step"] + 1 == PEER_STEP
                and not seen["raised"]):
            seen["raised"] = True
            note("peer")
            raise ValueError("injected failure in the forward pass")

    def failing_should_stop(step=None, total=None):
        seen["step"] = step
        if RESTART < len(FAULTS) and step == FAULTS[RESTART]:
            if RESTART == 0 and os.environ.get("RANK") == "1":
                os.kill(os.getpid(), signal.SIGSTOP)
            if RESTART > 0:
                if os.environ.get("RANK") == "0":
                    note("crash")
                sys.exit(3)        # every rank's process ends: no peer is left to recover it
        return should_stop(step=step, total=total)

    torch.nn.modules.module.register_module_forward_pre_hook(failing_forward)
    rt.should_stop = failing_should_stop
    sys.argv[0] = {script!r}
    runpy.run_path({script!r}, run_name="__main__")
""")


def prepare(cluster: str, folder: Path) -> tuple[Path, Path, Path]:
    """The wrapper, the experiment and the site (crash_retries 3) in `folder`."""
    folder.mkdir(parents=True)
    faults = folder / "faults.jsonl"
    script = str(REPO / "examples" / "torch_ddp.py")
    (folder / "failing.py").write_text(WRAPPER.format(fault_steps=FAULT_STEPS, peer_step=PEER_STEP, faults=str(faults),
                                                      script=script))
    args = ["--steps", str(STEPS), "--seconds-per-step", str(SECONDS_PER_STEP), "--log-every", "1"]
    experiment = folder / "failures.yaml"
    experiment.write_text(f"name: failures\nentrypoint: {{script: failing.py, args: {json.dumps(args)}}}\n"
                          f"resources: {{nodes: 1, spare_nodes: 1, time: '15'}}\n"
                          f"checkpoint: {{every_steps: {EVERY}, keep: 2}}\nrequeue: {{max: 3}}\n"
                          f"watchdog: {{stall_s: {STALL_S}}}\nrecovery: {{peer: true}}\n")
    site = folder / "site.yaml"
    site.write_text(f"extends: {SITES[cluster]}\ncrash_retries: 3\n")
    return experiment, site, faults


def seconds_between(earlier: float, stamp: str | None) -> float | None:
    return None if not stamp else datetime.fromisoformat(stamp).timestamp() - earlier


def sample(cluster: str, folder: Path, jobs: list[str]) -> dict[str, float]:
    """One run through the three roads: failure -> first resumed step (s) per road."""
    experiment, site, faults = prepare(cluster, folder)
    env = cluster_env(cluster, folder / "state")
    run_dir, job_id = submit_json([str(experiment), "--site", str(site), "--runs-dir", str(folder / "runs")],
                                  env, folder, cluster)
    jobs.append(job_id)
    deadline = time.time() + LIMIT_S
    while (record := read_record(run_dir)).get("state") not in ("COMPLETED", "FAILED", "CANCELLED"):
        if time.time() > deadline:
            raise BenchError(f"{cluster}: the run did not end within {LIMIT_S} s ({run_dir})")
        jobs.extend(s["job_id"] for s in record.get("starts", []) if s.get("job_id") not in jobs)
        time.sleep(1)
    return road_seconds(record, faults, run_dir, peer_recoveries(run_dir, env))


def peer_recoveries(run_dir: Path, env: dict[str, str]) -> dict:
    """The run's peer road as `glaunch status --json` counts it (its goodput's ``peer_recoveries``)."""
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "status", str(run_dir), "--json"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise BenchError(f"glaunch status {run_dir}: {proc.stderr.strip()[-500:]}")
    return (json.loads(proc.stdout).get("goodput") or {}).get("peer_recoveries") or {}


def road_seconds(record: dict, faults: Path, run_dir: Path, peer: dict) -> dict[str, float]:
    """Check that each start ended as its road says and the peer recovery stayed in the
    first, and time each failure to the next step done."""
    starts = record.get("starts", [])
    ends = [(s.get("state"), bool(s.get("left_out"))) for s in starts[:len(EXPECTED)]]
    if record.get("state") != "COMPLETED" or ends != list(EXPECTED) or len(starts) != len(EXPECTED) + 1:
        raise BenchError(f"the run took other roads than expected: {record.get('state')}, starts "
                         f"{[(s.get('state'), s.get('reason'), s.get('left_out')) for s in starts]} ({run_dir})")
    noted = [json.loads(line) for line in faults.read_text().splitlines()]
    failed = {int(f["restart"]): float(f["at"]) for f in noted if f["road"] == "crash"}
    detected = (starts[0].get("hang") or {}).get("detected_at")
    if not detected:
        raise BenchError(f"start 0 recorded no hang detection ({run_dir})")
    failed[int(starts[0]["restart"])] = datetime.fromisoformat(detected).timestamp()
    seconds = {"peer": peer_seconds(peer, [float(f["at"]) for f in noted if f["road"] == "peer"], starts[0], run_dir)}
    for road, start, following in zip(RESTART_ROADS, starts, starts[1:]):
        value = seconds_between(failed[int(start["restart"])], following.get("first_step_at"))
        if value is None:
            raise BenchError(f"{road}: start {following.get('restart')} has no first step ({run_dir})")
        seconds[road] = value
    return seconds


def peer_seconds(peer: dict, raised: list[float], first: dict, run_dir: Path) -> float:
    """The one peer recovery, in the first start, at most its step in flight lost: the
    failure -> the end of the step after it (the ledger's ``next_step_at``)."""
    entries = peer.get("entries") or []
    if len(raised) != 1 or peer.get("recoveries") != 1 or len(entries) != 1:
        raise BenchError(f"expected one peer recovery, got {peer.get('recoveries')} ({len(raised)} raised; {run_dir})")
    (entry,) = entries
    if (entry.get("restart"), entry.get("job_id"), entry.get("step")) != (first.get("restart"), first.get("job_id"),
                                                                        PEER_STEP) or entry.get("lost_steps", 2) > 1:
        raise BenchError(f"the peer recovery is not the one injected at step {PEER_STEP} of start 0: {entry} "
                         f"({run_dir})")
    value = seconds_between(raised[0], entry.get("next_step_at"))
    if value is None:
        raise BenchError(f"the peer recovery has no next step recorded ({run_dir})")
    return value


def report(samples: list[dict[str, float]]) -> None:
    med = {road: statistics.median(s[road] for s in samples) for road in ROADS}
    print(f"\nFailure -> the next step done, one run through each road (median of {len(samples)}, s)")
    print(f"{'road':12s} {'seconds':>8s} {'/ requeue':>10s}")
    for road in ROADS:
        print(f"{road:12s} {med[road]:8.3f} {med[road] / med['requeue']:10.5f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cluster", default="main", choices=sorted(SITES))
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument("--tiny", action="store_true", help="one sample")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="glaunch-failure-road-"))
    jobs: list[str] = []
    samples = []
    failed = None
    try:
        for index in range(1 if args.tiny else args.runs):
            result = sample(args.cluster, tmp / f"sample{index}", jobs)
            print("  ".join(f"{road} {result[road]:.3f} s" for road in ROADS), flush=True)
            samples.append(result)
    except BenchError as exc:
        failed = str(exc)
    finally:
        env = cluster_env(args.cluster, tmp)
        live = [j for j in dict.fromkeys(jobs) if squeue_has(j, env)]
        if live:
            run_cmd(["scancel", *live], env=env)
        if not args.keep and failed is None:
            shutil.rmtree(tmp, ignore_errors=True)
    if failed is not None:
        print(f"{failed}\n(scratch kept: {tmp})", file=sys.stderr)
        return 1
    report(samples)
    return 0


if __name__ == "__main__":
    sys.exit(main())

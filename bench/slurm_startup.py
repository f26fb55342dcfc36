"""Startup latency on Slurm: sbatch acceptance -> first training step, glaunch against a
hand-written sbatch + srun script launching the same training, interleaved, same run.

    python bench/slurm_startup.py [--runs 3] [--warmup 1] [--site local-slurm] [--keep] [--tiny]

Both sides run examples/torch_ddp.py --steps N (--steps, 40) --log-every 1 on --nodes nodes
(2) x 2 tasks (gloo), with OMP_NUM_THREADS=1 and GLOO_SOCKET_IFNAME=lo.

Definitions, the same for both sides:
- acceptance: the moment the `sbatch` process that queued the job exited with its job id.
  A wrapper named `sbatch`, first on PATH, records it (submitit runs `sbatch` by name
  inside `glaunch submit`); it also times glaunch's `sbatch --test-only` preflight, which
  happens before acceptance and is reported on its own.
- first step: the moment rank 0's "step 1/" line appears in its log file (glaunch: the
  rank-0 file srun writes; hand: the batch output srun forwards to), polled every 50 ms.
- queue = sacct Start - Submit; in-job = first step - sacct Start. Slurm keeps these in
  whole seconds (Start is truncated), so the split is good to about 1 s; the total is not.

The scheduler's wait on an idle cluster varies from run to run whatever the script (on
local-slurm about 0.3 s or 2 s, the same for plain `sbatch --wrap` jobs), so with few runs
the total's ratio moves by that much; the in-job ratio, which leaves it out, is printed too.

Before every submission the bench waits until `squeue -h` is empty and every node is idle,
so other users' jobs do not add queue time. Every job it submitted is cancelled on exit.

--tiny (CI: one job each side, tens of seconds, nearly all of it the ranks starting):
--runs 1 --warmup 0 --nodes 1 --steps 3, no more than 120 s of waiting for an empty queue
(one node: two ranks start in half the time four take on a small machine).
Both jobs run and every figure and ratio is printed; the 1.2x target is not checked: one
run each, unwarmed, is as likely to show the scheduler's 0.3 s or 2 s wait as glaunch.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchkit import epoch, glaunch_command, sacct_rows, squeue_has, wait_queue_empty

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "examples" / "torch_ddp.py"
EXPERIMENT = REPO / "examples" / "torch_ddp.yaml"
STEPS = 40
TINY_STEPS = 3
NODES, TASKS_PER_NODE, CPUS_PER_TASK, GPUS_PER_NODE = 2, 2, 2, 2
POLL_S = 0.05
FIRST_STEP = re.compile(r"^step 1/")

# Records start, end, exit status and arguments of every sbatch call, then passes the
# output through untouched.
SHIM = """#!/bin/sh
t0=$(date +%s.%N)
{real} "$@"
rc=$?
printf '%s %s %s %s\\n' "$t0" "$(date +%s.%N)" "$rc" "$*" >> {log}
exit $rc
"""

# What a user would write by hand for the same allocation and training.
HAND = """#!/bin/bash
#SBATCH --job-name=hand-ddp
#SBATCH --partition={partition}
#SBATCH --account={account}
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node={tasks}
#SBATCH --gpus-per-node={gpus}
#SBATCH --cpus-per-task={cpus}
#SBATCH --time=00:20:00
#SBATCH --chdir={workdir}
#SBATCH --output={workdir}/%j.out

export OMP_NUM_THREADS=1
export GLOO_SOCKET_IFNAME=lo
# The batch script runs on the allocation's first node: rank 0 lives there.
export MASTER_ADDR=$(hostname)
export MASTER_PORT=$((10000 + SLURM_JOB_ID % 20000))
export WORLD_SIZE=$SLURM_NTASKS
srun bash -c 'export RANK=$SLURM_PROCID LOCAL_RANK=$SLURM_LOCALID; exec {python} {script} {args}'
"""


class Bench:
    def __init__(self, tmp: Path, site: str, partition: str, account: str, steps: int = STEPS,
                 nodes: int = NODES) -> None:
        self.tmp = tmp
        self.nodes = nodes
        self.train_args = ["--steps", str(steps), "--log-every", "1"]
        self.site = site
        self.partition = partition
        self.account = account
        self.jobs: list[str] = []
        shim_dir = tmp / "bin"
        shim_dir.mkdir()
        self.sbatch_log = tmp / "sbatch.log"
        real = shutil.which("sbatch")
        if real is None:
            sys.exit("sbatch is not on PATH: this bench needs a Slurm cluster")
        shim = shim_dir / "sbatch"
        shim.write_text(SHIM.format(real=real, log=self.sbatch_log))
        shim.chmod(0o755)
        self.env = dict(os.environ, PATH=f"{shim_dir}:{os.environ['PATH']}",
                        GLAUNCH_STATE_DIR=str(tmp / "state"))

    def sbatch_calls(self) -> list[tuple[float, float, int, str]]:
        if not self.sbatch_log.exists():
            return []
        calls = []
        for line in self.sbatch_log.read_text().splitlines():
            t0, t1, rc, args = (line.split(" ", 3) + [""])[:4]
            calls.append((float(t0), float(t1), int(rc), args))
        return calls

    def submit(self, kind: str, index: int) -> dict:
        before = len(self.sbatch_calls())
        t0 = time.time()
        if kind == "hand":
            workdir = self.tmp / f"hand-{index}"
            workdir.mkdir()
            job_file = workdir / "job.sbatch"
            job_file.write_text(HAND.format(
                partition=self.partition, account=self.account, nodes=self.nodes, tasks=TASKS_PER_NODE,
                gpus=GPUS_PER_NODE, cpus=CPUS_PER_TASK, workdir=workdir, python=sys.executable,
                script=SCRIPT, args=" ".join(self.train_args)))
            proc = subprocess.run(["sbatch", "--parsable", str(job_file)], env=self.env, cwd=workdir,
                                  capture_output=True, text=True)
        else:
            args = json.dumps(self.train_args)
            proc = subprocess.run(
                [*glaunch_command(), "submit", str(EXPERIMENT), "--site", self.site, "--json",
                 "--runs-dir", str(self.tmp / "runs"), f"resources.nodes={self.nodes}", f"entrypoint.args={args}"],
                env=self.env, cwd=REPO, capture_output=True, text=True)
        t1 = time.time()
        if proc.returncode != 0:
            raise RuntimeError(f"{kind} submission failed ({proc.returncode}): {proc.stderr.strip()}")
        calls = self.sbatch_calls()[before:]
        queued = [c for c in calls if "--test-only" not in c[3]]
        preflight = [c for c in calls if "--test-only" in c[3]]
        if len(queued) != 1:
            raise RuntimeError(f"{kind}: expected one queuing sbatch call, saw {calls}")
        if kind == "hand":
            job_id = proc.stdout.strip().split(";")[0]
            log = workdir / f"{job_id}.out"
        else:
            info = json.loads(proc.stdout)
            job_id = str(info["job_id"])
            log = Path(info["run_dir"]) / "logs" / f"{job_id}_0_log.out"
        self.jobs.append(job_id)
        return dict(kind=kind, job_id=job_id, log=log, command_s=t1 - t0, accepted=queued[0][1],
                    preflight_s=sum(c[1] - c[0] for c in preflight) if preflight else None)

    def cancel_all(self) -> None:
        live = [j for j in self.jobs if squeue_has(j)]
        if live:
            subprocess.run(["scancel", *live], capture_output=True)






def wait_first_step(log: Path, job_id: str, limit_s: float) -> float:
    """Arrival time of rank 0's first step line (the file polled every POLL_S)."""
    deadline = time.time() + limit_s
    offset, pending, last_check = 0, "", 0.0
    while time.time() < deadline:
        if log.exists():
            with open(log, "rb") as f:
                f.seek(offset)
                data = f.read()
            seen = time.time()
            offset += len(data)
            *lines, pending = (pending + data.decode(errors="replace")).split("\n")
            if any(FIRST_STEP.match(line) for line in lines):
                return seen
        if time.time() - last_check > 2:
            last_check = time.time()
            if not squeue_has(job_id):
                raise RuntimeError(f"job {job_id} left the queue before its first step; see {log}")
        time.sleep(POLL_S)
    raise RuntimeError(f"no first step from job {job_id} within {limit_s:.0f} s; see {log}")


def sacct_times(job_id: str, limit_s: float = 30) -> tuple[float, float]:
    """(Submit, Start) of the job's allocation as epoch seconds."""
    deadline = time.time() + limit_s
    while True:
        rows = sacct_rows(job_id, ("Submit", "Start"))
        if rows and "Unknown" not in rows[0]["raw"]:
            return epoch(rows[0]["submit"]), epoch(rows[0]["start"])
        if time.time() > deadline:
            raise RuntimeError(f"sacct has no Submit/Start for job {job_id}")
        time.sleep(0.5)



def measure(bench: Bench, kind: str, index: int, queue_wait_s: float) -> dict:
    wait_queue_empty(queue_wait_s)
    run = bench.submit(kind, index)
    first = wait_first_step(run["log"], run["job_id"], 300)
    submitted, started = sacct_times(run["job_id"])
    while squeue_has(run["job_id"]):  # let it finish: the next run needs the nodes
        time.sleep(0.5)
    run.update(first_step=first, total_s=first - run["accepted"], queue_s=started - submitted,
               in_job_s=first - started)
    return run


def med(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="timed runs of each side")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs of each side first (page cache)")
    parser.add_argument("--site", default="local-slurm")
    parser.add_argument("--partition", default="debug")
    parser.add_argument("--account", default="glaunch")
    parser.add_argument("--queue-wait", type=float, default=600, help="seconds to wait for an empty queue")
    parser.add_argument("--steps", type=int, default=STEPS, help="training steps of each job")
    parser.add_argument("--nodes", type=int, default=NODES, help="nodes of each job")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory (run dirs, logs)")
    parser.add_argument("--tiny", action="store_true", help="one short job each side: checks the bench works")
    args = parser.parse_args()
    if args.tiny:
        args.runs, args.warmup, args.steps, args.nodes = 1, 0, TINY_STEPS, 1
        args.queue_wait = min(args.queue_wait, 120)

    tmp = Path(tempfile.mkdtemp(prefix="glaunch-bench-startup-"))
    bench = Bench(tmp, args.site, args.partition, args.account, args.steps, args.nodes)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results: dict[str, list[dict]] = {"hand": [], "glaunch": []}
    try:
        index = 0
        for _ in range(args.warmup):
            for kind in ("hand", "glaunch"):
                measure(bench, kind, index, args.queue_wait)
                index += 1
        for i in range(args.runs):
            for kind in (("hand", "glaunch") if i % 2 == 0 else ("glaunch", "hand")):
                run = measure(bench, kind, index, args.queue_wait)
                index += 1
                results[kind].append(run)
                print(f"  run {i + 1} {kind:7s} job {run['job_id']:>5s}: accept->step1 {run['total_s']:6.2f} s "
                      f"(queue {run['queue_s']:.0f} s, in-job {run['in_job_s']:5.2f} s)", flush=True)
    except RuntimeError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        args.keep = True
        return 1
    finally:
        bench.cancel_all()
        if args.keep:
            print(f"scratch kept: {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    hand, gl = results["hand"], results["glaunch"]
    ratio = med(gl, "total_s") / med(hand, "total_s")
    print(f"\nsbatch accepted -> rank 0 prints 'step 1/' (log polled every {POLL_S * 1000:.0f} ms); "
          f"{args.runs} interleaved runs each, medians; {args.nodes} node(s) x {TASKS_PER_NODE} tasks, "
          f"site {args.site}")
    print(f"{'':22s} {'accept->step1':>13s} {'queue':>8s} {'in-job':>8s} {'submit cmd':>11s}")
    for name, runs in (("hand sbatch + srun", hand), ("glaunch submit", gl)):
        print(f"{name:22s} {med(runs, 'total_s'):11.2f} s {med(runs, 'queue_s'):6.0f} s "
              f"{med(runs, 'in_job_s'):6.2f} s {med(runs, 'command_s'):9.2f} s")
    print("queue = sacct Start - Submit, in-job = step 1 - sacct Start (both ~1 s resolution); "
          "submit cmd = wall time of the submitting command")
    preflight = [r["preflight_s"] for r in gl if r["preflight_s"] is not None]
    if preflight:
        print(f"glaunch preflight (sbatch --test-only, before acceptance, not in the figures above): "
              f"median {statistics.median(preflight):.3f} s")
    verdict = "not checked, --tiny" if args.tiny else "met" if ratio <= 1.2 else "NOT met"
    print(f"ratio glaunch / hand, accept->step1: {ratio:.2f}x (target <= 1.2x: {verdict})")
    print(f"ratio glaunch / hand, in-job only (no scheduler wait): "
          f"{med(gl, 'in_job_s') / med(hand, 'in_job_s'):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Time-limit restarts: requeue against resubmission, from the end of one start to the
first training step of the next, on each local Slurm cluster.

    python bench/restart_road.py [--clusters main,defaults] [--runs 2] [--keep] [--tiny]

Each sample is one run of examples/torch_ddp.py (1 node x 2 ranks, a step line every
0.25 s) with a 1-minute time limit warned 10 s ahead (`resources.time=1`,
`requeue.signal_lead_s=10`) and `requeue.mode` set to the road measured:

- requeue: the job requeues itself (`scontrol requeue`); Slurm holds a requeued job until
  its launch credential expires (about 120 s), and the bench leaves that hold alone: it is
  what the road costs.
- resubmit: the ending job submits its own script again with
  `--dependency=afterany:<its id>`; the new job starts once the old one has ended.

The end of a start is when run.json first shows it ended (written by the job's end,
launcher.jobcontrol.jobend; polled every 50 ms); the next start's first step is when rank
0's first step line appears in any of the run's logs (logs/JOB_0_log.out: a resubmitted
start has a new job id, so a new file). Once the second start has stepped the bench
cancels the run with `glaunch cancel` and checks that no job of the run is left (cancel
follows the run's current job). Figures: the median of --runs samples per road and
cluster, and resubmit / requeue as a ratio per cluster. The two clusters differ where it
matters here: main sets KillWait=10 and MinJobAge=600, defaults keeps Slurm's (30, 300).

Every job the bench submitted is cancelled on exit. --tiny: one sample per road and
cluster (about 5 minutes, the clusters side by side); the figures are printed, no target
is enforced: the requeue hold is Slurm's, and a shared machine adds its own waits.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchkit import BenchError, cluster_env, read_record, run_cmd, squeue_has, submit_json

REPO = Path(__file__).resolve().parent.parent
EXPERIMENT = REPO / "examples" / "torch_ddp.yaml"
SITES = {"main": "local-slurm", "defaults": "local-slurm-defaults"}
ROADS = ("requeue", "resubmit")
STEP = re.compile(r"^step \d+/\d+")
POLL_S = 0.05
LIMIT_S = 600
GLAUNCH = [sys.executable, "-m", "launcher.cli"]


def step_lines_after(run_dir: Path, offsets: dict[Path, int]) -> bool:
    """A step line appended to any of rank 0's logs since `offsets` (updated)."""
    found = False
    for log in sorted((run_dir / "logs").glob("*_0_log.out")):
        with open(log, "rb") as f:
            f.seek(offsets.get(log, 0))
            data = f.read()
        offsets[log] = offsets.get(log, 0) + len(data)
        found = found or any(STEP.match(line) for line in data.decode(errors="replace").splitlines())
    return found


def sample(cluster: str, road: str, tmp: Path, jobs: list[str]) -> dict:
    """One run on `cluster` restarted at its time limit by `road`: end -> first step (s)."""
    env = cluster_env(cluster, tmp / "state")
    args = ["--steps", "400", "--seconds-per-step", "0.25", "--log-every", "1"]
    run_dir, job_id = submit_json([str(EXPERIMENT), "--site", SITES[cluster], "--runs-dir", str(tmp / "runs"),
                                   "resources.nodes=1", "resources.time=1", "requeue.signal_lead_s=10",
                                   "requeue.max=1", f"requeue.mode={road}", "checkpoint.every_steps=1000",
                                   f"entrypoint.args={json.dumps(args)}"], env, REPO, cluster)
    jobs.append(job_id)
    deadline = time.time() + LIMIT_S
    offsets: dict[Path, int] = {}
    ended = None
    while True:
        if time.time() > deadline:
            raise BenchError(f"{cluster} {road}: no second start within {LIMIT_S} s ({run_dir})")
        starts = read_record(run_dir).get("starts", [])
        jobs.extend(s["job_id"] for s in starts if s.get("job_id") and s["job_id"] not in jobs)
        if ended is None:
            step_lines_after(run_dir, offsets)       # skip the first start's lines
            if starts and starts[0].get("ended"):
                ended = time.time()
                if starts[0].get("state") != "REQUEUED" or starts[0].get("reason") != "timeout":
                    raise BenchError(f"{cluster} {road}: the first start ended {starts[0].get('state')} "
                                     f"({starts[0].get('reason')}, {starts[0].get('detail')}): {run_dir}")
        elif step_lines_after(run_dir, offsets):
            first_step = time.time()
            break
        time.sleep(POLL_S)
    record = read_record(run_dir)
    cancel = run_cmd([*GLAUNCH, "cancel", str(run_dir)], env=env)
    ids = sorted({s["job_id"] for s in record.get("starts", [])})
    wait_until = time.time() + 60
    while any(squeue_has(j, env) for j in ids):
        if time.time() > wait_until:
            raise BenchError(f"{cluster} {road}: jobs {ids} still queued 60 s after glaunch cancel "
                             f"({cancel.stdout.strip()} {cancel.stderr.strip()})")
        time.sleep(1)
    return dict(cluster=cluster, road=road, seconds=first_step - ended, jobs=ids)


def measure(cluster: str, runs: int, tmp: Path, jobs: list[str], results: list[dict], errors: list[str]) -> None:
    try:
        for _ in range(runs):
            for road in ROADS:
                result = sample(cluster, road, tmp / cluster, jobs)
                print(f"{cluster:9s} {road:9s} end -> first step {result['seconds']:6.1f} s  jobs {result['jobs']}",
                      flush=True)
                results.append(result)
    except BenchError as exc:
        errors.append(str(exc))


def report(results: list[dict], clusters: list[str]) -> None:
    print("\nTime-limit restart, end of a start -> first step of the next (median, s)")
    print(f"{'cluster':9s} {'requeue':>8s} {'resubmit':>9s} {'resubmit/requeue':>17s}")
    for cluster in clusters:
        med = {road: statistics.median([r["seconds"] for r in results if r["cluster"] == cluster
                                        and r["road"] == road] or [float("nan")]) for road in ROADS}
        print(f"{cluster:9s} {med['requeue']:8.1f} {med['resubmit']:9.1f} {med['resubmit'] / med['requeue']:17.3f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clusters", default="main,defaults")
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument("--tiny", action="store_true", help="one sample per road and cluster")
    args = parser.parse_args()
    clusters = [c for c in args.clusters.split(",") if c]
    unknown = [c for c in clusters if c not in SITES]
    if unknown:
        parser.error(f"unknown cluster(s) {unknown}: {', '.join(SITES)}")
    runs = 1 if args.tiny else args.runs
    tmp = Path(tempfile.mkdtemp(prefix="glaunch-restart-road-"))
    jobs: dict[str, list[str]] = {c: [] for c in clusters}
    results: list[dict] = []
    errors: list[str] = []
    threads = [threading.Thread(target=measure, args=(c, runs, tmp, jobs[c], results, errors)) for c in clusters]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        for cluster, ids in jobs.items():
            env = cluster_env(cluster, tmp / cluster / "state")
            live = [j for j in ids if squeue_has(j, env)]
            if live:
                run_cmd(["scancel", *live], env=env)
        if not args.keep and not errors:
            shutil.rmtree(tmp, ignore_errors=True)
    if errors:
        print("\n".join(errors) + f"\n(scratch kept: {tmp})", file=sys.stderr)
        return 1
    report(results, clusters)
    return 0


if __name__ == "__main__":
    sys.exit(main())

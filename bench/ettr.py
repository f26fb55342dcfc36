"""Effective training time ratio (ETTR) of a glaunch run preempted over and over on Slurm,
against an uninterrupted run of the same training in the same bench run.

    python bench/ettr.py [--every 45] [--preemptions 3] [--steps 600] [--seconds-per-step 0.2]
                         [--checkpoint-every 50] [--nodes 2] [--from-first-step] [--no-release]
                         [--keep] [--tiny]

Both runs: examples/torch_ddp.py through `glaunch submit` on --site (--nodes nodes x 2
ranks), --log-every 1. In the preempted run, --every seconds after each start of the job
(Slurm RUNNING; with --from-first-step, after the start's first step line), a job on the
high-priority partition takes both nodes of the local cluster (`sbatch -p urgent -N 2
--exclusive --wrap 'sleep 5'`), so Slurm preempts the glaunch job (warning signal, then
requeue). After each requeue the bench releases Slurm's hold on the job (`scontrol update
JobId=N StartTime=now`) unless --no-release; the hold Slurm set is recorded and reported.

Figures:
- ETTR = final step x per-step time / job wall time. Per-step time comes from the
  uninterrupted run (first to last step line); wall time is the first start to the last
  end of the job (sacct, whole seconds), so requeue waits count and the first queue wait
  does not.
- lost steps per interruption: run.json's stopped_at of a start minus the resumed_from of
  the next (0 when the warning leaves time to save), checked against the step lines.
- restart overhead per interruption: stop (urgent job accepted -> rank 0 says it stopped),
  end (stop -> sacct End), queue (sacct End -> next sacct Start), start (sacct Start ->
  first step line) and, inside start, resume: rank 0's joined-gloo -> first step, minus
  the same interval in the uninterrupted run. That difference is noisy (each is ~3 s of
  set-up and first collectives), so the resume load is also timed alone, outside the job, on the
  run's last checkpoint.
- the final param_sha256 in result.json must equal the uninterrupted run's.
- projected ETTR (launcher.resolution.goodput_projection) for the same schedule, from
  glaunch's own figures (`status --json` goodput): the uninterrupted ETTR x (1 - (lost + R)
  / M), R the requeue road's cost (queue wait + start-up + resume load) plus stop and
  teardown, M the wall time per interruption; want within 5 points of the measured ETTR
  (not enforced with --tiny). Then a table of projected ETTR at 1,024 and 16,384 GPUs
  (8 per node, the published failure rate, 4 h allocations) per recovery road, from the
  costs measured here. `--projection-only` prints that table from default costs, no cluster.

Log lines are timed by their arrival in rank 0's log files (polled every 50 ms); Slurm's
times are whole seconds. Before each submission the bench waits for an empty queue and
idle nodes. Every job it submitted is cancelled on exit. If the preempted run stops
making progress or ends in another state than COMPLETED, the bench prints run.json, the
batch log and `sacct -D`, keeps the scratch directory and exits 1.

--tiny (CI: under a minute on a quiet machine, most of it three starts of two ranks): one
node, 80 steps of 0.1 s, a checkpoint every 10 steps, one preemption 1 s after the first
step (--from-first-step: on a loaded machine the ranks' start alone can take longer than
any fixed delay; the 7 s of training left cover the seconds Slurm takes to preempt), the
preempting job holding the nodes 1 s. Every figure and the ETTR ratio are printed, and
the checks are the same as ever (the preempted run completes, the step counts agree, the
final parameters equal the uninterrupted run's); the ETTR itself has no target to miss.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from benchkit import BenchError, epoch, glaunch_command, run_cmd, sacct_rows, wait_queue_empty

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from launcher.resolution import goodput_projection as gp  # noqa: E402
from launcher.runner.goodput import number, projection_costs  # noqa: E402
EXPERIMENT = REPO / "examples" / "torch_ddp.yaml"
NODES = 2
# The urgent job takes every node of local-slurm, so it preempts the run wherever it runs.
URGENT_NODES = 2
POLL_S = 0.05
STATE_POLL_S = 0.5
ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL",
                   "DEADLINE", "PREEMPTED"})
STEP = re.compile(r"^step (\d+)/(\d+)")
RESUMED = re.compile(r"^resumed from .* \(step (\d+)\)")
STOPPED = re.compile(r"^glaunch: stopping at step (\d+)")
TASK_START = re.compile(r"^glaunch: rank 0/")
JOINED = re.compile(r"joined \w+: rank 0/")



class Tail:
    """Complete lines appended to a file, each with the time it was first seen."""

    def __init__(self, path: Path) -> None:
        self.path, self.offset, self.pending = path, 0, ""

    def poll(self) -> list[tuple[float, str]]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                data = f.read()
        except FileNotFoundError:
            return []
        seen = time.time()
        self.offset += len(data)
        *lines, self.pending = (self.pending + data.decode(errors="replace")).split("\n")
        return [(seen, line) for line in lines]



def scontrol_job(job_id: str) -> dict[str, str] | None:
    proc = run_cmd(["scontrol", "-o", "show", "job", job_id])
    if proc.returncode != 0 or not proc.stdout.strip():
        return None
    return dict(re.findall(r"(\w+)=(\S*)", proc.stdout.splitlines()[0]))





def sacct_starts(job_id: str) -> list[dict]:
    """One row per start of the job (sacct -D), oldest first, times as epoch seconds."""
    rows = [dict(state=r["state"], submit=epoch(r["submit"]), eligible=epoch(r["eligible"]), start=epoch(r["start"]),
                 end=epoch(r["end"]), elapsed=r["elapsed"], reason=r["reason"], raw=r["raw"])
            for r in sacct_rows(job_id, ("JobID", "State", "Submit", "Eligible", "Start", "End", "Elapsed", "Reason"),
                                starts=True)]
    return sorted(rows, key=lambda r: r["start"] or float("inf"))



class Bench:
    def __init__(self, args: argparse.Namespace, tmp: Path) -> None:
        self.args, self.tmp = args, tmp
        self.env = dict(os.environ, GLAUNCH_STATE_DIR=str(tmp / "state"))
        self.jobs: list[str] = []
        self.current: dict | None = None   # the run being followed, for diagnostics

    def submit(self) -> dict:
        a = self.args
        train = ["--steps", str(a.steps), "--seconds-per-step", str(a.seconds_per_step), "--log-every", "1"]
        proc = run_cmd([*glaunch_command(), "submit", str(EXPERIMENT), "--site", a.site, "--json",
                        "--runs-dir", str(self.tmp / "runs"), f"resources.nodes={a.nodes}",
                        f"entrypoint.args={json.dumps(train)}", f"checkpoint.every_steps={a.checkpoint_every}",
                        f"requeue.max={a.preemptions + 1}"], env=self.env, cwd=REPO)
        if proc.returncode != 0:
            raise BenchError(f"glaunch submit failed ({proc.returncode}): {proc.stderr.strip()}")
        info = json.loads(proc.stdout)
        self.jobs.append(str(info["job_id"]))
        return info

    def urgent(self) -> tuple[str, float]:
        a = self.args
        proc = run_cmd(["sbatch", "--parsable", "-p", a.urgent_partition, "-A", a.account, "-N", str(URGENT_NODES),
                        "--exclusive", "-t", "1", "-J", "bench-preempt", "-o", "/dev/null",
                        "--wrap", f"sleep {a.urgent_sleep}"])
        accepted = time.time()
        if proc.returncode != 0:
            raise BenchError(f"the preempting sbatch failed: {proc.stderr.strip()}")
        job_id = proc.stdout.strip().split(";")[0]
        self.jobs.append(job_id)
        return job_id, accepted

    def cancel_all(self) -> None:
        live = [j for j in self.jobs if run_cmd(["squeue", "-h", "-j", j, "-o", "%i"]).stdout.strip()]
        if live:
            run_cmd(["scancel", *live])

    def follow(self, info: dict, *, preempt: bool) -> dict:
        """Follow one run to its end; preempt it when asked. Returns what was seen."""
        a = self.args
        job_id, run_dir = str(info["job_id"]), Path(info["run_dir"])
        out = Tail(run_dir / "logs" / f"{job_id}_0_log.out")
        err = Tail(run_dir / "logs" / f"{job_id}_0_log.err")
        lines: list[tuple[float, str, str]] = []
        states: list[tuple[float, str, str, int]] = []
        running_since: dict[int, float] = {}
        stepping_since: dict[int, float] = {}    # restart -> when its first step line was seen
        urgent: list[dict] = []
        holds: list[dict] = []
        self.current = dict(job_id=job_id, run_dir=run_dir, lines=lines, states=states, urgent=urgent,
                            holds=holds)
        deadline = time.time() + a.limit
        last_progress = last_state_poll = time.time()
        ended_since = None
        while True:
            now = time.time()
            for stream, tail in (("out", out), ("err", err)):
                new = tail.poll()
                lines.extend((t, stream, text) for t, text in new)
                if new:
                    last_progress = now
                    if stream == "out" and running_since and any(STEP.match(text) for _, text in new):
                        stepping_since.setdefault(max(running_since), now)
            if now - last_state_poll >= STATE_POLL_S:
                last_state_poll = now
                job = scontrol_job(job_id)
                if job is None:
                    raise BenchError(f"job {job_id} is unknown to scontrol")
                state, reason, restarts = job.get("JobState", "?"), job.get("Reason", "?"), int(job.get("Restarts", 0))
                if not states or states[-1][1:] != (state, reason, restarts):
                    states.append((now, state, reason, restarts))
                    last_progress = now
                if state == "RUNNING":
                    running_since.setdefault(restarts, now)
                    since = stepping_since.get(restarts) if a.from_first_step else running_since[restarts]
                    if (preempt and len(urgent) < a.preemptions and restarts == len(urgent)
                            and since is not None and now - since >= a.every):
                        urgent_id, accepted = self.urgent()
                        urgent.append(dict(job_id=urgent_id, accepted=accepted, restart=restarts))
                if (state == "PENDING" and restarts > 0 and reason == "BeginTime"
                        and not any(h["restart"] == restarts for h in holds)):
                    holds.append(dict(restart=restarts, seen=now, begin_time=epoch(job.get("StartTime")),
                                      released=None))
                    if a.release:
                        run_cmd(["scontrol", "update", f"JobId={job_id}", "StartTime=now"])
                        holds[-1]["released"] = time.time()
                if state in ENDED:
                    ended_since = ended_since or now
                    # PREEMPTED may be a step on the way to a requeue; give it the grace time to become PENDING.
                    if state != "PREEMPTED" or now - ended_since > a.grace:
                        for stream, tail in (("out", out), ("err", err)):
                            lines.extend((t, stream, text) for t, text in tail.poll())
                        break
                else:
                    ended_since = None
            if now > deadline:
                raise BenchError(f"job {job_id} still not finished after {a.limit:.0f} s")
            if now - last_progress > a.stall:
                raise BenchError(f"job {job_id}: no new log line and no state change for {a.stall:.0f} s "
                                 f"(state {states[-1][1]}, reason {states[-1][2]}, restarts {states[-1][3]})")
            time.sleep(POLL_S)
        # Urgent jobs are short; wait for them so their sacct rows are complete.
        while any(run_cmd(["squeue", "-h", "-j", u["job_id"], "-o", "%i"]).stdout.strip() for u in urgent):
            time.sleep(0.5)
        time.sleep(1)
        status = json.loads(run_cmd([*glaunch_command(), "status", str(run_dir), "--json"], env=self.env).stdout)
        for u in urgent:
            rows = sacct_starts(u["job_id"])
            if rows:
                u.update(start=rows[-1]["start"], end=rows[-1]["end"])
        self.current.update(sacct=sacct_starts(job_id), status=status, final_state=states[-1][1] if states else None)
        return self.current


def segments(lines: list[tuple[float, str, str]]) -> list[dict]:
    """Rank 0's log lines cut into starts (each start logs 'glaunch: rank 0/...' on stderr)."""
    segs: list[dict] = []
    for t, stream, text in sorted(lines, key=lambda x: x[0]):
        if stream == "err" and TASK_START.match(text):
            segs.append(dict(task=t, joined=None, resumed=None, resumed_step=None, steps=[], stopped=None,
                             stopped_step=None))
            continue
        if not segs:
            continue
        seg = segs[-1]
        if stream == "err" and seg["joined"] is None and JOINED.search(text):
            seg["joined"] = t
        elif m := STEP.match(text):
            seg["steps"].append((t, int(m[1])))
        elif m := RESUMED.match(text):
            seg["resumed"], seg["resumed_step"] = t, int(m[1])
        elif m := STOPPED.match(text):
            seg["stopped"], seg["stopped_step"] = t, int(m[1])
    return segs


def jobs_between(t0: float, t1: float, ours: set[str]) -> list[str]:
    """Other jobs that started on the cluster in [t0, t1) (they can delay a requeued job)."""
    if t1 <= t0:
        return []
    fmt = "%Y-%m-%dT%H:%M:%S"
    out = run_cmd(["sacct", "-n", "-P", "-X", "-a", "-S", time.strftime(fmt, time.localtime(t0)),
                   "-E", time.strftime(fmt, time.localtime(t1)), "-o", "JobID,Start"]).stdout
    found = []
    for line in out.strip().splitlines():
        job, start = (line.split("|") + [""])[:2]
        when = epoch(start)
        if job not in ours and when is not None and t0 <= when < t1:
            found.append(job)
    return found


def save_timeline(path: Path, runs: dict[str, dict]) -> None:
    keep = ("job_id", "lines", "states", "urgent", "holds", "sacct", "final_state")
    path.write_text(json.dumps({name: {k: run.get(k) for k in keep} for name, run in runs.items()}, indent=1))


# Resume load in isolation: find and verify the newest complete checkpoint, load it into
# the example's model and optimizer as rank 0 of 4 (imports excluded). The in-job figure
# is a difference of two ~3 s intervals, too noisy for a load of milliseconds.
LOAD_PROBE = """
import os, statistics, sys, time
sys.path.insert(0, sys.argv[2])
import torch
from torch_ddp import make_model
from launcher.runtime.checkpoint.selection import latest_complete
from launcher.runtime.torchstate import load_torch_state
times = []
for _ in range(5):
    model = make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    t0 = time.perf_counter()
    ck = latest_complete(sys.argv[1], verify="hash")
    load_torch_state(ck, model, opt)
    times.append(time.perf_counter() - t0)
print(statistics.median(times))
"""


def offline_load_s(checkpoint_dir: Path) -> float | None:
    env = dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="4", LOCAL_WORLD_SIZE="2")
    proc = run_cmd([sys.executable, "-c", LOAD_PROBE, str(checkpoint_dir), str(EXPERIMENT.parent)], env=env)
    try:
        return float(proc.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        print(f"resume load probe failed: {proc.stderr.strip()[-500:]}")
        return None


def fmt(x: float | None, w: int = 6, p: int = 1) -> str:
    return f"{x:{w}.{p}f}" if x is not None else f"{'?':>{w}s}"


def step_time(seg: dict) -> float:
    (t0, s0), (t1, s1) = seg["steps"][0], seg["steps"][-1]
    return (t1 - t0) / (s1 - s0)


def diagnose(run: dict) -> None:
    run_dir = Path(run["run_dir"])
    job_id = run["job_id"]
    print(f"\n--- diagnostics for job {job_id} ({run_dir}) ---")
    print("scheduler states seen (time, state, reason, restarts):")
    t0 = run["states"][0][0] if run["states"] else 0
    for t, state, reason, restarts in run["states"]:
        print(f"  +{t - t0:7.1f} s {state} {reason} restarts={restarts}")
    for u in run["urgent"]:
        print(f"  urgent job {u['job_id']} accepted at +{u['accepted'] - t0:.1f} s")
    print("run.json:")
    print((run_dir / "run.json").read_text() if (run_dir / "run.json").exists() else "  (missing)")
    batch = run_dir / "logs" / f"{job_id}_batch.log"
    print(f"{batch.name}:")
    print(batch.read_text() if batch.exists() else "  (missing)")
    print("sacct -D:")
    print(run_cmd(["sacct", "-D", "-X", "-j", job_id,
                   "-o", "JobID,State,ExitCode,Submit,Eligible,Start,End,Elapsed,Reason"]).stdout)
    print(run_cmd(["scontrol", "show", "job", job_id]).stdout)


def check_run(run: dict, what: str) -> None:
    if run["final_state"] != "COMPLETED" or run["status"].get("state") != "COMPLETED":
        raise BenchError(f"the {what} run ended {run['final_state']} (glaunch status: {run['status'].get('state')})")
    if not run["status"].get("result"):
        raise BenchError(f"the {what} run has no result.json")


def report(args: argparse.Namespace, base: dict, pre: dict) -> int:
    bseg = segments(base["lines"])
    per_step = step_time(bseg[0])
    steps = args.steps
    productive = steps * per_step

    def wall(run: dict) -> float:
        rows = run["sacct"]
        return rows[-1]["end"] - rows[0]["start"]

    ettr_b, ettr_p = productive / wall(base), productive / wall(pre)
    segs = segments(pre["lines"])
    starts = pre["status"]["starts"]
    rows = pre["sacct"]
    n = len(pre["urgent"])
    since = "each start's first step" if args.from_first_step else "each start"
    print(f"\nETTR on site {args.site}: {args.nodes} node(s) x 2 ranks, {steps} steps x {args.seconds_per_step} s "
          f"delay, checkpoint every {args.checkpoint_every} steps; preempted {args.every:.0f} s after {since} "
          f"({n} preemption(s), hold {'released' if args.release else 'NOT released'})")
    print(f"per-step time (uninterrupted run, step lines): {per_step * 1000:.1f} ms; productive time "
          f"{productive:.1f} s")
    print(f"{'':24s} {'wall':>8s} {'ETTR':>6s} {'starts':>6s}")
    print(f"{'uninterrupted':24s} {wall(base):6.0f} s {ettr_b:6.3f} {len(base['sacct']):6d}")
    print(f"{'preempted':24s} {wall(pre):6.0f} s {ettr_p:6.3f} {len(rows):6d}")
    print(f"ETTR preempted / uninterrupted: {ettr_p / ettr_b:.3f}   "
          "(wall = first sacct Start -> last sacct End; productive = final step x per-step time)")

    problems = report_projection(args, pre, ettr_b, ettr_p, wall(pre), n)
    print("\nper interruption (s; lost = stopped_at - next resumed_from from run.json, [log] = from step lines)")
    print(f"{'#':>2s} {'stop@':>6s} {'resume@':>7s} {'lost':>9s} {'stop':>6s} {'end':>6s} {'queue':>6s} "
          f"{'(urgent':>7s} {'hold)':>6s} {'start':>6s} {'(resume)':>8s} {'no-step gap':>11s}")
    lost_all, gaps, queues, holds = [], [], [], []
    b0 = bseg[0]
    fresh = b0["steps"][0][0] - b0["joined"] if b0["joined"] and b0["steps"] else None
    for i in range(len(rows) - 1):
        this = starts[i] if i < len(starts) else {}
        nxt = starts[i + 1] if i + 1 < len(starts) else {}
        seg = segs[i] if i < len(segs) else None
        nseg = segs[i + 1] if i + 1 < len(segs) else None
        stopped_at, resumed = this.get("stopped_at"), nxt.get("resumed_from")
        lost = stopped_at - resumed if stopped_at is not None and resumed is not None else None
        log_lost = (seg["steps"][-1][1] - nseg["resumed_step"]
                    if seg and seg["steps"] and nseg and nseg["resumed_step"] is not None else None)
        lost_all.append(lost if lost is not None else log_lost)
        u = next((u for u in pre["urgent"] if u["restart"] == i), None)
        stop = seg["stopped"] - u["accepted"] if seg and seg["stopped"] and u else None
        end = rows[i]["end"] - seg["stopped"] if seg and seg["stopped"] else None
        queue = rows[i + 1]["start"] - rows[i]["end"]
        queues.append(queue)
        urgent_s = u["end"] - u["start"] if u and u.get("start") and u.get("end") else None
        h = next((h for h in pre["holds"] if h["restart"] == i + 1), None)
        hold = h["begin_time"] - rows[i]["end"] if h and h["begin_time"] else None
        if hold is not None:
            holds.append((hold, queue))
        first = nseg["steps"][0][0] if nseg and nseg["steps"] else None
        start = first - rows[i + 1]["start"] if first else None
        # Resuming happens between joining gloo and the first step; a fresh start does the same
        # minus the resume, so the difference is what resuming costs.
        resume = (nseg["steps"][0][0] - nseg["joined"] - fresh
                  if fresh is not None and nseg and nseg["joined"] and nseg["steps"] else None)
        gap = first - seg["steps"][-1][0] if first and seg and seg["steps"] else None
        if gap is not None:
            gaps.append(gap)
        ours = {pre["job_id"], *(x["job_id"] for x in pre["urgent"])}
        others = jobs_between(rows[i]["end"], rows[i + 1]["start"], ours)
        if others:
            problems.append(f"interruption {i + 1}: other jobs ran while the run was queued: {', '.join(others)}")
        if this.get("reason") != "preemption":
            problems.append(f"start {i}: run.json reason {this.get('reason')!r}, state {this.get('state')!r}")
        if lost is None:
            problems.append(f"start {i}: run.json has stopped_at={stopped_at}, next resumed_from={resumed}")
        elif log_lost is not None and log_lost != lost:
            problems.append(f"start {i}: lost steps {lost} by run.json, {log_lost} by the step lines")
        lost_txt = f"{lost if lost is not None else '?'} [{log_lost if log_lost is not None else '?'}]"
        print(f"{i + 1:2d} {stopped_at!s:>6s} {resumed!s:>7s} {lost_txt:>9s} {fmt(stop)} {fmt(end)} "
              f"{fmt(queue, p=0)} {fmt(urgent_s, 7, 0)} {fmt(hold, 6, 0)} {fmt(start)} {fmt(resume, 8, 2)} "
              f"{fmt(gap, 11)}")
    print("stop: urgent job accepted -> rank 0 'stopping at step'; end: -> sacct End; queue: sacct End -> next "
          "Start (urgent: its run time; hold: the BeginTime Slurm set at requeue - End); start: Start -> first "
          "step line (resume: rank 0 joined gloo -> first step, minus the same in the uninterrupted run"
          + (f", {fresh:.2f} s" if fresh is not None else "")
          + "); no-step gap: last step line -> next first step line")
    if gaps:
        lost_known = [x for x in lost_all if x is not None]
        print(f"median per interruption: queue {statistics.median(queues):.0f} s, no-step gap "
              f"{statistics.median(gaps):.1f} s, lost steps {statistics.median(lost_known) if lost_known else '?'}")
    load = offline_load_s(Path(pre["run_dir"]) / "checkpoints")
    if load is not None:
        print(f"resume load alone (verify + load the run's last checkpoint, rank 0 of 4, warm cache, "
              f"outside the job): {load * 1000:.1f} ms")
    if holds and args.release:
        extra = sum(max(0.0, h - q) for h, q in holds)
        print(f"Slurm's requeue hold: median {statistics.median(h for h, _ in holds):.0f} s after the requeue "
              f"(released by the bench); left in place it would add about {extra:.0f} s -> "
              f"ETTR about {productive / (wall(pre) + extra):.3f}")
    elif holds:
        print(f"Slurm's requeue hold: median {statistics.median(h for h, _ in holds):.0f} s after the requeue "
              "(left in place, --no-release)")
    elif len(rows) > 1:
        print("no requeue hold (Reason=BeginTime) was seen on the requeued job")

    b_hash = base["status"]["result"].get("param_sha256")
    p_hash = pre["status"]["result"].get("param_sha256")
    same = b_hash == p_hash
    print(f"\nfinal param_sha256: uninterrupted {b_hash[:16]}..., preempted {p_hash[:16]}... -> "
          f"{'equal' if same else 'DIFFERENT'}")
    if not same:
        problems.append("param_sha256 differs from the uninterrupted run")
    if len(rows) != n + 1:
        problems.append(f"{n} preemption(s) but sacct shows {len(rows)} start(s)")
    if problems:
        print("problems:\n  " + "\n  ".join(problems))
    return 1 if problems else 0


# --- the projection against what was measured ---------------------------------------------

PROJECTION_WANT_POINTS = 5.0
SCALE_SIZES = ((1024 // 8, 8), (16_384 // 8, 8))
SCALE_ALLOCATION_S = 4 * 3600.0


def projected_ettr(good: dict, ettr_base: float, wall: float, interruptions: int) -> tuple[float, str] | None:
    """The model's ETTR for the run's own failure schedule, from glaunch's own figures
    (`status --json` goodput): ETTR_base x (1 - (lost + R) / M), where R is what one
    interruption cost on the requeue road (queue wait + start-up + resume load) plus the
    stop and teardown a warned stop adds, lost the work lost per interruption (0 when the
    warning left time to save: the model's interval/2 is for failures without warning),
    and M the wall time per interruption. The uninterrupted run's ETTR carries what is no
    failure's (first start-up, save stalls)."""
    costs = projection_costs(good)
    rows = [r for r in good.get("starts") or [] if r.get("reason")]
    stops = [(number(r.get("stop_s")) or 0.0) + (number(r.get("teardown_s")) or 0.0) for r in rows]
    parts = [costs["queue_wait_s"], costs["startup_s"], costs["load_s"]]
    if not interruptions or not wall or any(p is None for p in parts):
        return None
    restart = sum(p or 0.0 for p in parts) + (statistics.median(stops) if stops else 0.0)
    lost = (number(good.get("lost_s")) or 0.0) / interruptions
    mtbf = wall / interruptions
    why = (f"R {restart:.1f} s (queue {parts[0]:.1f} + start-up {parts[1]:.1f} + load {parts[2]:.2f} + stop/teardown "
           f"{restart - sum(p or 0.0 for p in parts):.1f}), lost {lost:.1f} s, M {mtbf:.1f} s")
    return ettr_base * max(0.0, 1 - (lost + restart) / mtbf), why


def scale_table(measured: dict | None, every_steps: int) -> None:
    """Projected ETTR at 1,024 and 16,384 GPUs (8 per node) for each road, at the published
    failure rate, from the costs measured here (defaults where none)."""
    costs = gp.costs_with_defaults(measured or {}, every_steps)
    projection = gp.project(None, costs, SCALE_SIZES, SCALE_ALLOCATION_S)
    said = ", ".join(f"{k} {getattr(costs, k):g}" + (" (default)" if k in costs.defaults else "")
                     for k in gp.DEFAULT_COSTS)
    print(f"\nprojected ETTR at scale: {projection.failures_per_node_hour:.3g} failures per node-hour "
          f"({projection.rate_source}); costs (s): {said}; checkpoint every {every_steps} steps; "
          f"{SCALE_ALLOCATION_S / 3600:g} h allocations")
    print(f"{'GPUs':>6s} {'MTBF':>8s} {'Young-Daly':>10s}  {'road':14s} {'restart':>8s} {'ETTR now':>8s} "
          f"{'at Y-D':>7s}")
    for size in projection.sizes:
        for road in size.roads:
            name = road.name + (f" ({road.spare_nodes})" if road.name == "spares" else "")
            now = f"{road.ettr_configured:8.3f}" if road.ettr_configured is not None else f"{'-':>8s}"
            print(f"{size.gpus:6d} {size.mtbf_s / 3600:6.2f} h {size.optimal_interval_s:8.0f} s  {name:14s} "
                  f"{road.restart_s:6.0f} s {now} {road.ettr_optimal:7.3f}")


def report_projection(args: argparse.Namespace, pre: dict, ettr_b: float, ettr_p: float, wall: float,
                      n: int) -> list[str]:
    good = pre["status"].get("goodput") or {}
    found = projected_ettr(good, ettr_b, wall, n)
    problems = []
    if found is None:
        print("\nprojected ETTR: not enough measured (queue wait, start-up or resume load missing)")
    else:
        predicted, why = found
        off = 100 * abs(predicted - ettr_p)
        print(f"\nprojected ETTR for this schedule: {predicted:.3f} against {ettr_p:.3f} measured: {off:.1f} points "
              f"apart (want within {PROJECTION_WANT_POINTS:g}{'; not enforced with --tiny' if args.tiny else ''})"
              f"\n  ETTR_uninterrupted x (1 - (lost + R)/M): {why}")
        if off > PROJECTION_WANT_POINTS and not args.tiny:
            problems.append(f"the projection is {off:.1f} points from the measured ETTR")
    scale_table(projection_costs(good), args.checkpoint_every)
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--site", default="local-slurm")
    parser.add_argument("--account", default="glaunch")
    parser.add_argument("--urgent-partition", default="urgent")
    parser.add_argument("--every", type=float, default=45, help="seconds after each start before preempting")
    parser.add_argument("--preemptions", type=int, default=3)
    parser.add_argument("--urgent-sleep", type=int, default=5, help="seconds the preempting job holds the nodes")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--seconds-per-step", type=float, default=0.2)
    parser.add_argument("--checkpoint-every", type=int, default=50)
    parser.add_argument("--no-release", dest="release", action="store_false",
                        help="leave Slurm's requeue hold in place")
    parser.add_argument("--grace", type=float, default=45,
                        help="seconds a PREEMPTED job may take to be requeued before it counts as ended")
    parser.add_argument("--stall", type=float, default=150, help="no progress for this long: the run is stuck")
    parser.add_argument("--limit", type=float, default=600, help="seconds one run may take")
    parser.add_argument("--queue-wait", type=float, default=600)
    parser.add_argument("--nodes", type=int, default=NODES, help="nodes of the run")
    parser.add_argument("--from-first-step", action="store_true",
                        help="count --every from each start's first step line, not from RUNNING")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument("--tiny", action="store_true", help="one short preemption: checks the bench works")
    parser.add_argument("--projection-only", action="store_true",
                        help="print the projected ETTR at 1,024 and 16,384 GPUs from default costs; no cluster")
    args = parser.parse_args()
    if args.projection_only:
        scale_table(None, args.checkpoint_every)
        return 0
    if args.tiny:
        args.nodes, args.preemptions, args.every, args.from_first_step = 1, 1, 1.0, True
        args.steps, args.seconds_per_step, args.checkpoint_every, args.urgent_sleep = 80, 0.1, 10, 1
        args.queue_wait = min(args.queue_wait, 120)

    tmp = Path(tempfile.mkdtemp(prefix="glaunch-bench-ettr-"))
    bench = Bench(args, tmp)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    keep, rc = args.keep, 1
    try:
        wait_queue_empty(args.queue_wait)
        base = bench.follow(bench.submit(), preempt=False)
        check_run(base, "uninterrupted")
        print(f"uninterrupted run: job {base['job_id']} done", flush=True)
        wait_queue_empty(args.queue_wait)
        pre = bench.follow(bench.submit(), preempt=True)
        print(f"preempted run: job {pre['job_id']} ended {pre['final_state']}", flush=True)
        check_run(pre, "preempted")
        save_timeline(tmp / "timeline.json", {"uninterrupted": base, "preempted": pre})
        rc = report(args, base, pre)
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr, flush=True)
        if bench.current is not None:
            diagnose(bench.current)
        keep = True
    finally:
        bench.cancel_all()
        if keep or rc:
            print(f"scratch kept: {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())

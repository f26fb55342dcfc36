"""Submit time of a sweep against one single submission, in the same run, and how many
times sbatch is called for it.

    python bench/sweep.py [--elements 100] [--runs 3] [--real] [--tiny]

Times `glaunch submit examples/torch_ddp.yaml --site local-slurm` as a user runs it (this
tree's `python -m launcher.cli`, a process each, median of --runs): once alone and once
with a sweep of --elements elements (two --sweep axes), both with --dry-run; with --real
also submitted to the local Slurm cluster (scripts/local-slurm up), with a site variant
that holds every job for ten minutes (sbatch's --begin) so nothing runs, and each
submission cancelled right after. Every real submission goes through an `sbatch` shim on
PATH that logs each call: a sweep of one allocation shape makes one submitting sbatch
call (plus one `--test-only` preflight), and a sweep of two shapes (resources.nodes=1,2)
two.

--tiny (CI, seconds): a sweep of 4 elements, one timed run of each; the ratios are printed
as ever, and with --real the sbatch calls are checked as ever.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import BenchError, run_cmd  # noqa: E402

SHIM = """#!/bin/bash
printf '%s\\n' "$*" >> {log}
exec {sbatch} "$@"
"""


def axes(elements: int, shapes: int) -> list[str]:
    """--sweep options for `elements` elements in `shapes` allocation shapes (1 or 2)."""
    per_shape = elements // shapes
    first = max(d for d in range(1, per_shape + 1) if per_shape % d == 0 and d * d <= per_shape)
    out = ["--sweep", "hparams.a=" + ",".join(str(i) for i in range(first)),
           "--sweep", "hparams.b=" + ",".join(str(i) for i in range(per_shape // first))]
    if shapes == 2:
        out += ["--sweep", "resources.nodes=1,2"]
    return out


def timed(cmd: list[str], env: dict) -> tuple[float, dict]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise BenchError(f"{' '.join(cmd[:6])} ... failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    try:
        return seconds, json.loads(proc.stdout)
    except ValueError:
        return seconds, {}


def cancel(info: dict, env: dict) -> None:
    ids = [a["job_id"] for a in info.get("arrays") or [] if a.get("job_id")]
    if info.get("job_id"):
        ids.append(info["job_id"])
    if ids:
        run_cmd(["scancel", *ids], env=env)


def sbatch_calls(log: Path) -> dict[str, int]:
    lines = log.read_text().splitlines() if log.exists() else []
    log.write_text("")
    return {"submit": sum(1 for line in lines if "--test-only" not in line),
            "test-only": sum(1 for line in lines if "--test-only" in line)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--elements", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--real", action="store_true", help="also submit to the local Slurm cluster")
    parser.add_argument("--tiny", action="store_true", help="4 elements, 1 run: checks the bench works")
    args = parser.parse_args()
    if args.tiny:
        args.elements, args.runs = 4, 1
    # This tree's glaunch, whatever an installed console script points at.
    glaunch = [sys.executable, "-m", "launcher.cli"]
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, GLAUNCH_STATE_DIR=os.path.join(tmp, "state"))
        base = [*glaunch, "submit", "examples/torch_ddp.yaml", "--json"]
        runs = iter(range(10 ** 6))

        def case(extra: list[str]) -> list[str]:
            return [*base, "--runs-dir", os.path.join(tmp, f"runs-{next(runs)}"), *extra]

        sweep = axes(args.elements, 1)
        two_shapes = axes(args.elements, 2)
        results = {}
        dry = ["--site", "local-slurm", "--dry-run"]
        timed(case(dry), env)                       # warm the page and bytecode caches
        results["dry-run single"] = [timed(case(dry), env)[0] for _ in range(args.runs)]
        results[f"dry-run sweep of {args.elements}"] = [timed(case(dry + sweep), env)[0] for _ in range(args.runs)]
        calls: dict[str, dict[str, int]] = {}
        if args.real:
            real_sbatch = shutil.which("sbatch")
            if real_sbatch is None:
                raise BenchError("no sbatch on PATH: is the local cluster up (scripts/local-slurm up)?")
            shim_dir, log = Path(tmp) / "shim", Path(tmp) / "sbatch.log"
            shim_dir.mkdir()
            (shim_dir / "sbatch").write_text(SHIM.format(log=log, sbatch=real_sbatch))
            (shim_dir / "sbatch").chmod(0o755)
            site = Path(tmp) / "held.yaml"
            site.write_text("name: held\nextends: local-slurm\nsbatch: {begin: now+600}\n")
            real_env = dict(env, PATH=f"{shim_dir}{os.pathsep}{env['PATH']}")
            real = ["--site", str(site)]
            for label, extra in (("real single", []), (f"real sweep of {args.elements}", sweep)):
                times = []
                for _ in range(args.runs):
                    seconds, info = timed(case(real + extra), real_env)
                    cancel(info, env)
                    times.append(seconds)
                    calls[label] = sbatch_calls(log)
                results[label] = times
            seconds, info = timed(case(real + two_shapes), real_env)
            cancel(info, env)
            results[f"real sweep of {args.elements}, 2 shapes"] = [seconds]
            calls[f"real sweep of {args.elements}, 2 shapes"] = sbatch_calls(log)
    single = {"dry-run": statistics.median(results["dry-run single"])}
    if args.real:
        single["real"] = statistics.median(results["real single"])
    print(f"glaunch submit examples/torch_ddp.yaml --site local-slurm ({args.runs} runs each, median)")
    for label, times in results.items():
        median = statistics.median(times)
        against = single["real" if label.startswith("real") else "dry-run"]
        print(f"  {label:36s} {median * 1000:8.0f} ms  = {median / against:5.1f}x the single submission"
              + (f"   sbatch calls: {calls[label]}" if label in calls else ""))
    for label, count in calls.items():
        if "sweep" in label:
            shapes = 2 if "2 shapes" in label else 1
            if count["submit"] != shapes:
                print(f"  {label}: {count['submit']} submitting sbatch calls for {shapes} shape(s)")
                return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        sys.exit(2)

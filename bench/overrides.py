"""Wall time of a dry-run submit with thousands of KEY=VALUE overrides against the same
submit with none, in the same run, and the warnings it prints.

    python bench/overrides.py [--cli 3000] [--api 20000] [--runs 3] [--tiny]

Command line: `python -m launcher.cli submit examples/torch_ddp.yaml --dry-run` (this
tree's glaunch, a process each) with no override (the baseline), with --cli distinct
ones (`hparams.k0=0 hparams.k1=1 ...`), and with --cli repeated ones (`hparams.k{i % 100}`
and `model.params` over and over). API: `launcher.api.submit(..., dry_run=True)` in one
process, timed around the call alone, with no override (its baseline, after a first call
that imports everything) and with --api overrides, half distinct hparams keys and half
repeats. Each figure is the median of --runs, printed in seconds and as a ratio to its
baseline.

Each submission with repeats sets model.params, which only the planner reads: it must
print the warning that says so exactly once (checked in every mode, --tiny included).

Budget: each submission with overrides under 10 s (a few seconds on a quiet machine; the
cost grew with the square of their number before: 3,000 on the command line did not end
in 40 s); a miss exits 1. --tiny (CI: 300 on the command line, 2,000 through the API, one
run each) reports the budget's verdict without enforcing it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import BenchError  # noqa: E402

BUDGET_S = 10.0
TIMEOUT_S = 300
EXPERIMENT = "examples/torch_ddp.yaml"
WARNING = "overriding model.params changes nothing the job sees"


def distinct(count: int) -> list[str]:
    return [f"hparams.k{i}={i}" for i in range(count)]


def repeated(count: int) -> list[str]:
    """`count` overrides of few keys: hparams the job reads and model.params it does not."""
    return [f"hparams.k{i % 100}={i}" if i % 2 else f"model.params={i + 1}e6" for i in range(count)]


def timed_cli(overrides: list[str], env: dict, runs_dir: str) -> tuple[float, str]:
    """(wall seconds, stderr) of one dry-run submit on the command line."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", EXPERIMENT, "--dry-run", "--runs-dir",
                           runs_dir, *overrides], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT_S)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise BenchError(f"glaunch submit with {len(overrides)} overrides failed ({proc.returncode}): "
                         f"{proc.stderr.strip()[-2000:]}")
    return seconds, proc.stderr


def api_worker(count: int, runs: int, runs_dir: str) -> None:
    """In the process `timed_api` starts: print the seconds of each api.submit call, as JSON."""
    sys.path.insert(0, str(REPO))       # this tree's launcher, whatever an installed one points at
    from launcher import api

    overrides = distinct(count // 2) + repeated(count - count // 2)
    api.submit(EXPERIMENT, dry_run=True, runs_dir=runs_dir)        # imports everything, fills the caches

    def timed(items: list[str]) -> tuple[float, int]:
        start = time.perf_counter()
        run = api.submit(EXPERIMENT, overrides=items, dry_run=True, runs_dir=runs_dir)
        return time.perf_counter() - start, sum(warning.startswith(WARNING) for warning in run.warnings)

    print(json.dumps({"base": [timed([])[0] for _ in range(runs)], "many": [timed(overrides) for _ in range(runs)]}))


def timed_api(count: int, runs: int, env: dict, runs_dir: str) -> tuple[list[float], list[tuple[float, int]]]:
    """(seconds of each call without overrides, (seconds, model.params warnings) of each with `count`),
    from a process of its own (this tree's launcher, its own state dir)."""
    proc = subprocess.run([sys.executable, __file__, "--api-worker", str(count), str(runs), runs_dir], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=TIMEOUT_S * (runs + 1))
    if proc.returncode != 0:
        raise BenchError(f"api.submit with {count} overrides failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    result = json.loads(proc.stdout)
    return result["base"], [(seconds, warned) for seconds, warned in result["many"]]


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cli", type=int, default=3000, help="overrides on the command line")
    parser.add_argument("--api", type=int, default=20000, help="overrides through launcher.api.submit")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="300 and 2,000 overrides, 1 run; budget not enforced")
    parser.add_argument("--api-worker", nargs=3, help=argparse.SUPPRESS)     # COUNT RUNS RUNS_DIR: timed_api's
    args = parser.parse_args()
    if args.api_worker:
        count, runs, runs_dir = args.api_worker
        api_worker(int(count), int(runs), runs_dir)
        return 0
    if args.tiny:
        args.cli, args.api, args.runs = 300, 2000, 1
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, GLAUNCH_STATE_DIR=os.path.join(tmp, "state"))
        runs_dir = os.path.join(tmp, "runs")
        timed_cli([], env, runs_dir)                # warm the page and bytecode caches
        cases = {"no overrides (baseline)": [], f"{args.cli} distinct": distinct(args.cli),
                 f"{args.cli} repeated": repeated(args.cli)}
        cli: dict[str, list[float]] = {name: [] for name in cases}
        warned: list[int] = []
        for _ in range(args.runs):      # interleaved: a machine busy for a while slows every case alike
            for name, overrides in cases.items():
                seconds, stderr = timed_cli(overrides, env, runs_dir)
                cli[name].append(seconds)
                if "repeated" in name:
                    warned.append(stderr.count(WARNING))
        api_base, api_many = timed_api(args.api, args.runs, env, runs_dir)
    warned += [count for _, count in api_many]
    base = statistics.median(cli.pop("no overrides (baseline)"))
    print(f"glaunch submit {EXPERIMENT} --dry-run ({args.runs} runs each, median)")
    print(f"  {'command line, no overrides (baseline)':40s} {base:7.2f} s")
    worst = 0.0
    for name, times in cli.items():
        median = statistics.median(times)
        worst = max(worst, median)
        print(f"  {'command line, ' + name:40s} {median:7.2f} s  = {median / base:5.1f}x the baseline")
    api_base_s, api_s = statistics.median(api_base), statistics.median(s for s, _ in api_many)
    worst = max(worst, api_s)
    print(f"  {'api.submit, no overrides (baseline)':40s} {api_base_s:7.2f} s")
    print(f"  {f'api.submit, {args.api} overrides':40s} {api_s:7.2f} s  = {api_s / api_base_s:5.1f}x the baseline")
    verdict = "met" if worst < BUDGET_S else "NOT met"
    print(f"budget: each submission with overrides under {BUDGET_S:g} s: worst {worst:.2f} s, {verdict}"
          + (" (--tiny: reported, not enforced)" if args.tiny else ""))
    if any(count != 1 for count in warned):
        print(f"the model.params warning was printed {warned} times per submission, not once each")
        return 1
    return 0 if args.tiny or worst < BUDGET_S else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        sys.exit(2)

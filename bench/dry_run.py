"""Wall time of `glaunch submit --dry-run` against `python -c pass`, same run, same machine;
and proof that nothing heavy is imported on that path (python -X importtime).

    python bench/dry_run.py [--runs 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "lightning", "pytorch_lightning", "deepspeed")


def timed(cmd: list[str], env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, cwd=REPO, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, GLAUNCH_STATE_DIR=os.path.join(tmp, "state"))
        base = [sys.executable, "-c", "pass"]
        dry = [sys.executable, "-m", "launcher.cli", "submit", "examples/torch_ddp.yaml", "--dry-run",
               "--runs-dir", os.path.join(tmp, "runs")]
        dry_slurm = dry + ["--site", "juwels-booster", "resources.nodes=2"]
        env_slurm = dict(env, SCRATCH="/scratch/u", PROJECT="/p/u", WORK="/w/u", SCRATCHDIR="/s/u")
        for cmd, e in ((base, env), (dry, env), (dry_slurm, env_slurm)):  # warm the page cache
            timed(cmd, e)
        t_base = [timed(base, env) for _ in range(args.runs)]
        t_dry = [timed(dry, env) for _ in range(args.runs)]
        t_slurm = [timed(dry_slurm, env_slurm) for _ in range(args.runs)]
        imports = subprocess.run([sys.executable, "-X", "importtime", *dry[1:]], cwd=REPO, env=env,
                                 capture_output=True, text=True).stderr
    loaded = {line.split("|")[-1].strip().split(".")[0] for line in imports.splitlines() if "|" in line}
    heavy = sorted(set(HEAVY) & loaded)
    b, d, s = (statistics.median(t) for t in (t_base, t_dry, t_slurm))
    print(f"python -c pass                  median {b * 1000:7.1f} ms  (baseline, {args.runs} runs)")
    print(f"glaunch submit --dry-run local  median {d * 1000:7.1f} ms  = {d / b:4.1f}x baseline")
    print(f"glaunch submit --dry-run slurm  median {s * 1000:7.1f} ms  = {s / b:4.1f}x baseline")
    print(f"heavy modules imported on the dry-run path: {heavy or 'none'}")
    print(f"target < 300 ms median: {'met' if max(d, s) < 0.3 else 'NOT met'}")
    return 1 if heavy else 0


if __name__ == "__main__":
    sys.exit(main())

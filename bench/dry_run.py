"""Wall time of `glaunch submit --dry-run` against `python -c pass`, same run, same machine;
and proof that nothing heavy is imported on that path (python -X importtime).

    python bench/dry_run.py [--runs 15] [--module] [--no-bytecode-cache] [--against TREE] [--tiny]

It times what users run: the installed `glaunch` console script (pass --module for
`python -m launcher.cli`), with bytecode cached as after any install (in a private
PYTHONPYCACHEPREFIX; --no-bytecode-cache honours PYTHONDONTWRITEBYTECODE from the
environment instead, so glaunch's own modules may be compiled on every run).
`--against TREE` also times another checkout of glaunch (e.g. a `git worktree` of an
older commit) in the same run, both as `python -m launcher.cli` from their own tree.
A warm-up run fills the page and bytecode caches as a user's first submit does (and, for an
older tree that kept one, its template cache, in a private XDG_CACHE_HOME). Beside each
wall-clock median, the median CPU time (user + system, glaunch and the git it runs), which a
busy machine disturbs less.

Budget: on a quiet machine, the median of each dry run (local and Slurm site) under 8x the
median of `python -c pass`; the ratio is printed beside it, and a miss exits 1. --tiny (CI:
3 runs, a few seconds) prints the same figures and the budget's verdict, but fails only on
a heavy import: three samples on a machine shared with other jobs can put one command's
median behind a burst of someone else's work, which the ratio would blame on glaunch.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "lightning", "pytorch_lightning", "deepspeed")
BUDGET_X = 8.0      # each dry run's median, in medians of `python -c pass`
TINY_RUNS = 3


def timed(cmd: list[str], env: dict, cwd: Path = REPO) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the command and its children)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=120)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def medians(samples: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(w for w, _ in samples), statistics.median(c for _, c in samples)


def glaunch_command(module: bool) -> list[str]:
    script = Path(sysconfig.get_path("scripts")) / "glaunch"
    if module or not (script.is_file() and os.access(script, os.X_OK)):
        return [sys.executable, "-m", "launcher.cli"]
    return [str(script)]


def timed_tree(env: dict, script: bool, elsewhere: str) -> str:
    """Which launcher package the timed command imports: the console script finds it as
    from any other folder (`elsewhere`), where an editable install may point at another
    checkout than this one (PYTHONPATH, when set, comes first); `python -m` from here."""
    proc = subprocess.run([sys.executable, "-c", "import launcher; print(launcher.__file__)"],
                          cwd=elsewhere if script else REPO, env=env, capture_output=True, text=True, timeout=60)
    found = Path(proc.stdout.strip()).resolve().parent.parent if proc.returncode == 0 else None
    if found is None:
        return "launcher not importable"
    return "this checkout" if found == REPO else f"{found}, NOT this checkout (pass --module, or set PYTHONPATH)"


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--module", action="store_true", help="time `python -m launcher.cli`, not the script")
    parser.add_argument("--no-bytecode-cache", action="store_true",
                        help="no private bytecode cache; PYTHONDONTWRITEBYTECODE as in the environment")
    parser.add_argument("--against", type=Path, help="another glaunch checkout to time in the same run")
    parser.add_argument("--tiny", action="store_true",
                        help=f"{TINY_RUNS} runs; the budget is reported, not enforced (CI)")
    args = parser.parse_args()
    if args.tiny:
        args.runs = TINY_RUNS
    glaunch = glaunch_command(args.module)
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, GLAUNCH_STATE_DIR=os.path.join(tmp, "state"), XDG_CACHE_HOME=os.path.join(tmp, "cache"))
        if not args.no_bytecode_cache:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = os.path.join(tmp, "pycache")
        base = [sys.executable, "-c", "pass"]
        dry = [*glaunch, "submit", "examples/torch_ddp.yaml", "--dry-run", "--runs-dir", os.path.join(tmp, "runs")]
        dry_slurm = dry + ["--site", "juwels-booster", "resources.nodes=2"]
        env_slurm = dict(env, SCRATCH="/scratch/u", PROJECT="/p/u", WORK="/w/u", SCRATCHDIR="/s/u")
        commands = {"base": (base, env, REPO), "local": (dry, env, REPO), "slurm": (dry_slurm, env_slurm, REPO)}
        if args.against:
            module = [sys.executable, "-m", "launcher.cli", "submit", "examples/torch_ddp.yaml", "--dry-run"]
            for name, tree in (("this tree", REPO), (str(args.against), args.against.resolve())):
                runs_dir = os.path.join(tmp, f"runs-{len(commands)}")
                commands[name] = (module + ["--runs-dir", runs_dir], env, tree)
        for cmd, e, cwd in commands.values():       # warm the page and bytecode caches
            timed(cmd, e, cwd)
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
        for _ in range(args.runs):      # interleaved: a machine busy for a while slows every command alike
            for name, (cmd, e, cwd) in commands.items():
                samples[name].append(timed(cmd, e, cwd))
        t_base, t_dry, t_slurm = samples.pop("base"), samples.pop("local"), samples.pop("slurm")
        compared = {name: medians(times) for name, times in samples.items()}
        traced = dry if glaunch[0] != sys.executable else dry[1:]
        imports = subprocess.run([sys.executable, "-X", "importtime", *traced], cwd=REPO, env=env,
                                 capture_output=True, text=True).stderr
        tree = timed_tree(env, glaunch[0] != sys.executable, tmp)
    loaded = {line.split("|")[-1].strip().split(".")[0] for line in imports.splitlines() if "|" in line}
    heavy = sorted(set(HEAVY) & loaded)
    (b, bc), (d, dc), (s, sc) = (medians(t) for t in (t_base, t_dry, t_slurm))
    cache = "none of its own (--no-bytecode-cache)" if args.no_bytecode_cache else "cached"
    print(f"glaunch run as: {' '.join(glaunch)}; bytecode: {cache}; code: {tree}")
    print(f"python -c pass                  median {b * 1000:7.1f} ms  (baseline, {args.runs} runs)"
          f"  cpu {bc * 1000:6.1f} ms")
    print(f"glaunch submit --dry-run local  median {d * 1000:7.1f} ms  = {d / b:4.1f}x baseline"
          f"  cpu {dc * 1000:6.1f} ms = {dc / bc:4.1f}x")
    print(f"glaunch submit --dry-run slurm  median {s * 1000:7.1f} ms  = {s / b:4.1f}x baseline"
          f"  cpu {sc * 1000:6.1f} ms = {sc / bc:4.1f}x")
    print(f"heavy modules imported on the dry-run path: {heavy or 'none'}"
          f" (omegaconf: {'imported' if 'omegaconf' in loaded else 'not imported'})")
    for name, (seconds, cpu) in compared.items():
        print(f"python -m launcher.cli, local: {name:24s} median {seconds * 1000:7.1f} ms  "
              f"= {seconds / b:4.1f}x baseline  cpu {cpu * 1000:6.1f} ms = {cpu / bc:4.1f}x")
    worst = max(d, s) / b
    verdict = "met" if worst < BUDGET_X else "NOT met"
    print(f"budget: each dry run's median under {BUDGET_X:g}x python -c pass: worst {worst:.1f}x, {verdict}"
          + (" (--tiny: reported, not enforced)" if args.tiny else ""))
    if heavy:
        return 1
    return 0 if args.tiny or worst < BUDGET_X else 1


if __name__ == "__main__":
    sys.exit(main())

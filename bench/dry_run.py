"""Wall time of `glaunch submit --dry-run` against `python -c pass`, same run, same machine;
and proof that nothing heavy is imported on that path (python -X importtime).

    python bench/dry_run.py [--runs 15] [--module] [--no-bytecode-cache] [--against TREE] [--torchx PATH]
                            [--runs-dir DIR] [--tiny]

It times what users run: the installed `glaunch` console script (pass --module for
`python -m launcher.cli`), with bytecode cached as after any install (in a private
PYTHONPYCACHEPREFIX; --no-bytecode-cache honours PYTHONDONTWRITEBYTECODE from the
environment instead, so glaunch's own modules may be compiled on every run).
`--against TREE` also times another checkout of glaunch (e.g. a `git worktree` of an
older commit) in the same run, both as `python -m launcher.cli` from their own tree.
A warm-up run fills the page and bytecode caches as a user's first submit does (and, for an
older tree that kept one, its template cache, in a private XDG_CACHE_HOME).
`--torchx PATH` (a torchx executable, installed apart, e.g. in a venv of its own) also
times, interleaved with the rest, torchx's dry run of the same job, DDP on 1 node x 2 ranks
running examples/torch_ddp.py: `torchx run --dryrun --scheduler local_cwd dist.ddp -j 1x2
--script torch_ddp.py` against glaunch's on the `local` site, and `--scheduler slurm`
against glaunch's on `local-slurm`; it prints each side's medians and glaunch/torchx (the
target, at or below 0.6x, is reported, not enforced). torchx's Slurm dry run asks `sinfo`
for the partition's memory: torchx runs with a PATH that finds no Slurm command, so neither
side asks a scheduler anything. Beside each wall-clock median, the median CPU time (user +
system, glaunch and the git it runs), which a busy machine disturbs less.

The dry runs write their bundles (on a Slurm site with the code snapshot: hundreds of
files) into a new temporary folder, or into a new folder inside `--runs-dir DIR` (removed at
the end). Creating a file can cost far more in one folder, or at one time, than another (on
a machine shared with other writers: 38 us an openat against 1 us), which shows in the
system part of the CPU time: the torchx lines give the user part beside it.

Budget: on a quiet machine, the median of each dry run (local and Slurm site) under 8x the
median of `python -c pass`; the ratio is printed beside it, and a miss exits 1. --tiny (CI:
3 runs, a few seconds) prints the same figures and the budget's verdict, but fails only on
a heavy import: three samples on a machine shared with other jobs can put one command's
median behind a burst of someone else's work, which the ratio would blame on glaunch.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "lightning", "pytorch_lightning", "deepspeed")
BUDGET_X = 8.0      # each dry run's median, in medians of `python -c pass`
TORCHX_TARGET = 0.6     # glaunch/torchx on each site: reported, never enforced (torchx is optional)
# glaunch's site -> the torchx scheduler whose dry run renders the same job
TORCHX_SCHEDULERS = {"local": "local_cwd", "local-slurm": "slurm"}
TINY_RUNS = 3
TIMEOUT_S = 120     # a command that runs longer is killed (and the bench fails)


def timed(cmd: list[str], env: dict, cwd: Path = REPO) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds of the command and its children, the user part of those).
    Its end is awaited by one
    blocking wait4, not by subprocess's wait with a timeout: that polls, sleeping up to 50 ms
    between looks, and would round each wall time up to its next look (213, 263, 313 ms...)."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    bound = threading.Timer(TIMEOUT_S, proc.kill)
    bound.start()
    try:
        _, status, usage = os.wait4(proc.pid, 0)
    finally:
        bound.cancel()
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd)
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_utime


def medians(samples: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    """The median of each of timed()'s figures."""
    wall, cpu, user = (statistics.median(sample[i] for sample in samples) for i in range(3))
    return wall, cpu, user


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


def torchx_commands(torchx: Path, dry: list[str], env: dict, tmp: str) -> dict[str, tuple[list[str], dict, Path]]:
    """glaunch's dry run on each site of TORCHX_SCHEDULERS but `local` (timed already) and
    torchx's of the same job: from examples/, where its script is, with a PATH of one empty
    folder, so that its Slurm dry run finds no `sinfo` to ask (glaunch's asks nothing)."""
    no_commands = os.path.join(tmp, "empty-path")
    os.makedirs(no_commands, exist_ok=True)
    commands = {}
    for site, scheduler in TORCHX_SCHEDULERS.items():
        if site != "local":
            commands[f"glaunch {site}"] = ([*dry, "--site", site], env, REPO)
        commands[f"torchx {scheduler}"] = ([str(torchx), "run", "--dryrun", "--scheduler", scheduler, "dist.ddp",
                                            "-j", "1x2", "--script", "torch_ddp.py"], dict(env, PATH=no_commands),
                                           REPO / "examples")
    return commands


def print_torchx(torchx: Path, samples: dict[str, list[tuple[float, float, float]]]) -> None:
    """Per site: glaunch's and torchx's medians (wall, CPU, user CPU) and glaunch/torchx of
    each. User CPU is the steadiest: the system part of a Slurm site's dry run, which creates
    hundreds of files (the code snapshot), swings with other writers on the same disk."""
    print(f"torchx: {torchx}, run --dryrun dist.ddp -j 1x2 (PATH without Slurm's commands)")
    for site, scheduler in TORCHX_SCHEDULERS.items():
        (g, gc, gu), (t, tc, tu) = medians(samples[f"glaunch {site}"]), medians(samples[f"torchx {scheduler}"])
        verdict = "target met" if g / t <= TORCHX_TARGET else "target NOT met"
        print(f"glaunch --site {site:11s} median {g * 1000:6.1f} ms  cpu {gc * 1000:5.1f} user {gu * 1000:5.1f} | "
              f"torchx {scheduler:9s} median {t * 1000:6.1f} ms  cpu {tc * 1000:5.1f} user {tu * 1000:5.1f} | "
              f"glaunch/torchx {g / t:4.2f}x (cpu {gc / tc:4.2f}x, user {gu / tu:4.2f}x) {verdict}")
    print(f"target: glaunch/torchx at or below {TORCHX_TARGET:g}x on each site (wall medians): reported, not enforced")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--module", action="store_true", help="time `python -m launcher.cli`, not the script")
    parser.add_argument("--no-bytecode-cache", action="store_true",
                        help="no private bytecode cache; PYTHONDONTWRITEBYTECODE as in the environment")
    parser.add_argument("--against", type=Path, help="another glaunch checkout to time in the same run")
    parser.add_argument("--torchx", type=Path, metavar="PATH",
                        help="a torchx executable: time its dry run of the same job beside glaunch's")
    parser.add_argument("--runs-dir", type=Path, metavar="DIR",
                        help="write the bundles into a new folder inside DIR (default: a temporary folder)")
    parser.add_argument("--tiny", action="store_true",
                        help=f"{TINY_RUNS} runs; the budget is reported, not enforced (CI)")
    args = parser.parse_args()
    if args.tiny:
        args.runs = TINY_RUNS
    if args.torchx and not (args.torchx.is_file() and os.access(args.torchx, os.X_OK)):
        parser.error(f"--torchx {args.torchx}: not an executable file")
    glaunch = glaunch_command(args.module)
    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryDirectory(prefix="glaunch-dry-run-bench-",
                                                                          dir=args.runs_dir) as runs:
        env = dict(os.environ, GLAUNCH_STATE_DIR=os.path.join(tmp, "state"), XDG_CACHE_HOME=os.path.join(tmp, "cache"))
        if not args.no_bytecode_cache:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = os.path.join(tmp, "pycache")
        base = [sys.executable, "-c", "pass"]
        dry = [*glaunch, "submit", "examples/torch_ddp.yaml", "--dry-run", "--runs-dir", os.path.join(runs, "runs")]
        dry_slurm = dry + ["--site", "juwels-booster", "resources.nodes=2"]
        env_slurm = dict(env, SCRATCH="/scratch/u", PROJECT="/p/u", WORK="/w/u", SCRATCHDIR="/s/u")
        commands = {"base": (base, env, REPO), "local": (dry, env, REPO), "slurm": (dry_slurm, env_slurm, REPO)}
        if args.against:
            module = [sys.executable, "-m", "launcher.cli", "submit", "examples/torch_ddp.yaml", "--dry-run"]
            for name, tree in (("this tree", REPO), (str(args.against), args.against.resolve())):
                runs_dir = os.path.join(runs, f"runs-{len(commands)}")
                commands[name] = (module + ["--runs-dir", runs_dir], env, tree)
        if args.torchx:
            commands.update(torchx_commands(args.torchx.resolve(), dry, env, tmp))
        for cmd, e, cwd in commands.values():       # warm the page and bytecode caches
            timed(cmd, e, cwd)
        samples: dict[str, list[tuple[float, float, float]]] = {name: [] for name in commands}
        for _ in range(args.runs):      # interleaved: a machine busy for a while slows every command alike
            for name, (cmd, e, cwd) in commands.items():
                samples[name].append(timed(cmd, e, cwd))
        t_base, t_dry, t_slurm = samples.pop("base"), samples.pop("local"), samples.pop("slurm")
        against_torchx = {name: samples.pop(name) for name in list(samples) if name.startswith(("glaunch ", "torchx "))}
        against_torchx["glaunch local"] = t_dry
        compared = {name: medians(times) for name, times in samples.items()}
        traced = dry if glaunch[0] != sys.executable else dry[1:]
        imports = subprocess.run([sys.executable, "-X", "importtime", *traced], cwd=REPO, env=env,
                                 capture_output=True, text=True).stderr
        tree = timed_tree(env, glaunch[0] != sys.executable, tmp)
    loaded = {line.split("|")[-1].strip().split(".")[0] for line in imports.splitlines() if "|" in line}
    heavy = sorted(set(HEAVY) & loaded)
    (b, bc, _), (d, dc, _), (s, sc, _) = (medians(t) for t in (t_base, t_dry, t_slurm))
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
    for name, (seconds, cpu, _) in compared.items():
        print(f"python -m launcher.cli, local: {name:24s} median {seconds * 1000:7.1f} ms  "
              f"= {seconds / b:4.1f}x baseline  cpu {cpu * 1000:6.1f} ms = {cpu / bc:4.1f}x")
    if args.torchx:
        print_torchx(args.torchx, against_torchx)
    worst = max(d, s) / b
    verdict = "met" if worst < BUDGET_X else "NOT met"
    print(f"budget: each dry run's median under {BUDGET_X:g}x python -c pass: worst {worst:.1f}x, {verdict}"
          + (" (--tiny: reported, not enforced)" if args.tiny else ""))
    if heavy:
        return 1
    return 0 if args.tiny or worst < BUDGET_X else 1


if __name__ == "__main__":
    sys.exit(main())

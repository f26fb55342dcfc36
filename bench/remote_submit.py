"""Submit, status, logs and cancel over SSH from a laptop without Slurm, against the same
commands run directly on the login node, interleaved, same run; and each remote command's
SSH round trips.

    python bench/remote_submit.py [--samples 5] [--warmup 1] [--keep] [--tiny]

Needs the local cluster `main` (scripts/local-slurm up) and the local login node
(scripts/local-sshd up); runs as root, as the live tests of tests/test_remote_submission.py.

Each sample, on each side, times (wall clock, `time.perf_counter` around the process) this
tree's `python -m launcher.cli` running, in order:

    submit examples/torch_ddp.yaml --site SITE --runs-dir RUNS --json
    status RUN --json
    logs RUN
    cancel RUN

- remote: the laptop, set up as the `laptop` fixture of tests/test_remote_submission.py
  does it: PATH holds only `ssh` (a wrapper running /usr/bin/ssh with the laptop user
  glaunch-laptop's ~/.ssh/config, key and known_hosts), `git` and `tar`; no sbatch, no
  SLURM_* or SBATCH_* variables; HOME and GLAUNCH_STATE_DIR of its own. The glaunch
  process itself runs as root (the laptop user cannot read this Python under /root), but
  every SSH call goes out as the laptop user would make it, to root@glaunch-login.
  RUNS is a folder on the cluster (this host), the run's record lives in the laptop's
  state directory.
- direct: the login node itself: root's PATH with Slurm's commands, GLAUNCH_DIRECT=1 (an
  sbatch on PATH already keeps a `login:` profile off SSH; the variable forces it), HOME
  and GLAUNCH_STATE_DIR of its own. The run's directory is under RUNS there.

SITE is the same file on both sides: local-slurm-remote, with the job held for ten
minutes by sbatch's --begin (as bench/sweep.py does), so no training competes with the
timed commands for the CPUs; every job is cancelled by the sample's own `cancel`. Before
every submission the bench waits for an empty queue and idle nodes.

Round trips, counted outside the product: the `ssh` wrapper on the laptop's PATH logs every
ssh process glaunch starts (start, end, exit status, arguments). A round trip is one that
reaches the host; `ssh -O` (asks the local master) and `ssh -G` (prints the config) reach
none and are counted apart as local ssh calls. "in ssh" is the sum of the round trips'
wall times. Each command must use one connection (DESIGN.md: one multiplexed connection
per command; the distinct ControlPath values of its calls) and make at least one round
trip, else the bench fails. The wrapper is bash, run for each ssh call (a few ms each,
added to the remote side's time). The direct side has the same wrapper first on its PATH
and must make no ssh call.

Floor, measured after the samples through the same wrapper and options: the median time
to open a master connection (ssh glaunch-login true, the first call; 5 masters, --tiny 2)
and of bare round trips (`true`) over them (3 each, --tiny 2). Each command's remote -
direct is then set beside opening + round trips x floor. The login node is this host: a
round trip costs here the SSH session and the remote account's login shell (root's
~/.bashrc, which bash reads for commands sshd runs: here it runs `pyenv init`, 0.1-0.3 s),
not a network's latency; on a real link add one round-trip time per round trip and
several for each connection's handshake.

Prints per command: medians of both sides, the ratio remote / direct, the round trips and
the time in ssh; then the floor, and what each round trip ran on the login node with its
median time. Exits 1 when a command fails or says something unexpected (submit not going
the intended road, status not PENDING, cancel not cancelling, ssh from the direct side,
more than one connection), 2 when the bench cannot run. On exit, failed or not, it
cancels every job it queued that is still in the queue (those the run records name too),
closes any SSH master left behind and removes its scratch folder, which holds both
sides' run directories and state (--keep keeps it).

--tiny (CI, about a minute): one sample per command per side, no warm-up, no more than
120 s of waiting for an empty queue; the same figures and checks, no timing target (there
is none: the ratios are reported, not judged).
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import BenchError, run_cmd, squeue_has, wait_queue_empty

REPO = Path(__file__).resolve().parent.parent
EXPERIMENT = "examples/torch_ddp.yaml"
LAPTOP_USER = "glaunch-laptop"
COMMANDS = ("submit", "status", "logs", "cancel")
COMMAND_TIMEOUT_S = 120

HELD_SITE = """\
name: local-slurm-remote-held
extends: local-slurm-remote
sbatch: {begin: now+600}
"""

# One file per ssh call: start, end, exit status, then its arguments, each ended by a NUL.
SSH_WRAPPER = """#!/bin/bash
t0=$EPOCHREALTIME
/usr/bin/ssh -F {home}/config -i {home}/id_ed25519 -o UserKnownHostsFile={home}/known_hosts "$@"
rc=$?
printf '%s\\0' "$t0" "$EPOCHREALTIME" "$rc" "$@" > "{log}/$t0.$$"
exit $rc
"""


@dataclass
class SshCall:
    start: float
    end: float
    rc: int
    args: list[str]

    @property
    def local(self) -> bool:
        """`ssh -O` or `ssh -G`: answered here, by ssh or its master."""
        options = self.args[:self.args.index("--")] if "--" in self.args else self.args
        return "-O" in options or "-G" in options

    @property
    def control_path(self) -> str | None:
        return next((a.split("=", 1)[1] for a in self.args if a.startswith("ControlPath=")), None)

    def what(self) -> str:
        """What the call ran on the login node, in a few words."""
        if self.local:
            options = self.args[:self.args.index("--")] if "--" in self.args else self.args
            return "ssh -O " + options[options.index("-O") + 1] if "-O" in options else "ssh -G"
        at = self.args.index("--") if "--" in self.args else len(self.args) - 2
        command = self.args[at + 2] if len(self.args) > at + 2 else ""
        # The command inside the marks that frame its answer (launcher.schedulers.ssh.framing).
        framed = FRAMED.match(command)
        command = framed.group(1) if framed else command
        try:
            words = shlex.split(command)
        except ValueError:
            return command[:40]
        if words[:2] == ["bash", "-c"] and len(words) > 3 and words[3] == "glaunch-batch":
            return "batch (" + ", ".join(batch_labels(words[6:])) + ")"
        if words[:2] == ["sh", "-c"] and len(words) > 3:
            name = words[3].removeprefix("glaunch-")
            if name == "slurm" and len(words) > 5:     # sh -c SLURM_ENV glaunch-slurm CWD PROG ARGS...
                return slurm_label(words[5], words[6:])
            if name in ("read", "write") and len(words) > 4:
                return f"{name} {os.path.basename(words[4])}"
            if name == "pack" and len(words) > 5:
                return f"pack {words[5]}"
            return name
        if words[:2] == ["sh", "-c"]:
            return "account" if "id -un" in words[2] else "sh -c"
        return words[0] if words else "(login shell)"


FRAMED = re.compile(r"command printf '[^']*' \S+ \S+; command printf '[^']*' \S+ \S+ >&2; (.*); s=\$\?; ", re.S)


def batch_labels(pairs: list[str]) -> list[str]:
    """The commands of one batch (launcher.schedulers.ssh.on_login.BATCH: stdin text, then the
    command line, for each), each in a few words."""
    labels = []
    for line in pairs[1::2]:
        try:
            words = shlex.split(line)
        except ValueError:
            labels.append(line[:20])
            continue
        if words[:2] == ["sh", "-c"]:
            labels.append("account" if len(words) > 2 and "id -un" in words[2] else "sh -c")
        elif words:
            labels.append(slurm_label(words[0], words[1:]))
    return labels


def slurm_label(prog: str, args: list[str]) -> str:
    """A Slurm command in a few words: sbatch's --test-only/--hold, scontrol's and
    sacctmgr's verbs (else their flags)."""
    if prog == "sbatch":
        return " ".join([prog, *(a for a in args if a in ("--test-only", "--hold"))])
    if prog in ("scontrol", "sacctmgr"):
        return " ".join([prog, *([a for a in args if a.isalpha()][:2] or [a for a in args if a.startswith("-")][:2])])
    return prog


def ssh_calls(log_dir: Path) -> list[SshCall]:
    """The ssh calls logged since the last time, in the order they started; the log emptied."""
    calls = []
    for path in list(log_dir.iterdir()):
        fields = path.read_bytes().decode(errors="replace").split("\0")[:-1]
        path.unlink()
        if len(fields) >= 3:
            calls.append(SshCall(float(fields[0]), float(fields[1]), int(fields[2]), fields[3:]))
    return sorted(calls, key=lambda c: c.start)


@dataclass
class Measure:
    seconds: float
    round_trips: int = 0
    local_calls: int = 0
    in_ssh_s: float = 0.0
    connections: int = 0
    calls: list[tuple[str, float]] = field(default_factory=list)   # (what it ran, seconds), in order


class Bench:
    def __init__(self, tmp: Path, queue_wait_s: float) -> None:
        self.tmp = tmp
        self.queue_wait_s = queue_wait_s
        self.jobs: set[str] = set()
        self.queue_waited_s = 0.0
        self.site = tmp / "held.yaml"
        self.site.write_text(HELD_SITE)
        laptop_ssh = laptop_ssh_dir()
        self.runs = {"remote": tmp / "cluster runs", "direct": tmp / "direct runs"}
        self.logs = {"remote": tmp / "ssh-log-remote", "direct": tmp / "ssh-log-direct"}
        self.env: dict[str, dict[str, str]] = {}
        base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "GLAUNCH_"))}
        for side in ("remote", "direct"):
            self.runs[side].mkdir()
            self.logs[side].mkdir()
            (tmp / f"home-{side}").mkdir()
            bin_dir = tmp / f"bin-{side}"
            bin_dir.mkdir()
            wrapper = bin_dir / "ssh"
            wrapper.write_text(SSH_WRAPPER.format(home=laptop_ssh, log=self.logs[side]))
            wrapper.chmod(0o755)
            env = dict(base, HOME=str(tmp / f"home-{side}"), GLAUNCH_STATE_DIR=str(tmp / f"state-{side}"),
                       PYTHONPATH=str(REPO))
            if side == "remote":
                for tool in ("git", "tar"):
                    (bin_dir / tool).symlink_to(shutil.which(tool) or f"/usr/bin/{tool}")
                env["PATH"] = str(bin_dir)
            else:
                env["PATH"] = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
                env["GLAUNCH_DIRECT"] = "1"
                if os.environ.get("SLURM_CONF"):
                    env["SLURM_CONF"] = os.environ["SLURM_CONF"]
            self.env[side] = env

    def glaunch(self, side: str, *args: str) -> tuple[subprocess.CompletedProcess, Measure]:
        ssh_calls(self.logs[side])  # nothing from before counts
        cmd = [sys.executable, "-m", "launcher.cli", *args]
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd, cwd=REPO, env=self.env[side], capture_output=True, text=True,
                                  timeout=COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise BenchFailed(f"{side}: glaunch {' '.join(args[:2])} did not end within {COMMAND_TIMEOUT_S} s") \
                from None
        seconds = time.perf_counter() - start
        calls = ssh_calls(self.logs[side])
        trips = [c for c in calls if not c.local]
        measure = Measure(seconds, len(trips), len(calls) - len(trips), sum(c.end - c.start for c in trips),
                          len({c.control_path for c in calls if c.control_path}),
                          [(c.what(), c.end - c.start) for c in calls])
        if proc.returncode != 0:
            raise BenchFailed(f"{side}: glaunch {' '.join(args[:2])} failed ({proc.returncode}): "
                              f"{proc.stderr.strip()[-1500:]}")
        return proc, measure

    def sample(self, side: str) -> dict[str, Measure]:
        waiting = time.monotonic()
        wait_queue_empty(self.queue_wait_s)
        self.queue_waited_s += time.monotonic() - waiting
        proc, submit = self.glaunch(side, "submit", EXPERIMENT, "--site", str(self.site), "--runs-dir",
                                    str(self.runs[side]), "--json")
        info = json.loads(proc.stdout)
        if info.get("job_id"):
            self.jobs.add(str(info["job_id"]))
        run_id, run_dir = info["run_id"], Path(info["run_dir"])
        state_dir = Path(self.env[side]["GLAUNCH_STATE_DIR"])
        if side == "remote" and not (run_dir.is_relative_to(state_dir / "remote-runs")
                                     and (self.runs[side] / run_id / "job.sbatch").is_file()):
            raise BenchFailed(f"remote submit did not go over SSH: run dir {run_dir}")
        if side == "direct" and not run_dir.is_relative_to(self.runs[side]):
            raise BenchFailed(f"direct submit did not stay on the login node: run dir {run_dir}")
        if not info.get("job_id"):
            raise BenchFailed(f"{side}: submit queued no job: {proc.stdout.strip()}")
        proc, status = self.glaunch(side, "status", run_id, "--json")
        state = json.loads(proc.stdout).get("state")
        if state != "PENDING":
            raise BenchFailed(f"{side}: status of the held job says {state!r}, not PENDING")
        _, logs = self.glaunch(side, "logs", run_id)
        proc, cancel = self.glaunch(side, "cancel", run_id)
        if f"cancelled job {info['job_id']}" not in proc.stdout:
            raise BenchFailed(f"{side}: cancel said {proc.stdout.strip()!r}")
        measures = {"submit": submit, "status": status, "logs": logs, "cancel": cancel}
        for name, m in measures.items():
            if side == "direct" and m.round_trips + m.local_calls:
                raise BenchFailed(f"direct {name} ran ssh: {[w for w, _ in m.calls]}")
            if side == "remote" and (m.round_trips == 0 or m.connections != 1):
                raise BenchFailed(f"remote {name}: {m.round_trips} round trips over {m.connections} connections "
                                  "(one connection per command expected)")
        return measures

    def floor(self, opens: int, trips: int) -> tuple[float, float]:
        """(median time to open a master connection, median bare round trip over one): ssh
        running `true` on the login node through the same wrapper, options as glaunch's;
        `opens` masters opened and closed, `trips` round trips over each."""
        (self.tmp / "state-remote").mkdir(exist_ok=True)
        openings, bare = [], []
        for index in range(opens):
            words = [str(self.tmp / "bin-remote" / "ssh"), "-T", "-o", "BatchMode=yes", "-o", "ControlMaster=auto",
                     "-o", f"ControlPath={self.tmp / 'state-remote' / f'floor-{index}.sock'}",
                     "-o", "ControlPersist=60", "--", "glaunch-login"]
            try:
                for _ in range(trips + 1):
                    done = run_cmd([*words, "true"], env=self.env["remote"])
                    if done.returncode != 0:
                        raise BenchFailed(f"ssh glaunch-login true failed ({done.returncode}): {done.stderr.strip()}")
            finally:
                run_cmd([*words[:1], "-O", "exit", *words[1:]], env=self.env["remote"])
            times = [c.end - c.start for c in ssh_calls(self.logs["remote"]) if not c.local]
            openings.append(times[0])
            bare += times[1:]
        return statistics.median(openings), statistics.median(bare)

    def cleanup(self) -> None:
        """Cancel every job still queued (those the run records name too), close any SSH
        master left behind."""
        for runs in self.runs.values():
            for run_file in runs.glob("*/run.json"):
                try:
                    job = json.loads(run_file.read_text()).get("job_id")
                except (OSError, ValueError):
                    continue
                if job:
                    self.jobs.add(str(job))
        live = [j for j in sorted(self.jobs) if squeue_has(j)]
        if live:
            run_cmd(["scancel", *live])
            print(f"cancelled left-over job(s) {' '.join(live)}", file=sys.stderr)
        for sock in self._sockets():
            run_cmd([str(self.tmp / "bin-remote" / "ssh"), "-O", "exit", "-o", f"ControlPath={sock}",
                     "glaunch-login"])

    def _sockets(self) -> list[Path]:
        state = self.tmp / "state-remote"
        return [p for p in state.rglob("*") if p.is_socket()] if state.is_dir() else []


class BenchFailed(RuntimeError):
    """A glaunch command failed or answered what it should not."""


def laptop_ssh_dir() -> Path:
    try:
        home = Path(pwd.getpwnam(LAPTOP_USER).pw_dir) / ".ssh"
    except KeyError:
        raise BenchError(f"no user {LAPTOP_USER}: is the login node up (scripts/local-sshd up)?") from None
    if os.geteuid() != 0:
        raise BenchError("this bench uses the laptop user's key (as the live tests do): run it as root")
    if not (home / "config").is_file() or not (home / "id_ed25519").is_file():
        raise BenchError(f"{home} lacks config or id_ed25519: run scripts/local-sshd up")
    return home


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=5, help="timed samples of each command per side (median)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed samples per side first (page cache)")
    parser.add_argument("--queue-wait", type=float, default=600, help="seconds to wait for an empty queue")
    parser.add_argument("--keep", action="store_true", help="keep the scratch folder (run dirs, ssh logs)")
    parser.add_argument("--tiny", action="store_true", help="one sample per side, no warm-up: checks the bench works")
    args = parser.parse_args()
    if args.tiny:
        args.samples, args.warmup = 1, 0
        args.queue_wait = min(args.queue_wait, 120)
    if shutil.which("sbatch") is None:
        raise BenchError("no sbatch on PATH: the direct side runs on the login node (scripts/local-slurm up)")

    tmp = Path(tempfile.mkdtemp(prefix="glaunch-bench-remote-"))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results: dict[str, dict[str, list[Measure]]] = {side: {c: [] for c in COMMANDS} for side in ("remote", "direct")}
    try:
        bench = Bench(tmp, args.queue_wait)
        try:
            for _ in range(args.warmup):
                for side in ("remote", "direct"):
                    bench.sample(side)
            for i in range(args.samples):
                for side in (("remote", "direct") if i % 2 == 0 else ("direct", "remote")):
                    for name, m in bench.sample(side).items():
                        results[side][name].append(m)
                print(f"  sample {i + 1}: " + "  ".join(
                    f"{c} {results['remote'][c][-1].seconds * 1000:.0f}/{results['direct'][c][-1].seconds * 1000:.0f}"
                    for c in COMMANDS) + " ms (remote/direct)", flush=True)
            handshake, trip = bench.floor(*((2, 2) if args.tiny else (5, 3)))
        finally:
            bench.cleanup()
    except BenchFailed as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    finally:
        if args.keep:
            print(f"scratch kept: {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    def med(side: str, name: str, attr: str = "seconds") -> float:
        return statistics.median(getattr(m, attr) for m in results[side][name])

    print(f"\nglaunch CMD, {EXPERIMENT}, site local-slurm-remote (held); {args.samples} interleaved sample(s) "
          f"per side{', medians' if args.samples > 1 else ''}; remote = laptop over SSH, direct = on the login node")
    print(f"{'command':8s} {'direct':>9s} {'remote':>9s} {'ratio':>7s} {'round trips':>12s} {'in ssh':>9s} "
          f"{'local ssh calls':>16s}")
    for name in COMMANDS:
        direct, remote = med("direct", name), med("remote", name)
        print(f"{name:8s} {direct * 1000:6.0f} ms {remote * 1000:6.0f} ms {remote / direct:6.2f}x "
              f"{med('remote', name, 'round_trips'):12.0f} {med('remote', name, 'in_ssh_s') * 1000:6.0f} ms "
              f"{med('remote', name, 'local_calls'):16.0f}")
    print("ratio = remote / direct (wall time of the process); round trips = ssh calls that reached the host "
          "(ssh -O/-G apart, as local ssh calls); in ssh = their summed wall time")
    print(f"(waited {bench.queue_waited_s:.0f} s in all for an empty queue before the submissions)")
    print(f"floor (medians): opening a master connection (ssh glaunch-login true) {handshake * 1000:.0f} ms; "
          f"one bare round trip over it {trip * 1000:.0f} ms")
    for name in COMMANDS:
        trips = med("remote", name, "round_trips")
        print(f"  {name:7s} opening + {trips:2.0f} round trips x {trip * 1000:.0f} ms = "
              f"{(handshake + trips * trip) * 1000:5.0f} ms; measured remote - direct: "
              f"{(med('remote', name) - med('direct', name)) * 1000:5.0f} ms")
    print(f"what each remote command ran on the login node, ms each ({median_or_first(args.samples)}):")
    for name in COMMANDS:
        print(f"  {name:7s} " + ", ".join(f"{what} {seconds * 1000:.0f}"
                                          for what, seconds in call_medians(results["remote"][name])))
    return 0


def median_or_first(samples: int) -> str:
    return "medians" if samples > 1 else "one sample"


def call_medians(measures: list[Measure]) -> list[tuple[str, float]]:
    """Each call's median time over the samples; the first sample's when they ran different calls."""
    labels = [[what for what, _ in m.calls] for m in measures]
    if any(other != labels[0] for other in labels):
        return measures[0].calls
    return [(what, statistics.median(m.calls[i][1] for m in measures)) for i, what in enumerate(labels[0])]


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        sys.exit(2)

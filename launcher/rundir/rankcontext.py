"""The rank's environment: who am I, where do my files go, read from what the launcher
exported (the GLAUNCH_* names: launcher.rundir.envnames; RANK, WORLD_SIZE and the rest of
torch.distributed's).

Both sides of a job read it: the training library on every rank, and the job controller on
the batch host (its job id, its restart, the run directory). With none of it set the process
is a single stand-alone one. Standard library only; the collectives the training library
makes once torch.distributed is up are :mod:`launcher.runtime.distributed`.
"""

from __future__ import annotations

import errno
import os
import random
import re
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from launcher.rundir import envnames
from launcher.rundir.layout import STANDALONE_RUN_DIR, RunDir
from launcher.rundir.records import is_job_id, is_node_name

DEFAULT_STOP_SIGNALS = ("USR2", "TERM")
DEFAULT_KEEP = 2


class RuntimeConfigError(ValueError):
    """An environment variable the launcher sets has a value the runtime cannot use."""


# Ranks, counts and steps: more is not a value a launcher set.
MAX_ENV_INT = 2**31 - 1
# What a shell or a launcher writes: int() alone would also take 1_000 and other scripts' digits.
_INTEGER = re.compile(r"[+-]?[0-9]{1,18}")
_PORT = re.compile(r"[0-9]{1,5}")


def _env_int(name: str, default: int, *, minimum: int = 0, maximum: int = MAX_ENV_INT) -> int:
    raw = os.environ.get(name, "")
    text = raw.strip()
    if text == "":
        return default
    if not _INTEGER.fullmatch(text):
        raise RuntimeConfigError(f"{name}={raw!r}: not an integer")
    value = int(text)
    if value < minimum:
        raise RuntimeConfigError(f"{name}={raw!r}: must be >= {minimum}")
    if value > maximum:
        raise RuntimeConfigError(f"{name}={raw!r}: must be <= {maximum}")
    return value


def _env_port() -> int | None:
    raw = os.environ.get("MASTER_PORT", "")
    text = raw.strip()
    if text == "":
        return None
    if not _PORT.fullmatch(text) or not 0 < int(text) < 65536:
        raise RuntimeConfigError(f"MASTER_PORT={raw!r}: not a port number (1..65535)")
    return int(text)


def _env_job_id() -> str | None:
    """GLAUNCH_JOB_ID, else SLURM_JOB_ID: a job id of Slurm's shape (it names files and
    reaches scancel)."""
    for name, what in ((envnames.JOB_ID, "a job id"), ("SLURM_JOB_ID", "a Slurm job id")):
        raw = os.environ.get(name, "")
        if raw.strip() == "":
            continue
        if not is_job_id(raw.strip()):
            raise RuntimeConfigError(f"{name}={raw!r}: not {what} (digits, or ARRAYJOB_TASK)")
        return raw.strip()
    return None


def bare_signal_name(name: str) -> str:
    """A signal's name as glaunch compares and lists them: ``" sigusr2"`` -> ``"USR2"``."""
    return name.strip().upper().removeprefix("SIG")


def _signal_names(raw: str | None) -> tuple[str, ...]:
    if raw is None or raw.strip() == "":
        return DEFAULT_STOP_SIGNALS
    return tuple(name for name in map(bare_signal_name, raw.split(",")) if name)


@dataclass(frozen=True)
class RankContext:
    """This process's place in the job. Built by :func:`context` from the environment."""

    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_rank: int
    master_addr: str | None
    master_port: int | None
    run_dir: Path
    run_id: str | None
    job_id: str | None
    checkpoint_dir: Path
    checkpoint_every: int
    checkpoint_keep: int
    strategy: str
    precision: str
    ds_config: Path | None
    restart: int
    launcher: str | None
    stop_signals: tuple[str, ...]
    standalone: bool
    # recovery.peer: this process replaces a lost rank and joins the process group at this
    # generation (set by the job controller: launcher.jobcontrol.replace); None: a rank of the start.
    peer_join: int | None = None

    @property
    def is_main(self) -> bool:
        """True on global rank 0 (the rank that commits checkpoints and writes result.json)."""
        return self.rank == 0

    @property
    def num_nodes(self) -> int:
        return max(1, self.world_size // max(1, self.local_world_size))

    def checkpoint_due(self, step: int) -> bool:
        """True when ``step`` is a multiple of GLAUNCH_CHECKPOINT_EVERY (0 disables)."""
        return self.checkpoint_every > 0 and step > 0 and step % self.checkpoint_every == 0


def context() -> RankContext:
    """Read the rank context from the environment (cheap; re-reads on every call)."""
    env = os.environ
    standalone = "RANK" not in env and "WORLD_SIZE" not in env
    rank = _env_int("RANK", 0)
    world = _env_int("WORLD_SIZE", 1, minimum=1)
    local_world = _env_int("LOCAL_WORLD_SIZE", world, minimum=1)
    local_rank = _env_int("LOCAL_RANK", rank % local_world)
    node_rank = _env_int("GROUP_RANK", _env_int("NODE_RANK", rank // local_world))
    if rank >= world:
        raise RuntimeConfigError(f"RANK={rank} is not below WORLD_SIZE={world}")
    if local_world > world:
        raise RuntimeConfigError(f"LOCAL_WORLD_SIZE={local_world} is more than WORLD_SIZE={world}")
    if local_rank >= local_world:
        raise RuntimeConfigError(f"LOCAL_RANK={local_rank} is not below LOCAL_WORLD_SIZE={local_world}")
    run_dir = Path(env.get(envnames.RUN_DIR) or Path.cwd() / STANDALONE_RUN_DIR)
    ckpt_dir = Path(env.get(envnames.CHECKPOINT_DIR) or RunDir(run_dir).checkpoint_dir)
    ds = env.get(envnames.DS_CONFIG)
    return RankContext(
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        local_world_size=local_world,
        node_rank=node_rank,
        master_addr=env.get("MASTER_ADDR"),
        master_port=_env_port(),
        run_dir=run_dir,
        run_id=env.get(envnames.RUN_ID),
        job_id=_env_job_id(),
        checkpoint_dir=ckpt_dir,
        checkpoint_every=_env_int(envnames.CHECKPOINT_EVERY, 0),
        checkpoint_keep=_env_int(envnames.CHECKPOINT_KEEP, DEFAULT_KEEP, minimum=1),
        strategy=(env.get(envnames.STRATEGY) or "ddp").lower(),
        precision=(env.get(envnames.PRECISION) or "fp32").lower(),
        ds_config=Path(ds) if ds else None,
        restart=_env_int(envnames.RESTART, 0),
        launcher=env.get(envnames.LAUNCHER) or None,
        stop_signals=_signal_names(env.get(envnames.STOP_SIGNALS)),
        standalone=standalone,
        peer_join=_env_int(envnames.PEER_JOIN, 0, minimum=1) if env.get(envnames.PEER_JOIN, "").strip() else None,
    )


# A rendezvous port picked on this machine (the local site's job step, a world of one) lies
# below the kernel's ephemeral range, as a Slurm start's does (jobplan.PORT_BASE): a port of
# that range found free is handed to the next outgoing connection of any process, and one
# made before rank 0's store binds it (seconds: rank 0 imports torch first) left the store
# EADDRINUSE. Below the range only a process that binds the port itself takes it.
FREE_PORT_FLOOR = 10000
FREE_PORT_TRIES = 64
EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"
EPHEMERAL_FIRST = 32768        # Linux's default, where the range cannot be read


def free_port() -> int:
    """A TCP port no process listens on here, picked at random below the ephemeral range
    (FREE_PORT_FLOOR up to it); one the system picks where none of FREE_PORT_TRIES is free."""
    below = _ephemeral_first()
    if below - FREE_PORT_FLOOR >= FREE_PORT_TRIES:
        for _ in range(FREE_PORT_TRIES):
            port = random.randrange(FREE_PORT_FLOOR, below)
            if port_taken(port) is False:
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ephemeral_first() -> int:
    """The first port of the kernel's ephemeral range (EPHEMERAL_FIRST where unreadable)."""
    try:
        with open(EPHEMERAL_RANGE, encoding="ascii") as f:
            first = f.read(64).split()[0]
    except (OSError, ValueError, IndexError):
        return EPHEMERAL_FIRST
    return int(first) if first.isdigit() and 1024 < int(first) < 65536 else EPHEMERAL_FIRST


def port_taken(port: int) -> bool | None:
    """Whether a process here listens on `port`, asked as a rendezvous store binds: every
    address, SO_REUSEADDR (a port whose last connections wait out TIME_WAIT is free). None
    where the question fails otherwise (a port out of range, a bind refused for another
    reason)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(("", port))
    except OSError as exc:
        return True if exc.errno == errno.EADDRINUSE else None
    except (ValueError, OverflowError):
        return None
    return False


def seconds_from_env(name: str, default: float) -> float:
    """A number of seconds >= 0 from the environment variable `name`: `default` when it is
    unset or empty, and (said in the log) when it is not such a number."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        log(f"{name}={raw!r} is not a number of seconds >= 0; using {default:g}")
        return default
    return value


def node_name() -> str:
    """Slurm's name of this node (several may share a host), else the host name. A
    SLURMD_NODENAME that is no node name is not used: it goes into records and file names."""
    name = os.environ.get("SLURMD_NODENAME", "")
    return name if is_node_name(name) else os.uname().nodename      # gethostname(), without socket


def log(msg: str) -> None:
    """One line on stderr, prefixed with glaunch and the rank."""
    rank = os.environ.get("RANK", "0")
    print(f"glaunch[rank {rank}]: {msg}", file=sys.stderr, flush=True)

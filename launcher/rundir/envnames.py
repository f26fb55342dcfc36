"""The ``GLAUNCH_*`` environment variables: each name once, for every side that sets or
reads one (the renderer's env.sh, the schedulers, the in-job runtime, the registry).

What a job needs to know at submit time travels in task.json (:mod:`.taskspec`); these
are what a training script and the runtime on every rank read from their environment,
and what a user or a site sets. Standard library only.
"""

from __future__ import annotations

PREFIX = "GLAUNCH_"               # reserved: an experiment's or a site's `env:` may not set these

# Exported by env.sh to every task (launcher.rendering.render.glaunch_env).
RUN_ID = "GLAUNCH_RUN_ID"
RUN_DIR = "GLAUNCH_RUN_DIR"
CHECKPOINT_DIR = "GLAUNCH_CHECKPOINT_DIR"
CHECKPOINT_EVERY = "GLAUNCH_CHECKPOINT_EVERY"
CHECKPOINT_KEEP = "GLAUNCH_CHECKPOINT_KEEP"
STRATEGY = "GLAUNCH_STRATEGY"
PRECISION = "GLAUNCH_PRECISION"
LAUNCHER = "GLAUNCH_LAUNCHER"
NODES = "GLAUNCH_NODES"
RANKS_PER_NODE = "GLAUNCH_RANKS_PER_NODE"
MICRO_BATCH = "GLAUNCH_MICRO_BATCH"
GLOBAL_BATCH = "GLAUNCH_GLOBAL_BATCH"
STOP_SIGNALS = "GLAUNCH_STOP_SIGNALS"
HPARAMS = "GLAUNCH_HPARAMS"
DS_CONFIG = "GLAUNCH_DS_CONFIG"
RECOVERY_PEER = "GLAUNCH_RECOVERY_PEER"   # "1": recovery.peer (launcher.runtime.peer)
# "HOST:PORT": the rendezvous store the job controller serves for the step's ranks under
# recovery.peer (launcher.storeprocess); where unset, rank 0 starts one on the rendezvous port.
PEER_STORE = "GLAUNCH_PEER_STORE"
# Set by the job controller for a process that replaces a lost rank (launcher.jobcontrol.replace):
# the generation of the process group it joins, and the pid the lost rank had on this node.
PEER_JOIN = "GLAUNCH_PEER_JOIN"
PEER_LOST_PID = "GLAUNCH_PEER_LOST_PID"
# Per start, from the scheduler: the job's id and how many starts came before this one.
JOB_ID = "GLAUNCH_JOB_ID"
RESTART = "GLAUNCH_RESTART"
# A stop signal the node's torchrun agent took before its workers existed ("USR2"): each
# worker starts with the stop asked (launcher.runtime.worker).
STOPPED_BEFORE_WORKERS = "GLAUNCH_STOPPED_BEFORE_WORKERS"

# Read by the runtime on every rank, from a site's or an experiment's environment, or
# (TENSORBOARD_DIR, where unset) set by it for the script.
HEARTBEAT_S = "GLAUNCH_HEARTBEAT_S"
GPU_SAMPLE_S = "GLAUNCH_GPU_SAMPLE_S"
DIST_BACKEND = "GLAUNCH_DIST_BACKEND"
TENSORBOARD_DIR = "GLAUNCH_TENSORBOARD_DIR"

# Read by glaunch itself, where it runs.
STATE_DIR = "GLAUNCH_STATE_DIR"
SITE_PATH = "GLAUNCH_SITE_PATH"

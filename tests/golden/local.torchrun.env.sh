# shellcheck shell=bash
# shellcheck disable=SC2016  # quoted values are literal on purpose, '$' included
# Environment of glaunch run torch-ddp-20260101-000000-abcd (site local), sourced by job.sbatch
# before the launch; every task inherits it.

# site and experiment environment
export OMP_NUM_THREADS="1"
export PYTHONUNBUFFERED="1"
export DS_ACCELERATOR="cpu"

# glaunch
export PYTHONPATH=/home/alice/exp/runs/torch-ddp-20260101-000000-abcd/lib"${PYTHONPATH:+:$PYTHONPATH}"
export GLAUNCH_RUN_ID=torch-ddp-20260101-000000-abcd
export GLAUNCH_RUN_DIR=/home/alice/exp/runs/torch-ddp-20260101-000000-abcd
export GLAUNCH_CHECKPOINT_DIR=/home/alice/exp/runs/torch-ddp-20260101-000000-abcd/checkpoints
export GLAUNCH_CHECKPOINT_EVERY=10
export GLAUNCH_CHECKPOINT_KEEP=2
export GLAUNCH_STRATEGY=ddp
export GLAUNCH_PRECISION=bf16
export GLAUNCH_LAUNCHER=torchrun
export GLAUNCH_NODES=1
export GLAUNCH_RANKS_PER_NODE=2
export GLAUNCH_MICRO_BATCH=8
export GLAUNCH_GLOBAL_BATCH=16
export GLAUNCH_STOP_SIGNALS=USR2,TERM
export GLAUNCH_HPARAMS=/home/alice/exp/runs/torch-ddp-20260101-000000-abcd/hparams.json

# rendezvous
# localrun picks a free port on this machine for each start
export MASTER_ADDR=127.0.0.1

# shellcheck shell=bash
# shellcheck disable=SC2016  # quoted values are literal on purpose, '$' included
# Environment of glaunch run torch-ddp-20260101-000000-abcd (site cscs-clariden), sourced by job.sbatch
# before the launch; every task inherits it.

# site and experiment environment
export OMP_NUM_THREADS="1"
export PYTHONUNBUFFERED="1"
export MPICH_GPU_SUPPORT_ENABLED="0"
export CUDA_CACHE_DISABLE="1"
export TRITON_HOME="/dev/shm/"

# NCCL and network
export NCCL_DEBUG="WARN"
export TORCH_NCCL_ASYNC_ERROR_HANDLING="1"
export NCCL_NET="AWS Libfabric"
export NCCL_NET_GDR_LEVEL="PHB"
export NCCL_CROSS_NIC="1"
export NCCL_PROTO="^LL128"
export FI_CXI_DEFAULT_CQ_SIZE="131072"
export FI_CXI_DEFAULT_TX_SIZE="32768"
export FI_CXI_DISABLE_HOST_REGISTER="1"
export FI_CXI_RX_MATCH_MODE="software"
export FI_MR_CACHE_MONITOR="userfaultfd"
export NCCL_NCHANNELS_PER_NET_PEER="4"

# glaunch
export PYTHONPATH=/scratch/alice/glaunch/torch-ddp-20260101-000000-abcd/lib"${PYTHONPATH:+:$PYTHONPATH}"
export GLAUNCH_RUN_ID=torch-ddp-20260101-000000-abcd
export GLAUNCH_RUN_DIR=/scratch/alice/glaunch/torch-ddp-20260101-000000-abcd
export GLAUNCH_CHECKPOINT_DIR=/scratch/alice/glaunch/torch-ddp-20260101-000000-abcd/checkpoints
export GLAUNCH_CHECKPOINT_EVERY=10
export GLAUNCH_CHECKPOINT_KEEP=2
export GLAUNCH_STRATEGY=ddp
export GLAUNCH_PRECISION=bf16
export GLAUNCH_LAUNCHER=srun
export GLAUNCH_NODES=2
export GLAUNCH_RANKS_PER_NODE=4
export GLAUNCH_MICRO_BATCH=8
export GLAUNCH_GLOBAL_BATCH=64
export GLAUNCH_STOP_SIGNALS=USR2,TERM
export GLAUNCH_HPARAMS=/scratch/alice/glaunch/torch-ddp-20260101-000000-abcd/hparams.json
export GLAUNCH_JOB_ID="$SLURM_JOB_ID"
export GLAUNCH_RESTART="${SLURM_RESTART_COUNT:-0}"

# rendezvous
# SLURM_JOB_ID names the job here and in every task, and is a number below, where bash
# would evaluate any other text as an expression: stop unless it is a plain job id.
if [[ ! ${SLURM_JOB_ID:-} =~ ^[0-9]{1,18}$ ]]; then
    printf 'glaunch: SLURM_JOB_ID is not a Slurm job id: %q\n' "${SLURM_JOB_ID:-}" >&2
    return 1
fi
# The first host of the allocation (or of the node list given), by the address slurmctld
# reaches it at.
glaunch_first_host() {
    local host addr
    host=$(scontrol show hostnames "${1:-$SLURM_JOB_NODELIST}" | head -n 1)
    addr=$(scontrol show node "$host" 2>/dev/null | sed -n 's/.*NodeAddr=\([^ ]*\).*/\1/p' | head -n 1)
    printf '%s\n' "${addr:-$host}"
}
MASTER_ADDR=$(glaunch_first_host)
export MASTER_ADDR
# Derived from the job id and the start's number (a step started again in the allocation
# rendezvous on a port of its own), below the ephemeral range 32768-60999; job ids step by
# 1329, so a job's later starts miss its neighbours' ports. Only their digits
# reach the arithmetic, even if this file runs without the check above (a job id with none
# is then an arithmetic error, never a port); 10#: not octal.
glaunch_master_port() {
    local job=${SLURM_JOB_ID//[!0-9]/} start=${GLAUNCH_RESTART//[!0-9]/}
    job=${job:0:18} start=${start:0:9}
    printf '%s\n' "$(( 10000 + ((10#$job % 20000) * 1329 + 10#${start:-0}) % 20000 ))"
}
export MASTER_PORT
MASTER_PORT=$(glaunch_master_port)

"""Peer recovery (recovery.peer) on the local Slurm clusters (`defaults`; `main`, which counts
memory, for a hung rank 0): a 2-node DDP run of
one rank per node whose rank 1 (on the second node) raises inside its backward pass at step
FAIL_STEP, its peer waiting for it in the gradient all-reduce. The run goes on in the same
job step (one start), rank 1 gets rank 0's state across the nodes, at most the step in
flight is done again, no checkpoint is read (one was there), every rank's log says from
which peer, the ledger records it once and `glaunch status` counts it; the final
parameters are bitwise those of the same run uninterrupted (its ranks started directly
on this machine: one Slurm job only). The same for a rank whose process is lost, and for
rank 0 hung in its data, which ends itself. The failing example is test_peer_recovery's."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import RANK_VARS, requires_slurm
from launcher.rundir.layout import RunDir, read_heartbeat
from launcher.rundir.rankcontext import free_port
from slurmkit import DEFAULTS, MAIN, glaunch, read_json, submit
from test_peer_recovery import SCRIPT, recovery_lines, stop_all

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

# One rank per node (ONE_RANK_PER_NODE): a peer is always on another node.
NODES, PER_NODE = 2, 1
WORLD = NODES * PER_NODE
STEPS, FAIL_STEP, FAIL_RANK = 20, 8, 1
ARGS = ["--steps", str(STEPS), "--log-every", "5", "--seconds-per-step", "0.05"]
EXPERIMENT = f"""
name: peer-slurm
entrypoint:
  script: failing_ddp.py
  args: {json.dumps(ARGS)}
resources: {{nodes: {NODES}, gpus_per_node: {PER_NODE}, time: "00:10:00"}}
strategy: {{name: ddp}}
precision: fp32
batch: {{micro_size: 8}}
checkpoint: {{every_steps: 5, keep: 4}}
recovery: {{peer: true}}
env: {{FAIL_RANK: "{FAIL_RANK}", FAIL_STEP: "{FAIL_STEP}", FAIL_WHERE: backward}}
"""


def uninterrupted_sha256(folder: Path) -> str:
    """param_sha256 of the same script on WORLD ranks started here, no failure, no recovery.peer."""
    script = folder / "failing_ddp.py"
    run_dir = folder / "uninterrupted"
    run_dir.mkdir()
    port = free_port()
    procs = []
    for rank in range(WORLD):
        env = {k: v for k, v in os.environ.items() if k not in RANK_VARS and not k.startswith(("GLAUNCH_", "SLURM"))}
        env.update(PYTHONPATH=str(Path(__file__).resolve().parents[2]), OMP_NUM_THREADS="1", RANK=str(rank),
                   LOCAL_RANK=str(rank % PER_NODE), WORLD_SIZE=str(WORLD), LOCAL_WORLD_SIZE=str(PER_NODE),
                   GROUP_RANK=str(rank // PER_NODE), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   GLAUNCH_RUN_DIR=str(run_dir), GLAUNCH_CHECKPOINT_DIR=str(run_dir / "checkpoints"))
        procs.append(subprocess.Popen([sys.executable, str(script), *ARGS], env=env, cwd=run_dir,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outputs = [proc.communicate(timeout=300)[0] for proc in procs]
    finally:
        stop_all(procs)
    assert [proc.returncode for proc in procs] == [0] * WORLD, "\n".join(outputs)[-4000:]
    return read_json(run_dir / "result.json")["param_sha256"]


def joined_logs(run_dir: Path, pattern: str) -> str:
    folder = run_dir / "logs"
    return "\n".join(p.read_text(errors="replace") for p in sorted(folder.glob(pattern))) if folder.is_dir() else ""


@dataclass(frozen=True)
class PeerRun:
    run_dir: Path
    start: dict           # the run's one start, from run.json
    logs: str             # every rank's log
    batch: str            # the batch script's log


def submitted_peer_run(tmp_path: Path, experiment: str, env: dict[str, str], cluster: str = DEFAULTS) -> PeerRun:
    """SCRIPT run under `experiment` on `cluster`, after the same script uninterrupted here. It must end
    in one completed start (no restart, no requeue), not resumed from a checkpoint, with the final
    parameters of the uninterrupted run."""
    (tmp_path / "failing_ddp.py").write_text(SCRIPT)
    (tmp_path / "peer.yaml").write_text(experiment)
    expected = uninterrupted_sha256(tmp_path)

    proc, info = submit(str(tmp_path / "peer.yaml"), tmp_path / "runs", env, cluster=cluster)
    run_dir = tmp_path / "runs" / str(info.get("run_id"))
    logs, batch = joined_logs(run_dir, "*_log.*"), joined_logs(run_dir, "*_batch.log")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:] + batch[-3000:] + logs[-4000:]

    record = read_json(run_dir / "run.json")
    (start,) = record["starts"]
    assert record["state"] == start["state"] == "COMPLETED", record
    assert start.get("resumed_from") is None, start
    assert read_json(run_dir / "result.json")["param_sha256"] == expected
    return PeerRun(run_dir, start, logs, batch)


def test_a_rank_that_raises_on_the_second_node_is_restored_from_a_peer_in_the_same_job(tmp_path,
                                                                                       slurm_defaults_env):
    run = submitted_peer_run(tmp_path, EXPERIMENT, slurm_defaults_env)
    run_dir, start, logs = run.run_dir, run.start, run.logs

    # Every rank says it, with the peer; the step in flight is done again, nothing more.
    lines = recovery_lines(logs)
    assert len(lines) == WORLD, logs[-4000:]
    for line in lines:
        assert (f"failed rank(s) {FAIL_RANK}; state of step {FAIL_STEP - 1} from rank 0 to rank(s) {FAIL_RANK}; "
                f"the ranks go on at step {FAIL_STEP}") in line and "no checkpoint read" in line, line
    assert "resumed from" not in logs
    assert (run_dir / "checkpoints" / "step-00000005").is_dir()     # there to read, and not read

    (entry,) = (json.loads(line) for line in (run_dir / "peer-recoveries.jsonl").read_text().splitlines())
    assert (entry["rank"], entry["source"], entry["failed"], entry["lost_steps"]) == (FAIL_RANK, 0, [FAIL_RANK], 1)
    assert entry["job_id"] == start["job_id"] and entry["restart"] == 0 and entry["next_step"] == FAIL_STEP
    # Across the nodes: rank 0, the source, beat on the first node, the failed rank on the other.
    nodes = {rank: (read_heartbeat(path) or {}).get("node") for rank, path in RunDir(run_dir).heartbeats()}
    assert len(set(nodes.values())) == NODES and entry["world_size"] == WORLD, nodes
    assert entry["node"] == nodes[FAIL_RANK] != nodes[0], (entry, nodes)

    status = json.loads(glaunch("status", str(run_dir), "--json", env=slurm_defaults_env, cluster=DEFAULTS).stdout)
    road = status["goodput"]["peer_recoveries"]
    assert (road["recoveries"], road["lost_steps"], road["checkpoint_reads"]) == (1, 1, 0), road
    assert status["restarts"] == 0 and len(status["starts"]) == 1
    took = re.search(r"no checkpoint read; ([0-9.]+) s", lines[0])
    print(f"rank {FAIL_RANK} on {entry['node']} failed at step {FAIL_STEP}; state from rank 0; failure -> end of "
          f"step {entry['next_step']} {entry['to_next_step_s']:.3f} s (recovery {took.group(1) if took else '?'} s)")


LOST_EXPERIMENT = EXPERIMENT.replace("FAIL_WHERE: backward", "FAIL_WHERE: exit").replace("name: peer-slurm",
                                                                                          "name: peer-lost")
# Rank 0 hangs in its data instead (nothing raises); the watchdog's floor lowered to 20 s, so
# its peer waits 10 s before it ends itself. Rank 0 is its node's only task: the step's end
# there ends every process the step started on that node, so the rendezvous store is the job
# controller's, beside the step (launcher.storeprocess).
HUNG_RANK = 0
HUNG_EXPERIMENT = (LOST_EXPERIMENT.replace("FAIL_WHERE: exit", "FAIL_WHERE: hang").replace("name: peer-lost",
                                                                                            "name: peer-hung")
                   .replace(f'FAIL_RANK: "{FAIL_RANK}"', f'FAIL_RANK: "{HUNG_RANK}"')
                   + "watchdog: {auto_floor_s: 20}\n")


@requires_slurm
def test_a_hung_rank_0_ends_itself_is_started_again_and_gets_a_peers_state_in_the_same_job(tmp_path, isolated_env):
    """Rank 0 hangs in its data at step FAIL_STEP on the first node while its peer waits for
    it in the gradient all-reduce: after half the hang bound it ends its own process, its
    peer goes on waiting (srun --kill-on-bad-exit=0 for recovery.peer) through the store that
    outlives it, rank 1 asks for it, the job controller starts it again on its node in a
    step of its own (srun --overlap), the new process joins, gets rank 1's state and the run
    ends in the same job and start, the watchdog never ending the step, with the parameters
    of the uninterrupted run. On `main`, whose Slurm counts memory (CR_Core_Memory): the
    running step holds the job's memory on the node, which the new step shares (--mem=0)."""
    assert f'FAIL_RANK: "{HUNG_RANK}"' in HUNG_EXPERIMENT and "FAIL_WHERE: hang" in HUNG_EXPERIMENT
    assert "auto_floor_s: 20" in HUNG_EXPERIMENT
    run = submitted_peer_run(tmp_path, HUNG_EXPERIMENT, isolated_env, cluster=MAIN)
    run_dir, start, logs, batch = run.run_dir, run.start, run.logs, run.batch
    assert start["exit_code"] == 0 and "hang" not in start, start
    held = re.search(r"have waited ([0-9]+) s for this rank in its step \(half the hang bound of "
                     r"([0-9.]+) s\)", logs)
    assert held and float(held.group(1)) >= float(held.group(2)) / 2, logs[-4000:]
    # srun's status was the ended task's; its new process ended well, and so the step.
    assert f"task {HUNG_RANK}: Exited with exit code 75" in batch and "the step's is 0" in batch, batch[-3000:]
    assert f"rank {HUNG_RANK}'s process is lost: starting it again on" in batch, batch[-3000:]
    assert "the step's rendezvous store (recovery.peer) listens here" in batch, batch[-3000:]

    # The new process of rank 0 writes on in rank 0's log: it received rank 1's state.
    (own_log,) = (p for p in (run_dir / "logs").glob(f"{start['job_id']}_{HUNG_RANK}_log.err"))
    own = recovery_lines(own_log.read_text(errors="replace"))
    assert len(own) == 1 and (f"state of step {FAIL_STEP - 1} from rank 1 to rank(s) {HUNG_RANK}; the ranks go on "
                              f"at step {FAIL_STEP}") in own[0] and "(received it)" in own[0], own
    assert "lost their process and were started again" in own[0] and "no checkpoint read" in own[0]
    lines = recovery_lines(logs)
    assert len(lines) == WORLD, logs[-4000:]                 # the survivor and the new process
    assert "resumed from" not in logs and (run_dir / "checkpoints" / "step-00000005").is_dir()

    (entry,) = (json.loads(line) for line in (run_dir / "peer-recoveries.jsonl").read_text().splitlines())
    # The entry names the lost rank and its replacement's account, not the source's loss of it.
    assert (entry["rank"], entry["source"], entry["failed"], entry["replaced"], entry["lost_steps"]) == \
        (HUNG_RANK, 1, [HUNG_RANK], [HUNG_RANK], 1), entry
    assert entry["error"] == "process lost; started again" and entry["node"], entry
    hung_at = read_json(run_dir / f"peer-times-{HUNG_RANK}.json")["failed_at"]
    again = read_json(run_dir / f"peer-times-{HUNG_RANK}-started-again.json")
    to_next = again["step_ends"][0] - hung_at
    print(f"rank {HUNG_RANK} hung at step {FAIL_STEP} (bound {held.group(2)} s): ended itself after its peers "
          f"waited {held.group(1)} s; its new process ended step {FAIL_STEP} {to_next:.2f} s after the hang began; "
          f"rank 1: its loss -> the end of step {entry['next_step']} {entry['to_next_step_s']:.2f} s")


SPARE_EXPERIMENT = (LOST_EXPERIMENT.replace("name: peer-lost", "name: peer-spare")
                    .replace(f"resources: {{nodes: {NODES},", f"resources: {{nodes: {NODES}, spare_nodes: 1,")
                    .replace("FAIL_WHERE: exit", "FAIL_WHERE: exit, FAIL_TIMES: \"2\""))


def test_a_rank_lost_again_where_it_was_started_again_moves_to_the_spare_node(tmp_path, slurm_defaults_env):
    """Rank 1's process is lost at step FAIL_STEP, and its new process, on the same node, is
    lost again at the same step: the third is started on the allocation's spare node (one
    none of them ran on), joins, and the run ends in the same job and start with the
    parameters of the uninterrupted run."""
    assert "spare_nodes: 1" in SPARE_EXPERIMENT and "FAIL_TIMES" in SPARE_EXPERIMENT
    run = submitted_peer_run(tmp_path, SPARE_EXPERIMENT, slurm_defaults_env)
    run_dir, batch = run.run_dir, run.batch
    first = re.search(rf"rank {FAIL_RANK}'s process is lost: starting it again on (\S+) to join generation 1", batch)
    moved = re.search(rf"rank {FAIL_RANK}'s process is lost: starting it again on the spare node (\S+) \(it was lost again "
                      r"on (\S+)\) to join generation 2", batch)
    assert first and moved, batch[-4000:]
    assert moved.group(2) == first.group(1) != moved.group(1), (first.group(0), moved.group(0))
    entries = [json.loads(line) for line in (run_dir / "peer-recoveries.jsonl").read_text().splitlines()]
    assert [(e["failed"], e["replaced"]) for e in entries] == [([FAIL_RANK], [FAIL_RANK])] * 2, entries
    # The last process of the lost rank beat from the spare node.
    nodes = {rank: (read_heartbeat(path) or {}).get("node") for rank, path in RunDir(run_dir).heartbeats()}
    assert nodes[FAIL_RANK] == moved.group(1), nodes
    print(f"rank {FAIL_RANK} lost on {first.group(1)}, started again there, lost again: moved to the spare node "
          f"{moved.group(1)}; one start, bitwise")


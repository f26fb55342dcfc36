"""A plain Lightning script's own save at the time limit's warning (Lightning's SLURM
auto-requeue), warned while its ranks are at different points of a step: with glaunch's
callback (launcher.runtime.lightning_warning, added through Lightning's entry point) every
rank saves at the same step boundary.

The two ranks run as srun would start them: Lightning's real SLURMEnvironment, read from
the SLURM_* variables the test sets (no Slurm job); `scontrol` is a stand-in that records the
requeue Lightning asks for. The warning comes as Slurm sends it, to every task, while rank 0
waits in the step's gradient all-reduce for rank 1, which is late in its forward pass."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning")

from launcher.rundir.rankcontext import free_port
from launcher.runtime import lightning_warning

REPO = Path(__file__).resolve().parents[2]
WARNED_AT = 3
STEPS = 6

PLAIN_SCRIPT = f"""
import os, signal, sys, time
from pathlib import Path
import torch
from torch.utils.data import DataLoader
from lightning.pytorch import LightningModule, Trainer

root = Path(sys.argv[1])

class Model(LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        if self.global_step == {WARNED_AT} and self.global_rank == 1:
            # Late at this step: rank 0 already waits in the gradient all-reduce when the
            # warning reaches every task.
            time.sleep(2)
            for pid_file in sorted(root.glob("pid-*")):
                os.kill(int(pid_file.read_text()), signal.SIGUSR1)
        print(f"step {{self.global_step}}", flush=True)
        return self.layer(batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.layer.parameters(), lr=0.1)

(root / f"pid-{{os.environ['SLURM_PROCID']}}").write_text(str(os.getpid()))
torch.manual_seed(0)
data = DataLoader(torch.randn(64, 8), batch_size=2)
trainer = Trainer(default_root_dir=root, accelerator="cpu", devices=2, num_nodes=1, strategy="ddp",
                  max_steps={STEPS}, limit_val_batches=0, num_sanity_val_steps=0, logger=False,
                  enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Model(), train_dataloaders=data)
print("trained", flush=True)
"""


def run_ranks(tmp_path: Path, under_glaunch: bool) -> tuple[list[subprocess.CompletedProcess], Path, Path]:
    root = tmp_path / "root"
    root.mkdir()
    stand_in = tmp_path / "bin"
    stand_in.mkdir()
    requeues = tmp_path / "scontrol-calls"
    (stand_in / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {requeues}\n')
    (stand_in / "scontrol").chmod(0o755)
    script = tmp_path / "plain.py"
    script.write_text(PLAIN_SCRIPT)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "GLAUNCH_"))}
    env.update(PATH=f"{stand_in}:{env['PATH']}", PYTHONPATH=str(REPO), MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()), SLURM_JOB_ID="4242", SLURM_JOB_NAME="plain", SLURM_NTASKS="2",
               SLURM_NTASKS_PER_NODE="2", SLURM_NNODES="1", SLURM_NODEID="0", SLURM_NODELIST="127.0.0.1")
    if under_glaunch:
        env["GLAUNCH_RUN_DIR"] = str(tmp_path)
    ranks = [subprocess.Popen([sys.executable, str(script), str(root)], env=dict(env, SLURM_PROCID=str(rank),
                                                                                SLURM_LOCALID=str(rank)),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for rank in range(2)]
    done = []
    for rank in ranks:
        try:
            out, err = rank.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for other in ranks:
                other.kill()
            out, err = rank.communicate()
        done.append(subprocess.CompletedProcess(rank.args, rank.returncode, out, err))
    return done, root, requeues


def test_a_rank_warned_mid_step_saves_with_its_peers_at_the_next_step_boundary(tmp_path):
    import torch

    ranks, root, requeues = run_ranks(tmp_path, under_glaunch=True)
    for rank in ranks:
        assert rank.returncode == 0 and "trained" in rank.stdout, rank.stdout[-2000:] + rank.stderr[-3000:]
    # Saved once, by every rank at the end of the warned step's batch; then the requeue asked.
    (saved,) = root.glob("hpc_ckpt_*.ckpt")
    assert torch.load(saved, weights_only=False)["global_step"] == WARNED_AT + 1
    assert requeues.read_text().split() == ["requeue", "4242"]


def test_the_callback_does_nothing_outside_a_glaunch_run_or_where_lightning_does_not_requeue(monkeypatch):
    monkeypatch.delenv("GLAUNCH_RUN_DIR", raising=False)
    assert lightning_warning.lightning_callbacks() == []
    monkeypatch.setenv("GLAUNCH_RUN_DIR", "/nonexistent")
    (callback,) = lightning_warning.lightning_callbacks()

    class Trainer:
        class strategy:
            cluster_environment = type("LightningEnvironment", (), {})()
    callback.on_train_start(Trainer, None)
    assert callback.lightning_handler is None
    Trainer.strategy.cluster_environment = type("SLURMEnvironment", (), {"auto_requeue": False})()
    callback.on_train_start(Trainer, None)
    assert callback.lightning_handler is None

# Vendored for glaunch's tests from Lightning-AI/pytorch-lightning (Apache License 2.0, see
# LICENSE beside this file), examples/pytorch/bug_report/bug_report_model.py at commit
# 7f0c3436cd3f6ad3753125672024fc415cbcb414, run unchanged but for:
#   1. these header lines;
#   2. `import sys, time`;
#   3. training_step prints its step and sleeps 0.5 s (progress to follow, time to be warned in);
#   4. the Trainer: 2 nodes x 1 CPU device over DDP, its root dir and number of epochs (one
#      training batch each) from the command line: `bug_report_model.py ROOT_DIR EPOCHS`.
import os
import sys
import time

import torch
from torch.utils.data import DataLoader, Dataset

from lightning.pytorch import LightningModule, Trainer


class RandomDataset(Dataset):
    def __init__(self, size, length):
        self.len = length
        self.data = torch.randn(length, size)

    def __getitem__(self, index):
        return self.data[index]

    def __len__(self):
        return self.len


class BoringModel(LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(32, 2)

    def forward(self, x):
        return self.layer(x)

    def training_step(self, batch, batch_idx):
        loss = self(batch).sum()
        print(f"step {self.global_step}", flush=True)
        time.sleep(0.5)
        self.log("train_loss", loss)
        return {"loss": loss}

    def validation_step(self, batch, batch_idx):
        loss = self(batch).sum()
        self.log("valid_loss", loss)

    def test_step(self, batch, batch_idx):
        loss = self(batch).sum()
        self.log("test_loss", loss)

    def configure_optimizers(self):
        return torch.optim.SGD(self.layer.parameters(), lr=0.1)


def run():
    train_data = DataLoader(RandomDataset(32, 64), batch_size=2)
    val_data = DataLoader(RandomDataset(32, 64), batch_size=2)
    test_data = DataLoader(RandomDataset(32, 64), batch_size=2)

    model = BoringModel()
    trainer = Trainer(
        default_root_dir=sys.argv[1] if len(sys.argv) > 1 else os.getcwd(),
        accelerator="cpu",
        devices=1,
        num_nodes=2,
        strategy="ddp",
        limit_train_batches=1,
        limit_val_batches=1,
        limit_test_batches=1,
        num_sanity_val_steps=0,
        max_epochs=int(sys.argv[2]) if len(sys.argv) > 2 else 1,
        enable_model_summary=False,
    )
    trainer.fit(model, train_dataloaders=train_data, val_dataloaders=val_data)
    trainer.test(model, dataloaders=test_data)


if __name__ == "__main__":
    run()

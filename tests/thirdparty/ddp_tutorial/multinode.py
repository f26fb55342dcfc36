# Vendored for glaunch's tests from pytorch/examples (BSD-3-Clause licence, see LICENSE beside
# this file), distributed/ddp-tutorial-series/multinode.py at commit
# 77f55b912142e11fcfdf5b530231fb9c52f181e8, run unchanged but for:
#   1. these header lines;
#   2. ddp_setup: the CUDA device is set only where there is CUDA, and the backend is gloo
#      without it (the tutorial's nccl needs GPUs);
#   3. Trainer: without CUDA the model, batches and snapshot go to "cpu" (where the tutorial
#      uses the local rank as a CUDA device), and DDP gets no device_ids;
#   4. a --snapshot_path option (default the tutorial's "snapshot.pt"), passed to main();
#   5. after destroy_process_group() a rank flushes its output and leaves with os._exit(0):
#      under torch 2.13 with gloo across two torchrun agents, the interpreter's finalization
#      after training aborts a rank now and then ("terminate called without an active
#      exception", SIGABRT; 2 runs in 6 of plain torchrun on two agents without glaunch);
#   6. each epoch ends with a 1 s sleep (and `import time`): glaunch's test runs it past a
#      1-minute time limit, which its epochs alone, at a batch size of 32, would need a
#      minute of every CPU here to reach.
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset, DataLoader
from datautils import MyTrainDataset

import torch.multiprocessing as mp
from torch.utils.data.distributed import DistributedSampler
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.distributed import init_process_group, destroy_process_group
import os
import time


def ddp_setup():
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")

class Trainer:
    def __init__(
        self,
        model: torch.nn.Module,
        train_data: DataLoader,
        optimizer: torch.optim.Optimizer,
        save_every: int,
        snapshot_path: str,
    ) -> None:
        self.local_rank = int(os.environ["LOCAL_RANK"]) if torch.cuda.is_available() else "cpu"
        self.global_rank = int(os.environ["RANK"])
        self.model = model.to(self.local_rank)
        self.train_data = train_data
        self.optimizer = optimizer
        self.save_every = save_every
        self.epochs_run = 0
        self.snapshot_path = snapshot_path
        if os.path.exists(snapshot_path):
            print("Loading snapshot")
            self._load_snapshot(snapshot_path)

        self.model = DDP(self.model, device_ids=[self.local_rank] if torch.cuda.is_available() else None)

    def _load_snapshot(self, snapshot_path):
        loc = f"cuda:{self.local_rank}" if torch.cuda.is_available() else "cpu"
        snapshot = torch.load(snapshot_path, map_location=loc)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"]
        print(f"Resuming training from snapshot at Epoch {self.epochs_run}")

    def _run_batch(self, source, targets):
        self.optimizer.zero_grad()
        output = self.model(source)
        loss = F.cross_entropy(output, targets)
        loss.backward()
        self.optimizer.step()

    def _run_epoch(self, epoch):
        b_sz = len(next(iter(self.train_data))[0])
        print(f"[GPU{self.global_rank}] Epoch {epoch} | Batchsize: {b_sz} | Steps: {len(self.train_data)}")
        self.train_data.sampler.set_epoch(epoch)
        for source, targets in self.train_data:
            source = source.to(self.local_rank)
            targets = targets.to(self.local_rank)
            self._run_batch(source, targets)
        time.sleep(1)

    def _save_snapshot(self, epoch):
        snapshot = {
            "MODEL_STATE": self.model.module.state_dict(),
            "EPOCHS_RUN": epoch,
        }
        torch.save(snapshot, self.snapshot_path)
        print(f"Epoch {epoch} | Training snapshot saved at {self.snapshot_path}")

    def train(self, max_epochs: int):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if self.global_rank == 0 and epoch % self.save_every == 0:
                self._save_snapshot(epoch)


def load_train_objs():
    train_set = MyTrainDataset(2048)  # load your dataset
    model = torch.nn.Linear(20, 1)  # load your model
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    return train_set, model, optimizer


def prepare_dataloader(dataset: Dataset, batch_size: int):
    return DataLoader(
        dataset,
        batch_size=batch_size,
        pin_memory=True,
        shuffle=False,
        sampler=DistributedSampler(dataset)
    )


def main(save_every: int, total_epochs: int, batch_size: int, snapshot_path: str = "snapshot.pt"):
    ddp_setup()
    dataset, model, optimizer = load_train_objs()
    train_data = prepare_dataloader(dataset, batch_size)
    trainer = Trainer(model, train_data, optimizer, save_every, snapshot_path)
    trainer.train(total_epochs)
    destroy_process_group()
    print(end="", flush=True)
    os._exit(0)


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description='simple distributed training job')
    parser.add_argument('total_epochs', type=int, help='Total epochs to train the model')
    parser.add_argument('save_every', type=int, help='How often to save a snapshot')
    parser.add_argument('--batch_size', default=32, type=int, help='Input batch size on each device (default: 32)')
    parser.add_argument('--snapshot_path', default="snapshot.pt", type=str)
    args = parser.parse_args()

    main(args.save_every, args.total_epochs, args.batch_size, args.snapshot_path)

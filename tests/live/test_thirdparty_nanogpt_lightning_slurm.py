"""nanoGPT's train.py and Lightning's bug-report model (tests/thirdparty), brought as a user
would bring them, on the cluster `main`: 2 nodes on the CPU over gloo.

nanoGPT runs under `launcher: torchrun` with its own config overrides as arguments, writes
into its run (`--out_dir=${run:dir}/out`), reports progress through its "iter N:" lines
(entrypoint.progress) and checkpoints by itself. After its first checkpoint a job of the
`urgent` partition preempts it (Slurm requeues it); the next start gets
`entrypoint.resume_args` (`--init_from=resume`) and goes on from that checkpoint. A second
run from the same folder has outputs of its own.

The plain Lightning script (Trainer(num_nodes=2, devices=1, strategy="ddp")) gets SIGUSR1
ahead of a 2-minute limit (late enough that its handler is in place on a busy machine): Lightning's SLURM environment saves hpc_ckpt_1.ckpt and requeues
the job itself, once; the next start resumes from it.
"""

from __future__ import annotations

import hashlib
import pickle
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import requires_slurm
from launcher.rundir.layout import RunDir
from slurmkit import SITE, final_sacct_state, finish, job_id_of, out, preempt, read_json, sacct_rows, wait_until
from test_thirdparty_scripts_slurm import ConsoleInFiles, new_run_dir, project, rank0_step, still_running

pytestmark = [pytest.mark.slurm, pytest.mark.slow, requires_slurm]


def start_console(folder: Path, env, *overrides: str, name: str = "console") -> subprocess.Popen:
    """`glaunch submit --wait` on `main` from the project's folder (the ranks' working
    directory), its console in `name`.out beside the folder."""
    return ConsoleInFiles([sys.executable, "-m", "launcher.cli", "submit", "--wait", "exp.yaml", "--site", SITE,
                           "--runs-dir", "runs", *overrides], folder, env, name)


def no_traceback(console: str, err: str) -> None:
    for text in (console, err):
        assert "ChildFailedError" not in text and "Traceback" not in text, text[-3000:]


# --- nanoGPT's train.py, under torchrun ----------------------------------------------------------

MAX_ITERS, EVAL_INTERVAL = 1500, 250
NANOGPT = f"""name: nanogpt
entrypoint:
  script: train.py
  args: ["--dataset=tiny", "--device=cpu", "--backend=gloo", "--compile=False", "--dtype=float32",
         "--n_layer=2", "--n_head=2", "--n_embd=64", "--block_size=64", "--batch_size=8",
         "--gradient_accumulation_steps=4", "--eval_iters=2", "--max_iters=${{hparams.max_iters}}",
         "--eval_interval=${{hparams.eval_interval}}", "--out_dir=${{run:dir}}/out"]
  resume_args: ["--init_from=resume"]
  progress: {{pattern: '^iter (\\d+):', total: {MAX_ITERS}}}
hparams: {{max_iters: {MAX_ITERS}, eval_interval: {EVAL_INTERVAL}}}
launcher: torchrun
resources: {{nodes: 2, time: "00:10:00"}}
requeue: {{max: 3}}
"""


def tiny_char_dataset(folder: Path) -> None:
    """nanoGPT's data/<dataset>/{train,val}.bin and meta.pkl (as its prepare.py of
    shakespeare_char writes them), from a few sentences: read relative to the ranks'
    working directory, the folder the run was submitted from."""
    text = "the quick brown fox jumps over the lazy dog; pack my box with five dozen liquor jugs.\n" * 100
    chars = sorted(set(text))
    ids = np.array([chars.index(c) for c in text], dtype=np.uint16)
    data = folder / "data" / "tiny"
    data.mkdir(parents=True)
    split = int(len(ids) * 0.9)
    ids[:split].tofile(data / "train.bin")
    ids[split:].tofile(data / "val.bin")
    (data / "meta.pkl").write_bytes(pickle.dumps({"vocab_size": len(chars)}))


def iterations(console: str) -> list[int]:
    return [int(n) for n in re.findall(r"\biter (\d+): loss", console)]


def resumed_at(steps: list[int]) -> int:
    """The first step of a start that went back (a resume): where it went on from."""
    drops = [after for before, after in zip(steps, steps[1:]) if after <= before]
    assert len(drops) == 1, steps
    return drops[0]


def checkpoint_iter(path: Path) -> int:
    return int(torch.load(path, map_location="cpu", weights_only=False)["iter_num"])


def written_checkpoint(path: Path) -> int:
    """The iteration of nanoGPT's checkpoint; -1 before one (or while it is being written)."""
    try:
        return checkpoint_iter(path)
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError):
        return -1


@pytest.mark.release_only     # on Slurm 24.11, whose clusters are idle most of the run
def test_nanogpt_preempted_resumes_through_resume_args(tmp_path, isolated_env):
    folder = project(tmp_path, "nanogpt", NANOGPT)
    tiny_char_dataset(folder)
    runs = folder / "runs"
    proc = start_console(folder, isolated_env)
    first = new_run_dir(runs, set())
    job = job_id_of(first)
    ckpt = first / "out" / "ckpt.pt"

    # Preempted once a checkpoint is written and training went on past it: the `urgent`
    # partition's job takes both nodes and Slurm requeues this one.
    def checkpointed():
        return 0 < written_checkpoint(ckpt) < rank0_step(first)
    wait_until(still_running(proc, checkpointed), 600, "a checkpoint of the first start", interval=1)
    saved = checkpoint_iter(ckpt)
    preempt()
    code, console, err = finish(proc, job, 900)
    assert code == 0, console[-3000:] + err[-3000:]

    record = read_json(first / "run.json")
    assert record["state"] == "COMPLETED" and len(record["starts"]) >= 2, record["starts"]
    assert record["starts"][0]["state"] == "REQUEUED" and record["starts"][0]["reason"] == "preemption", \
        record["starts"][0]
    # The second start got --init_from=resume: it loaded its own run's checkpoint and went on
    # from the iteration it held (the first start's checkpoint at the preemption, or later).
    assert f"Resuming training from {first}/out" in console, console[-3000:]
    steps = iterations(console)
    again = resumed_at(steps)
    assert again >= saved > 0 and again % EVAL_INTERVAL == 0, (saved, again)
    assert steps[-1] == MAX_ITERS and checkpoint_iter(ckpt) == MAX_ITERS
    # Progress from its own lines on the console; a preemption, not a crash.
    assert re.search(rf"\[glaunch\] RUNNING \| (start 1 \| )?step \d+/{MAX_ITERS}", console), console[-3000:]
    no_traceback(console, err)

    # A second run from the same folder writes its own checkpoint and leaves the first's alone.
    kept = hashlib.sha256(ckpt.read_bytes()).hexdigest()
    second_proc = start_console(folder, isolated_env, "hparams.max_iters=20", "hparams.eval_interval=10",
                                name="second")
    second = new_run_dir(runs, {first})
    code, console, err = finish(second_proc, job_id_of(second), 600)
    assert code == 0, console[-3000:] + err[-3000:]
    assert "Initializing a new model from scratch" in console and "Resuming training" not in console
    assert checkpoint_iter(second / "out" / "ckpt.pt") == 20
    assert hashlib.sha256(ckpt.read_bytes()).hexdigest() == kept
    assert not (folder / "out").exists()


# --- Lightning's bug-report model, plain (no glaunch runtime) --------------------------------------

# 0.5 s a step: more steps than a 2-minute start can run (240 at most), so the limit's warning
# comes first.
EPOCHS = 300
LIGHTNING = f"""name: lightning-bug-report
entrypoint:
  script: bug_report_model.py
  args: ["${{run:dir}}/lightning", "{EPOCHS}"]
  progress: {{pattern: '\\bstep (\\d+)$', total: {EPOCHS - 1}}}
resources: {{nodes: 2, gpus_per_node: 1, time: "2"}}
requeue: {{max: 3, signal_lead_s: 5, mode: requeue}}
"""


def requeues(job_id: str) -> int:
    """How often Slurm has requeued the job (`scontrol show job`'s Restarts)."""
    shown = re.search(r"\bRestarts=(\d+)", out("scontrol", "show", "job", job_id))
    return int(shown.group(1)) if shown else 0


def logged_steps(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"\bstep (\d+)$", text, re.M)]


def test_plain_lightning_saves_at_the_warning_and_resumes(tmp_path, isolated_env):
    folder = project(tmp_path, "lightning_bug_report", LIGHTNING)
    runs = folder / "runs"
    proc = start_console(folder, isolated_env)
    run_dir = new_run_dir(runs, set())
    job = job_id_of(run_dir)
    root = run_dir / "lightning"
    try:
        # The limit's warning (SIGUSR1, 85 to 115 s into the start: Slurm looks at time
        # limits every 30 s, and warns at the first look within 30 s of the lead): Lightning saves
        # hpc_ckpt_1.ckpt and requeues the job itself. On a busy machine its requeue may come
        # after the limit: then the limit ends the step and glaunch's controller requeues the
        # same job (requeue.mode requeue; requeue.max allows it). Either way, one requeue.
        wait_until(still_running(proc, lambda: requeues(job) >= 1), 300, "the first start's requeue",
                   interval=0.5)
        saved_at_warning = (root / "hpc_ckpt_1.ckpt").is_file()
        # Its next start, with the limit raised, finishes unwarned: one warning, one requeue.
        out("scontrol", "update", f"JobId={job}", "TimeLimit=10")
        code, console, err = finish(proc, job, 600)
    finally:
        if proc.poll() is None:
            proc.kill()
            subprocess.run(["scancel", job, str(read_json(run_dir / "run.json").get("job_id"))],
                           capture_output=True, timeout=60)
    assert code == 0, console[-3000:] + err[-3000:]

    record = read_json(run_dir / "run.json")
    assert record["state"] == "COMPLETED", record
    assert [s["state"] for s in record["starts"]] == ["REQUEUED", "COMPLETED"], record["starts"]
    assert final_sacct_state(job) == "COMPLETED"
    assert [r["state"] for r in sacct_rows(job)] == ["REQUEUED", "COMPLETED"]
    logs = RunDir(run_dir)
    errors = logs.task_log(job, 0, "err").read_text(errors="replace")
    steps = logged_steps(logs.task_log(job, 0, "out").read_text(errors="replace"))
    if not saved_at_warning:
        # Lightning's save runs at the first training batch's end after the warning, on every
        # rank together (glaunch's callback, launcher.runtime.lightning_warning; run without
        # it, a rank warned in its forward pass enters the save's barrier while a peer waits in
        # the gradient all-reduce: tests/runtime/test_lightning_warning.py). The warning comes
        # 5 to 35 s before the limit: on a loaded machine the limit may still come first. Then
        # it is the start's end: glaunch's controller requeues the job (a timeout), and the
        # next start, with no checkpoint of Lightning's, trains from the beginning to the end.
        warned = all("Bypassing signal SIGCONT" in logs.task_log(job, rank, "err").read_text(errors="replace")
                     for rank in range(2))       # Slurm's warning: SIGCONT, then SIGUSR1, to every task
        assert warned and record["starts"][0]["reason"] == "timeout", (record["starts"][0], errors[-3000:])
        assert not list(root.glob("hpc_ckpt_*.ckpt")) and steps[-1] == EPOCHS - 1, steps[-5:]
        assert "Restoring states from the checkpoint path" not in errors, errors[-3000:]
        print("Lightning's handler did not save before the limit; "
              "the limit requeued the job and the next start trained from the beginning")
        no_traceback(console, err)
        return
    assert sorted(p.name for p in root.glob("hpc_ckpt_*.ckpt")) == ["hpc_ckpt_1.ckpt"]
    saved = torch.load(root / "hpc_ckpt_1.ckpt", map_location="cpu", weights_only=False)["global_step"]
    assert len(re.findall(r"Handling auto-requeue signal: (?:10|Signals\.SIGUSR1)\b", errors)) == 1, errors[-3000:]
    # Who requeued: Lightning, or (its requeue too late for the limit) glaunch at the timeout.
    # Lightning logs its requeue after scontrol returns, by when the requeue may have ended
    # its process: slurmstepd's line in the first start's part of the batch log (before its
    # end; glaunch's own requeue writes one after it) says the job was requeued, and the
    # start reads as requeued by someone, not as a preemption nor as the time limit.
    by_lightning = errors.count(f"Requeued SLURM job: {job}")
    batch = logs.batch_log(job).read_text(errors="replace")
    first_start = batch.split(f"glaunch: start 0 of job {job} ended", 1)[0]
    requeued = re.search(rf"\*\*\* JOB {job} ON \S+ CANCELLED AT .* DUE TO JOB REQUEUE \*\*\*", first_start) is not None
    reason = record["starts"][0]["reason"]
    assert reason == ("requeued" if requeued else "timeout") and (by_lightning == 0 or requeued), \
        (record["starts"][0], batch, errors[-3000:])
    assert f"Restoring states from the checkpoint path at {root}/hpc_ckpt_1.ckpt" in errors, errors[-3000:]
    assert 0 < saved < EPOCHS - 1 and sorted(set(steps)) == list(range(EPOCHS)) and steps[-1] == EPOCHS - 1, \
        (saved, steps)
    # The second start goes on from the saved step: back to it where the first start logged
    # steps past its save before the requeue ended it, else right after its last step.
    drops = [after for before, after in zip(steps, steps[1:]) if after <= before]
    assert drops == [saved] or (drops == [] and steps == list(range(EPOCHS))), (saved, steps)
    no_traceback(console, err)

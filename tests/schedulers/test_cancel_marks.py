"""`glaunch cancel` of a sweep marks each element it ends where the element lives (its
cancel file, under run.json's lock) before the one scancel: each element's job controller
then ends its start as cancelled, where a start Slurm ended would be requeued."""

from __future__ import annotations

import subprocess
from pathlib import Path

from launcher.jobcontrol.jobend import record_successor
from launcher.rundir import registry
from launcher.rundir.records import RunRecord
from launcher.schedulers.slurm.scheduler import SlurmScheduler


class Scancel:
    def __init__(self) -> None:
        self.calls: list[tuple[str, ...]] = []

    def call(self, *cmd, **_):
        self.calls.append(cmd)
        return subprocess.CompletedProcess(list(cmd), 0, "", "")


def element(root: Path, name: str, job_id: str, state: str) -> tuple[Path, RunRecord]:
    run_dir = root / name
    (run_dir / "logs").mkdir(parents=True)
    record = RunRecord.from_dict({"run_id": name, "scheduler": "slurm", "state": state, "job_id": job_id,
                                  "starts": [{"job_id": job_id, "restart": 0, "state": state}]})
    registry.write(run_dir, record)
    return run_dir, record


def test_a_sweep_s_cancel_marks_each_live_element_with_its_own_job_then_cancels_once(tmp_path):
    running = element(tmp_path, "e0", "2701_0", "RUNNING")
    resubmitted = element(tmp_path, "e1", "2710", "PENDING")     # left its array at the time limit
    ended = element(tmp_path, "e2", "2701_2", "COMPLETED")
    slurm = Scancel()
    said = SlurmScheduler(slurm).cancel_many([running, resubmitted, ended], ["2701"])
    assert slurm.calls == [("scancel", "2701", "2710")]
    assert said == ["cancelled job 2701", "cancelled job 2710"]
    assert (running[0] / "cancel-requested").read_text() == "2701_0\n"
    assert (resubmitted[0] / "cancel-requested").read_text() == "2710\n"
    assert not (ended[0] / "cancel-requested").exists()
    # The element's job, ending at its time limit meanwhile, resubmits nothing.
    assert not record_successor(running[0], "2720", "2701_0", 0)

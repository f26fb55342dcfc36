"""A checkpoint dir holding things glaunch did not write (files and dirs with its names, a
directory where ``latest`` should be, a link, a damaged manifest, a half-deleted newest
checkpoint): resume takes the newest complete checkpoint, and the next save commits."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from launcher import runtime as rt  # noqa: E402


@pytest.fixture(autouse=True)
def _env(single_rank_env):
    yield
    rt.wait_checkpoints()


def test_foreign_entries_and_a_half_deleted_checkpoint_are_skipped_and_the_next_save_commits(tmp_path):
    d = tmp_path / "ckpt"
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    rt.save_torch_state(3, model, opt)
    rt.save_torch_state(5, model, opt)
    (d / "step-abc").mkdir()
    (d / "step-00000099").write_text("a file with a checkpoint's name")
    (d / "step-00000050").mkdir()
    (d / "step-00000050" / "manifest.json").write_text("{not json")
    os.symlink(d / "step-00000005", d / "step-00000077")
    (d / "latest").unlink()
    (d / "latest").mkdir()
    (d / "README.txt").write_text("notes")
    assert rt.resume_checkpoint().step == 5

    first = sorted((d / "step-00000005" / "state").iterdir())[0]
    first.unlink()                                   # a deletion that stopped half-way
    found = rt.resume_checkpoint()
    assert found.step == 3
    rt.load_torch_state(found, model, opt)

    # Before, the directory named latest failed every later save after its rename
    # ("IsADirectoryError ... nothing committed", although the step dir was in place).
    saved = rt.save_torch_state(6, model, opt)
    assert saved.step == 6
    assert (d / "latest").read_text() == "step-00000006"
    assert rt.resume_checkpoint().step == 6
    assert (d / "README.txt").exists() and (d / "step-abc").is_dir() and (d / "step-00000099").is_file()

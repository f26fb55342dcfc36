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


def test_opening_a_save_leaves_trash_to_the_background_prune_still_deleting_it(tmp_path, monkeypatch):
    """Rank 0 clears what an interrupted prune left before it stages; while this process's
    own background prune runs, its ``.trash-*`` dirs are that thread's work, not leftovers,
    and deleting them here would stall the save for the prune's whole length."""
    import threading

    from launcher.runtime.checkpoint import commit as checkpoint_commit
    from launcher.runtime.checkpoint.directory import TRASH_PREFIX
    from launcher.runtime.checkpoint.save import open_staging
    from launcher.rundir.rankcontext import context

    d = tmp_path / "ckpt"
    d.mkdir()
    trash = d / f"{TRASH_PREFIX}old"
    trash.mkdir()
    (trash / "shard").write_bytes(b"x" * 1024)
    release = threading.Event()
    prune = threading.Thread(target=release.wait, args=(60,), daemon=True)
    prune.start()
    monkeypatch.setattr(checkpoint_commit, "_pruning", prune)
    open_staging(7, context(), d)
    assert trash.is_dir()
    release.set()
    prune.join()
    open_staging(8, context(), d)
    assert not trash.exists()
    assert [p.name for p in d.iterdir() if p.name.startswith(".staging")] == [".staging-step-00000008"]

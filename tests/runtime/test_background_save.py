"""Background saves and the checksum path, in one process: at most one save in flight, a failed
save raised by the next call, commit without re-reading, exit waiting for the last save,
the checksum fallback, and the older checkpoint layouts still loading."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from conftest import RANK_VARS  # noqa: E402
from launcher import runtime as rt  # noqa: E402
from launcher.runtime.checkpoint import dcp  # noqa: E402
from launcher.runtime.checkpoint.checksums import Checksum, ChecksumWriter, checksum_algorithm, checksum_file  # noqa: E402
from launcher.runtime.checkpoint.save import stage_checkpoint  # noqa: E402
from launcher.runtime.checkpoint.directory import CheckpointError, step_dir_name  # noqa: E402
from launcher.runtime.checkpoint.selection import latest_complete  # noqa: E402
from launcher.runtime.checkpoint.verify import verify_checkpoint  # noqa: E402
from launcher.runtime.checkpoint import checksums  # noqa: E402
from launcher.runtime.torchstate import MODEL_FILE, rank_file  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _clean_env(single_rank_env):
    yield
    try:
        rt.wait_checkpoints()
    except CheckpointError:
        pass


def _model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32), torch.nn.Linear(32, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(3, 32)).sum().backward()
    opt.step()
    return model, opt


def _params(model) -> list:
    return [p.detach().clone() for p in model.parameters()]


def test_background_save_writes_the_state_of_the_call_not_later_changes(tmp_path):
    model, opt = _model()
    at_save = _params(model)
    pending = rt.save_torch_state(1, model, opt, blocking=False)
    assert isinstance(pending, rt.PendingCheckpoint) and pending.step == 1
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)                     # training goes on while the save is written
    c = rt.wait_checkpoints()
    assert c.path == pending.path == tmp_path / "ckpt" / "step-00000001"
    assert rt.wait_checkpoints() is None    # nothing in flight any more
    model2, opt2 = _model()
    rt.load_torch_state(c, model2, opt2)
    assert all(torch.equal(a, b) for a, b in zip(_params(model2), at_save))


def test_at_most_one_save_in_flight(tmp_path, monkeypatch):
    """A second save waits for the first; monkeypatch only slows the first one's writing down."""
    model, opt = _model()
    release = threading.Event()
    real = dcp.write_share

    def slow(*args, **kwargs):
        release.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(dcp, "write_share", slow)
    first = rt.save_torch_state(1, model, opt, blocking=False)
    assert not first.done()
    second: list = []
    t = threading.Thread(target=lambda: second.append(rt.save_torch_state(2, model, opt, blocking=False)))
    t.start()
    time.sleep(0.5)
    assert second == []                                                   # it waits for the first
    assert not (tmp_path / "ckpt" / ".staging-step-00000002").exists()   # and has not begun
    release.set()
    t.join(30)
    assert first.done() and first.result().step == 1
    assert len(second) == 1 and second[0].step == 2
    assert rt.wait_checkpoints().step == 2
    assert sorted(p.name for p in (tmp_path / "ckpt").glob("step-*")) == ["step-00000001", "step-00000002"]


def test_failed_background_save_is_raised_by_the_next_call(tmp_path):
    model, opt = _model()
    rt.save_torch_state(1, model, opt)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dcp, "write_share", _boom)
        pending = rt.save_torch_state(2, model, opt, blocking=False)    # returns: the failure comes later
        with pytest.raises(CheckpointError, match="disk full"):
            pending.result(timeout=30)                                  # this rank's own part
    with pytest.raises(CheckpointError, match=r"step 2.*disk full \(injected\)"):
        rt.save_torch_state(3, model, opt)
    assert latest_complete(tmp_path / "ckpt", quiet=True).step == 1
    assert rt.save_torch_state(3, model, opt).step == 3              # raised once, then saving works
    assert not list((tmp_path / "ckpt").glob(".staging-*"))


def _boom(*args, **kwargs):
    raise OSError("disk full (injected)")


def test_failed_background_save_is_raised_by_wait_checkpoints(monkeypatch):
    model, opt = _model()
    monkeypatch.setattr(dcp, "write_share", _boom)
    rt.save_torch_state(1, model, opt, blocking=False)
    with pytest.raises(CheckpointError, match="disk full"):
        rt.wait_checkpoints()
    assert rt.wait_checkpoints() is None


def test_commit_trusts_the_checksums_taken_while_writing(tmp_path):
    """Nothing is read back to be checksummed: not at the marker, not at the commit."""
    model, opt = _model()

    def no_reading(*a, **k):
        raise AssertionError("a shard was read back to be checksummed")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checksums, "checksum_file", no_reading)
        c = rt.save_torch_state(1, model, opt)
        rt.save_torch_state(2, model, opt, blocking=False)
        assert rt.wait_checkpoints().step == 2
    for step in (1, 2):
        assert verify_checkpoint(tmp_path / "ckpt" / step_dir_name(step))[1] is None
    # the blocking save wrote its tensors without torch's zip CRC-32 and switched it back on
    assert torch.serialization.get_crc32_options() is True
    names = {s["path"] for s in c.manifest["shards"]}
    # the rank's share: one data file per I/O thread
    data = {f"state/__0_{i}.distcp" for i in range(dcp.io_threads(rt.context()))}
    assert names == {"rank-00000.pt", "state/.metadata"} | data


def test_checksum_writer_matches_the_file(tmp_path):
    import io

    payload = os.urandom(1 << 20)
    for algo in ("sha256", checksum_algorithm()):
        buf = io.BytesIO()
        with ChecksumWriter(tmp_path / algo, algo) as w:
            for i in range(0, len(payload), 4099):
                w.write(payload[i:i + 4099])
                buf.write(payload[i:i + 4099])
        assert w.size == len(payload) == w.tell()
        c = Checksum(algo)
        c.update(buf.getvalue())
        assert w.digest == c.hexdigest() == checksum_file(tmp_path / algo, algo)


def test_sha256_fallback_without_crc32c(tmp_path, capfd):
    model, opt = _model()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checksums, "_crc32c", None)
        assert checksum_algorithm() == "sha256"
        c = rt.save_torch_state(1, model, opt)
    assert all("sha256" in s and "crc32c" not in s for s in c.manifest["shards"])
    assert verify_checkpoint(c.path)[1] is None
    if checksum_algorithm() != "crc32c":
        return
    c2 = rt.save_torch_state(2, model, opt)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checksums, "_crc32c", None)       # crc32c shards, verified where the package is missing
        assert verify_checkpoint(c2.path)[1] is None
    assert "needs the 'crc32c' package" in capfd.readouterr().err


def test_scheduler_and_extra_round_trip(tmp_path):
    model, opt = _model()
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    for _ in range(3):
        opt.step()
        sched.step()
    c = rt.save_torch_state(3, model, opt, scheduler=sched, extra={"epoch": 7})
    model2, opt2 = _model()
    sched2 = torch.optim.lr_scheduler.StepLR(opt2, step_size=2, gamma=0.5)
    info = rt.load_torch_state(c, model2, opt2, scheduler=sched2)
    assert info["step"] == 3 and info["extra"] == {"epoch": 7}
    assert sched2.state_dict() == sched.state_dict()
    assert opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"] == 0.05


def test_earlier_layouts_still_load(tmp_path):
    model, opt = _model()
    expect = _params(model)
    with stage_checkpoint(4) as st:             # rank 0's model.pt, as written before DCP
        torch.save({"step": 4, "model": model.state_dict(), "optimizer": opt.state_dict(), "extra": {"a": 1}},
                   st.file(MODEL_FILE))
        torch.save({"step": 4, "rank": 0, "world_size": 1, "rng": rt.rng_state(), "rank_state": {"pos": 3}},
                   st.file(rank_file(0)))
    model2, opt2 = _model()
    with torch.no_grad():
        for p in model2.parameters():
            p.zero_()
    info = rt.load_torch_state(st.committed, model2, opt2)
    assert info == {"step": 4, "extra": {"a": 1}, "rank_state": {"pos": 3}, "rng_restored": True}
    assert all(torch.equal(a, b) for a, b in zip(_params(model2), expect))
    c = rt.save_torch_state(5, model, opt, per_rank_model=True)   # every rank's own torch.save
    assert (c.path / "model-rank-00000.pt").exists() and not (c.path / "state").exists()
    assert rt.load_torch_state(c, model2, opt2)["step"] == 5


EXIT_SCRIPT = textwrap.dedent("""
    import torch
    from launcher import runtime as rt
    from launcher.runtime.checkpoint import dcp
    real = dcp.write_share
    def slow(*a, **k):
        import time; time.sleep(1.5)
        return real(*a, **k)
    dcp.write_share = slow
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 8)).sum().backward(); opt.step()
    rt.save_torch_state(1, model, opt, blocking=False)
    print("RETURNING", flush=True)
""")


def test_process_exit_waits_for_the_save_in_flight(tmp_path):
    script = tmp_path / "exit.py"
    script.write_text(EXIT_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARS}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "RETURNING" in proc.stdout
    found = latest_complete(tmp_path / "ckpt")
    assert found is not None and found.step == 1
    assert json.loads((found.path / "manifest.json").read_text())["step"] == 1


def test_saving_before_the_first_step_leaves_the_optimizer_as_constructed(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    c = rt.save_torch_state(0, model, opt)
    assert not opt.state and c.layout == {"state": "dcp", "dir": "state", "optimizer": "unstepped"}
    torch.manual_seed(1)
    model2 = torch.nn.Linear(4, 2)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=0.1)
    rt.load_torch_state(c, model2, opt2)
    assert not opt2.state
    for m, o in ((model, opt), (model2, opt2)):        # the next step is the same in both
        m(torch.ones(1, 4)).sum().backward()
        o.step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters()))
    with pytest.raises(CheckpointError, match="no optimizer state"):
        rt.load_torch_state(rt.save_torch_state(1, model), model2, opt2)

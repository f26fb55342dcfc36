"""Atomic sharded checkpoints: commit protocol, verification, fallback, kills, bitwise resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import RANK_VARS
from launcher.runtime.checkpoint.checksums import checksum_algorithm
from launcher.runtime.checkpoint.save import stage_checkpoint
from launcher.runtime.checkpoint.directory import Checkpoint
from launcher.rundir.rankcontext import free_port
from launcher.runtime.checkpoint import checksums
from launcher.runtime.checkpoint.directory import CheckpointError, read_latest
from launcher.runtime.checkpoint.selection import latest_complete
from launcher.runtime.checkpoint.verify import verify_checkpoint

REPO = Path(__file__).resolve().parents[2]


pytestmark = pytest.mark.usefixtures("single_rank_env")


def _save(step: int, payload: bytes = b"x" * 100, **kw) -> Checkpoint:
    with stage_checkpoint(step, **kw) as st:
        st.file("rank-00000.bin").write_bytes(payload + str(step).encode())
        (st.path / "sub").mkdir()
        (st.path / "sub" / "unclaimed.txt").write_text("written behind our back")
    return st.committed


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARS}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update({k: str(v) for k, v in extra.items()})
    return env


# ------------------------------------------------------------------ commit protocol

def test_commit_layout_manifest_latest(tmp_path):
    c = _save(3)
    d = tmp_path / "ckpt"
    assert c.path == d / "step-00000003" and c.step == 3
    assert read_latest(d) == "step-00000003"
    m = json.loads((c.path / "manifest.json").read_text())
    assert m["step"] == 3 and m["world_size"] == 1 and m["framework"] == "torch"
    shards = {s["path"]: s for s in m["shards"]}
    assert set(shards) == {"rank-00000.bin", "sub/unclaimed.txt"}
    assert shards["rank-00000.bin"]["rank"] == 0 and shards["sub/unclaimed.txt"]["rank"] is None
    assert shards["rank-00000.bin"]["size"] == 101
    assert (c.path / ".done-rank-00000.json").exists()
    assert not any(p.name.startswith(".staging") for p in d.iterdir())
    assert latest_complete(d).path == c.path


def test_commit_makes_what_it_renames_durable_first_fsyncing_each_once(tmp_path, monkeypatch):
    """Before the rename that commits, every file of the checkpoint and every directory that
    holds one has been fsynced, each once; the checkpoint dir's entry after it. The done
    marker (a message to rank 0, not read after the commit) is not fsynced."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("names the fsynced files through /proc")
    events: list[tuple] = []
    real_fsync, real_rename = os.fsync, os.rename

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def rename(src, dst):
        events.append(("rename", str(src), str(dst)))
        real_rename(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "rename", rename)
    c = _save(1)
    d = tmp_path / "ckpt"
    staging = str(d / ".staging-step-00000001")
    committed = events.index(("rename", staging, str(c.path)))
    before = [e[1] for e in events[:committed] if e[0] == "fsync"]
    after = [e[1] for e in events[committed:] if e[0] == "fsync"]
    in_staging = [p for p in before if p == staging or p.startswith(staging + "/")]
    assert sorted(in_staging) == sorted([staging] + [f"{staging}/{name}" for name in
                                                      ("manifest.json", "rank-00000.bin", "sub", "sub/unclaimed.txt")])
    assert after == [str(d)]
    assert not [p for p in before + after if ".done-rank-" in p]


def test_keep_prunes_old_and_stale_staging(tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / ".staging-step-00000099").mkdir()           # left by a killed attempt
    (d / ".latest.tmp-elsewhere-123").write_text("step-00000099")   # a killed commit's new latest
    for s in (10, 20, 30, 40):
        _save(s, keep=2)
    assert sorted(p.name for p in d.iterdir()) == ["latest", "step-00000030", "step-00000040"]


def test_step_names_sort_numerically(tmp_path):
    for s in (9, 10, 100):
        _save(s, keep=5)
    names = sorted(p.name for p in (tmp_path / "ckpt").glob("step-*"))
    assert names == ["step-00000009", "step-00000010", "step-00000100"]
    assert latest_complete(tmp_path / "ckpt").step == 100


def test_same_step_saved_again_replaces(tmp_path):
    _save(5, b"a" * 10)
    c = _save(5, b"b" * 20)
    assert (c.path / "rank-00000.bin").read_bytes().startswith(b"b")
    assert latest_complete(tmp_path / "ckpt").step == 5
    assert [p.name for p in (tmp_path / "ckpt").iterdir() if p.name.startswith(".")] == []


def test_writer_exception_commits_nothing(tmp_path):
    _save(1)
    with pytest.raises(CheckpointError, match="failed writing"), stage_checkpoint(2) as st:
        st.file("rank-00000.bin").write_bytes(b"partial")
        raise OSError("disk full")
    assert latest_complete(tmp_path / "ckpt").step == 1
    assert read_latest(tmp_path / "ckpt") == "step-00000001"


def test_claimed_but_missing_file_fails(tmp_path):
    with pytest.raises(CheckpointError, match="not written"), stage_checkpoint(1) as st:
        st.add("never-written.pt")
    assert latest_complete(tmp_path / "ckpt") is None


def test_claim_outside_staging_rejected(tmp_path):
    with pytest.raises(CheckpointError), stage_checkpoint(1) as st:
        st.add(tmp_path / "elsewhere.pt")


def test_newer_damaged_checkpoints_removed_on_commit(tmp_path):
    """After falling back from a damaged step-30 to step-20, committing step 25 drops step-30."""
    d = tmp_path / "ckpt"
    _save(20, keep=5)
    bad = _save(30, keep=5)
    (bad.path / "rank-00000.bin").write_bytes(b"garbage")
    assert latest_complete(d, quiet=True).step == 20
    _save(25, keep=5)
    assert sorted(p.name for p in d.glob("step-*")) == ["step-00000020", "step-00000025"]


# ------------------------------------------------------------------ verification and fallback

def test_truncated_shard_falls_back_with_warning(tmp_path, capfd):
    d = tmp_path / "ckpt"
    _save(1)
    c2 = _save(2)
    with open(c2.path / "rank-00000.bin", "r+b") as f:
        f.truncate(10)
    assert verify_checkpoint(c2.path)[0] is None
    found = latest_complete(d)
    assert found.step == 1
    err = capfd.readouterr().err
    assert "step-00000002" in err and "warning" in err


def test_same_size_corruption_caught_by_hash_only(tmp_path):
    d = tmp_path / "ckpt"
    _save(1)
    c2 = _save(2)
    data = bytearray((c2.path / "rank-00000.bin").read_bytes())
    data[0] ^= 0xFF
    (c2.path / "rank-00000.bin").write_bytes(bytes(data))
    assert latest_complete(d, quiet=True).step == 1
    assert latest_complete(d, verify="size", quiet=True).step == 2


def test_latest_pointing_at_missing_dir(tmp_path, capfd):
    d = tmp_path / "ckpt"
    _save(1)
    (d / "latest").write_text("step-00000007")
    assert latest_complete(d).step == 1
    assert "step-00000007" in capfd.readouterr().err


def test_no_latest_file_and_no_manifest(tmp_path):
    d = tmp_path / "ckpt"
    assert latest_complete(d) is None                 # dir does not even exist
    _save(1)
    (d / "latest").unlink()
    assert latest_complete(d).step == 1
    (d / "step-00000002").mkdir()                     # a step dir without manifest
    (d / "step-00000002" / "rank-00000.bin").write_bytes(b"x")
    assert latest_complete(d, quiet=True).step == 1


def test_staging_dir_never_selected_even_with_manifest(tmp_path):
    d = tmp_path / "ckpt"
    _save(1)
    c = _save(2)
    os.rename(c.path, d / ".staging-step-00000003")  # a fully written, uncommitted attempt
    m = json.loads((d / ".staging-step-00000003" / "manifest.json").read_text())
    m["step"] = 3
    (d / ".staging-step-00000003" / "manifest.json").write_text(json.dumps(m))
    (d / "latest").write_text(".staging-step-00000003")
    assert latest_complete(d, quiet=True).step == 1


def test_manifest_hash_mismatch(tmp_path):
    d = tmp_path / "ckpt"
    _save(1)
    c = _save(2)
    m = json.loads((c.path / "manifest.json").read_text())
    algo = checksum_algorithm()
    assert algo in m["shards"][0] and m["format"] == 2
    m["shards"][0][algo] = "0" * len(m["shards"][0][algo])
    (c.path / "manifest.json").write_text(json.dumps(m))
    assert f"{algo} mismatch" in verify_checkpoint(c.path)[1]
    assert latest_complete(d, quiet=True).step == 1


def test_manifest_with_unsafe_path_rejected(tmp_path):
    c = _save(1)
    m = json.loads((c.path / "manifest.json").read_text())
    m["shards"][0]["path"] = "../../etc/passwd"
    (c.path / "manifest.json").write_text(json.dumps(m))
    assert verify_checkpoint(c.path)[0] is None


# ------------------------------------------------------------------ checksums

def test_shards_checksummed_as_written_are_not_read_back(monkeypatch):
    """st.open checksums while writing; a file written otherwise is read back once, by the
    rank that wrote it (for its done marker), and not again at the commit."""
    real, read = checksums.checksum_file, []

    def counting(path, *args, **kwargs):
        read.append(Path(path).name)
        return real(path, *args, **kwargs)

    monkeypatch.setattr(checksums, "checksum_file", counting)
    with stage_checkpoint(1) as st:
        with st.open("rank-00000.pt") as f:
            f.write(b"y" * 5000)
        st.file("framework.bin").write_bytes(b"z" * 100)
    assert read == ["framework.bin"]
    assert verify_checkpoint(st.committed.path)[1] is None


def test_checksum_writer_hands_what_it_wrote_to_the_disk_as_it_goes(tmp_path, monkeypatch):
    """Every WRITEBACK_BYTES written have their writeback started before the file ends, not
    all of them at the fsync, and the same call evicts those handed over the time before;
    the bytes and the checksum are those written."""
    started = []
    monkeypatch.setattr(checksums, "_drop_cached", lambda fd, offset=0, length=0: started.append((offset, length)))
    monkeypatch.setattr(checksums.ChecksumWriter, "WRITEBACK_BYTES", 1000)
    w = checksums.ChecksumWriter(tmp_path / "shard.bin", sync=False)
    for _ in range(5):
        w.write(b"x" * 600)
    # [0, 1200) handed over; then [1200, 2400) handed over and [0, 1200) evicted with it
    assert started == [(0, 1200), (0, 2400)]
    w.write(b"x" * 900)
    assert started[-1] == (1200, 2700)
    w.close()
    assert started[-1] == (0, 0)          # the whole file leaves the page cache at close
    assert (tmp_path / "shard.bin").read_bytes() == b"x" * 3900
    assert w.digest == checksums.checksum_file(tmp_path / "shard.bin", w.algorithm)


def test_checksum_writer_hands_a_large_write_to_the_disk_in_pieces(tmp_path, monkeypatch):
    """One write of a whole tensor (what torch.save makes) is handed to the disk every
    WRITEBACK_BYTES as it goes, not at its end."""
    started = []
    monkeypatch.setattr(checksums, "_drop_cached", lambda fd, offset=0, length=0: started.append((offset, length)))
    monkeypatch.setattr(checksums.ChecksumWriter, "WRITEBACK_BYTES", 1000)
    data = bytes(range(256)) * 10
    with checksums.ChecksumWriter(tmp_path / "shard.bin", sync=False) as w:
        assert w.write(data) == 2560 and w.tell() == 2560
        assert started == [(0, 1000), (0, 2000)]
    assert (tmp_path / "shard.bin").read_bytes() == data
    assert w.digest == checksums.checksum_file(tmp_path / "shard.bin", w.algorithm)


def test_sha256_without_the_crc32c_package(monkeypatch):
    monkeypatch.setattr(checksums, "_crc32c", None)
    assert checksums.checksum_algorithm() == "sha256"
    c = _save(1)
    assert len(c.manifest["shards"]) == 2
    assert all("sha256" in s and "crc32c" not in s for s in c.manifest["shards"])
    assert verify_checkpoint(c.path)[1] is None


def test_crc32c_shards_checked_by_size_where_the_package_is_missing(monkeypatch, capfd):
    pytest.importorskip("crc32c")
    c = _save(1)
    assert all("crc32c" in s for s in c.manifest["shards"])
    monkeypatch.setattr(checksums, "_crc32c", None)
    assert verify_checkpoint(c.path)[1] is None
    assert "needs the 'crc32c' package" in capfd.readouterr().err


# ------------------------------------------------------------------ real SIGKILL mid-save

KILL_SCRIPT = textwrap.dedent("""
    import os, sys, time
    from launcher.runtime.checkpoint.checksums import checksum_algorithm
    from launcher.runtime.checkpoint.save import stage_checkpoint
    from launcher.runtime.checkpoint.directory import Checkpoint
    mode = sys.argv[1]
    with stage_checkpoint(1) as st:
        st.file("rank-00000.bin").write_bytes(b"first" * 1000)
    if mode == "rename":       # die inside the commit, manifest written, before the rename
        def rename(src, dst, _real=os.rename):
            if ".staging-step-" in str(src):
                print("COMMITTING", flush=True); time.sleep(60)
            _real(src, dst)
        os.rename = rename
    if mode == "latest":       # die after the rename, before latest is replaced
        def replace(src, dst, _real=os.replace):
            if os.path.basename(dst) == "latest" and os.path.exists(os.path.join(os.path.dirname(dst), "step-00000002")):
                print("COMMITTING", flush=True); time.sleep(60)
            _real(src, dst)
        os.replace = replace
    with stage_checkpoint(2) as st:
        with open(st.file("rank-00000.bin"), "wb") as f:
            for i in range(10000):
                f.write(b"y" * 4096); f.flush()
                if i == 5: print("WRITING", flush=True)
                if mode == "write": time.sleep(0.01)
    print("DONE", flush=True)
""")


@pytest.mark.parametrize("mode,expect", [("write", 1), ("rename", 1), ("latest", 2)])
def test_sigkill_mid_save_leaves_previous_checkpoint(tmp_path, mode, expect):
    script = tmp_path / "kill_me.py"
    script.write_text(KILL_SCRIPT)
    d = tmp_path / "ckpt"
    proc = subprocess.Popen([sys.executable, str(script), mode], stdout=subprocess.PIPE, text=True,
                            env=_env(GLAUNCH_CHECKPOINT_DIR=d))
    want = "WRITING" if mode == "write" else "COMMITTING"
    try:
        for line in proc.stdout:
            if line.strip() == want:
                proc.send_signal(signal.SIGKILL)
                break
            assert line.strip() != "DONE", "the save finished before it could be killed"
    finally:
        proc.kill()
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    found = latest_complete(d, quiet=True)
    assert found is not None and found.step == expect
    assert (d / ".staging-step-00000002").exists() == (mode != "latest")
    # the next save cleans up and works
    _save(3)
    assert latest_complete(d).step == 3
    assert not list(d.glob(".staging-*")) and not list(d.glob(".trash-*"))


# ------------------------------------------------------------------ torch state, bitwise resume

def test_torch_state_roundtrip_restores_rng_and_optimizer(tmp_path):
    torch = pytest.importorskip("torch")
    import random

    from launcher.runtime.torchstate import load_torch_state, save_torch_state

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    c = save_torch_state(1, model, opt, rank_state={"pos": 17}, extra={"note": "x"})
    expect = (torch.rand(3), random.random())
    ref = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    model2 = torch.nn.Linear(4, 2)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=0.1)
    info = load_torch_state(c, model2, opt2)
    assert info["step"] == 1 and info["rank_state"] == {"pos": 17} and info["rng_restored"]
    assert info["extra"] == {"note": "x"} and c.extra == {"note": "x"}
    assert torch.equal(torch.rand(3), expect[0]) and random.random() == expect[1]
    for k, v in model2.state_dict().items():
        assert torch.equal(v, ref[k])
    assert opt2.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]


def _adamw_model(torch):
    """A small model and its AdamW, as a (re)started process builds them: no optimizer state yet."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    return model, torch.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)


def _train(torch, model, opt, steps: int, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(4, 6, generator=gen)).square().mean().backward()
        opt.step()


def _count_optimizer_steps():
    """``(steps, handle)``: every optimizer step taken until ``handle.remove()``, in a list."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    steps: list = []
    handle = register_optimizer_step_pre_hook(lambda opt, args, kwargs: steps.append(type(opt).__name__))
    return steps, handle


def test_resume_into_a_fresh_optimizer_runs_no_optimizer_step_and_is_bitwise():
    torch = pytest.importorskip("torch")
    from launcher.runtime.torchstate import resume_torch_state, save_torch_state

    model, opt = _adamw_model(torch)
    _train(torch, model, opt, 3)
    save_torch_state(3, model, opt)
    fresh, fresh_opt = _adamw_model(torch)
    steps, handle = _count_optimizer_steps()
    try:
        got = resume_torch_state(fresh, fresh_opt)
    finally:
        handle.remove()
    assert got is not None and got["step"] == 3
    assert steps == []          # the optimizer's state came from the checkpoint, not from a step
    saved, loaded = opt.state_dict(), fresh_opt.state_dict()
    assert saved["param_groups"] == loaded["param_groups"]
    assert saved["state"].keys() == loaded["state"].keys()
    for k, entries in saved["state"].items():
        assert entries.keys() == loaded["state"][k].keys()
        assert all(torch.equal(v, loaded["state"][k][n]) for n, v in entries.items()), k
    _train(torch, model, opt, 2, seed=1)
    _train(torch, fresh, fresh_opt, 2, seed=1)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), fresh.parameters()))


def test_a_refused_checkpoint_leaves_the_fresh_optimizer_without_state():
    """The only checkpoint fails its checksum during the load: no resume, and the optimizer
    steps as one just built does (no state left over from the attempt)."""
    torch = pytest.importorskip("torch")
    from launcher.runtime.torchstate import resume_torch_state, save_torch_state

    model, opt = _adamw_model(torch)
    _train(torch, model, opt, 2)
    c = save_torch_state(2, model, opt)
    data = next((c.path / "state").glob("*.distcp"))
    damaged = bytearray(data.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    data.write_bytes(bytes(damaged))
    fresh, fresh_opt = _adamw_model(torch)
    assert resume_torch_state(fresh, fresh_opt) is None
    assert not fresh_opt.state
    reference, reference_opt = _adamw_model(torch)
    _train(torch, fresh, fresh_opt, 1)
    _train(torch, reference, reference_opt, 1)
    assert all(torch.equal(a, b) for a, b in zip(fresh.parameters(), reference.parameters()))


def _launch(tmp_path: Path, run: str, steps: int, restart: int = 0, sps: float = 0.0, world: int = 2):
    port = free_port()
    procs = []
    for r in range(world):
        env = _env(RANK=r, LOCAL_RANK=r, WORLD_SIZE=world, LOCAL_WORLD_SIZE=world, GROUP_RANK=0,
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port, GLAUNCH_RUN_DIR=tmp_path / run,
                   GLAUNCH_CHECKPOINT_DIR=tmp_path / run / "checkpoints", GLAUNCH_CHECKPOINT_EVERY=5,
                   GLAUNCH_CHECKPOINT_KEEP=2, GLAUNCH_RESTART=restart, OMP_NUM_THREADS=1)
        procs.append(subprocess.Popen(
            [sys.executable, str(REPO / "examples" / "torch_ddp.py"), "--steps", str(steps),
             "--seconds-per-step", str(sps), "--log-every", "1"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs


def _finish(procs, timeout=120) -> list[str]:
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=timeout)
        outs.append(out)
        assert p.returncode == 0, out
    return outs


@pytest.mark.slow
def test_a_process_replacing_a_lost_rank_reads_no_checkpoint(monkeypatch):
    """recovery.peer: the process started in place of a lost rank gets its state from a
    live peer; the newest checkpoint is there, and it is not read."""
    torch = pytest.importorskip("torch")
    from launcher.runtime.torchstate import resume_torch_state, save_torch_state

    model, opt = _adamw_model(torch)
    _train(torch, model, opt, 2)
    save_torch_state(2, model, opt)
    monkeypatch.setenv("GLAUNCH_PEER_JOIN", "1")
    fresh, fresh_opt = _adamw_model(torch)
    before = [p.detach().clone() for p in fresh.parameters()]
    assert resume_torch_state(fresh, fresh_opt) is None
    assert all(torch.equal(a, b) for a, b in zip(before, fresh.parameters())) and not fresh_opt.state


def test_torch_ddp_resume_is_bitwise_identical(tmp_path):
    """2 ranks: 20 steps straight vs. SIGUSR2 to rank 1 mid-run, then a requeue to completion."""
    straight = _launch(tmp_path, "straight", 20)
    _finish(straight)
    ref = json.loads((tmp_path / "straight" / "result.json").read_text())
    assert ref["final_step"] == 20 and ref["world_size"] == 2 and ref["resumed_from"] is None

    first = _launch(tmp_path, "stopped", 20, sps=0.2)
    lines = []
    for line in first[0].stdout:               # rank 0's progress lines
        lines.append(line)
        if line.startswith("step 7/20"):
            first[1].send_signal(signal.SIGUSR2)  # only rank 1 is signalled
            break
    rest, _ = first[0].communicate(timeout=60)
    out0 = "".join(lines) + rest
    assert first[0].returncode == 0, out0
    _finish(first[1:])
    stop_line = [ln for ln in out0.splitlines() if ln.startswith("glaunch: stopping at step")]
    assert stop_line and stop_line[0].endswith("checkpoint saved"), out0
    stopped_at = int(stop_line[0].split()[4].rstrip(","))
    assert 7 <= stopped_at < 20
    assert not (tmp_path / "stopped" / "result.json").exists()
    stop = json.loads((tmp_path / "stopped" / "stop.json").read_text())
    assert stop["step"] == stopped_at and stop["signal"] == "SIGUSR2"
    assert latest_complete(tmp_path / "stopped" / "checkpoints").step == stopped_at

    _finish(_launch(tmp_path, "stopped", 20, restart=1))
    res = json.loads((tmp_path / "stopped" / "result.json").read_text())
    assert res["resumed_from"] == stopped_at and res["restarts"] == 1 and res["final_step"] == 20
    assert res["param_sha256"] == ref["param_sha256"]
    assert res["final_loss"] == ref["final_loss"]

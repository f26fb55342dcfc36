"""Model and optimizer state through torch.distributed.checkpoint inside the commit protocol:
spread writes, checksums taken while writing, spread verification at resume, DDP and FSDP2
round trips, resharding, and a rank killed in the middle of a background save."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from launcher.runtime.checkpoint.checksums import checksum_algorithm, checksum_file  # noqa: E402
from launcher.runtime.checkpoint.selection import latest_complete  # noqa: E402
from launcher.runtime.checkpoint.verify import verify_checkpoint  # noqa: E402
from launcher.rundir.rankcontext import free_port  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
             "MASTER_ADDR", "MASTER_PORT")

WORKER = textwrap.dedent('''
    import hashlib, json, os, sys
    import torch
    from torch import nn
    from launcher import runtime as rt
    from launcher.runtime.checkpoint import checksums
    from launcher.runtime.checkpoint.checksums import ChecksumWriter, checksum_algorithm, checksum_file
    from launcher.runtime.checkpoint.selection import latest_complete
    from launcher.runtime.checkpoint.verify import verify_checkpoint
    from launcher.runtime import fsdp as gfsdp
    from launcher.runtime.checkpoint import dcp
    from launcher.runtime.checkpoint.directory import CheckpointDamaged
    from torch.distributed.checkpoint.state_dict import get_state_dict
    from torch.distributed.tensor import DTensor
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    mode, kind = sys.argv[1], sys.argv[2]
    out = {}
    torch.set_num_threads(1)
    ctx = rt.init_distributed()

    def build():
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Linear(64, 64) for _ in range(6)])
        if kind == "fsdp":
            gfsdp.shard(model, ctx)
            wrapped = model
        else:
            wrapped = torch.nn.parallel.DistributedDataParallel(model) if ctx.world_size > 1 else model
        return model, wrapped, torch.optim.AdamW(model.parameters(), lr=0.01)

    def train(wrapped, opt, steps):
        for s in range(steps):
            g = torch.Generator().manual_seed(1000 * s + ctx.rank)
            opt.zero_grad()
            wrapped(torch.randn(8, 64, generator=g)).square().mean().backward()
            opt.step()

    def count_checksums():
        """The files re-checksummed from now on (relative to the checkpoint dir), in a list."""
        seen = []
        def counting(path, *a, **k):
            seen.append(os.path.relpath(path, ctx.checkpoint_dir))
            return checksum_file(path, *a, **k)
        checksums.checksum_file = counting
        return seen

    def state_hash(model, opt):
        """SHA-256 of the whole (gathered) model and optimizer state, by name."""
        msd, osd = get_state_dict(model, opt)
        h = hashlib.sha256()
        def visit(prefix, v):
            if isinstance(v, dict):
                for k in sorted(v, key=str):
                    visit(f"{prefix}.{k}", v[k])
            elif isinstance(v, (list, tuple)):
                for i, x in enumerate(v):
                    visit(f"{prefix}.{i}", x)
            elif isinstance(v, torch.Tensor):
                t = v.full_tensor() if isinstance(v, DTensor) else v
                h.update(prefix.encode()); h.update(t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes())
            else:
                h.update(f"{prefix}={v!r}".encode())
        visit("model", msd); visit("optimizer", osd["state"])
        return h.hexdigest()

    if mode == "roundtrip":            # blocking save at 2, background save at 3, load each back
        model, wrapped, opt = build()
        train(wrapped, opt, 2)
        out["hash2"] = state_hash(model, opt)
        c2 = rt.save_torch_state(2, model, opt, ctx=ctx, rank_state={"pos": 10 + ctx.rank})
        train(wrapped, opt, 1)
        out["hash3"] = state_hash(model, opt)
        pending = rt.save_torch_state(3, model, opt, ctx=ctx, blocking=False, rank_state={"pos": 20 + ctx.rank})
        out["pending"] = type(pending).__name__
        train(wrapped, opt, 2)         # the live state moves on while step 3 is written
        c3 = rt.wait_checkpoints(ctx)
        out["committed3"] = str(c3.path)
        rt.load_torch_state(c2, model, opt, ctx=ctx)
        out["loaded2"] = state_hash(model, opt)
        out["rank_state2"] = rt.load_torch_state(c2, model, opt, ctx=ctx)["rank_state"]
        info = rt.load_torch_state(c3, model, opt, ctx=ctx)
        out["loaded3"] = state_hash(model, opt)
        out["rank_state"] = info["rank_state"]
        out["rng_restored"] = info["rng_restored"]
    elif mode == "save":               # train 3 steps, save, report the state
        model, wrapped, opt = build()
        train(wrapped, opt, 3)
        rt.save_torch_state(3, model, opt, ctx=ctx, blocking=False)
        rt.wait_checkpoints(ctx)
        out["hash"] = state_hash(model, opt)
    elif mode == "load":               # load the newest checkpoint (any world size), report the state
        model, wrapped, opt = build()
        c = rt.resume_checkpoint(ctx)
        steps = []                     # optimizer steps taken by the load (none: its state is read)
        hook = register_optimizer_step_pre_hook(lambda *a: steps.append(1))
        info = rt.load_torch_state(c, model, opt, ctx=ctx)
        hook.remove()
        out["optimizer_steps"] = len(steps)
        out["hash"] = state_hash(model, opt)
        out["step"] = info["step"]
        out["rng_restored"] = info["rng_restored"]
    elif mode == "fail":               # rank 1's background write fails: every rank raises at the wait
        model, wrapped, opt = build()
        train(wrapped, opt, 1)
        real_write_share = dcp.write_share
        if ctx.rank == 1:
            def boom(*a, **k):
                raise OSError("disk full (injected)")
            dcp.write_share = boom
        rt.save_torch_state(1, model, opt, ctx=ctx, blocking=False)
        try:
            rt.wait_checkpoints(ctx)
            out["raised"] = None
        except rt.CheckpointError as e:
            out["raised"] = str(e)
        dcp.write_share = real_write_share
        out["after"] = rt.save_torch_state(2, model, opt, ctx=ctx).step
    elif mode == "series":             # blocking saves at steps 1, 2, 3 (keep 3)
        model, wrapped, opt = build()
        for s in (1, 2, 3):
            train(wrapped, opt, 1)
            rt.save_torch_state(s, model, opt, ctx=ctx)
    elif mode == "replan":             # saves 1-4; rank 1 gains a parameter before step 3
        model, wrapped, opt = build()
        train(wrapped, opt, 1)
        sent = []                      # the saves whose plans travelled to rank 0
        real_gather = torch.distributed.gather_object
        def gather(obj, *a, **k):
            sent.append(step)
            return real_gather(obj, *a, **k)
        torch.distributed.gather_object = gather
        for step in (1, 2, 3, 4):
            if step == 3 and ctx.rank == 1:
                model.register_parameter("extra", nn.Parameter(torch.full((5,), 7.0)))
            rt.save_torch_state(step, model, ctx=ctx, blocking=step % 2 == 0)
            rt.wait_checkpoints(ctx)
        out["planned"] = sent
        out["saved"] = {s: sorted(dcp.read_metadata(ctx.checkpoint_dir / f"step-{s:08d}" / "state").state_dict_metadata)
                        for s in (2, 4)}
    elif mode == "resume":             # resume_torch_state; a load of the newest with its checksums pending first
        model, wrapped, opt = build()
        before = state_hash(model, opt)
        seen = count_checksums()
        newest = rt.resume_checkpoint(ctx, verify="load")
        out["pending"] = sorted(s["path"] for s in newest.pending)
        try:
            rt.load_torch_state(newest, model, opt, ctx=ctx)
            out["refused"] = None
        except CheckpointDamaged as e:
            out["refused"] = str(e)
        out["untouched"] = state_hash(model, opt) == before
        del seen[:]
        got = rt.resume_torch_state(model, opt, ctx=ctx)
        checksums.checksum_file = checksum_file
        out["hashed"] = seen
        out["step"], out["checkpoint"] = got["step"], got["checkpoint"].path.name
        out["hash"] = state_hash(model, opt)
        reference, _, opt2 = build()     # the same checkpoint, checked in full before a plain load
        rt.load_torch_state(rt.resume_checkpoint(ctx), reference, opt2, ctx=ctx)
        out["reference"] = state_hash(reference, opt2)
    elif mode == "blind":              # rank 1 looks for checkpoints in a dir the others do not use
        if ctx.rank == 1:
            os.environ["GLAUNCH_CHECKPOINT_DIR"] = os.path.join(os.environ["OUT_DIR"], "elsewhere")
        try:
            rt.resume_checkpoint()
            out["raised"] = None
        except rt.CheckpointError as e:
            out["raised"] = str(e)
    elif mode == "verify":             # resume: which files did this rank re-checksum?
        seen = count_checksums()
        found = rt.resume_checkpoint(ctx)
        out["found"] = None if found is None else found.step
        out["hashed"] = seen
    rt.shutdown_distributed()
    with open(os.path.join(os.environ["OUT_DIR"], f"rank-{ctx.rank}.json"), "w") as f:
        json.dump(out, f)
''')


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARS and not k.startswith("GLAUNCH_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["OMP_NUM_THREADS"] = "1"
    # A rank that aborts (SIGABRT, e.g. in gloo's teardown) prints every thread's Python stack.
    env["PYTHONFAULTHANDLER"] = "1"
    env.update({k: str(v) for k, v in extra.items()})
    return env


def _start(script: Path, args: list[str], world: int, ckpt: Path, out: Path, restart: int = 0, **env):
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    procs = []
    for r in range(world):
        e = _env(RANK=r, LOCAL_RANK=r, WORLD_SIZE=world, LOCAL_WORLD_SIZE=world, GROUP_RANK=0,
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=port, GLAUNCH_RUN_DIR=out, GLAUNCH_CHECKPOINT_DIR=ckpt,
                 GLAUNCH_RESTART=restart, OUT_DIR=out, **env)
        procs.append(subprocess.Popen([sys.executable, str(script), *args], env=e, cwd=out,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs


def _finish(procs, timeout: float = 900) -> list[str]:   # a bound for hangs only: CI may be slow
    outs = []
    try:
        for p in procs:
            text, _ = p.communicate(timeout=timeout)
            outs.append(text)
            assert p.returncode == 0, text[-4000:]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=30)
    return outs


def _run(tmp_path: Path, mode: str, kind: str, world: int, ckpt: Path, name: str, **env) -> tuple[list[dict], str]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out = tmp_path / name
    logs = _finish(_start(script, [mode, kind], world, ckpt, out, **env))
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(world)], "".join(logs)


def _manifest(path: Path) -> dict:
    return json.loads((path / "manifest.json").read_text())


# ------------------------------------------------------------------ DDP

def test_ddp_state_spread_over_ranks_checksummed_while_written_and_bitwise(tmp_path):
    ckpt = tmp_path / "ckpt"
    outs, _ = _run(tmp_path, "roundtrip", "ddp", 2, ckpt, "ddp")
    for r, o in enumerate(outs):
        assert o["loaded2"] == o["hash2"] and o["loaded3"] == o["hash3"] != o["hash2"]
        assert o["pending"] == "PendingCheckpoint"
        assert o["rank_state2"] == {"pos": 10 + r} and o["rank_state"] == {"pos": 20 + r}
        assert o["rng_restored"] is True
    assert outs[0]["hash3"] == outs[1]["hash3"]            # DDP replicas
    step3 = ckpt / "step-00000003"
    assert outs[0]["committed3"] == outs[1]["committed3"] == str(step3)
    m = _manifest(step3)
    shards = {s["path"]: s for s in m["shards"]}
    algo = checksum_algorithm()
    assert all(algo in s for s in shards.values())
    # each rank wrote a share of the replicated model + optimizer state, neither all of it
    a, b = shards["state/__0_0.distcp"], shards["state/__1_0.distcp"]
    assert (a["rank"], b["rank"]) == (0, 1)
    assert 0.35 < a["size"] / (a["size"] + b["size"]) < 0.65, (a["size"], b["size"])
    assert shards["state/.metadata"]["rank"] == 0
    assert {shards["rank-00000.pt"]["rank"], shards["rank-00001.pt"]["rank"]} == {0, 1}
    # the checksums each rank took while writing are those of the bytes on disk
    for rank in (0, 1):
        marker = json.loads((step3 / f".done-rank-{rank:05d}.json").read_text())
        for e in marker["files"]:
            assert checksum_file(step3 / e["path"], algo) == e[algo], e
    assert verify_checkpoint(step3)[1] is None


def test_background_failure_on_one_rank_raises_on_every_rank_then_saves_again(tmp_path):
    ckpt = tmp_path / "ckpt"
    outs, _ = _run(tmp_path, "fail", "ddp", 2, ckpt, "fail")
    for o in outs:
        assert o["raised"] and "rank 1" in o["raised"] and "disk full (injected)" in o["raised"], o
        assert o["after"] == 2
    assert [p.name for p in ckpt.glob("step-*")] == ["step-00000002"]
    assert not list(ckpt.glob(".staging-*"))


def damage_steps_2_and_3(ckpt):
    """Step 3: a flipped byte in rank 1's data file (same size: only its checksum finds it);
    step 2: a truncated data file (its size finds it)."""
    f3 = ckpt / "step-00000003" / "state" / "__1_0.distcp"
    data = bytearray(f3.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f3.write_bytes(bytes(data))
    with open(ckpt / "step-00000002" / "state" / "__0_0.distcp", "r+b") as f:
        f.truncate(100)


def test_resume_verification_is_spread_and_skips_damaged_checkpoints(tmp_path):
    ckpt = tmp_path / "ckpt"
    _run(tmp_path, "series", "ddp", 2, ckpt, "series", GLAUNCH_CHECKPOINT_KEEP=3)
    assert sorted(p.name for p in ckpt.glob("step-*")) == ["step-00000001", "step-00000002", "step-00000003"]
    damage_steps_2_and_3(ckpt)
    outs, log = _run(tmp_path, "verify", "ddp", 2, ckpt, "verify")
    assert [o["found"] for o in outs] == [1, 1]
    assert "step-00000003" in log and "mismatch" in log and "step-00000002" in log
    # the files of step 1, the complete one, were re-checksummed once each, split between the ranks
    hashed = [sorted(x for x in o["hashed"] if x.startswith("step-00000001/")) for o in outs]
    every = sorted(f"step-00000001/{s['path']}" for s in _manifest(ckpt / "step-00000001")["shards"])
    assert sorted(hashed[0] + hashed[1]) == every
    assert hashed[0] and hashed[1] and not set(hashed[0]) & set(hashed[1])
    # step 2 failed on sizes alone: nobody read it
    assert not any(x.startswith("step-00000002/") for o in outs for x in o["hashed"])
    # a rank that cannot see the checkpoints rank 0 sees: an error on every rank, not a fresh start
    outs, _ = _run(tmp_path, "blind", "ddp", 2, ckpt, "blind")
    for o in outs:
        assert o["raised"] and "rank 1 cannot see" in o["raised"] and "shared" in o["raised"], o


def test_a_save_plans_again_only_when_some_rank_has_other_state(tmp_path):
    """A save whose ranks hold the tensors of the last planning (shapes, dtypes) reuses it:
    the plans do not travel to rank 0 again. One rank with a new entry makes every rank plan
    again, and that entry is in the checkpoint (rank 0 alone could not know of it)."""
    ckpt = tmp_path / "ckpt"
    outs, _ = _run(tmp_path, "replan", "ddp", 2, ckpt, "replan", GLAUNCH_CHECKPOINT_KEEP=4)
    for o in outs:
        assert o["planned"] == [1, 3], o
    saved = outs[0]["saved"]
    assert "model.extra" not in saved["2"] and "model.extra" in saved["4"]
    assert set(saved["4"]) - set(saved["2"]) == {"model.extra"}
    for s in (1, 2, 3, 4):
        assert verify_checkpoint(ckpt / f"step-{s:08d}")[1] is None


def test_resume_torch_state_reads_data_files_once_and_refuses_a_damaged_checkpoint_whole(tmp_path):
    ckpt = tmp_path / "ckpt"
    _run(tmp_path, "series", "ddp", 2, ckpt, "series", GLAUNCH_CHECKPOINT_KEEP=3)
    damage_steps_2_and_3(ckpt)
    outs, log = _run(tmp_path, "resume", "ddp", 2, ckpt, "resume")
    for o in outs:
        # every data file of step 3 (each rank writes its share as one file per I/O thread)
        assert o["pending"] == sorted(f"state/{f.name}" for f in (ckpt / "step-00000003" / "state").glob("*.distcp"))
        # the load of step 3 found the flipped byte on rank 1: refused on every rank, nothing loaded
        assert o["refused"] and "__1_0.distcp" in o["refused"] and "mismatch" in o["refused"], o
        assert o["untouched"] is True
        # resume_torch_state skipped steps 3 and 2 and loaded step 1, as the full check before a load does
        assert (o["step"], o["checkpoint"]) == (1, "step-00000001")
        assert o["hash"] == o["reference"]
    assert "step-00000003" in log and "step-00000002" in log
    # the data files were checksummed by the load, not re-read for it; the other files were
    hashed = [x for o in outs for x in o["hashed"]]
    assert not [x for x in hashed if x.endswith(".distcp")], hashed
    assert "step-00000001/state/.metadata" in hashed and "step-00000001/rank-00001.pt" in hashed


def test_resume_torch_state_at_another_world_size(tmp_path):
    ckpt = tmp_path / "ckpt"
    saved, _ = _run(tmp_path, "save", "ddp", 2, ckpt, "save2")
    loaded, _ = _run(tmp_path, "resume", "ddp", 1, ckpt, "resume1")
    o = loaded[0]
    assert o["refused"] is None and o["step"] == 3
    assert o["hash"] == o["reference"] == saved[0]["hash"]
    assert not [x for x in o["hashed"] if x.endswith(".distcp")], o["hashed"]


def test_ddp_checkpoint_loads_at_another_world_size(tmp_path):
    ckpt = tmp_path / "ckpt"
    saved, _ = _run(tmp_path, "save", "ddp", 2, ckpt, "save2")
    loaded, log = _run(tmp_path, "load", "ddp", 1, ckpt, "load1")
    assert loaded[0]["hash"] == saved[0]["hash"] == saved[1]["hash"]
    assert loaded[0]["optimizer_steps"] == 0
    assert loaded[0]["step"] == 3 and loaded[0]["rng_restored"] is False
    assert "resumed at world size 1 from a checkpoint saved at world size 2" in log
    assert "no longer bitwise reproducible" in log


# ------------------------------------------------------------------ FSDP2

def test_fsdp2_roundtrip_bitwise(tmp_path):
    outs, _ = _run(tmp_path, "roundtrip", "fsdp", 2, tmp_path / "ckpt", "fsdp")
    for o in outs:
        assert o["loaded2"] == o["hash2"] and o["loaded3"] == o["hash3"] != o["hash2"]
    m = _manifest(tmp_path / "ckpt" / "step-00000003")
    ranks = {s["path"]: s["rank"] for s in m["shards"]}
    assert ranks["state/__0_0.distcp"] == 0 and ranks["state/__1_0.distcp"] == 1


def test_fsdp2_reshards_two_ranks_to_one_and_one_to_two(tmp_path):
    two = tmp_path / "from2"
    saved, _ = _run(tmp_path, "save", "fsdp", 2, two, "save2")
    loaded, log = _run(tmp_path, "load", "fsdp", 1, two, "load1")
    assert loaded[0]["hash"] == saved[0]["hash"] == saved[1]["hash"]
    assert loaded[0]["optimizer_steps"] == 0
    assert loaded[0]["step"] == 3 and loaded[0]["rng_restored"] is False
    assert "no longer bitwise reproducible" in log
    one = tmp_path / "from1"
    saved, _ = _run(tmp_path, "save", "fsdp", 1, one, "save1")
    loaded, _ = _run(tmp_path, "load", "fsdp", 2, one, "load2")
    assert loaded[0]["hash"] == loaded[1]["hash"] == saved[0]["hash"]
    assert loaded[0]["optimizer_steps"] == loaded[1]["optimizer_steps"] == 0


# ------------------------------------------------------------------ SIGKILL during a background save

KILLER = textwrap.dedent('''
    # examples/fsdp.py, except that on the first start rank 1 stops inside the background write
    # of its shard of step KILL_STEP and says so: the test then SIGKILLs it there.
    import os, runpy, sys, time
    from launcher.runtime.checkpoint.checksums import ChecksumWriter, checksum_algorithm, checksum_file
    from launcher.runtime.checkpoint.selection import latest_complete
    from launcher.runtime.checkpoint.verify import verify_checkpoint

    KILL = ".staging-step-%08d" % int(os.environ["KILL_STEP"])
    real = ChecksumWriter.write

    def write(self, data):
        if os.environ.get("GLAUNCH_RESTART") == "0" and os.environ["RANK"] == "1" and KILL in str(self.path) \\
                and self.path.suffix == ".distcp" and self.size > 0:
            print("WRITING", flush=True)
            time.sleep(600)
        return real(self, data)

    ChecksumWriter.write = write
    sys.argv[0] = {script!r}
    runpy.run_path({script!r}, run_name="__main__")
''')


@pytest.mark.slow
def test_rank_killed_mid_background_save_resumes_from_previous_checkpoint_bitwise(tmp_path):
    example = REPO / "examples" / "fsdp.py"
    args = ["--steps", "20", "--log-every", "1"]
    common = {"GLAUNCH_CHECKPOINT_EVERY": 5, "GLAUNCH_CHECKPOINT_KEEP": 5}
    _finish(_start(example, args, 2, tmp_path / "straight" / "ckpt", tmp_path / "straight", **common))
    ref = json.loads((tmp_path / "straight" / "result.json").read_text())
    assert ref["final_step"] == 20 and ref["world_size"] == 2

    killer = tmp_path / "killer.py"
    killer.write_text(KILLER.format(script=str(example)))
    ckpt = tmp_path / "killed" / "ckpt"
    procs = _start(killer, args, 2, ckpt, tmp_path / "killed", KILL_STEP=10, **common)
    try:
        for line in procs[1].stdout:
            if line.strip() == "WRITING":
                procs[1].send_signal(signal.SIGKILL)
                break
        procs[1].wait(timeout=60)
        assert procs[1].returncode == -signal.SIGKILL
    finally:
        for p in procs:        # the launcher ends the other ranks of a start that lost one
            if p.poll() is None:
                p.kill()
            p.communicate(timeout=60)
    assert (ckpt / ".staging-step-00000010").is_dir()
    assert sorted(p.name for p in ckpt.glob("step-*")) == ["step-00000005"]
    assert latest_complete(ckpt, quiet=True).step == 5

    outs = _finish(_start(example, args, 2, ckpt, tmp_path / "killed", restart=1, **common))
    assert f"resumed from {ckpt / 'step-00000005'} (step 5)" in outs[0]
    res = json.loads((tmp_path / "killed" / "result.json").read_text())
    assert res["resumed_from"] == 5 and res["final_step"] == 20
    assert res["param_sha256"] == ref["param_sha256"]
    assert res["final_loss"] == ref["final_loss"]
    assert not list(ckpt.glob(".staging-*"))


# ------------------------------------------------------------------ checksums taken while loading

@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_verifying_reader_refuses_before_anything_is_loaded_and_checks_files_nobody_reads(tmp_path, monkeypatch):
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint import save as dcp_save

    from launcher.runtime.checkpoint import dcp
    from launcher.runtime.checkpoint.directory import CheckpointDamaged
    from launcher.rundir.rankcontext import context

    for var in RANK_VARS:
        monkeypatch.delenv(var, raising=False)
    ctx = context()
    d = tmp_path / "state"
    saved = {"a": torch.arange(300_000, dtype=torch.float32), "b": torch.ones(3, 5)}
    dcp_save(saved, storage_writer=FileSystemWriter(d), no_dist=True)
    algo = checksum_algorithm()
    (d / "spare.distcp").write_bytes(b"read by nobody")     # in the manifest, not in DCP's metadata

    def entry(name: str) -> dict:
        return {"path": f"state/{name}", "size": (d / name).stat().st_size, algo: checksum_file(d / name, algo)}

    expected = {n: entry(n) for n in ("__0_0.distcp", "spare.distcp")}

    def load() -> dict:
        target = {"a": torch.zeros(300_000), "b": torch.zeros(3, 5)}
        dcp.load(target, d, ctx, reader=dcp.VerifyingReader(d, expected, ctx))
        return target

    got = load()
    assert all(torch.equal(got[k], saved[k]) for k in saved)
    (d / "spare.distcp").write_bytes(b"READ by nobody")
    with pytest.raises(CheckpointDamaged, match=r"spare\.distcp .* mismatch"):
        load()
    (d / "spare.distcp").write_bytes(b"read by nobody")
    data = bytearray((d / "__0_0.distcp").read_bytes())
    data[len(data) // 2] ^= 0x01                           # inside tensor a's bytes
    (d / "__0_0.distcp").write_bytes(bytes(data))
    target = {"a": torch.zeros(300_000), "b": torch.zeros(3, 5)}
    with pytest.raises(CheckpointDamaged, match=r"__0_0\.distcp .* mismatch"):
        dcp.load(target, d, ctx, reader=dcp.VerifyingReader(d, expected, ctx))
    assert not target["a"].any() and not target["b"].any()  # refused before anything reached it


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_placeholders_take_the_tensors_read_and_the_rest_is_filled_in_place(tmp_path, monkeypatch):
    """A fresh optimizer's uninitialised state (placeholders) gets the tensors read, not a copy
    of them; a model's tensors keep their memory and are filled; a refused file reaches neither."""
    from torch.distributed.checkpoint import save as dcp_save

    from launcher.runtime.checkpoint import dcp
    from launcher.runtime.checkpoint.directory import CheckpointDamaged
    from launcher.rundir.rankcontext import context

    for var in RANK_VARS:
        monkeypatch.delenv(var, raising=False)
    ctx = context()
    d = tmp_path / "state"
    saved = {"model": {"w": torch.randn(200_000)}, "optimizer": {"state": {"w": {"m": torch.randn(200_000),
                                                                             "step": torch.tensor(3.0)}}}}
    dcp_save(saved, storage_writer=dcp.ChecksummingWriter(d), no_dist=True)
    algo = checksum_algorithm()
    expected = {f.name: {"path": f"state/{f.name}", "size": f.stat().st_size, algo: checksum_file(f, algo)}
                for f in d.glob("*.distcp")}

    def target() -> tuple[dict, torch.Tensor, list]:
        placeholders = [torch.empty(200_000), torch.empty(())]
        model = torch.zeros(200_000)
        return {"model": {"w": model}, "optimizer": {"state": {"w": dict(zip(("m", "step"), placeholders))}}}, \
            model, placeholders

    got, model, placeholders = target()
    dcp.load(got, d, ctx, reader=dcp.VerifyingReader(d, expected, ctx), replaceable=placeholders)
    assert got["model"]["w"] is model and torch.equal(model, saved["model"]["w"])
    state = got["optimizer"]["state"]["w"]
    assert state["m"] is not placeholders[0] and state["step"] is not placeholders[1]
    assert torch.equal(state["m"], saved["optimizer"]["state"]["w"]["m"]) and state["step"].item() == 3.0
    data = next(d.glob("*.distcp"))
    damaged = bytearray(data.read_bytes())
    damaged[len(damaged) // 2] ^= 0x01
    data.write_bytes(bytes(damaged))
    got, model, placeholders = target()
    with pytest.raises(CheckpointDamaged):
        dcp.load(got, d, ctx, reader=dcp.VerifyingReader(d, expected, ctx), replaceable=placeholders)
    assert not model.any() and got["optimizer"]["state"]["w"]["m"] is placeholders[0]


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_a_share_written_as_several_files_is_read_in_parallel_and_each_file_checked(tmp_path, monkeypatch):
    """A rank's share in three files, written and read in three threads: loaded bitwise; a
    flipped byte in the second file refuses the whole checkpoint, the state untouched."""
    from torch.distributed.checkpoint import save as dcp_save

    from launcher.runtime.checkpoint import dcp
    from launcher.runtime.checkpoint.directory import CheckpointDamaged
    from launcher.rundir.rankcontext import context

    for var in RANK_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(dcp, "io_threads", lambda ctx: 3)
    ctx = context()
    d = tmp_path / "state"
    saved = {name: torch.randn(100_000 + i) for i, name in enumerate("abcdef")}
    writer = dcp.ChecksummingWriter(d, thread_count=3)
    dcp_save(saved, storage_writer=writer, no_dist=True)
    files = sorted(f.name for f in d.glob("*.distcp"))
    assert files == ["__0_0.distcp", "__0_1.distcp", "__0_2.distcp"]
    algo = checksum_algorithm()
    expected = {f: {"path": f"state/{f}", "size": (d / f).stat().st_size, algo: checksum_file(d / f, algo)}
                for f in files}

    def target() -> dict:
        return {name: torch.zeros_like(t) for name, t in saved.items()}

    got = target()
    dcp.load(got, d, ctx, reader=dcp.VerifyingReader(d, expected, ctx))
    assert all(torch.equal(got[k], saved[k]) for k in saved)
    data = bytearray((d / files[1]).read_bytes())
    data[len(data) // 2] ^= 0x01
    (d / files[1]).write_bytes(bytes(data))
    got = target()
    with pytest.raises(CheckpointDamaged, match=r"__0_1\.distcp .* mismatch"):
        dcp.load(got, d, ctx, reader=dcp.VerifyingReader(d, expected, ctx))
    assert not any(t.any() for t in got.values())

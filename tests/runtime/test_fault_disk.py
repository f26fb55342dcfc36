"""A checkpoint filesystem that refuses writes: the error names the file system's own
failure, the failed save leaves no staging dir behind (nor do killed attempts before it),
so the next save fits again; a checkpoint dir that cannot be created is named on every
rank; a collective save waits for the background one in flight."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from conftest import RANK_VARS  # noqa: E402
from launcher import runtime as rt  # noqa: E402
from launcher.runtime.checkpoint import background  # noqa: E402
from launcher.runtime.checkpoint.selection import latest_complete  # noqa: E402
from launcher.runtime.checkpoint.verify import verify_checkpoint  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

# One stand-alone rank whose files may not grow past LIMIT bytes (RLIMIT_FSIZE: the write
# fails with EFBIG, as a full disk fails with ENOSPC), then may again.
FULL = textwrap.dedent('''
    import json, os, resource, signal, sys
    import torch
    from launcher import runtime as rt

    blocking = sys.argv[1] == "blocking"
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)     # the write fails instead of killing us
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.Linear(128, 128))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.randn(2, 128)).sum().backward()
    opt.step()
    ckpt = os.environ["GLAUNCH_CHECKPOINT_DIR"]
    os.makedirs(os.path.join(ckpt, ".staging-step-00000001"))   # a killed attempt's leftovers
    os.makedirs(os.path.join(ckpt, ".trash-step-00000000-1"))   # an interrupted prune's
    out = {}
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(os.environ["LIMIT"]), hard))
    try:
        saved = rt.save_torch_state(2, model, opt, blocking=blocking)
        if not blocking:
            saved = rt.wait_checkpoints()
        out["error"] = None
    except rt.CheckpointError as e:
        out["error"] = str(e)
    out["after_failure"] = sorted(os.listdir(ckpt))
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    saved = rt.save_torch_state(3, model, opt, blocking=blocking)
    if not blocking:
        saved = rt.wait_checkpoints()
    out["saved"] = saved.step
    out["after_success"] = sorted(os.listdir(ckpt))
    print(json.dumps(out))
''')


def _clean_env(tmp_path: Path, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in RANK_VARS and not k.startswith("GLAUNCH_")}
    env.update(PYTHONPATH=str(REPO) + os.pathsep + env.get("PYTHONPATH", ""), OMP_NUM_THREADS="1",
               GLAUNCH_RUN_DIR=str(tmp_path / "run"), GLAUNCH_CHECKPOINT_DIR=str(tmp_path / "ckpt"))
    env.update({k: str(v) for k, v in extra.items()})
    return env


@pytest.mark.parametrize("mode", ["blocking", "background"])
def test_a_full_disk_is_named_leaves_no_staging_dir_and_the_next_save_fits(tmp_path, mode):
    script = tmp_path / "full.py"
    script.write_text(FULL)
    # the DCP shard (~400 KB) does not fit; the rank file and the markers do
    proc = subprocess.run([sys.executable, str(script), mode], env=_clean_env(tmp_path, LIMIT=64 * 1024),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # the file system's error, not the framework's rewording of it ("unexpected pos ...")
    assert out["error"] and "File too large" in out["error"] and "unexpected pos" not in out["error"], out
    assert not [n for n in out["after_failure"] if n.startswith((".staging-", ".trash-"))], out
    assert out["saved"] == 3
    assert [n for n in out["after_success"] if not n.startswith(".trash-")] == ["latest", "step-00000003"], out


WORKER = textwrap.dedent('''
    import json, os, sys
    import torch
    from launcher import runtime as rt
    ctx = rt.init_distributed()
    model = torch.nn.Linear(4, 4)
    try:
        rt.save_torch_state(1, model)
        out = None
    except rt.CheckpointError as e:
        out = str(e)
    rt.shutdown_distributed()
    print(json.dumps(out))
''')


def test_a_checkpoint_dir_that_cannot_be_made_is_named_on_every_rank(tmp_path):
    import socket

    not_a_dir = tmp_path / "ckpt"
    not_a_dir.write_text("a file where the checkpoint dir should be")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=_clean_env(tmp_path, RANK=r, LOCAL_RANK=r, WORLD_SIZE=2, LOCAL_WORLD_SIZE=2,
                                             MASTER_ADDR="127.0.0.1", MASTER_PORT=port))
             for r in range(2)]
    outs = []
    for p in procs:
        text, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-3000:]
        outs.append(json.loads(text.strip().splitlines()[-1]))
    for message in outs:   # rank 1 too says why, not only that rank 0 failed
        assert message and str(not_a_dir) in message and "FileExistsError" in message, outs


def test_a_collective_save_waits_for_the_background_save_in_flight(single_rank_env, tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    rt.save_torch_state(1, model, blocking=False)
    with rt.stage_checkpoint(2, framework="test") as st:
        assert background.in_flight() is None   # waited for, before step 2 opened its staging dir
        with st.open("blob.bin") as f:
            f.write(b"x" * 10)
    assert st.committed.step == 2
    assert verify_checkpoint(tmp_path / "ckpt" / "step-00000001")[1] is None
    assert latest_complete(tmp_path / "ckpt").step == 2


ORPHAN = textwrap.dedent('''
    import sys, threading
    from pathlib import Path
    from launcher.runtime.checkpoint import staging as cs
    from launcher.runtime.checkpoint.directory import CheckpointError

    staging = Path(sys.argv[1])

    def commit():   # rank 0's background commit; rank 1 died before its marker
        try:
            cs.read_markers(staging, 5, 2, timeout_s=1e6, orphan_stall_s=1.0)
        except CheckpointError as e:
            print("GAVE UP:", e, flush=True)

    threading.Thread(target=commit).start()
    print("main thread ends", flush=True)   # as it does when a peer's death breaks a collective
''')


def test_a_background_commit_gives_up_on_a_dead_rank_once_the_main_thread_ended(tmp_path):
    staging = tmp_path / ".staging-step-00000005"
    staging.mkdir()
    (staging / ".done-rank-00000.json").write_text(json.dumps({"rank": 0, "step": 5, "files": []}))
    (staging / "__1_0.distcp").write_bytes(b"half a shard")
    script = tmp_path / "orphan.py"
    script.write_text(ORPHAN)
    # Before, the process stayed until the marker timeout (30 min for save_torch_state).
    proc = subprocess.run([sys.executable, str(script), str(staging)], env=_clean_env(tmp_path),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "GAVE UP: rank 1 wrote no done marker" in proc.stdout and "main thread ended" in proc.stdout, proc.stdout

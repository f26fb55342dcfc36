"""Under torchrun each worker's own log is copied into its node's task log: whole lines, as
written, stdout to stdout and stderr to stderr; an unfinished last line at the end."""

from __future__ import annotations

import io
from pathlib import Path

from launcher.runtime.workerlogs import WorkerLogCopier


def worker_file(log_dir: Path, local_rank: int, name: str) -> Path:
    path = log_dir / "7_abcd" / "attempt_0" / str(local_rank) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    return path


def test_lines_are_copied_whole_to_the_matching_stream(tmp_path):
    out, err = io.BytesIO(), io.BytesIO()
    copier = WorkerLogCopier(tmp_path, out, err)
    first, second, errors = (worker_file(tmp_path, 0, "stdout.log"), worker_file(tmp_path, 1, "stdout.log"),
                             worker_file(tmp_path, 0, "stderr.log"))
    first.write_bytes(b"iter 1: loss 2.0\niter 2: lo")
    second.write_bytes(b"rank 1 up\n")
    errors.write_bytes(b"a warning\n")
    copier.poll()
    assert out.getvalue().splitlines() == [b"iter 1: loss 2.0", b"rank 1 up"]
    assert err.getvalue() == b"a warning\n"
    with first.open("ab") as f:
        f.write(b"ss 1.9\nunfinished")
    copier.poll()
    assert out.getvalue().splitlines()[-1] == b"iter 2: loss 1.9"
    copier.finish()
    assert out.getvalue().endswith(b"\nunfinished\n")

"""A sweep's directory and record.

    <runs dir>/<sweep id>/
        sweep.json                 the sweep: its axes, elements (run id, run dir, swept values)
                                   and how they were submitted (Slurm: one array job per shape)
        array-N.sbatch             Slurm: each array's script, the exact bytes sbatch received
        code/  code.patch          the code snapshot its elements share
        logs/                      Slurm: what each array task printed before its element's logs
        <sweep id>-<i>/            element i: a run directory like any other (its run.json
                                   says which sweep and values it belongs to)

The sweep id is registered in the run index beside its elements' run ids, so `glaunch
status|logs|cancel|list SWEEP` find it; `summarize` gathers each element's swept values,
state, step and result and the count of each state (launcher.views.sweep_text makes the
text).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from launcher.errors import ConfigError, GlaunchError, RunError
from launcher.rundir import registry
from launcher.rundir.files import atomic_write_text, exclusive_lock, load_json_object, read_record
from launcher.rundir.layout import SWEEP_FILE
from launcher.rundir.records import IN_FLIGHT, RunRecord, State
from launcher.runner.status import progress

LOCK_FILE = ".sweep.lock"
LOG_DIR = "logs"


def new_sweep_id(name: str) -> str:
    return registry.new_run_id(f"{name}-sweep")


def element_run_id(sweep_id: str, index: int) -> str:
    return f"{sweep_id}-{index}"


# --- the record -------------------------------------------------------------------------------


@dataclass
class SweepElement:
    index: int
    run_id: str
    run_dir: str
    params: dict[str, str]


@dataclass
class SweepArray:
    """One submission: a Slurm array (its script and job id), or, elsewhere, one element."""

    elements: list[int]
    script: str | None = None
    job_id: str | None = None
    error: str | None = None


@dataclass
class SweepRecord:
    sweep_id: str
    name: str
    site: str
    scheduler: str
    sweep_dir: str
    experiment_file: str
    created: str
    dry_run: bool
    axes: list[dict[str, Any]]
    max_parallel: int | None
    elements: list[SweepElement]
    arrays: list[SweepArray] = field(default_factory=list)
    after: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k not in ("elements", "arrays")}
        out["elements"] = [e.__dict__ for e in self.elements]
        out["arrays"] = [a.__dict__ for a in self.arrays]
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SweepRecord:
        """ValueError naming what is missing or of the wrong shape."""
        def need(mapping: Mapping[str, Any], key: str, kind: type | tuple, where: str) -> Any:
            value = mapping.get(key)
            if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
                raise ValueError(f"{where}{key}: missing or not a {getattr(kind, '__name__', kind)}")
            return value

        elements = []
        for i, item in enumerate(need(data, "elements", list, "")):
            if not isinstance(item, Mapping):
                raise ValueError(f"elements[{i}]: not an object")
            params = need(item, "params", dict, f"elements[{i}].")
            elements.append(SweepElement(need(item, "index", int, f"elements[{i}]."),
                                         need(item, "run_id", str, f"elements[{i}]."),
                                         need(item, "run_dir", str, f"elements[{i}]."),
                                         {str(k): str(v) for k, v in params.items()}))
        arrays = []
        for i, item in enumerate(data.get("arrays") or []):
            if not isinstance(item, Mapping):
                raise ValueError(f"arrays[{i}]: not an object")
            members = need(item, "elements", list, f"arrays[{i}].")
            job_id = item.get("job_id")
            if job_id is not None and not (isinstance(job_id, str) and job_id.isdigit()):
                raise ValueError(f"arrays[{i}].job_id: not a Slurm job id: {job_id!r}")
            arrays.append(SweepArray([int(m) for m in members if isinstance(m, int)],
                                     item.get("script") if isinstance(item.get("script"), str) else None,
                                     job_id, item.get("error") if isinstance(item.get("error"), str) else None))
        parallel = data.get("max_parallel")
        return cls(sweep_id=need(data, "sweep_id", str, ""), name=str(data.get("name") or ""),
                   site=str(data.get("site") or ""), scheduler=str(data.get("scheduler") or ""),
                   sweep_dir=str(data.get("sweep_dir") or ""), experiment_file=str(data.get("experiment_file") or ""),
                   created=str(data.get("created") or ""), dry_run=bool(data.get("dry_run")),
                   axes=[a for a in data.get("axes") or [] if isinstance(a, dict)],
                   max_parallel=parallel if isinstance(parallel, int) and not isinstance(parallel, bool) else None,
                   elements=elements, arrays=arrays,
                   after=[str(a) for a in data.get("after") or [] if isinstance(a, str)])


def read(sweep_dir: str | os.PathLike) -> SweepRecord:
    return read_record(Path(sweep_dir) / SWEEP_FILE, SweepRecord.from_dict, "sweep record")


def write(sweep_dir: str | os.PathLike, record: SweepRecord) -> None:
    path = Path(sweep_dir) / SWEEP_FILE
    try:
        atomic_write_text(path, json.dumps(record.to_dict(), indent=2) + "\n")
    except OSError as exc:
        raise RunError(f"cannot write the sweep record: {exc.strerror or exc}", file=str(path)) from None


@contextlib.contextmanager
def updating(sweep_dir: str | os.PathLike) -> Iterator[SweepRecord]:
    with exclusive_lock(Path(sweep_dir) / LOCK_FILE, "sweep record"):
        record = read(sweep_dir)
        yield record
        write(sweep_dir, record)


def is_sweep_dir(path: str | os.PathLike) -> bool:
    try:
        return os.path.isfile(Path(path) / SWEEP_FILE)
    except (OSError, ValueError):
        return False


def find_sweep(ref: str | os.PathLike) -> Path | None:
    """A sweep id or directory -> the sweep directory; None when `ref` names no sweep."""
    text = os.fspath(ref)
    candidate = Path(text).expanduser()
    if is_sweep_dir(candidate):
        return candidate.resolve()
    for entry in reversed(registry.indexed_runs()):
        if entry["run_id"] == text and is_sweep_dir(entry["run_dir"]):
            return Path(entry["run_dir"])
    return None


# --- writing it ---------------------------------------------------------------------------------


@dataclass
class Written:
    """A written sweep directory, to take back on failure."""

    path: Path
    registered: list[tuple[str, str]] = field(default_factory=list)
    bundles: list[Any] = field(default_factory=list)     # launcher.runner.bundle.Bundle
    owns_path: bool = False

    def remove(self) -> None:
        for written in reversed(self.bundles):
            written.remove()
        for run_id, run_dir in reversed(self.registered):
            registry.unregister(run_id, run_dir)
        if self.owns_path:
            shutil.rmtree(self.path, ignore_errors=True)
            self.owns_path = False


def create_dir(sweep_dir: Path, experiment_file: str) -> Written:
    """The sweep directory (new) and its logs folder; its parents as needed."""
    try:
        sweep_dir.parent.mkdir(parents=True, exist_ok=True)
        sweep_dir.mkdir()
    except FileExistsError:
        raise ConfigError(f"sweep directory {sweep_dir} already exists", file=experiment_file, key="name") from None
    except OSError as exc:
        raise ConfigError(f"cannot create the sweep directory {sweep_dir}: {exc.strerror or exc}",
                          key="--runs-dir") from None
    written = Written(sweep_dir, owns_path=True)
    try:
        (sweep_dir / LOG_DIR).mkdir()
    except OSError:
        written.remove()
        raise
    return written


def record_launch(sweep_dir: str | os.PathLike, batches: Sequence[Any]) -> SweepRecord:
    """The submissions (launcher.schedulers.base.LaunchedBatch) into sweep.json."""
    with updating(sweep_dir) as record:
        record.arrays = [SweepArray(list(b.elements), b.script, b.job_id if b.script else None, b.error)
                         for b in batches]
    return record


# --- its state -------------------------------------------------------------------------------------


def sweep_state(states: Sequence[str]) -> str:
    """The sweep's state from its elements': theirs when they agree; else RUNNING or PENDING
    while any is in flight; else ENDED (the summary line counts each)."""
    distinct = set(states)
    if len(distinct) == 1:
        return states[0]
    if distinct & {s.value for s in IN_FLIGHT}:
        return State.RUNNING.value if State.RUNNING.value in distinct else State.PENDING.value
    return "ENDED"


def _result_of(run_dir: Path) -> dict[str, Any] | None:
    try:
        data = load_json_object(Path(run_dir) / "result.json")
    except (OSError, ValueError):
        return None
    return {k: data.get(k) for k in ("final_step", "final_loss", "param_sha256") if k in data}


def summarize(sweep_dir: Path, records: Mapping[str, RunRecord | GlaunchError],
              now: float | None = None) -> dict[str, Any]:
    """What `glaunch status SWEEP --json` prints: one row per element (`records`: run id ->
    its refreshed record, or why it cannot be read), the arrays, the counts."""
    now = time.time() if now is None else now
    sweep = read(sweep_dir)
    rows: list = []
    counts: dict[str, int] = {}
    for element in sweep.elements:
        run_dir = Path(element.run_dir)
        record = records.get(element.run_id)
        row: dict[str, Any] = {"index": element.index, "run_id": element.run_id, "run_dir": element.run_dir,
                               "params": element.params}
        if not isinstance(record, RunRecord):
            row.update(state=None, error=str(record) if record is not None else "no run record")
            rows.append(row)
            continue
        live = progress(run_dir, record, now) if record.state in IN_FLIGHT else None
        result = _result_of(run_dir)
        step = (live or {}).get("step")
        if step is None and result is not None:
            step = result.get("final_step")
        if step is None:
            step = next((s.stopped_at for s in reversed(record.starts) if s.stopped_at is not None), None)
        row.update(state=record.state, job_id=record.job_id, restarts=max(len(record.starts) - 1, 0),
                   step=step, result=result, reason=record.reason, detail=record.detail,
                   pending_reason=record.extra.get("pending_reason"))
        counts[record.state] = counts.get(record.state, 0) + 1
        rows.append(row)
    states = [r["state"] or "UNKNOWN" for r in rows]
    return {"sweep_id": sweep.sweep_id, "sweep_dir": str(sweep_dir), "site": sweep.site, "name": sweep.name,
            "state": sweep_state(states) if states else "EMPTY", "counts": counts,
            "axes": sweep.axes, "max_parallel": sweep.max_parallel, "after": sweep.after,
            "arrays": [a.__dict__ for a in sweep.arrays], "elements": rows}


def element_records(sweep_dir: Path, refresh: Callable[[list[tuple[Path, RunRecord]]], list[RunRecord]]
                    ) -> dict[str, RunRecord | GlaunchError]:
    """Every element's record, refreshed together (`refresh`: the scheduler's batch refresh)."""
    sweep = read(sweep_dir)
    found: dict[str, RunRecord | GlaunchError] = {}
    readable: list[tuple[Path, RunRecord]] = []
    for element in sweep.elements:
        try:
            readable.append((Path(element.run_dir), registry.read(element.run_dir)))
        except GlaunchError as exc:
            found[element.run_id] = exc
    for record in refresh(readable):
        found[record.run_id] = record
    return found

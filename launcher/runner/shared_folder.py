"""Runs whose ranks work in the same folder: the warning at submit.

Where the ranks run: every start of a run begins in its working directory (the plan's
`workdir`), the folder `glaunch submit` (or `glaunch run`) was called from. job.sbatch names
it (`--chdir`); the local site starts its job there. A code snapshot does not move it: the
script runs from its copy under `<run dir>/code` (a module from the copy's counterpart of
that folder, first on sys.path), but the relative paths it opens are still taken from the
submit folder. Over SSH the ranks run in the snapshot's counterpart of that folder (or the
run directory): a folder of the run's own.

So an unchanged script that writes `out/ckpt.pt` or `snapshot.pt` writes where every run
started from the same folder writes: a second run resumes, or overwrites, the first one's
checkpoint. A submission is warned (`warning`) when its ranks' working directory is that of
another run that is live (its record in flight) or can be resumed (ended other than
COMPLETED, after a start), and neither run keeps its outputs in its own run: a run does
when its args, resume_args or env values use a run-scoped value that differs between runs
(`${run:dir}`, `${run:id}`, `${run:checkpoint_dir}`), or when its script imports glaunch's
runtime, whose checkpoints go to the run's checkpoint directory. Whether the script writes
relative paths at all cannot be told before it runs: the warning says so.

Cheap enough for every dry run: no scheduler is asked (a record's state is taken as
written), only the newest RECENT_RUNS runs of the index are looked at, and only those that
are live or resumable have their resolved.yaml and task.json read.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from launcher.config.typed import NULLS
from launcher.config.yamlfile import MAX_FILE_BYTES, Scalar, parse
from launcher.errors import GlaunchError
from launcher.resolution.jobplan import JobPlan
from launcher.resolution.paths import inside
from launcher.rundir import registry, runvalues
from launcher.rundir.files import read_text
from launcher.rundir.layout import RESOLVED_FILE
from launcher.rundir.records import IN_FLIGHT, LIVE, RunRecord, State
from launcher.rundir.taskspec import read_task_spec
from launcher.runner.frameworks import LAUNCHER_IMPORT, script_text

# The newest runs of the index that a submission compares its folder with.
RECENT_RUNS = 50
# Run-scoped values that differ from one run to the next (`${run:restart}` does not).
OWN_VALUES = frozenset({"dir", "id", "checkpoint_dir"})
# Other runs named in the warning; the rest are counted.
NAMED = 3
# A working directory that resolved.yaml holds as written (no quotes, escapes or folded
# lines): a file without it is another folder's run, told without parsing the file.
PLAIN_PATH = re.compile(r"/[A-Za-z0-9/._+-]*")


@dataclass(frozen=True)
class FolderUse:
    """What the warning needs of a run: where its ranks work, whether its outputs are its
    own, and (another run) how it stands (`standing`)."""

    run_id: str
    workdir: str
    own_outputs: bool
    standing: str = ""


def names_own_folder(words: Iterable[str]) -> bool:
    """Pure: whether an entry point's args, resume_args or env values (`words`) name a
    run-scoped value that differs between runs."""
    return any(match.group(1) in OWN_VALUES for word in words for match in runvalues.REFERENCE.finditer(word))


def imports_runtime(script_text: str | None) -> bool:
    """Pure: whether a script's text imports glaunch's runtime (None: not known, e.g. a module)."""
    return script_text is not None and LAUNCHER_IMPORT.search(script_text) is not None


def standing(record: RunRecord) -> str | None:
    """Pure: how a run that may still write stands: its state while its record is in flight
    (live), "STATE, resumable" once it ended other than COMPLETED after a start; None for
    any other (a dry run, a completed run, a run the scheduler refused)."""
    state = str(record.state)
    if record.dry_run or state in (State.RENDERED.value, State.COMPLETED.value):
        return None
    if state in IN_FLIGHT or state in LIVE:
        return state
    return f"{state}, resumable" if record.starts else None


def sharing(this: FolderUse, others: Iterable[FolderUse]) -> list[FolderUse]:
    """Pure: the other runs whose ranks work in this run's folder where neither keeps its
    outputs in its own run."""
    if this.own_outputs:
        return []
    folder = os.path.normpath(this.workdir)
    return [other for other in others if other.run_id != this.run_id and not other.own_outputs
            and os.path.normpath(other.workdir) == folder]


def warning_text(this: FolderUse, shared: Sequence[FolderUse], entry: str) -> str | None:
    """Pure: the submission's warning (one line) for the runs it shares its folder with."""
    if not shared:
        return None
    names = ", ".join(f"{other.run_id} ({other.standing})" for other in shared[:NAMED])
    more = f" and {len(shared) - NAMED} more" if len(shared) > NAMED else ""
    runs, other = ("run", "the other") if len(shared) == 1 else ("runs", "the others")
    return (f"the ranks run in {this.workdir}, as do those of {runs} {names}{more}: if {entry} writes relative "
            f"paths (out/ckpt.pt), the runs share them, and this one may resume from or overwrite what {other} "
            "wrote. Give this run a folder of its own with a run-scoped value, e.g. entrypoint.args: "
            "[\"--out_dir=${run:dir}/out\"] (${run:checkpoint_dir} and ${run:id} too; in env values as well)")


def warning(plan: JobPlan) -> str | None:
    """The warning for a submission of `plan` whose ranks work in the folder of another
    live or resumable run, neither keeping its outputs in its own run; None otherwise, and
    where the run index cannot be read."""
    if inside(plan.workdir, plan.run_dir) is not None:
        return None                      # over SSH: the ranks run in the run's own snapshot
    words = [*plan.launch.entry_args, *plan.launch.entry_resume_args, *(value for _, value in plan.launch.env)]
    if names_own_folder(words) or imports_runtime(script_text(plan.submitted_script)):
        return None
    this = FolderUse(plan.run_id, plan.workdir, own_outputs=False)
    try:
        others = list(folder_uses(plan.run_id, plan.run_dir, plan.workdir))
    except (GlaunchError, OSError):
        return None
    entry = plan.submitted_script or plan.launch.entry_module or "the entry point"
    return warning_text(this, sharing(this, others), entry)


def folder_uses(run_id: str, run_dir: str, workdir: str) -> Iterator[FolderUse]:
    """The live and resumable runs among the newest RECENT_RUNS of the index (not `run_id`)
    whose ranks work in `workdir`. A run whose files cannot be read is left out."""
    for other_dir in recent_run_dirs(RECENT_RUNS):
        if other_dir == Path(run_dir):
            continue
        try:
            record = registry.read(other_dir)
        except GlaunchError:
            continue
        how = standing(record)
        if how is not None and record.run_id != run_id:
            use = recorded_use(other_dir, record.run_id, how, workdir)
            if use is not None:
                yield use


def recent_run_dirs(limit: int) -> list[Path]:
    """The run directories of the newest `limit` entries of the index, newest first, once each."""
    seen: list[Path] = []
    for entry in reversed(registry.indexed_runs()):
        run_dir = Path(entry["run_dir"])
        if run_dir not in seen:
            seen.append(run_dir)
            if len(seen) >= limit:
                break
    return seen


def recorded_use(run_dir: Path, run_id: str, how: str, workdir: str) -> FolderUse | None:
    """How the run in `run_dir` uses `workdir`, from its resolved.yaml (its working directory,
    args, resume_args, env values) and task.json (the script it runs); None when its ranks
    work elsewhere or resolved.yaml cannot be read."""
    path = run_dir / RESOLVED_FILE
    try:
        text = read_text(path, MAX_FILE_BYTES)
        if PLAIN_PATH.fullmatch(workdir) and workdir not in text:
            return None                  # elsewhere: told without parsing the file
        data, _ = parse(text, str(path))
    except (GlaunchError, OSError, ValueError):
        return None
    recorded = scalar(data, "derived", "workdir")
    if recorded is None or os.path.normpath(recorded) != os.path.normpath(workdir):
        return None
    words = (scalars(data, "experiment", "entrypoint", "args") + scalars(data, "experiment", "entrypoint",
             "resume_args") + scalars(data, "experiment", "env") + scalars(data, "site", "env"))
    own = names_own_folder(words) or imports_runtime(script_text(task_script(run_dir)))
    return FolderUse(run_id, recorded, own, how)


def task_script(run_dir: Path) -> str | None:
    """The script the run's starts run (task.json); None for a module or an unreadable task.json."""
    try:
        return read_task_spec(run_dir).script
    except GlaunchError:
        return None


def scalar(data: Any, *keys: str) -> str | None:
    """The text of the scalar at `keys` of a document read by read_yaml; None when absent or null."""
    value = _at(data, keys)
    if not isinstance(value, Scalar) or (value.plain and value.text in NULLS):
        return None
    return value.text


def scalars(data: Any, *keys: str) -> list[str]:
    """The texts of the scalars of the list or mapping at `keys` (a mapping's values)."""
    value = _at(data, keys)
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return [item.text for item in items if isinstance(item, Scalar)]


def _at(data: Any, keys: Sequence[str]) -> Any:
    for key in keys:
        data = data.get(key) if isinstance(data, dict) else None
    return data


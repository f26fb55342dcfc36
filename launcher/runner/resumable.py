"""A run to be resumed: its recorded configuration (resolved.yaml) read back, whether its
record lets it resume, and the entry a resume adds to its run.json. A resume on either road
(launcher.runner.resume here, launcher.runner.remote over SSH) reads and writes them."""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from launcher.config.load import experiment_from_data
from launcher.config.sites import site_from_layers
from launcher.config.typed import NULLS
from launcher.config.yamlfile import Scalar, read_yaml
from launcher.errors import ConfigError, GlaunchError, RunError
from launcher.resolution.jobplan import CodeRoot, JobPlan, SubmitContext
from launcher.rundir import claims, registry
from launcher.rundir.layout import (
    TASK_FILE,
    CRASH_FILE,
    DS_CONFIG_FILE,
    ENV_FILE,
    HEARTBEAT_DIR,
    HPARAMS_FILE,
    JOB_SCRIPT,
    LIB_DIR,
    PEER_NOT_STARTED_FILE,
    RESOLVED_FILE,
    RESULT_FILE,
    RESUME_FILE,
    STOP_FILE,
    RunDir,
)
from launcher.rundir.lifecycle import resubmit
from launcher.rundir.records import IN_FLIGHT, LIVE, RunRecord, State, is_known_state
from launcher.runner import bundle, frameworks
from launcher.runner.prepared import PreparedResume

# Moved to resumes/N/: the previous submission's files (its lib/ too: the new job.sbatch
# runs the job side of the glaunch that renders it), and the files a start leaves for the
# next one (a new start would take an old result.json for its own end).
MOVED_ASIDE = (JOB_SCRIPT, ENV_FILE, DS_CONFIG_FILE, RESOLVED_FILE, HPARAMS_FILE, TASK_FILE, LIB_DIR,
               RESULT_FILE, STOP_FILE, RESUME_FILE, CRASH_FILE, PEER_NOT_STARTED_FILE, HEARTBEAT_DIR)
# run.json keys about the previous job that the new one's scheduler writes afresh.
_PREVIOUS_JOB_KEYS = ("scheduler_history", "accounting", "request", "warnings", "pending_reason", "blocked",
                      "unreachable", "submission")
WHERE = "command line"


def refuse_unless_ended(record: RunRecord, run_dir: Path) -> None:
    """ConfigError for a run that may still be queued or running, or that never ran;
    RunError (a damaged record) for a state that is neither glaunch's nor Slurm's."""
    state = str(record.state)
    if record.dry_run or state == State.RENDERED.value:
        raise ConfigError(f"run {record.run_id} is a dry run: nothing ran to continue (glaunch submit the "
                          "experiment instead)", file=WHERE, key="RUN")
    uncertain = state == State.UNKNOWN.value and any(k in record.extra for k in ("submission", "unreachable"))
    if not is_known_state(state):
        raise RunError(f"damaged run record: {state!r} is no state of glaunch's or Slurm's, so whether run "
                       f"{record.run_id} ended is not known: it is not resumed", file=str(RunDir(run_dir).run_file),
                       key="state")
    if state in IN_FLIGHT or state in LIVE or uncertain:
        job = f" (job {record.job_id})" if record.job_id else ""
        raise ConfigError(f"run {record.run_id} is {state}{job}: only a run that ended can be resumed; wait for "
                          f"its end or cancel it (glaunch cancel {record.run_id})", file=WHERE, key="RUN")


@dataclass(frozen=True)
class RecordedConfig:
    """resolved.yaml of a run: the experiment and site it ran with, and what its
    submission derived (working directory, run and checkpoint directories, code snapshot)."""

    path: Path
    doc: Any                           # launcher.config.yamlfile.YamlDoc

    @classmethod
    def read(cls, run_dir: Path) -> RecordedConfig:
        path = Path(run_dir) / RESOLVED_FILE
        doc = read_yaml(path)
        for key in ("experiment", "site", "derived"):
            if not isinstance(doc.data.get(key), dict):
                raise ConfigError("not a resolved.yaml written by glaunch (no mapping here)", file=str(path), key=key,
                                  line=doc.lines.get(key))
        return cls(path, doc)

    def text(self, dotted: str) -> str | None:
        """A scalar of the document by dotted key (None when absent or null)."""

        value: Any = self.doc.data
        for part in dotted.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if not isinstance(value, Scalar) or (value.plain and value.text in NULLS):
            return None
        return value.text

    def load(self, overrides: tuple[str, ...]):
        """(LoadedExperiment, LoadedSite) of the recorded sections, `overrides` on the
        experiment's; checked as loading an experiment and a profile checks them."""

        doc = self.doc
        # Relative paths (entrypoint.script) are taken from the experiment file's folder, as at submit.
        exp_file = self.text("experiment_file") or str(self.path)
        site_file = Path(self.text("site_file") or self.path)
        exp = experiment_from_data(doc.data["experiment"], lambda key: doc.origin(f"experiment.{key}"),
                                   file=str(self.path), path=exp_file, overrides=overrides)
        site = site_from_layers([(doc.data["site"], lambda key: doc.origin(f"site.{key}"))], file=str(self.path),
                                path=site_file, chain=(site_file,))
        return exp, site

    def conventions(self, plan: JobPlan) -> JobPlan:
        """`plan` with the entry script's conventions the submission found (its warning
        signal, launcher.runner.frameworks), which the script's text need not give again."""
        signal = frameworks.recorded_signal(self.text("derived.warning_signal"))
        return dataclasses.replace(plan, recovery=dataclasses.replace(plan.recovery, warning_signal=signal))

    def context(self, exp, site):
        """The submission's context again: its working directory and run directory, the
        code snapshot it took; no sweep (an element resumes as a job of its own)."""

        workdir = self.text("derived.workdir") or os.getcwd()
        run_dir = self.text("derived.run_dir") or str(self.path.parent)
        code_root = code_dir = None
        source, script = self.text("derived.code.source"), self.text("derived.code.script")
        if source is not None:
            code_dir = self.text("derived.code.snapshot")
            workdir = submitted_from(workdir, source, code_dir, run_dir=run_dir)
            script = submitted_from(script, source, code_dir) if script else script
            anchor = os.path.dirname(script) if script else workdir
            code_root = CodeRoot(source, self.text("derived.code.git") == "true", _below(anchor, source) or ".",
                                 _below(workdir, source))
        return SubmitContext(cwd=workdir, python=sys.executable, environ=dict(os.environ),
                             run_id=os.path.basename(run_dir), runs_dir=os.path.dirname(run_dir).replace("$", "$$"),
                             code_root=code_root, code_dir=code_dir)

    def check_site_kept(self, exp, site) -> None:
        """The run resumes on the profile recorded with it: `site` cannot change."""
        wanted = exp.config.site
        if wanted is None or wanted in (self.text("experiment.site"), site.config.name):
            return
        raise exp.provenance.error("site", f"the run ran on site {site.config.name!r}; a resumed run keeps its site "
                                   f"(to run on {wanted!r}, submit the experiment again)")

    def check_kept(self, plan: JobPlan, exp, files: Any = os.path) -> None:
        """The run keeps its run directory, its checkpoint directory and its code snapshot
        (`files`: where they are looked for, with isdir and isfile; this machine's by default)."""
        where = exp.provenance
        checkpoint_dir = self.text("derived.checkpoint_dir")
        if checkpoint_dir is not None and os.path.normpath(plan.checkpoint_dir) != os.path.normpath(checkpoint_dir):
            raise where.error("checkpoint.dir", f"the run's checkpoints are in {checkpoint_dir}; a resumed run keeps "
                              f"its checkpoint directory (this would be {plan.checkpoint_dir})")
        problem = _claim_problem(plan)
        if problem:
            raise where.error("checkpoint.dir", f"checkpoint directory {plan.checkpoint_dir}: {problem}")
        run_dir = self.text("derived.run_dir")
        if run_dir is not None and os.path.normpath(plan.run_dir) != os.path.normpath(run_dir):
            raise ConfigError(f"the run directory would move to {plan.run_dir}", file=str(self.path),
                              key="derived.run_dir")
        if plan.code is not None and not files.isdir(plan.code.dest):
            raise where.error("code.snapshot", f"the run has no code snapshot in {plan.code.dest} to run from "
                              "(it was submitted without one)")
        script = plan.launch.entry_script
        if script and plan.launch.container is None and not files.isfile(script):
            raise where.error("entrypoint.script", f"script {script!r} not found")


def _claim_problem(plan: JobPlan) -> str | None:
    """Why the run may not load its checkpoint directory any more (another run took it
    over), or None. A directory with no claim is the run's (submitted before claims)."""
    if not bundle.checkpoint_outside(plan):
        return None
    try:
        owner = claims.owner_of(plan.checkpoint_dir)
    except GlaunchError as exc:
        return str(exc)
    if owner is None or owner.run_id == plan.run_id:
        return None
    return (f"it belongs to run {owner.run_id} now (run directory {owner.run_dir}), which writes its checkpoints "
            f"there; continue that run (glaunch resume {owner.run_id}) or submit this experiment again")


def submitted_from(workdir: str, source: str, snapshot: str | None, *, run_dir: str | None = None) -> str:
    """The folder a run was submitted from, given the working directory it recorded (or a
    path in it): a run that runs on a cluster from its code snapshot (submitted over SSH)
    records the snapshot's counterpart of that folder, whose experiment-relative paths and
    place in the code tree are those of the folder in `source`. A recorded `run_dir` (a
    resume over SSH by an earlier glaunch wrote it): a run is never submitted from its own
    directory, which did not exist yet, so the code tree's root is taken."""
    if snapshot and run_dir and os.path.normpath(workdir) == os.path.normpath(run_dir):
        return os.path.normpath(source)
    inside = _below(workdir, snapshot) if snapshot else None
    return os.path.normpath(os.path.join(source, inside)) if inside is not None else workdir


def _below(path: str, root: str) -> str | None:
    """`path` relative to `root` when inside it (as written: the tree may be gone)."""
    rel = os.path.relpath(os.path.normpath(path), os.path.normpath(root))
    return None if rel == ".." or rel.startswith("../") else rel


def record_resume(record: RunRecord, prepared: PreparedResume, number: int, aside: Path) -> None:
    """run.json: the resume entry, the new shape, the state back to SUBMITTING; the keys
    about the previous job go into the entry (its scheduler writes them afresh)."""

    plan = prepared.plan
    ended: dict[str, Any] = {"state": str(record.state), "reason": record.reason, "detail": record.detail,
                             "job_id": record.job_id, "nodes": record.nodes, "world_size": record.world_size,
                             "partition": record.partition}
    for key in _PREVIOUS_JOB_KEYS:
        if key in record.extra:
            value = record.extra.pop(key)
            if key == "scheduler_history":
                ended[key] = value
    entry = {"number": number, "at": registry.now(), "overrides": list(prepared.overrides),
             "previous_files": os.path.relpath(aside, prepared.run_dir), "ended": ended,
             "nodes": plan.allocation.nodes, "world_size": plan.launch.world_size,
             "partition": plan.allocation.partition, "first_start": len(record.starts)}
    resumes = record.extra.get("resumes")
    record.extra["resumes"] = [*(resumes if isinstance(resumes, list) else []), entry]
    resubmit(record)
    record.job_id = None
    record.nodes, record.world_size = plan.allocation.nodes, plan.launch.world_size
    record.partition = plan.allocation.partition
    record.requeue_max, record.crash_retries = plan.recovery.requeue_max, plan.recovery.crash_retries

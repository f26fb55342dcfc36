"""glaunch's Python API: what the command line calls, and what scripts, tests and
benchmarks call instead of the command line.

    from launcher import api
    run = api.submit("exp.yaml", site="mycluster", overrides=["resources.nodes=4"], dry_run=True)
    run.run_id, run.run_dir, run.job_id      # job_id is None for a dry run
    api.status(run.run_id)                   # the same dict as `glaunch status RUN --json`
    api.wait(run.run_id, on_line=print)      # follow to the end; returns the final state
    api.cancel(run.run_id); api.list_runs()
    api.resume(run.run_id, overrides=["resources.nodes=1"]); api.plan("exp.yaml", site="mycluster")

`submit` is `prepare` (or `prepare_sweep`) then `launch`; `resume` is `prepare_resume`
then `launch`. The first step loads, resolves and renders: every check that needs no
scheduler, nothing written. `launch` writes the run directory and hands it to the
scheduler. A caller that acts between the two (the command line shows the warnings once
the checks passed) calls them itself. Errors are `launcher.errors.GlaunchError`
subclasses carrying `exit_code`; bad input writes nothing.

A run that the scheduler runs to its end here (the local site; `run`, inside an
allocation), and `wait` given `echo`, show the run's console (launcher.views.console):
rank 0's log, a status line (redrawn in place when `live`), requeue events and the
outcome, as text to `echo` (stdout for a run that starts here without one).

The work is done in launcher.runner: `submission` (one run), `sweep_submission`,
`resume`, and `manage` (status, wait, logs, cancel, list); this module gathers it with
the site and planner calls, and makes the console from launcher.views. Each call imports
the part of the runner that does its work where it is called, and the console where a
run starts here: a command loads its own road, so `glaunch submit --dry-run` loads none of
the code that follows runs (manage, logs, the console), resumes or sweeps them, or talks
SSH (bench/dry_run.py times it).
"""

from __future__ import annotations

import importlib.resources
import os
from dataclasses import asdict
from pathlib import Path
from importlib.resources.abc import Traversable
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence, overload

from launcher.errors import ConfigError
from launcher.runner.inputs import rank_of, run_ref
from launcher.runner.results import Run, RunRef, Sweep

if TYPE_CHECKING:
    from launcher.runner.resume import PreparedResume
    from launcher.runner.submission import Prepared
    from launcher.runner.sweep_submission import PreparedSweep
    from launcher.schedulers.base import Echo

__all__ = ["Run", "Sweep", "cancel", "check_site", "detect_site", "init", "launch", "list_runs", "logs", "plan",
           "prepare", "prepare_resume", "prepare_sweep", "resume", "run", "sites", "status", "submit", "wait"]

Text = Callable[[str], None]


# --- submitting -------------------------------------------------------------------------------


def prepare(experiment: str | os.PathLike, *, site: str | None = None, overrides: Sequence[str] = (),
            runs_dir: str | None = None, after: Sequence[str] = (), dry_run: bool = False) -> Prepared:
    """One run of the experiment on the site (its `site:` unless `site` is given, else
    local), `overrides` (KEY=VALUE) applied, resolved and rendered; nothing written.
    `after` (RUN[:ok|any]): runs or sweeps to wait for; their state is asked of the
    scheduler unless `dry_run`."""
    from launcher.runner import submission

    return submission.prepare(experiment, site=site, overrides=overrides, runs_dir=runs_dir, after=after,
                              dry_run=dry_run)


def prepare_sweep(experiment: str | os.PathLike, sweep: Sequence[str], *, site: str | None = None,
                  overrides: Sequence[str] = (), runs_dir: str | None = None, max_parallel: int | None = None,
                  after: Sequence[str] = (), dry_run: bool = False) -> PreparedSweep:
    """Every combination of the `sweep` values (KEY=V1,V2,... each; the first varies
    slowest), each resolved and checked as its own run would be, its values applied after
    `overrides`; `max_parallel` of its elements run at a time. One element that cannot run
    refuses the whole sweep, naming it. Nothing written (see
    launcher.runner.sweep_submission)."""
    from launcher.runner import sweep_submission

    return sweep_submission.prepare_sweep(experiment, sweep, site=site, overrides=overrides, runs_dir=runs_dir,
                                          max_parallel=max_parallel, after=after, dry_run=dry_run)


def prepare_resume(run: RunRef, *, overrides: Sequence[str] = (), dry_run: bool = False) -> PreparedResume:
    """The ended run `run`, its recorded configuration resolved with `overrides` and
    rendered; nothing written; its state asked of the scheduler unless `dry_run`
    (see launcher.runner.resume)."""
    from launcher.runner import resume as resumption

    return resumption.prepare_resume(run, overrides=overrides, dry_run=dry_run)


@overload
def launch(prepared: PreparedSweep, *, dry_run: bool = False, check: bool = True, echo: Text | None = None,
           live: bool = False) -> Sweep: ...


@overload
def launch(prepared: Prepared | PreparedResume, *, dry_run: bool = False, check: bool = True,
           echo: Text | None = None, live: bool = False) -> Run: ...


def launch(prepared: Prepared | PreparedResume | PreparedSweep, *, dry_run: bool = False, check: bool = True,
           echo: Text | None = None, live: bool = False) -> Run | Sweep:
    """Write what `prepare`, `prepare_sweep` or `prepare_resume` made and, unless `dry_run`,
    hand it to the scheduler (`check`: Slurm's `sbatch --test-only` first). The local site
    runs it to its end here, its console to `echo`."""
    from launcher.runner import submission

    console = None if dry_run else _console(echo, live)     # a dry run starts nothing to show
    if not isinstance(prepared, submission.Prepared):
        from launcher.runner import resume as resumption, sweep_submission

        if isinstance(prepared, sweep_submission.PreparedSweep):
            return sweep_submission.launch_sweep(prepared, dry_run=dry_run, check=check, echo=console)
        if isinstance(prepared, resumption.PreparedResume):
            return resumption.launch_resume(prepared, dry_run=dry_run, check=check, echo=console)
    return submission.launch(prepared, dry_run=dry_run, check=check, echo=console)


def submit(experiment: str | os.PathLike, *, site: str | None = None, overrides: Sequence[str] = (),
           dry_run: bool = False, runs_dir: str | None = None, check: bool = True, echo: Text | None = None,
           live: bool = False, sweep: Sequence[str] = (), max_parallel: int | None = None,
           after: Sequence[str] = ()) -> Run | Sweep:
    """Resolve, render, write the run bundle and submit it (or stop there with `dry_run`).
    With `sweep` (KEY=V1,V2,... each): a sweep of every combination, `max_parallel` of
    its elements at a time (see prepare_sweep)."""
    if sweep:
        return launch(prepare_sweep(experiment, sweep, site=site, overrides=overrides, runs_dir=runs_dir,
                                    max_parallel=max_parallel, after=after, dry_run=dry_run),
                      dry_run=dry_run, check=check, echo=echo, live=live)
    return launch(prepare(experiment, site=site, overrides=overrides, runs_dir=runs_dir, after=after,
                          dry_run=dry_run),
                  dry_run=dry_run, check=check, echo=echo, live=live)


def resume(run: RunRef, *, overrides: Sequence[str] = (), dry_run: bool = False, check: bool = True,
           echo: Text | None = None, live: bool = False) -> Run:
    """Continue the ended run `run` from its newest complete checkpoint, in its run
    directory, with `overrides` (KEY=VALUE) on its recorded configuration (see
    launcher.runner.resume)."""
    return launch(prepare_resume(run, overrides=overrides, dry_run=dry_run), dry_run=dry_run, check=check,
                  echo=echo, live=live)


def run(experiment: str | os.PathLike, *, site: str | None = None, overrides: Sequence[str] = (),
        runs_dir: str | None = None, echo: Text | None = None, live: bool = False,
        environ: Mapping[str, str] | None = None) -> Run:
    """`glaunch run`: inside an existing Slurm allocation, start the run's ranks on its
    nodes with srun and follow it to its end (see launcher.runner.submission.run)."""
    from launcher.runner import submission

    return submission.run(experiment, site=site, overrides=overrides, runs_dir=runs_dir, echo=_console(echo, live),
                          environ=environ)


def _console(echo: Text | None, live: bool) -> Echo | None:
    """How a run that starts here is shown: its console, to `echo`; nothing without it."""
    if echo is None:
        return None
    from launcher.views.console import Console

    return lambda run_dir: Console(run_dir, echo, live=live)


# --- runs after submission -------------------------------------------------------------------


def status(run: RunRef) -> dict[str, Any]:
    """What `glaunch status RUN --json` prints (a sweep: its elements, arrays and counts)."""
    from launcher.runner import manage

    return manage.status(run_ref(run))


def wait(run: RunRef, *, on_line: Text | None = None, on_state: Text | None = None, echo: Text | None = None,
         live: bool = False, poll_s: float | None = None) -> str:
    """Follow the run to its end across requeues; returns the final state. `on_line`: rank
    0's log, one whole line (without its newline) per call; `on_state`: a line per change
    of state (a sweep: each element's); `echo`: the run's console; `poll_s`: seconds
    between looks (default launcher.runner.manage.FOLLOW_POLL_S). SchedulerError when it
    can never start."""
    from launcher.runner import manage
    from launcher.views.submit_text import state_line

    if poll_s is None:
        poll_s = manage.FOLLOW_POLL_S
    said = (lambda change: on_state(state_line(change))) if on_state is not None else None
    return manage.wait(run_ref(run), on_line=on_line, on_state=said, poll_s=poll_s,
                       console=_console(echo, live))


def logs(run: RunRef, *, rank: int | None = None, follow: bool = False, echo: Text = print,
         poll_s: float = 1.0) -> None:
    """The task logs of the run, each line tagged with its task's ranks (``[r0]``, ``[r1!]``
    for stderr; under torchrun a node's, ``[node1 r2-3]``), across requeues; `rank`: global
    rank N's task only; with `follow`, until it ends. A sweep's: every element's."""
    from launcher.runner import manage

    manage.logs(run_ref(run), rank=rank_of(rank), follow=follow, echo=echo, poll_s=poll_s)


def cancel(run: RunRef) -> str:
    """Cancel the run's job (a sweep: every element's); a sentence saying what was done."""
    from launcher.runner import manage

    return manage.cancel(run_ref(run))


def list_runs(limit: int = 20, sweep: Any = None) -> list[dict[str, Any]]:
    """The newest runs and sweeps, one row each (`glaunch list --json`); with `sweep`, its
    elements' rows."""
    from launcher.runner import manage

    return manage.list_runs(limit, None if sweep is None else run_ref(sweep, "sweep"))


# --- planning and sites ----------------------------------------------------------------------


def plan(experiment: str | os.PathLike, *, site: str | None = None, overrides: Sequence[str] = (),
         at_gpus: int | None = None):
    """The planner's result (launcher.resolution.planner.PlanResult) for the experiment on the
    site, with goodput projected at its size and, given `at_gpus`, at that many GPUs."""
    from launcher.resolution.strategy import plan_for
    from launcher.runner import submission

    exp, loaded_site = submission.load(experiment, site, overrides)
    return plan_for(exp, loaded_site, at_gpus)


def sites(site: str | os.PathLike | None = None) -> dict[str, Any]:
    """The profiles on the search path: {"sites": name -> the file that name finds,
    "shadowed": [(name, file) of those it hides], "search_path": [{folder, source,
    exists}] in search order, "profiles": [{name, path, folder, source, shadows: [{path,
    folder, source}]}]} (source: site_configs, GLAUNCH_SITE_PATH, user or shipped). With
    `site` (a name or a file): that profile loaded and checked, resolved through its
    extends chain: {"site", "file", "chain", "values": every key's value and where it came
    from}; ConfigError for a bad one."""
    from launcher.config.sites import found_profiles, load_site, search_folders

    if site is None:
        cwd = Path.cwd()
        found = found_profiles(cwd, os.environ)
        return {"sites": {p["name"]: p["path"] for p in found},
                "shadowed": [(p["name"], s["path"]) for p in found for s in p["shadows"]],
                "search_path": search_folders(cwd, os.environ), "profiles": found}

    loaded = load_site(site, Path.cwd(), os.environ, key="SITE")
    rows = []
    for key, value in _flatten(asdict(loaded.config)).items():
        origin = loaded.provenance.of(key, exact=True)
        rows.append({"key": key, "value": value, "from": origin.file + (f":{origin.line}" if origin.line else "")})
    return {"site": loaded.config.name, "file": str(loaded.path), "chain": [str(p) for p in loaded.chain],
            "values": rows}


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def check_site(site: str):
    """The profile against the live cluster (over SSH where its `login:` is the road): a
    CheckReport (launcher.schedulers.cluster.check) with the fatal differences and the
    warnings, each in profile terms."""
    from launcher.runner import site_tools

    return site_tools.check_site(site)


def detect_site(name: str | None = None, *, write_to: str | os.PathLike | bool = False,
                login: str | None = None) -> tuple[str, str, Path | None]:
    """(profile name, profile text, the file written) for the Slurm cluster this machine
    submits to, or the one reached over SSH through `login` (`[user@]host[:port]`, an
    ~/.ssh/config alias too; the profile then names it). With `write_to` (a file; True:
    NAME.yaml where the user's own profiles live, ~/.config/glaunch/sites/, which the site
    search path reads from any working directory) the profile is written there, never over
    a file that exists and never into the profiles shipped with glaunch (ConfigError naming
    --output)."""
    from launcher.config.login import login_from_text
    from launcher.runner import site_tools

    reached = login_from_text(login, key="--login") if login is not None else None
    return site_tools.detect_site(name, write_to=write_to, login=reached)


# --- a new experiment --------------------------------------------------------------------------

STARTER_FILES = ("exp.yaml", "train.py")


def init(directory: str | os.PathLike = ".") -> list[Path]:
    """Write a starter experiment into `directory` (made when missing): exp.yaml and the
    train.py it runs, a small model trained with torch DDP that checkpoints, stops when
    asked and resumes; `glaunch submit exp.yaml` runs it on this machine as written.
    Returns the files written. A file of those names that exists already is a ConfigError
    naming it (exit 2), and then nothing is written."""
    folder = Path(directory)
    if os.path.lexists(folder) and not folder.is_dir():
        raise ConfigError("exists and is not a folder", file=str(folder), key="DIR")
    targets = [folder / name for name in STARTER_FILES]
    for path in targets:
        if os.path.lexists(path):
            raise ConfigError("already exists; glaunch init writes over no file (give another DIR)", file=str(path))
    starter = _starter()
    texts = [starter.joinpath(name).read_text(encoding="utf-8") for name in STARTER_FILES]
    written: list[Path] = []
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for path, text in zip(targets, texts):
            with open(path, "x", encoding="utf-8") as out:   # "x": never over a file made since the check
                written.append(path)
                out.write(text)
    except OSError as exc:
        for path in written:
            path.unlink(missing_ok=True)
        raise ConfigError(exc.strerror or str(exc), file=str(exc.filename or folder)) from None
    return written


def _starter() -> Traversable:
    """The starter's files: launcher/starter/ where the package is installed (read through
    importlib.resources, a folder or not), else the checkout's starter/ (a source tree, an
    editable install)."""
    shipped = importlib.resources.files("launcher").joinpath("starter")
    if shipped.is_dir():
        return shipped
    return Path(__file__).resolve().parents[1] / "starter"

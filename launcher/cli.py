"""glaunch's command line: parse, call launcher.api, print what launcher.views makes of
its results, map errors to exit codes. A command imports the views it prints with where it
prints them, as the API imports the part of the runner each call needs: `glaunch submit
--dry-run` loads no status, plan or listing text.

Exit codes: 0 success; 1 the run failed (or was cancelled); 2 bad input; 3 the scheduler
refused or could not be reached; 130 interrupted (Ctrl-C)."""

from __future__ import annotations

import errno
import json
import os
import sys

import click

from launcher import __version__, api, shell
from launcher.cli_sites import sites
from launcher.errors import GlaunchError
from launcher.views import submit_text
from launcher.views.text import printable

INTERRUPTED = 130
_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())     # click >= 8.2


def run() -> None:
    """The console script: `main`, then its output flushed here, so that output that cannot
    be written (a full disk, a reader gone) is one line and exit 1, not a traceback at exit."""
    try:
        main()
        code: int | str | None = 0
    except SystemExit as exc:
        code = exc.code
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EPIPE):
            raise
        if exc.errno != errno.EPIPE:
            _cannot_write(exc)
        code = 1
    sys.exit(_flush_output(code))


def _flush_output(code: int | str | None) -> int | str | None:
    """Flush stdout and stderr; one that cannot take it is pointed at /dev/null, so that the
    interpreter's own flush at exit has nothing left to complain about."""
    for stream in (sys.stdout, sys.stderr):
        if stream is None:          # the process was started with it closed
            continue
        try:
            stream.flush()
        except (OSError, ValueError) as exc:
            code = code or 1
            if stream is sys.stdout and isinstance(exc, OSError) and not isinstance(exc, BrokenPipeError):
                _cannot_write(exc)
            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
            except (OSError, ValueError):
                pass
    return code


def _cannot_write(exc: OSError) -> None:
    """Say on stderr, if it can take it, that the output could not be written."""
    try:
        if sys.stderr is not None:
            sys.stderr.write(f"glaunch: error: cannot write the output: {exc.strerror or exc}\n")
            sys.stderr.flush()
    except (OSError, ValueError):
        pass


def main() -> None:
    try:
        cli.main(prog_name="glaunch", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except (click.exceptions.Abort, KeyboardInterrupt):
        click.echo("glaunch: interrupted", err=True)
        sys.exit(INTERRUPTED)
    except (click.ClickException, GlaunchError) as exc:
        if isinstance(exc, click.ClickException) and isinstance(exc, _NO_ARGS_IS_HELP):
            exc.show()                  # `glaunch`, `glaunch sites`: their help
            sys.exit(2)
        # One line, usage errors too; no control character of a quoted value reaches the terminal.
        hint = f" ({exc.ctx.command_path} --help)" if isinstance(exc, click.UsageError) and exc.ctx else ""
        text = exc.format_message() if isinstance(exc, click.ClickException) else exc
        click.echo(f"glaunch: error: {printable(text, lines=True)}{hint}", err=True)
        sys.exit(2 if isinstance(exc, click.UsageError) else exc.exit_code)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="glaunch")
def cli() -> None:
    """Launch multi-node PyTorch training on Slurm from a site profile and an experiment.

    \b
    glaunch submit exp.yaml --site mycluster            submit through submitit
    glaunch submit exp.yaml --site mycluster --dry-run  render the run bundle only
    glaunch plan exp.yaml --site mycluster              which strategy fits the GPUs
    glaunch init my-experiment                          a starter exp.yaml and train.py
    """


# --- init ----------------------------------------------------------------------------------


@cli.command()
@click.argument("directory", metavar="[DIR]", default=".", required=False)
def init(directory):
    """Write a starter experiment into DIR (default: the current folder): exp.yaml and the
    train.py it runs. `glaunch submit exp.yaml` runs it on this machine as written.

    Existing files are never overwritten: exit 2, naming the file.
    """
    from launcher.views.init_text import initialized

    click.echo(initialized(api.init(directory)))


def _emit(as_json: bool, data: dict, text: str) -> None:
    click.echo(json.dumps(data, indent=2) if as_json else text)


def _warn(warnings) -> None:
    click.echo("".join(f"glaunch: warning: {w}\n" for w in warnings), err=True, nl=False)


def _flush(pending: list) -> None:
    """Call the deferred outputs, once each, in order."""
    while pending:
        pending.pop(0)()


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


# --- submit --------------------------------------------------------------------------------


@cli.command()
@click.argument("experiment")
@click.argument("overrides", nargs=-1)
@click.option("--site", "-s", help="Site profile name or YAML path (default: the experiment's site:, else local).")
@click.option("--dry-run", is_flag=True, help="Render the run bundle and print it; submit nothing.")
@click.option("--runs-dir", help="Where run directories go.")
@click.option("--wait", is_flag=True, help="Follow the job to its end; exit with its outcome.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--check/--no-check", default=True, help="Run `sbatch --test-only` before submitting (Slurm).")
@click.option("--sweep", "sweep", multiple=True, metavar="KEY=V1,V2,...",
              help="Sweep KEY over the values (repeatable: every combination runs, one run directory each; "
                   "on Slurm one job array per allocation shape).")
@click.option("--max-parallel", type=click.IntRange(min=1), default=None,
              help="With --sweep: how many elements run at once (per array on Slurm).")
@click.option("--after", multiple=True, metavar="RUN[:ok|any]",
              help="Start only once RUN (a run or sweep) ended: ok (default) completed, any whatever its end.")
def submit(experiment, overrides, site, dry_run, runs_dir, wait, as_json, check, sweep, max_parallel, after):
    """Resolve EXPERIMENT on a site, write the run bundle and submit it.

    OVERRIDES are KEY=VALUE dot-list edits of the experiment, e.g. resources.nodes=4.
    """
    if not dry_run:
        _quiet_submitit()
    if sweep:
        _submit_sweep(experiment, overrides, site, dry_run, runs_dir, wait, as_json, check, sweep, max_parallel,
                      after)
        return
    if max_parallel is not None:
        raise click.UsageError("--max-parallel applies to a sweep (give --sweep)")
    prepared = api.prepare(experiment, site=site, overrides=overrides, runs_dir=runs_dir, after=after, dry_run=dry_run)
    to_submit = _command_line("submit", experiment, *_option("--site", site), *_option("--runs-dir", runs_dir),
                              *(word for a in after for word in _option("--after", a)), *overrides)
    _launch_and_follow(prepared, dry_run=dry_run, wait=wait, as_json=as_json, check=check, to_submit=to_submit)


def _option(name: str, value: str | None) -> list[str]:
    return [] if value is None else [name, value]


def _command_line(*words: str) -> str | None:
    """`glaunch WORDS...` as a shell reads it back: what a dry run tells the user to type
    (None for a word no shell line can hold)."""
    try:
        return printable(shell.join(["glaunch", *words]))
    except shell.ShellTextError:
        return None


def _launch_and_follow(prepared, *, dry_run: bool, wait: bool, as_json: bool, check: bool,
                       action: str = "submitted", to_submit: str | None = None) -> None:
    """Launch a prepared run (api.prepare or api.prepare_resume), print what happened, and
    with `wait` follow it to its end; exits with its outcome."""
    # The warnings (and a local run's first line) wait until launch's checks passed, so that
    # bad input is one error line; a run on this machine shows them before its console.
    pending = [lambda: _warn(prepared.warnings)]
    shown = not (as_json or dry_run)
    if shown and prepared.scheduler.runs_to_completion:
        pending.append(lambda: click.echo(submit_text.running_here(prepared.plan)))

    def write(text: str) -> None:
        _flush(pending)
        _write(text)

    live = sys.stdout.isatty()
    run = api.launch(prepared, dry_run=dry_run, check=check, echo=write if shown else _quiet, live=live)
    _flush(pending)
    info = {"run_id": run.run_id, "run_dir": str(run.run_dir), "site": run.site, "dry_run": run.dry_run,
            "files": sorted(run.files)}
    if dry_run:
        if run.cluster() is not None:
            info["cluster"] = run.cluster()
        _emit(as_json, info, submit_text.dry_run(run, prepared.files["job.sbatch"], to_submit))
        return
    if run.exit_code is not None:     # the scheduler ran it to its end; its console said how it ended
        info.update(state=run.state, job_ids=list(run.job_ids), exit_code=run.exit_code)
        if as_json:
            click.echo(json.dumps(info, indent=2))
        sys.exit(run.exit_code)
    info.update(job_id=run.job_id, state=run.state)
    if run.cluster() is not None:
        info["cluster"] = run.cluster()
    if not wait:
        _emit(as_json, info, submit_text.started(run, action))
        return
    if shown:
        click.echo(submit_text.started(run, action, following=True))
    try:
        state = api.wait(run, echo=write if shown else None, live=live)
    except KeyboardInterrupt:
        click.echo(f"glaunch: stopped following run {run.run_id}; job {run.job_id} goes on "
                   f"(glaunch status {run.run_id}, glaunch cancel {run.run_id})", err=True)
        sys.exit(INTERRUPTED)
    info["state"] = state
    if as_json:
        click.echo(json.dumps(info, indent=2))
    sys.exit(0 if state == "COMPLETED" else 1)


def _quiet(text: str) -> None:
    """Where the console of a run goes when nothing but one JSON object is printed."""


@cli.command()
@click.argument("run")
@click.argument("overrides", nargs=-1)
@click.option("--dry-run", is_flag=True, help="Resolve and render the resumed run and print it; write and submit "
                                              "nothing.")
@click.option("--wait", is_flag=True, help="Follow the job to its end; exit with its outcome.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--check/--no-check", default=True, help="Run `sbatch --test-only` before submitting (Slurm).")
def resume(run, overrides, dry_run, wait, as_json, check):
    """Continue RUN (a run id or directory) that ended, from its newest complete checkpoint.

    It stays in its run directory with its checkpoint directory. OVERRIDES are KEY=VALUE
    edits of its recorded configuration (resolved.yaml), e.g. resources.nodes=1 or
    entrypoint.args=[--steps,200]; the previous job.sbatch, env.sh and the rest move to
    resumes/N/ in the run directory.
    """
    if not dry_run:
        _quiet_submitit()
    prepared = api.prepare_resume(run, overrides=overrides, dry_run=dry_run)
    _launch_and_follow(prepared, dry_run=dry_run, wait=wait, as_json=as_json, check=check, action="resumed as",
                       to_submit=_command_line("resume", run, *overrides))


def _submit_sweep(experiment, overrides, site, dry_run, runs_dir, wait, as_json, check, sweep, max_parallel,
                  after) -> None:
    prepared = api.prepare_sweep(experiment, sweep, site=site, overrides=overrides, runs_dir=runs_dir,
                                 max_parallel=max_parallel, after=after, dry_run=dry_run)
    local = prepared.scheduler.runs_to_completion
    runs_here = local and not dry_run
    _warn(prepared.warnings if runs_here else ())
    if local and not (as_json or dry_run):
        click.echo(submit_text.sweep_running_here(prepared))
    result = api.launch(prepared, dry_run=dry_run, check=check, echo=_quiet)
    _warn(() if runs_here else prepared.warnings)
    info = result.to_json()
    if dry_run:
        _emit(as_json, info, submit_text.sweep_dry_run(result, prepared.prepared[0].files["job.sbatch"]))
        return
    if not local:
        if not (as_json and wait):
            _emit(as_json, info, submit_text.sweep_started(result))
        if not wait:
            return
        try:
            state = api.wait(result, on_state=None if as_json else click.echo)
        except KeyboardInterrupt:
            click.echo(f"glaunch: stopped following sweep {result.sweep_id}; its jobs go on "
                       f"(glaunch status {result.sweep_id}, glaunch cancel {result.sweep_id})", err=True)
            sys.exit(INTERRUPTED)
        info["state"] = state
    from launcher.views.status_text import format_status

    summary = api.status(result.sweep_dir)
    info["state"] = summary["state"]
    _emit(as_json, dict(info, elements=summary["elements"]), format_status(summary))
    sys.exit(0 if summary["state"] == "COMPLETED" else 1)


@cli.command("run")
@click.argument("experiment")
@click.argument("overrides", nargs=-1)
@click.option("--site", "-s", help="Site profile of the cluster (default: the experiment's site:, else local).")
@click.option("--runs-dir", help="Where run directories go.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object at the end.")
def run_cmd(experiment, overrides, site, runs_dir, as_json):
    """Inside a Slurm allocation (salloc, an interactive job): start EXPERIMENT's ranks on
    its nodes with srun, no sbatch; follow it to its end."""
    _quiet_submitit()
    run = api.run(experiment, site=site, overrides=overrides, runs_dir=runs_dir, echo=_quiet if as_json else _write)
    if as_json:
        click.echo(json.dumps(dict(run.to_json(), job_ids=list(run.job_ids)), indent=2))
    else:
        click.echo(submit_text.ended_here(run))
    sys.exit(run.exit_code or 0)


def _quiet_submitit() -> None:
    """submitit logs each submission at INFO on stdout (the console says what matters): a filter,
    as importing submitit resets its logger. A dry run submits nothing and skips it."""
    import logging

    logging.getLogger("submitit").addFilter(lambda record: record.levelno >= logging.WARNING)


# --- plan ----------------------------------------------------------------------------------


@cli.command()
@click.argument("experiment")
@click.argument("overrides", nargs=-1)
@click.option("--site", "-s", help="Site profile name or YAML path.")
@click.option("--at-gpus", type=click.IntRange(min=1), help="Also project goodput at this many GPUs.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def plan(experiment, overrides, site, at_gpus, as_json):
    """Per-GPU memory of each strategy on the site, the recommendation, and goodput projected."""
    from launcher.views.plan_text import format_plan

    result = api.plan(experiment, site=site, overrides=overrides, at_gpus=at_gpus)
    _emit(as_json, result.to_json(), format_plan(result))


cli.add_command(sites)          # glaunch sites ...: launcher/cli_sites.py


# --- runs ----------------------------------------------------------------------------------


@cli.command("status")
@click.argument("run")
@click.option("--json", "as_json", is_flag=True)
def status_cmd(run, as_json):
    """State of RUN (a run or sweep: id or directory), across requeues."""
    from launcher.views.status_text import format_status

    summary = api.status(run)
    _emit(as_json, summary, format_status(summary))


@cli.command()
@click.argument("run")
@click.option("-f", "--follow", is_flag=True, help="Keep printing as the logs grow.")
@click.option("--rank", type=click.IntRange(min=0), default=None,
              help="Only the log of global rank N (under torchrun: its node's).")
def logs(run, follow, rank):
    """Per-task logs of RUN, each line tagged with its ranks ([r0]; under torchrun [node1 r2-3]),
    across requeues (a sweep: every element's)."""
    shown = 0

    def echo(line: str) -> None:
        nonlocal shown
        shown += 1
        click.echo(line)

    api.logs(run, rank=rank, follow=follow, echo=echo)
    if not shown:
        # Said, not silent: an empty answer reads as a broken command.
        whose = f"rank {rank} of {run}" if rank is not None else run
        click.echo(f"glaunch: no output from {printable(whose)} in its logs yet", err=True)


@cli.command()
@click.argument("run")
def cancel(run):
    """Cancel RUN's job (a sweep: every element's)."""
    click.echo(api.cancel(run))


@cli.command("list")
@click.argument("sweep", required=False)
@click.option("--json", "as_json", is_flag=True)
@click.option("-n", "limit", default=20, show_default=True, type=click.IntRange(min=1), help="How many recent runs.")
def list_cmd(sweep, as_json, limit):
    """Recent runs (and sweeps) with state, site, nodes and age; with SWEEP, its elements."""
    from launcher.views.listing import format_list
    from launcher.views.sweep_text import format_elements

    if sweep is not None:
        elements = api.list_runs(limit, sweep=sweep)
        _emit(as_json, {"elements": elements}, format_elements(elements))
        return
    rows = api.list_runs(limit)
    _emit(as_json, {"runs": rows}, format_list(rows))


if __name__ == "__main__":
    run()

"""glaunch's command line: parse, call the library, map errors to exit codes."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import click

from . import __version__
from .errors import ConfigError, GlaunchError


def main() -> None:
    try:
        cli.main(prog_name="glaunch", standalone_mode=False)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("glaunch: aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(2 if isinstance(exc, click.UsageError) else exc.exit_code)
    except GlaunchError as exc:
        click.echo(f"glaunch: error: {exc}", err=True)
        sys.exit(exc.exit_code)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="glaunch")
def cli() -> None:
    """Launch multi-node PyTorch training on Slurm from a site profile and an experiment.

    \b
    glaunch submit exp.yaml --site mycluster            submit through submitit
    glaunch submit exp.yaml --site mycluster --dry-run  render the run bundle only
    glaunch plan exp.yaml --site mycluster              which strategy fits the GPUs
    """


# --- shared ------------------------------------------------------------------------------


def _load(exp_path: str, site: str | None, overrides: tuple[str, ...]):
    from .load import Origin, load_experiment, load_site

    exp = load_experiment(exp_path, overrides)
    cwd = Path.cwd()
    if site is not None:
        loaded_site = load_site(site, cwd, os.environ)
    else:
        name = exp.config.site or "local"
        referrer = exp.provenance.of("site") if exp.config.site else Origin("(default site)")
        loaded_site = load_site(name, cwd, os.environ, referrer=referrer)
    return exp, loaded_site


def _plan(exp_path: str, site: str | None, overrides: tuple[str, ...], runs_dir: str | None):
    from .render import render
    from .resolve import SubmitContext, resolve
    from .runs import new_run_id

    exp, loaded_site = _load(exp_path, site, overrides)
    ctx = SubmitContext(cwd=os.getcwd(), python=sys.executable, environ=dict(os.environ),
                        run_id=new_run_id(exp.config.name), runs_dir=runs_dir)
    plan = resolve(exp, loaded_site, ctx)
    return plan, render(plan)


def _emit(as_json: bool, data: dict, text: str) -> None:
    click.echo(json.dumps(data, indent=2) if as_json else text)


# --- submit --------------------------------------------------------------------------------


@cli.command()
@click.argument("experiment", type=click.Path(dir_okay=False))
@click.argument("overrides", nargs=-1)
@click.option("--site", "-s", help="Site profile name or YAML path (default: the experiment's site:, else local).")
@click.option("--dry-run", is_flag=True, help="Render the run bundle and print it; submit nothing.")
@click.option("--runs-dir", type=click.Path(file_okay=False), help="Where run directories go.")
@click.option("--wait", is_flag=True, help="Follow the job to its end; exit with its outcome.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--check/--no-check", default=True, help="Run `sbatch --test-only` before submitting (Slurm).")
def submit(experiment, overrides, site, dry_run, runs_dir, wait, as_json, check):
    """Resolve EXPERIMENT on a site, write the run bundle and submit it.

    OVERRIDES are KEY=VALUE dot-list edits of the experiment, e.g. resources.nodes=4.
    """
    from . import bundle, runs

    plan, files = _plan(experiment, site, overrides, runs_dir)
    bundle.check_inputs(plan)
    if plan.scheduler == "slurm" and not dry_run:
        from . import slurm
        slurm.require_slurm()
    run_dir = bundle.write_bundle(plan, files, dry_run=dry_run)
    runs.register(plan.run_id, str(run_dir))
    info = {"run_id": plan.run_id, "run_dir": str(run_dir), "site": plan.site_name, "dry_run": dry_run,
            "files": sorted(files)}
    if dry_run:
        _emit(as_json, info, f"run directory: {run_dir}\n--- job.sbatch ---\n{files['job.sbatch']}")
        return
    if plan.scheduler == "local":
        from . import local
        if not as_json:
            click.echo(f"run {plan.run_id}: running on this machine ({plan.world_size} ranks); {run_dir}")
        status = local.run(plan, echo=None if not as_json else (lambda text: None))
        record = runs.read(run_dir)
        info.update(state=record["state"], job_ids=[s["job_id"] for s in record["starts"]], exit_code=status)
        if as_json:
            click.echo(json.dumps(info, indent=2))
        else:
            click.echo(f"run {plan.run_id}: {record['state']}")
        sys.exit(status)
    _submit_slurm(plan, files, run_dir, info, wait=wait, as_json=as_json, check=check)


def _submit_slurm(plan, files, run_dir: Path, info: dict, *, wait: bool, as_json: bool, check: bool) -> None:
    from . import runs, slurm

    try:
        if check:
            slurm.preflight(plan, run_dir / "job.sbatch")
        job_id = slurm.submit(plan, files["job.sbatch"])
    except GlaunchError as exc:
        with runs.updating(run_dir) as record:
            record["state"] = "REFUSED"
            record["reason"] = exc.message
        raise
    with runs.updating(run_dir) as record:
        record["job_id"] = job_id
        record["state"] = "PENDING"
        record["starts"].append(runs.start_record(job_id, 0))
    info.update(job_id=job_id, state="PENDING")
    if not wait:
        _emit(as_json, info, f"run {plan.run_id}: submitted job {job_id}\nrun directory: {run_dir}")
        return
    if not as_json:
        click.echo(f"run {plan.run_id}: submitted job {job_id}\nrun directory: {run_dir}")
    state = _follow(run_dir, quiet=as_json)
    info["state"] = state
    if as_json:
        click.echo(json.dumps(info, indent=2))
    sys.exit(0 if state == "COMPLETED" else 1)


def _follow(run_dir: Path, *, quiet: bool) -> str:
    from . import local, status as status_mod

    followers: dict[str, local.LogFollower] = {}
    last = None
    while True:
        summary = status_mod.refresh(run_dir)
        state = summary["state"]
        job_id = summary.get("job_id")
        if not quiet:
            if job_id and job_id not in followers:
                followers[job_id] = local.LogFollower(run_dir / "logs" / f"{job_id}_0_log.out",
                                                      lambda t: (sys.stdout.write(t), sys.stdout.flush()))
            for f in followers.values():
                f.poll()
            if state != last:
                click.echo(f"[glaunch] job {job_id}: {state}", err=True)
        last = state
        if state in status_mod.TERMINAL or state == "UNKNOWN":
            for f in followers.values():
                f.poll()
            return state
        time.sleep(2)


# --- plan ----------------------------------------------------------------------------------


@cli.command()
@click.argument("experiment", type=click.Path(dir_okay=False))
@click.argument("overrides", nargs=-1)
@click.option("--site", "-s", help="Site profile name or YAML path.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def plan(experiment, overrides, site, as_json):
    """Per-GPU memory of each strategy on the site, and the recommendation."""
    from .planning import format_plan_table, plan_for

    exp, loaded_site = _load(experiment, site, overrides)
    result = plan_for(exp, loaded_site)
    _emit(as_json, result.to_json(), format_plan_table(result))


# --- sites ---------------------------------------------------------------------------------


@cli.group()
def sites() -> None:
    """Find, inspect and check site profiles."""


@sites.command("list")
@click.option("--json", "as_json", is_flag=True)
def sites_list(as_json):
    """The profiles found on the search path (first match of a name wins)."""
    from .load import site_search_path

    seen: dict[str, str] = {}
    shadowed = []
    for directory in site_search_path(Path.cwd(), os.environ):
        if not directory.is_dir():
            continue
        for path in sorted(directory.glob("*.y*ml")):
            if path.stem in seen:
                shadowed.append((path.stem, str(path)))
            else:
                seen[path.stem] = str(path)
    lines = [f"{name:28s} {path}" for name, path in sorted(seen.items())]
    lines += [f"{name:28s} {path} (shadowed)" for name, path in shadowed]
    _emit(as_json, {"sites": seen}, "\n".join(lines) or "no site profiles found")


@sites.command("show")
@click.argument("site")
@click.option("--json", "as_json", is_flag=True)
def sites_show(site, as_json):
    """SITE resolved through its extends chain, with the file each value came from."""
    from dataclasses import asdict

    from .load import load_site

    loaded = load_site(site, Path.cwd(), os.environ)
    flat = _flatten(asdict(loaded.config))
    rows = []
    for key, value in flat.items():
        origin = loaded.provenance.of(key, exact=True)
        where = origin.file + (f":{origin.line}" if origin.line else "")
        rows.append({"key": key, "value": value, "from": where})
    if as_json:
        click.echo(json.dumps({"site": loaded.config.name, "file": str(loaded.path),
                               "chain": [str(p) for p in loaded.chain], "values": rows}, indent=2))
        return
    click.echo(f"site {loaded.config.name}: {loaded.path}")
    click.echo("extends chain: " + " -> ".join(str(p) for p in loaded.chain))
    width = max(len(r["key"]) for r in rows)
    for r in rows:
        click.echo(f"  {r['key']:{width}s} = {json.dumps(r['value'])}    # {r['from']}")


def _flatten(data, prefix=""):
    out = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


@sites.command("validate")
@click.argument("profiles", nargs=-1, required=True)
def sites_validate(profiles):
    """Load and check each profile (name or file); exit 2 if any is bad."""
    from .load import load_site

    bad = 0
    for item in profiles:
        try:
            loaded = load_site(item, Path.cwd(), os.environ)
            click.echo(f"ok    {item} ({loaded.path})")
        except ConfigError as exc:
            bad += 1
            click.echo(f"error {item}: {exc}", err=True)
    if bad:
        sys.exit(2)


@sites.command("detect")
@click.option("--name", help="Profile name (default: Slurm's ClusterName).")
@click.option("-o", "--output", type=click.Path(dir_okay=False),
              help="Where to write it (default: ./site_configs/NAME.yaml; '-' prints it).")
def sites_detect(name, output):
    """Write a profile skeleton from the Slurm cluster this machine submits to."""
    from .detect import query_cluster

    if name is not None:
        from .load import NAME_PATTERN
        if not NAME_PATTERN.fullmatch(name):
            raise click.BadParameter(f"{name!r}: use letters, digits, '.', '_' and '-'", param_hint="--name")
    profile_name, text = query_cluster(name)
    if output == "-":
        click.echo(text, nl=False)
        return
    path = Path(output) if output else Path("site_configs") / f"{profile_name}.yaml"
    if path.exists():
        raise ConfigError(f"{path} already exists; choose another --output or --name", key="--output")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    click.echo(f"wrote {path}; check it with: glaunch sites validate {path}")


# --- runs ----------------------------------------------------------------------------------


@cli.command("status")
@click.argument("run")
@click.option("--json", "as_json", is_flag=True)
def status_cmd(run, as_json):
    """State of RUN (a run id or directory), across requeues."""
    from . import runs, status as status_mod

    run_dir = runs.find_run(run)
    summary = status_mod.refresh(run_dir)
    _emit(as_json, summary, status_mod.format_status(summary))


@cli.command()
@click.argument("run")
@click.option("-f", "--follow", is_flag=True, help="Keep printing as the logs grow.")
@click.option("--rank", type=int, default=None, help="Only this rank.")
def logs(run, follow, rank):
    """Per-rank logs of RUN, merged with a rank prefix, across requeues."""
    from . import runs, status as status_mod

    run_dir = runs.find_run(run)
    status_mod.print_logs(run_dir, rank=rank, follow=follow, echo=click.echo)


@cli.command()
@click.argument("run")
def cancel(run):
    """Cancel RUN's job."""
    from . import runs, status as status_mod

    run_dir = runs.find_run(run)
    click.echo(status_mod.cancel(run_dir))


@cli.command("list")
@click.option("--json", "as_json", is_flag=True)
@click.option("-n", "limit", default=20, show_default=True, help="How many recent runs.")
def list_cmd(as_json, limit):
    """Recent runs with state, site, nodes and age."""
    from . import status as status_mod

    rows = status_mod.recent(limit)
    _emit(as_json, {"runs": rows}, status_mod.format_list(rows))


if __name__ == "__main__":
    main()

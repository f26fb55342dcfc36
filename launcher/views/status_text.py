"""The text `glaunch status` prints from a run's summary (launcher.runner.status.summarize)
or a sweep's (launcher.runner.sweeps.summarize)."""

from __future__ import annotations

from typing import Any, Mapping

from launcher.rundir.records import is_known_state
from launcher.runner.goodput import as_mapping, number, step_of
from launcher.views.goodput_text import projection_lines
from launcher.views.sweep_text import format_sweep
from launcher.views.text import clipped, duration, printable


def _gb(value: Any) -> str:
    amount = number(value)
    return "?" if amount is None else f"{amount:.3g} GB"


def _measured(start: Mapping[str, Any]) -> str:
    """What a start's ranks measured, for its status line."""
    parts = []
    if number(start.get("peak_memory_gb")) is not None:
        memory = start.get("memory")
        kind = memory.get("kind") if isinstance(memory, dict) else None
        parts.append(f"peak {_gb(start['peak_memory_gb'])}" + (" (host RSS)" if kind == "host_rss" else ""))
    times = start.get("step_time_s")
    if isinstance(times, dict) and number(times.get("median")) is not None:
        parts.append(f"step {number(times['median']):.3g} s"
                     + (f" (p90 {number(times['p90']):.3g} s)" if number(times.get("p90")) is not None else ""))
    last = step_of(start.get("last_step"))
    if last is not None:
        parts.append(f"last step {last}")
    return ("  " + ", ".join(parts)) if parts else ""


def _memory_line(memory: Mapping[str, Any]) -> str:
    kind = memory.get("kind")
    what = {"cuda": "per GPU (CUDA peak allocated)", "host_rss": "per rank (host RSS: no GPU used)"}.get(str(kind), "")
    line = f"  memory: peak {_gb(memory.get('peak_gb'))} {what}".rstrip()
    planned = memory.get("planned")
    if isinstance(planned, dict):
        name = printable(planned.get("strategy"))
        if number(planned.get("estimate_gb")) is not None:
            line += f"; planner's estimate for {name}: {_gb(planned['estimate_gb'])}"
            if number(memory.get("ratio")) is not None:
                line += f" (peak/estimate {number(memory['ratio']):.2f})"
            elif kind != "cuda":
                line += " (per GPU: not comparable with a host's memory)"
        elif planned.get("error"):
            line += f"; no planner estimate: {printable(planned['error'])}"
    return line


def _lost_steps(good: Mapping[str, Any]) -> str:
    """The steps the run lost, or "?" where that is not known: where no start counted its
    steps (a script without the runtime and without entrypoint.progress), saying so."""
    lost = step_of(good.get("lost_steps"))
    if lost is not None:
        return str(lost)
    rows = [row for row in good.get("starts") or () if isinstance(row, Mapping)]
    if any(step_of(row.get("steps_done")) is not None for row in rows):
        return "?"
    return "? (no start counted its steps: entrypoint.progress reads them from the script's log)"


def _goodput_lines(report: Mapping[str, Any]) -> list[str]:
    good = report.get("goodput")
    if not isinstance(good, dict) or not good.get("starts"):
        return []
    ettr = number(good.get("ettr"))
    head = f"  goodput: ETTR {ettr:.2f}" if ettr is not None else "  goodput: ETTR ?"
    if number(good.get("productive_s")) is not None and number(good.get("wall_s")) is not None:
        head += f" ({duration(good['productive_s'])} of training kept in {duration(good['wall_s'])}"
        if number(good.get("idle_s")):
            head += f"; {duration(good['idle_s'])} ended before a resume left out"
        head += ")"
    head += f"; lost steps {_lost_steps(good)}"
    if number(good.get("lost_s")):
        head += f" ({duration(good['lost_s'])})"
    if number(good.get("restart_overhead_s")) is not None:
        head += f"; restart overhead {duration(good['restart_overhead_s'])}"
    interruptions = good.get("interruptions") or 0
    head += f" over {interruptions} interruption(s)"
    if number(good.get("mean_time_between_interruptions_s")):
        head += f", one every {duration(good['mean_time_between_interruptions_s'])}"
    if number(good.get("restarts_in_allocation")):
        head += (f"; {good['restarts_in_allocation']} restart(s) in the allocation, not through the queue"
                 f" ({good.get('spare_swaps') or 0} on a spare node)")
    if number(good.get("spare_node_hours")):
        head += f"; spare nodes idle {good['spare_node_hours']:.2f} node-hour(s)"
    lines = [head, *_peer_lines(good.get("peer_recoveries"))]
    names = (("queue_wait_s", "queue"), ("startup_s", "start-up"), ("resume_load_s", "resume load"),
             ("stop_s", "stop"), ("teardown_s", "teardown"))
    for row in good["starts"]:
        parts = [f"{label} {duration(row[key])}" for key, label in names if number(row.get(key)) is not None]
        if row.get("lost_steps"):
            parts.append(f"{row['lost_steps']} step(s) lost")
        if parts:
            job = f"resume {row['resume']}, " if row.get("resume") else ""
            lines.append(f"    {job}start {row['restart']}: " + ", ".join(parts))
    return lines


def _short(seconds: Any) -> str:
    """A time that may be a fraction of a second: 0.043 s, 2.31 s, then as `duration`."""
    value = number(seconds)
    if value is None or value >= 10:
        return duration(value)
    return f"{value:.3f} s" if value < 1 else f"{value:.2f} s"


def _ranks(value: Any) -> str:
    return ", ".join(str(r) for r in value) if isinstance(value, list) and value else "none"


def _peer_lines(peer: Any) -> list[str]:
    """The peer road (recovery.peer): how many recoveries, the steps they lost, the time
    from a failure to the next step, and the newest one: which ranks failed, from which
    peer their state came."""
    if not isinstance(peer, Mapping):
        return []
    lines = []
    count = step_of(peer.get("recoveries")) or 0
    if count:
        line = (f"    peer recoveries: {count} in the start they happened in, no checkpoint read; "
                f"lost steps {step_of(peer.get('lost_steps'))}")
        to_next, recovery = as_mapping(peer.get("to_next_step_s")), as_mapping(peer.get("recovery_s"))
        if to_next:
            line += (f"; failure -> next step {_short(to_next.get('median'))}"
                     + (f" (median; at most {_short(to_next.get('max'))})" if count > 1 else ""))
        if recovery:
            line += f"; state received in {_short(recovery.get('median'))}" + (" (median)" if count > 1 else "")
        lines.append(line)
        entries = [e for e in peer.get("entries") or () if isinstance(e, Mapping)]
        if entries:
            last = entries[-1]
            job = f"job {printable(last.get('job_id'))} " if last.get("job_id") else ""
            error = f" ({clipped(printable(last['error']), 100)})" if last.get("error") else ""
            lines.append(f"      {'newest' if count > 1 else 'it'}: {job}start {last.get('restart')}, step "
                         f"{last.get('step')}: rank(s) {_ranks(last.get('failed'))} failed{error}; state of step "
                         f"{last.get('resume_after')} from rank {last.get('source')} to rank(s) "
                         f"{_ranks(last.get('receivers'))}")
    problems = []
    if step_of(peer.get("damaged_lines")):
        problems.append(f"{peer['damaged_lines']} line(s) of the peer recovery ledger are not records: left out")
    if peer.get("truncated"):
        problems.append("the peer recovery ledger is larger than glaunch reads: its end is left out")
    if peer.get("problem"):
        problems.append(f"the peer recovery ledger cannot be read: {printable(peer['problem'])}")
    return lines + [f"    {p}" for p in problems]


def _suggestion_lines(suggestions: Any) -> list[str]:
    lines = []
    for key, item in (suggestions or {}).items():
        if not isinstance(item, dict):
            continue
        now = item.get("current")
        lines.append(f"  suggest: {key}={printable(item.get('value'))}"
                     + (f" (now {printable(now)})" if now is not None else "") + f": {printable(item.get('why'))}")
    return lines


def _origin_lines(summary: Mapping[str, Any]) -> list[str]:
    """The code it runs (commit, dirty tree, snapshot), its sweep, the runs it waits for."""
    p = printable
    lines = []
    origin = as_mapping(summary.get("provenance"))
    git, code = as_mapping(origin.get("git")), as_mapping(origin.get("code"))
    if git:
        line = f"  code: commit {p(str(git.get('commit'))[:12])}"
        line += f" ({p(git['branch'])})" if git.get("branch") else ""
        if git.get("dirty") and git.get("patch"):
            line += f", dirty tree: {p(git.get('patch'))} (sha256 {p(str(git.get('diff_sha256'))[:12])})"
        elif git.get("dirty"):
            line += ", dirty tree (no snapshot: it runs from the work tree as it is)"
        else:
            line += ", clean tree"
        lines.append(line)
    if code:
        lines.append(f"  snapshot: {p(code.get('snapshot'))} ({code.get('files')} files from {p(code.get('source'))})")
    lines += _profile_lines(origin.get("profiles"))
    sweep = as_mapping(summary.get("sweep"))
    if sweep:
        values = " ".join(f"{p(k)}={p(v)}" for k, v in as_mapping(sweep.get("params")).items())
        lines.append(f"  sweep {p(sweep.get('id'))}, element {sweep.get('index')}: {values}")
    for item in summary.get("after") or []:
        if isinstance(item, dict):
            ids = item.get("job_ids")
            jobs = ",".join(map(str, ids)) if isinstance(ids, list) and ids else "-"
            lines.append(f"  after {p(item.get('ref'))}:{p(item.get('kind'))} (jobs {p(jobs)})")
    return lines


def _profile_lines(profiles: Any) -> list[str]:
    """Each file of the site profile (base first): its hash as read and its git state."""
    lines = []
    for item in profiles if isinstance(profiles, list) else []:
        item = as_mapping(item)
        git = as_mapping(item.get("git"))
        line = f"  profile: {printable(item.get('path'))} (sha256 {printable(str(item.get('sha256'))[:12])}"
        commit = printable(str(git.get("commit"))[:12])
        if git.get("tracked"):
            line += f", commit {commit}" + (", modified" if git.get("modified") else "")
        elif git:
            line += f", not in commit {commit}" if git.get("commit") else ", in a git tree with no commit"
        lines.append(line + ")")
    return lines


def _failure_lines(start: Mapping[str, Any]) -> list[str]:
    """What the watchdog found in a start (its silent ranks, their stacks), and the node a
    failure pointed at with what became of it."""
    p, lines = printable, []
    hang = as_mapping(start.get("hang"))
    if hang:
        silent = [s for s in hang.get("silent") or [] if isinstance(s, dict)]
        ranks = ", ".join(f"rank {s.get('rank')}" + (f" on {p(s['node'])}" if s.get("node") else "")
                          + (f" at step {s['step']}" if s.get("step") is not None else "") for s in silent[:8])
        kind = {"stall": "no step", "first_step": "no first step", "save": "a save unfinished"}.get(
            str(hang.get("kind")), p(hang.get("kind")))
        lines.append(f"    hang: {kind} for {duration(hang.get('bound_s'))}; silent: {ranks}"
                     + (" ..." if len(silent) > 8 else ""))
        stacks = [p(s) for s in hang.get("stacks") or []]
        lines.append("    stacks: " + (", ".join(stacks) if stacks else "none written"))
    if start.get("bad_node"):
        lines.append(f"    node {p(start['bad_node'])}: {p(start.get('exclusion') or 'not excluded')}")
    return lines


def _watchdog_lines(start: Mapping[str, Any]) -> list[str]:
    """The bound the watchdog holds the start to (the first step's until a rank stepped;
    auto: from what), or that it is off or does not watch and why; and the ranks it named
    slow with their nodes."""
    p, lines = printable, list[str]()
    watch = as_mapping(start.get("watchdog"))
    if not watch:
        return lines
    state = watch.get("state", "watching")      # an entry without a state: written when every watch had bounds
    if state in ("off", "not watched"):
        why = watch.get("why")
        lines.append(f"    watchdog: {state}" + (f": {p(why)}" if isinstance(why, str) else ""))
    else:
        lines += _bound_lines(watch)
    for slow in [s for s in watch.get("slow") or [] if isinstance(s, dict)][:8]:
        ratio = number(slow.get("ratio"))
        lines.append(f"    slow: rank {p(slow.get('rank'))}" + (f" on {p(slow['node'])}" if slow.get("node") else "")
                     + (f", busy {ratio:.2f}x its peers' time a step" if ratio else "")
                     + (f" (named at {p(slow['named_at'])})" if slow.get("named_at") else ""))
    swap = as_mapping(watch.get("swap"))
    if swap.get("node"):
        lines.append(f"    slow node {p(swap['node'])} to leave for the spare {p(swap.get('spare'))}: the ranks were "
                     f"asked to save and stop" + (f" at {p(swap['asked_at'])}" if swap.get("asked_at") else ""))
    if watch.get("exclusion"):
        lines.append(f"    {p(watch['exclusion'])}")
    return lines


def _bound_lines(watch: Mapping[str, Any]) -> list[str]:
    """The bound in force: before any rank stepped, the first step's; then the step's."""
    bound = number(watch.get("bound_s"))
    basis = {"fixed": "fixed", "initial": "auto, before warm-up",
             "early": f"auto, early: slowest of the first steps {duration(watch.get('step_p99_s'))}",
             "steps": f"auto, p99 step {duration(watch.get('step_p99_s'))}"}.get(str(watch.get("basis")), "?")
    stall = ""
    if bound is not None and bound > 0:
        save = number(watch.get("save_bound_s"))
        stall = (f"hang after {duration(bound)} without a step ({basis})"
                 + (f", {duration(save)} for a save" if save else ""))
    if watch.get("in_force") != "first_step":
        return [f"    watchdog: {stall}"] if stall else []
    first = number(watch.get("first_step_s"))
    since = watch.get("watched_since")
    head = (f"hang if no rank steps within {duration(first)}" if first else "no bound before the first step")
    head += f" of the runtime's start ({printable(since)})" if first and isinstance(since, str) else ""
    return [f"    watchdog: {head}" + (f"; then {stall}" if stall else "")]


def _resume_line(resume: Mapping[str, Any]) -> str:
    """A resume: when, how the run had ended, the overrides, the new shape, and from which
    start on its job runs."""
    p = printable
    ended = as_mapping(resume.get("ended"))
    why = "; ".join(p(x) for x in (ended.get("reason"), ended.get("detail")) if x)
    line = (f"  resume {resume.get('number')} at {p(resume.get('at') or '?')}: the run had ended "
            f"{p(ended.get('state'))}" + (f" ({why})" if why else "")
            + (f" as job {p(ended['job_id'])}" if ended.get("job_id") else ""))
    overrides = resume.get("overrides") or []
    line += "; overrides: " + " ".join(p(o) for o in overrides) if overrides else "; no overrides"
    if resume.get("nodes") is not None:
        line += f"; now {p(resume['nodes'])} node(s), world size {p(resume.get('world_size'))}"
        line += f", partition {p(resume['partition'])}" if resume.get("partition") else ""
    if not resume.get("started"):
        return line + "; its job has not started yet"
    line += f"; its job runs from starts[{resume.get('first_start')}] on"
    step = resume.get("resumed_from")
    return line + (f", resumed from step {step}" if step is not None else "")


def _job_lines(summary: Mapping[str, Any]) -> dict[int, list[str]]:
    """The line that opens each job of a resumed run, by the index in `starts` of the job's
    first start (a run without resumes has one job: no such lines)."""
    resumes = [r for r in summary.get("resumes") or [] if isinstance(r, dict)]
    if not resumes:
        return {}
    created = summary.get("created")
    heads: dict[int, list[str]] = {0: ["  submitted" + (f" at {printable(created)}" if created else "") + ":"]}
    for resume in resumes:
        first = resume.get("first_start")
        if isinstance(first, int):
            heads.setdefault(first, []).append(_resume_line(resume) + ":")
    return heads


def _state(state: Any) -> str:
    """A run's state; one neither glaunch nor Slurm names (run.json edited) is shown as unknown."""
    return printable(state) if is_known_state(state) else f"UNKNOWN (run.json says {printable(state)})"


def format_status(summary: Mapping[str, Any]) -> str:
    """The text of a run's summary, or of a sweep's (each text of it clipped to MAX_SHOWN)."""
    summary = clipped(summary)
    if "sweep_id" in summary:
        return format_sweep(summary)
    p = printable
    resumed = len([r for r in summary.get("resumes") or [] if isinstance(r, dict)])
    lines = [f"run {p(summary['run_id'])}: {_state(summary['state'])} (site {p(summary['site'])}, "
             f"job {p(summary['job_id'])}, {summary['restarts']} restart(s)"
             + (f", {resumed} resume(s)" if resumed else "") + ")", f"  {p(summary['run_dir'])}"]
    cluster = summary.get("cluster")
    if isinstance(cluster, Mapping):
        lines.append(f"  on {p(cluster.get('host'))}: {p(cluster.get('run_dir'))}")
    if summary.get("accounting") is False:
        lines.append("  (no Slurm accounting here: states come from squeue only)")
    lines += _origin_lines(summary)
    lines += _start_lines(summary)
    if summary.get("excluded_nodes"):
        lines.append("  excluded nodes: " + p(", ".join(summary["excluded_nodes"])))
    if summary.get("reason") or summary.get("detail"):
        lines.append("  reason: " + p("; ".join(x for x in (summary.get("reason"), summary.get("detail")) if x)))
    if isinstance(summary.get("progress"), dict):
        lines.append(_progress_line(summary["progress"]))
    if isinstance(summary.get("memory"), dict):
        lines.append(_memory_line(summary["memory"]))
    for gpu in summary.get("gpu") or []:
        lines.append(f"  gpu: node {p(gpu['node'])} (job {p(gpu['job_id'])}): {gpu['samples']} samples, "
                     f"utilisation mean {gpu['utilization_mean_pct']:g}%, memory max "
                     f"{gpu['memory_used_max_mib']:g}/{gpu['memory_total_mib']:g} MiB")
    lines += _goodput_lines(summary)
    good = as_mapping(summary.get("goodput"))
    if good.get("starts"):         # once it has started: from what the run measured so far
        lines += ["  " + line for line in projection_lines(good.get("projection"))]
    lines += _suggestion_lines(summary.get("suggest"))
    for warning in summary.get("warnings") or []:
        lines.append(f"  warning: {p(warning)}")
    if summary.get("result"):
        r = summary["result"]
        lines.append(f"  result: step {p(r.get('final_step'))} loss {p(r.get('final_loss'))} "
                     f"world {p(r.get('world_size'))}")
    if summary.get("result_error"):
        lines.append(f"  result: unreadable: {p(summary['result_error'])}")
    return "\n".join(lines)


def _start_lines(summary: Mapping[str, Any]) -> list[str]:
    """Each start (a requeue is one more) with what ended it and what its ranks measured,
    each job of a resumed run opened by its resume."""
    p = printable
    lines = []
    heads = _job_lines(summary)
    for index, start in enumerate(summary["starts"]):
        lines += heads.pop(index, [])
        lines.append(f"  start {start['restart']}: job {start['job_id']} {p(start['state'])}"
                     + (f" reason={p(start['reason'])}" if start.get("reason") else "")
                     + (f" resumed_from={start['resumed_from']}" if start.get("resumed_from") is not None else "")
                     + (f" stopped_at={start['stopped_at']}" if start.get("stopped_at") is not None else "")
                     + p(_measured(start)))
        lines += _failure_lines(start)
        lines += _watchdog_lines(start)
    for index in sorted(heads):        # resumes whose job has no start yet
        lines += heads[index]
    return lines


def _progress_line(live: Mapping[str, Any]) -> str:
    """The running start's step, rate, when it last stepped, and the ranks gone silent."""
    p = printable
    total = f"/{live['total']}" if live.get("total") else ""
    line = f"  progress: step {live['step']}{total}"
    if number(live.get("step_s")):
        line += f", {1 / live['step_s']:.3g} steps/s"
    if number(live.get("eta_s")):
        line += f", ETA {duration(live['eta_s'])}"      # as --wait's line has it
    if live.get("age_s") is not None:
        line += f", last step {duration(live['age_s'])} ago"
    silent = live.get("silent") or []
    if silent:
        line += f"; {len(silent)} rank(s) silent: " + ", ".join(
            f"rank {s['rank']} ({p(s.get('node'))}) at step {s['step']} for {duration(s['for_s'])}"
            for s in silent[:8]) + (" ..." if len(silent) > 8 else "")
    return line

"""The code snapshot: what is copied (git's view of the work tree, or the entry point's
folder), what never is (runs and checkpoint directories, code.exclude), the bound, the
patch of a dirty tree that gives back what ran, and provenance; real git and real files."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher import schedulers
from launcher.config.load import load_experiment
from launcher.config.sites import load_site
from launcher.errors import ConfigError
from launcher.resolution.jobplan import CodeSnapshot, SubmitContext
from launcher.resolution.resolve import code_anchor, resolve
from launcher.rundir.layout import RunDir
from launcher.runner import bundle, provenance, snapshot
from launcher.schedulers.slurm.scheduler import SlurmScheduler

REPO = Path(__file__).resolve().parents[2]


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(cwd), *args], capture_output=True, text=True, check=True, timeout=30,
                          env=dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@x", GIT_COMMITTER_NAME="t",
                                   GIT_COMMITTER_EMAIL="t@x")).stdout.strip()


@pytest.fixture
def work_tree(tmp_path) -> Path:
    """A git work tree: src/train.py and a helper module committed, an ignored data folder,
    an untracked (not ignored) note, a local runs folder."""
    root = tmp_path / "proj"
    (root / "src").mkdir(parents=True)
    (root / "src" / "train.py").write_text("import helper\nprint(helper.VALUE)\n")
    (root / "src" / "helper.py").write_text("VALUE = 1\n")
    (root / ".gitignore").write_text("data/\n*.log\n")
    (root / "data").mkdir()
    (root / "data" / "big.bin").write_bytes(b"x" * 4096)
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "first")
    (root / "notes.txt").write_text("untracked, not ignored\n")
    (root / "run.log").write_text("ignored\n")
    return root


def code_for(root: Path, dest: Path, *, exclude=(), max_bytes=10 ** 8, skip=(), git_tree=True) -> CodeSnapshot:
    return CodeSnapshot(source=str(root), git=git_tree, dest=str(dest), script=str(root / "src" / "train.py"),
                        exclude=tuple(exclude), max_bytes=max_bytes, skip=tuple(str(s) for s in skip),
                        import_path=None)


def test_locate_finds_the_work_tree_and_where_the_entry_point_is(work_tree):
    root = snapshot.locate(str(work_tree / "src"), str(work_tree))
    assert (root.path, root.git, root.entry_dir, root.workdir) == (str(work_tree), True, "src", ".")
    outside = snapshot.locate(str(work_tree / "src"), "/")
    assert outside.workdir is None


def test_locate_without_git_is_the_entry_points_folder(tmp_path):
    (tmp_path / "f").mkdir()
    root = snapshot.locate(str(tmp_path / "f"), str(tmp_path / "f"))
    assert (root.path, root.git, root.entry_dir, root.workdir) == (str(tmp_path / "f"), False, ".", ".")


def test_locate_keeps_a_symlinked_path_as_written(work_tree, tmp_path):
    link = tmp_path / "link"
    link.symlink_to(work_tree)
    root = snapshot.locate(str(link / "src"), str(link))
    assert root.path == str(link) and root.entry_dir == "src" and root.workdir == "."


def test_survey_is_gits_view_without_runs_and_checkpoints(work_tree):
    runs = work_tree / "runs" / "r1"
    runs.mkdir(parents=True)
    (runs / "old.pt").write_bytes(b"c" * 100)
    (work_tree / "ckpt").mkdir()
    (work_tree / "ckpt" / "step-1").write_text("c")
    other = work_tree / "elsewhere" / "old-run"          # a run directory another --runs-dir put here
    other.mkdir(parents=True)
    (other / "run.json").write_text("{}")
    (other / "job.sbatch").write_text("#!/bin/bash\n")
    (other / "code").mkdir()
    (other / "code" / "train.py").write_text("old\n")
    (work_tree / "src" / "__pycache__").mkdir()
    (work_tree / "src" / "__pycache__" / "helper.cpython-311.pyc").write_bytes(b"\0")
    found = snapshot.survey(code_for(work_tree, work_tree / "runs" / "r1" / "code",
                                     skip=(work_tree / "runs", work_tree / "ckpt")))
    names = sorted(n for n, _ in found.files)
    assert names == [".gitignore", "notes.txt", "src/helper.py", "src/train.py"]
    assert found.git.commit == git(work_tree, "rev-parse", "HEAD") and found.git.branch == "main"
    assert found.git.untracked == ("notes.txt",) and not found.git.changed and found.dirty


def test_exclude_globs_by_name_and_by_path(work_tree):
    (work_tree / "src" / "weights.pt").write_bytes(b"w")
    (work_tree / "assets" / "img").mkdir(parents=True)
    (work_tree / "assets" / "img" / "a.png").write_bytes(b"p")
    (work_tree / "assets" / "keep.txt").write_text("k")
    found = snapshot.survey(code_for(work_tree, work_tree.parent / "dest", exclude=("*.pt", "assets/img/")))
    names = {n for n, _ in found.files}
    assert "src/weights.pt" not in names and "assets/img/a.png" not in names and "assets/keep.txt" in names
    assert found.excluded == 2
    assert snapshot.matches("a/b/c.ckpt", ("*.ckpt",)) and snapshot.matches("a/b/c", ("a/b",))
    assert not snapshot.matches("xa/b", ("a/b",)) and not snapshot.matches("a/bc", ("a/b",))


def test_without_git_the_whole_folder_but_pycache(tmp_path):
    folder = tmp_path / "plain"
    (folder / "pkg" / "__pycache__").mkdir(parents=True)
    (folder / "train.py").write_text("pass\n")
    (folder / "pkg" / "m.py").write_text("pass\n")
    (folder / "pkg" / "__pycache__" / "m.pyc").write_bytes(b"\0")
    (folder / ".hidden").write_text("h")
    found = snapshot.survey(code_for(folder, tmp_path / "dest", git_tree=False))
    assert sorted(n for n, _ in found.files) == [".hidden", "pkg/m.py", "train.py"] and found.git is None


def test_over_the_bound_names_the_largest_files(work_tree):
    (work_tree / "model.bin").write_bytes(b"m" * 300_000)
    (work_tree / "src" / "table.csv").write_bytes(b"t" * 200_000)
    with pytest.raises(ConfigError) as err:
        snapshot.check(code_for(work_tree, work_tree.parent / "dest", max_bytes=250_000), "exp.yaml")
    text = str(err.value)
    assert err.value.key == "code.max_mb" and err.value.exit_code == 2 and "exp.yaml" in text
    assert text.index("model.bin (293.0 KB)") < text.index("src/table.csv (195.3 KB)")
    assert "code.exclude" in text
    assert not (work_tree.parent / "dest").exists()


def test_dirty_tree_patch_gives_back_the_snapshot(work_tree, tmp_path):
    (work_tree / "src" / "helper.py").write_text("VALUE = 2\n")          # changed, not staged
    (work_tree / "src" / "extra.py").write_text("X = 'new'\n")           # untracked
    (work_tree / "src" / "blob.bin").write_bytes(bytes(range(256)))      # untracked, binary
    code = code_for(work_tree, tmp_path / "dest")
    found = snapshot.survey(code)
    assert found.git.changed and set(found.git.untracked) == {"notes.txt", "src/extra.py", "src/blob.bin"}
    taken = snapshot.take(code, found, tmp_path / "code.patch")
    data = (tmp_path / "code.patch").read_bytes()
    assert taken.patch_sha256 == hashlib.sha256(data).hexdigest()
    # The commit plus the patch is the snapshot, file for file.
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(work_tree), str(clone))
    git(clone, "checkout", "-q", found.git.commit)
    git(clone, "apply", "--binary", str(tmp_path / "code.patch"))
    copied = {str(p.relative_to(tmp_path / "dest")): p.read_bytes() for p in (tmp_path / "dest").rglob("*")
              if p.is_file()}
    rebuilt = {n: (clone / n).read_bytes() for n in copied}
    assert copied == rebuilt and copied["src/helper.py"] == b"VALUE = 2\n"


def test_a_dirty_trees_snapshot_asks_git_for_the_repositorys_filters_once(work_tree, tmp_path, monkeypatch):
    """git status and the patch both read files through the repository's filters (each
    one emptied): the list the survey asked for serves the patch too."""
    from launcher.runner import gitview

    asked = []

    def counted(cwd, deadline, *, ask=gitview.repository_filters):
        asked.append(str(cwd))
        return ask(cwd, deadline)

    monkeypatch.setattr(gitview, "repository_filters", counted)
    monkeypatch.setattr(snapshot, "repository_filters", counted, raising=False)
    (work_tree / "src" / "helper.py").write_text("VALUE = 2\n")
    code = code_for(work_tree, tmp_path / "dest")
    found = snapshot.survey(code)
    taken = snapshot.take(code, found, tmp_path / "code.patch")
    assert found.dirty and taken.patch and b"+VALUE = 2" in (tmp_path / "code.patch").read_bytes()
    assert asked == [str(work_tree)]


def test_clean_tree_has_no_patch(work_tree, tmp_path):
    (work_tree / "notes.txt").unlink()
    code = code_for(work_tree, tmp_path / "dest")
    found = snapshot.survey(code)
    assert not found.dirty
    taken = snapshot.take(code, found, tmp_path / "code.patch")
    assert taken.patch is None and not (tmp_path / "code.patch").exists()
    origin = provenance.collect(found, taken)
    assert origin["git"]["dirty"] is False and origin["git"]["diff_sha256"] is None
    assert origin["git"]["commit"] == git(work_tree, "rev-parse", "HEAD")


# --- through resolution and the bundle --------------------------------------------------------


def plan_in(work_tree: Path, runs: Path, site: str = "local-slurm", *overrides: str,
            entry: str = "script: src/train.py"):
    exp_file = work_tree / "exp.yaml"
    exp_file.write_text(f"name: snap\nentrypoint: {{{entry}, args: ['--x', '1']}}\n"
                        "resources: {nodes: 1, time: '10'}\nrequeue: {signal_lead_s: 30}\n")
    exp = load_experiment(exp_file, list(overrides))
    loaded_site = load_site(site, work_tree, os.environ)
    ctx = SubmitContext(cwd=str(work_tree), python="/usr/bin/python3", environ=dict(os.environ),
                        run_id="snap-1", runs_dir=str(runs))
    anchor = code_anchor(exp, loaded_site, ctx)
    if anchor is not None:
        ctx = SubmitContext(**{**ctx.__dict__, "code_root": snapshot.locate(anchor, ctx.cwd)})
    return resolve(exp, loaded_site, ctx)


def test_slurm_runs_the_snapshot_local_site_the_work_tree(work_tree, tmp_path):
    plan = plan_in(work_tree, tmp_path / "runs")
    run_dir = tmp_path / "runs" / "snap-1"
    assert plan.code is not None and plan.code.source == str(work_tree) and plan.code.git
    assert plan.launch.entry_script == str(run_dir / "code" / "src" / "train.py")
    assert plan.submitted_script == str(work_tree / "src" / "train.py")
    assert plan.code.import_path == str(run_dir / "code")
    files = SlurmScheduler().render(plan)
    assert f"#   python {run_dir}/code/src/train.py --x 1" in files["job.sbatch"]
    local = plan_in(work_tree, tmp_path / "runs2", "local")
    assert local.code is None and local.launch.entry_script == str(work_tree / "src" / "train.py")


def test_bundle_copies_the_code_and_records_provenance(work_tree, tmp_path):
    plan = plan_in(work_tree, tmp_path / "runs")
    files = SlurmScheduler().render(plan)
    found = bundle.check_inputs(plan)
    written = bundle.write_bundle(plan, files, dry_run=True, survey=found)
    run_dir = written.path
    assert (run_dir / "code" / "src" / "helper.py").read_text() == "VALUE = 1\n"
    assert sorted(str(p.relative_to(run_dir / "code")) for p in (run_dir / "code").rglob("*") if p.is_file()) == [
        ".gitignore", "exp.yaml", "notes.txt", "src/helper.py", "src/train.py"]
    record = json.loads((run_dir / "run.json").read_text())
    # Its backend and the transport its commands take (Slurm's commands run on this machine).
    assert (record["scheduler"], record["transport"]) == ("slurm", "local")
    origin = record["provenance"]
    assert origin["git"]["commit"] == git(work_tree, "rev-parse", "HEAD") and origin["git"]["dirty"] is True
    assert origin["git"]["patch"] == str(run_dir / "code.patch")
    assert origin["git"]["diff_sha256"] == hashlib.sha256((run_dir / "code.patch").read_bytes()).hexdigest()
    assert origin["code"]["files"] == 5 and origin["packages"].get("submitit")
    assert json.loads((run_dir / "hparams.json").read_text()) == {}


def test_bound_refused_before_anything_is_written(work_tree, tmp_path):
    (work_tree / "huge.bin").write_bytes(b"h" * (2 * 1024 * 1024))
    plan = plan_in(work_tree, tmp_path / "runs")
    plan = plan.__class__(**{**plan.__dict__, "code": plan.code.__class__(
        **{**plan.code.__dict__, "max_bytes": 1024 * 1024})})
    with pytest.raises(ConfigError) as err:
        bundle.check_inputs(plan)
    assert "huge.bin (2.0 MB)" in str(err.value) and err.value.key == "code.max_mb"
    with pytest.raises(ConfigError):
        bundle.write_bundle(plan, SlurmScheduler().render(plan), dry_run=True)
    assert not (tmp_path / "runs").exists()


def test_the_task_imports_from_the_snapshot_first(tmp_path):
    """run_entry puts the snapshot's copy of the working directory before the live one."""
    from launcher.rundir.taskspec import TaskSpec
    from launcher.runtime.task import run_entry, snapshot_environment

    live, copy = tmp_path / "live", tmp_path / "copy"
    spec = TaskSpec(launcher="srun", script=str(copy / "scripts" / "train.py"), module=None, args=(),
                    nodes=1, ranks_per_node=1, world_size=1, run_dir=str(tmp_path / "run"), run_id="r1",
                    requeue_max=0, crash_retries=0, exclude_bad_nodes=False, watchdog_stall_s=0.0,
                    watchdog_first_step_s=0.0, code_path=str(copy))
    for folder, value in ((live, "live"), (copy, "snapshot")):
        (folder / "pkg").mkdir(parents=True)
        (folder / "pkg" / "__init__.py").write_text("")
        (folder / "pkg" / "where.py").write_text(f"WHERE = {value!r}\n")
    (copy / "scripts").mkdir()
    out = tmp_path / "out.txt"
    (copy / "scripts" / "train.py").write_text(
        f"import pkg.where\nopen({str(out)!r}, 'w').write(pkg.where.WHERE)\n")
    cwd = os.getcwd()
    os.chdir(live)
    try:
        run_entry(spec)
    finally:
        os.chdir(cwd)
        for name in ("pkg", "pkg.where"):
            __import__("sys").modules.pop(name, None)
    assert out.read_text() == "snapshot"
    env = snapshot_environment(dataclasses.replace(spec, script=None, module="pkg.train"), {"PYTHONPATH": "/x"})
    assert env == {"PYTHONPATH": f"{copy}:/x", "PYTHONSAFEPATH": "1"}
    # The glaunch the run carries (env.sh's first entry) stays first: a project's own
    # `launcher` package does not stand in for the workers' glaunch. An empty entry stays.
    carried = str(RunDir(spec.run_dir).lib_dir)
    assert snapshot_environment(spec, {"PYTHONPATH": f"{carried}::/x"}) == {"PYTHONPATH": f"{carried}:{copy}::/x"}
    assert snapshot_environment(spec, {"PYTHONPATH": f"/x:{carried}"}) == {"PYTHONPATH": f"{copy}:/x:{carried}"}


# --- the experiment's code: and hparams: ------------------------------------------------------


def test_code_settings_from_the_experiment(work_tree, tmp_path):
    off = plan_in(work_tree, tmp_path / "a", "local-slurm", "code.snapshot=false")
    assert off.code is None and off.launch.entry_script == str(work_tree / "src" / "train.py")
    on = plan_in(work_tree, tmp_path / "b", "local", "code.snapshot=true", "code.exclude=[notes.txt,'*.yaml']")
    assert on.code is not None and on.code.exclude == ("notes.txt", "*.yaml")
    found = snapshot.survey(on.code)
    assert sorted(n for n, _ in found.files) == [".gitignore", "src/helper.py", "src/train.py"]
    for bad in ("code.max_mb=0", "code.max_mb=-1"):
        with pytest.raises(ConfigError) as err:
            plan_in(work_tree, tmp_path / "c", "local-slurm", bad)
        assert err.value.key == "code.max_mb"


def test_over_the_bound_from_the_command_line_exits_2_nothing_written(work_tree, tmp_path, isolated_env):
    (work_tree / "weights.bin").write_bytes(b"w" * 300_000)
    plan_in(work_tree, tmp_path / "unused")            # writes exp.yaml
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", str(work_tree / "exp.yaml"), "--site",
                           "local-slurm", "--dry-run", "--runs-dir", str(tmp_path / "runs"), "code.max_mb=0.2"],
                          cwd=work_tree, env=isolated_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "code.max_mb" in proc.stderr and "weights.bin (293.0 KB)" in proc.stderr
    assert "exp.yaml" in proc.stderr and "Traceback" not in proc.stderr and not (tmp_path / "runs").exists()


def test_hparams_reach_args_and_hparams_json(work_tree, tmp_path):
    exp_file = work_tree / "exp.yaml"
    exp_file.write_text("name: hp\nentrypoint: {script: src/train.py, args: ['--lr', '${hparams.lr}']}\n"
                        "hparams: {lr: 3e-4, layers: [2, 4], tag: '0123', nested: {on: true}}\n"
                        "resources: {time: '10'}\nrequeue: {signal_lead_s: 30}\n")
    exp = load_experiment(exp_file, ["hparams.lr=1e-4"])
    ctx = SubmitContext(cwd=str(work_tree), python="/usr/bin/python3", environ=dict(os.environ), run_id="hp-1",
                        runs_dir=str(tmp_path / "runs"))
    plan = resolve(exp, load_site("local", work_tree, os.environ), ctx)
    assert plan.launch.entry_args == ("--lr", "0.0001")          # the value interpolated, as a number
    files = schedulers.get(plan.scheduler).render(plan)
    assert json.loads(files["hparams.json"]) == {"lr": 1e-4, "layers": [2, 4], "tag": "0123", "nested": {"on": True}}
    assert f"export GLAUNCH_HPARAMS={tmp_path}/runs/hp-1/hparams.json" in files["env.sh"]


def test_a_run_without_snapshot_records_the_tree_it_runs_from(work_tree, tmp_path):
    plan = plan_in(work_tree, tmp_path / "runs", "local")
    assert plan.code is None
    written = bundle.write_bundle(plan, schedulers.get("local").render(plan), dry_run=True)
    origin = json.loads((written.path / "run.json").read_text())["provenance"]
    assert origin["git"]["commit"] == git(work_tree, "rev-parse", "HEAD") and origin["git"]["dirty"] is True
    assert origin["git"]["patch"] is None and origin["code"] is None and not (written.path / "code").exists()
    from launcher.views.status_text import _origin_lines

    assert _origin_lines({"provenance": origin})[0].endswith("dirty tree (no snapshot: it runs from the work tree as "
                                                             "it is)")


# --- package versions --------------------------------------------------------------------------


def test_package_versions_are_importlib_metadatas():
    from importlib import metadata

    expected = {}
    for name in provenance.PACKAGES:
        try:
            expected[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    found = provenance.package_versions()
    assert found == expected and list(found) == list(expected)
    assert found.get("submitit")          # installed with glaunch: a search that finds nothing fails here


def test_package_versions_first_on_the_path_normalised_names(tmp_path):
    """Crafted metadata folders: the first entry of the path that has the package wins, names
    match as PEP 503 normalises them, egg-info folders and files count, unreadable metadata
    is left out; importlib.metadata reads the same layout the same way."""
    from importlib import metadata

    first, second = tmp_path / "first", tmp_path / "second"
    for folder, text in ((first / "Torch-2.1.0+cu121.dist-info", "Metadata-Version: 2.1\nName: torch\n"
                                                                 "Version: 2.1.0+cu121\n\nVersion: body\n"),
                         (second / "torch-1.0.dist-info", "Name: torch\nVersion: 1.0\n"),
                         (second / "Pytorch.Lightning-2.2.0.dist-info", "Name: pytorch-lightning\nVersion: 2.2.0\n"),
                         (second / "DeepSpeed-0.14.egg-info", None),
                         (second / "numpy-9.dist-info", None)):
        folder.mkdir(parents=True)
        if text is not None:
            (folder / "METADATA").write_text(text)
    (second / "DeepSpeed-0.14.egg-info" / "PKG-INFO").write_text("Name: deepspeed\nversion:   0.14.0\n")
    (second / "omegaconf-2.3.0-py3.11.egg-info").write_text("Name: omegaconf\nVersion: 2.3.0\n")
    path = [str(tmp_path / "missing"), str(first), str(second)]
    found = provenance.package_versions(path=path)
    assert found == {"torch": "2.1.0+cu121", "pytorch-lightning": "2.2.0", "deepspeed": "0.14.0",
                     "omegaconf": "2.3.0"}
    assert list(found) == ["torch", "pytorch-lightning", "deepspeed", "omegaconf"]
    for name in provenance.PACKAGES:
        dist = next(iter(metadata.Distribution.discover(name=name, path=path)), None)
        try:
            version = dist.version if dist is not None else None
        except TypeError:          # numpy: no metadata to read
            version = None
        assert found.get(name) == version, name


# --- git's view in one call ----------------------------------------------------------------------


def _state_by_plumbing(root: Path) -> snapshot.GitState:
    """What separate git commands say: the reference git_state must agree with."""
    def out(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=30)

    head = out("rev-parse", "--verify", "-q", "HEAD")
    commit = head.stdout.strip() if head.returncode == 0 else None
    ref = out("symbolic-ref", "-q", "--short", "HEAD")
    changed = (out("diff", "--quiet", "HEAD").returncode == 1 if commit
               else bool(out("ls-files", "--cached").stdout.strip()))
    untracked = out("ls-files", "-z", "--others", "--exclude-standard").stdout.split("\0")
    return snapshot.GitState(commit, ref.stdout.strip() if ref.returncode == 0 else None, changed,
                             tuple(sorted(n for n in untracked if n)))


@pytest.mark.parametrize("change", ["clean", "edited", "staged", "renamed", "deleted", "untracked", "detached",
                                    "unborn", "odd names"])
def test_git_state_agrees_with_gits_plumbing(work_tree, tmp_path, change):
    root = work_tree
    if change != "untracked":
        (root / "notes.txt").unlink()
    if change == "edited":
        (root / "src" / "helper.py").write_text("VALUE = 2\n")
    elif change == "staged":
        (root / "src" / "helper.py").write_text("VALUE = 3\n")
        git(root, "add", "src/helper.py")
    elif change == "renamed":
        git(root, "mv", "src/helper.py", "src/helper2.py")
    elif change == "deleted":
        (root / "src" / "train.py").unlink()
    elif change == "untracked":
        (root / "new dir").mkdir()
        (root / "new dir" / "a b.txt").write_text("x\n")
    elif change == "detached":
        git(root, "checkout", "-q", "--detach")
    elif change == "unborn":
        root = tmp_path / "fresh"
        root.mkdir()
        git(root, "init", "-q", "-b", "trunk")
        (root / "a.py").write_text("a\n")
        git(root, "add", "a.py")
    elif change == "odd names":
        (root / "line\nbreak.py").write_text("x\n")
        (root / "tab\there.py").write_text("y\n")
        git(root, "add", "line\nbreak.py")
    expected = _state_by_plumbing(root)
    assert snapshot.git_state(str(root)) == expected
    assert expected.changed == (change in ("edited", "staged", "renamed", "deleted", "unborn", "odd names"))
    assert bool(expected.untracked) == (change in ("untracked", "odd names"))
    assert snapshot.git_state(str(root), copied={"tab\there.py"}).untracked == (
        ("tab\there.py",) if change == "odd names" else ())


def test_tree_state_outside_git_is_none(tmp_path):
    assert snapshot.tree_state(str(tmp_path)) is None


def test_the_copy_keeps_modes_times_links_and_bytes(work_tree, tmp_path):
    run_sh = work_tree / "run.sh"
    run_sh.write_text("#!/bin/sh\necho hi\n")
    run_sh.chmod(0o750)
    os.utime(run_sh, ns=(1_600_000_000_123_456_789, 1_500_000_000_987_654_321))
    (work_tree / "empty.txt").write_bytes(b"")
    (work_tree / "blob.bin").write_bytes(bytes(range(256)) * 4000)
    (work_tree / "latest").symlink_to("src/train.py")
    (work_tree / "gone.txt").write_text("deleted before the copy\n")
    code = code_for(work_tree, tmp_path / "dest")
    found = snapshot.survey(code)
    (work_tree / "gone.txt").unlink()
    snapshot.take(code, found, tmp_path / "code.patch")
    dest = tmp_path / "dest"
    copied = dest / "run.sh"
    assert copied.read_text() == "#!/bin/sh\necho hi\n" and copied.stat().st_mode & 0o777 == 0o750
    assert copied.stat().st_mtime_ns == 1_500_000_000_987_654_321
    assert (dest / "empty.txt").read_bytes() == b""
    assert (dest / "blob.bin").read_bytes() == bytes(range(256)) * 4000
    assert (dest / "latest").is_symlink() and os.readlink(dest / "latest") == "src/train.py"
    assert not (dest / "gone.txt").exists()
    assert (dest / "src" / "helper.py").read_text() == "VALUE = 1\n"


def test_a_fifo_or_socket_in_the_tree_is_left_out_never_waited_on(tmp_path, work_tree):
    """Not code (git cannot track one): left out by the survey, and one that appears
    between the survey and the copy is skipped, never opened for a blocking read."""
    import socket

    root = tmp_path / "plain"
    root.mkdir()
    (root / "train.py").write_text("pass\n")
    os.mkfifo(root / "pipe")
    os.mkfifo(work_tree / "pipe")
    for tree, git_tree in ((root, False), (work_tree, True)):
        code = code_for(tree, tmp_path / f"dest-{git_tree}", git_tree=git_tree)
        found = snapshot.survey(code)
        assert "pipe" not in {name for name, _ in found.files}
        (tree / "late.py").write_text("x = 1\n")
        found = snapshot.survey(code)
        (tree / "late.py").unlink()
        os.mkfifo(tree / "late.py")                    # a file that became a pipe after the survey
        snapshot.take(code, found, tmp_path / "code.patch")
        assert sorted(os.listdir(code.dest)) == sorted(n for n in os.listdir(tree) if n not in (
            "pipe", "late.py", ".git", "data", "run.log"))
        (tree / "late.py").unlink()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(root / "sock"))
        code = code_for(root, tmp_path / "dest-socket", git_tree=False)
        assert "sock" not in {name for name, _ in snapshot.survey(code).files}


def test_a_file_the_copy_cannot_open_names_code_exclude(tmp_path):
    """A file that became a socket after the survey cannot be opened (ENXIO): said in the
    experiment's terms, not as the run directory's fault."""
    import socket

    root = tmp_path / "plain"
    root.mkdir()
    (root / "train.py").write_text("pass\n")
    (root / "sock").write_text("a file at survey time\n")
    code = code_for(root, tmp_path / "dest", git_tree=False)
    found = snapshot.survey(code)
    (root / "sock").unlink()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(root / "sock"))
        with pytest.raises(ConfigError) as caught:
            snapshot.take(code, found, tmp_path / "code.patch", "exp.yaml")
    assert caught.value.key == "code.exclude" and caught.value.file == "exp.yaml"
    assert str(root / "sock") in caught.value.message


@pytest.mark.parametrize("sweep", [(), ("--sweep", "hparams.a=1,2")])
def test_a_fifo_beside_the_entry_point_submits(tmp_path, isolated_env, sweep):
    """A folder outside git (copied whole) with a named pipe in it."""
    root = tmp_path / "plain"
    root.mkdir()
    (root / "train.py").write_text("pass\n")
    (root / "exp.yaml").write_text("name: snap\nentrypoint: {script: train.py}\nresources: {time: '10'}\n"
                                   "requeue: {signal_lead_s: 30}\n")
    os.mkfifo(root / "pipe")
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", "exp.yaml", "--site", "local-slurm",
                           "--dry-run", "--runs-dir", str(tmp_path / "runs"), *sweep],
                          cwd=root, env=isolated_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    (written,) = (tmp_path / "runs").iterdir()
    assert sorted(os.listdir(written / "code")) == ["exp.yaml", "train.py"]


ODD_NAMES = ("star*.txt", "[ab].txt", ":(glob)magic", "tab\tname.py", "new\nline.py", "é.txt", "sp ace/x.py", "link")


def _untracked_tree(work_tree: Path) -> tuple[str, ...]:
    """Untracked files whose names are pathspec magic, globs and control characters, a
    binary file, an executable one and a symlink, beside a changed tracked file."""
    (work_tree / "src" / "helper.py").write_text("VALUE = 2\n")
    (work_tree / "sp ace").mkdir()
    for name in ODD_NAMES[:-1]:
        (work_tree / name).write_text(f"{name!r}\n")
    (work_tree / "link").symlink_to("src/train.py")
    (work_tree / "blob.bin").write_bytes(bytes(range(256)) * 16)
    (work_tree / "tool.sh").write_text("#!/bin/sh\n")
    (work_tree / "tool.sh").chmod(0o755)
    untracked = snapshot.git_state(str(work_tree)).untracked
    assert set(untracked) == {*ODD_NAMES, "notes.txt", "blob.bin", "tool.sh"}
    return untracked


def _patch_one_by_one(root: Path, names: tuple[str, ...]) -> bytes:
    out = [subprocess.run(["git", "-C", str(root), "diff", "--binary", "HEAD"], capture_output=True, timeout=30).stdout]
    for name in sorted(names):
        out.append(subprocess.run(["git", "-C", str(root), "diff", "--binary", "--no-index", "--", "/dev/null", name],
                                  capture_output=True, timeout=30).stdout)
    return b"".join(out)


def test_the_patch_holds_each_untracked_file_as_gits_new_file_diff(work_tree):
    untracked = _untracked_tree(work_tree)
    assert snapshot.patch(str(work_tree), untracked) == _patch_one_by_one(work_tree, untracked)
    some = ("star*.txt", "tab\tname.py")      # only the copy's: a glob names no other file
    assert snapshot.patch(str(work_tree), some) == _patch_one_by_one(work_tree, some)


def test_the_patch_with_a_git_that_cannot_read_pathspecs_from_stdin(work_tree, tmp_path, monkeypatch):
    """A git older than 2.25 (a stand-in that refuses --pathspec-from-file, then runs the
    real git) gives the same patch."""
    real = subprocess.run(["sh", "-c", "command -v git"], capture_output=True, text=True, check=True).stdout.strip()
    shim = tmp_path / "bin" / "git"
    shim.parent.mkdir()
    refused = tmp_path / "refused"
    shim.write_text(f'#!/bin/sh\ncase "$*" in *--pathspec-from-file*) echo x >> {refused}; exit 129;; esac\n'
                    f'exec {real} "$@"\n')
    shim.chmod(0o755)
    untracked = _untracked_tree(work_tree)
    expected = _patch_one_by_one(work_tree, untracked)
    monkeypatch.setenv("PATH", f"{shim.parent}{os.pathsep}{os.environ['PATH']}")
    assert snapshot.patch(str(work_tree), untracked) == expected
    assert refused.read_text() == "x\n"


NEVER_S = 240          # how long the stand-in git takes to answer


def test_a_git_that_hangs_is_no_git_within_the_timeout(work_tree, tmp_path, monkeypatch):
    """A stand-in git that never answers: every call ends at the timeout, and the tree
    reads as outside git (a snapshot of the folder, provenance without git)."""
    from launcher.runner import gitview

    shim = tmp_path / "bin" / "git"
    shim.parent.mkdir()
    shim.write_text(f"#!/bin/sh\nexec sleep {NEVER_S}\n")
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(gitview, "GIT_TIMEOUT_S", 0.5)
    started = time.monotonic()
    assert snapshot.tree_state(str(work_tree / "src")) is None
    assert snapshot.git_state(str(work_tree)) == snapshot.GitState(None, None, False, ())
    with gitview.GitCall(work_tree, "status"):
        pass                        # never read: killed on the way out, not waited for
    # Bound by what a waited-for git would take (one call alone NEVER_S), not by this machine's speed.
    assert time.monotonic() - started < NEVER_S / 2


# --- what every start runs is in the copy -------------------------------------------------------


def refused_before_writing(plan, runs: Path) -> ConfigError:
    """The ConfigError check_inputs and write_bundle both raise for `plan`; nothing written."""
    with pytest.raises(ConfigError) as err:
        bundle.check_inputs(plan)
    with pytest.raises(ConfigError) as again:
        bundle.write_bundle(plan, SlurmScheduler().render(plan), dry_run=True)
    assert str(again.value) == str(err.value) and err.value.exit_code == 2
    assert not runs.exists()
    return err.value


@pytest.mark.parametrize("pattern", ["train.py", "*.py", "src", "src/", "src/train.py", "src/*", "tr*"])
def test_an_exclude_that_leaves_out_the_script_is_refused(work_tree, tmp_path, pattern):
    plan = plan_in(work_tree, tmp_path / "runs", "local-slurm", f"code.exclude=[notes.txt,'{pattern}']")
    error = refused_before_writing(plan, tmp_path / "runs")
    assert error.key == "code.exclude" and error.file == plan.experiment_file
    assert f"'{pattern}'" in error.message and "src/train.py" in error.message
    assert "entrypoint.script" in error.message and "notes.txt" not in error.message


def test_an_exclude_that_spares_the_script_is_taken(work_tree, tmp_path):
    """Only what glaunch knows the job runs is checked: a module the script imports is
    the user's to keep."""
    plan = plan_in(work_tree, tmp_path / "runs", "local-slurm", "code.exclude=[helper.py,'*.txt']")
    found = bundle.check_inputs(plan)
    assert found is not None and {n for n, _ in found.files} == {".gitignore", "exp.yaml", "src/train.py"}


IGNORED = [
    # (the ignore file, relative to the work tree; what it holds; the line of the rule)
    ("src/.gitignore", "# local copies\ntrain.py\n", 2),
    (".gitignore", "data/\n*.log\nsrc/\n", 3),
    (".gitignore", "data/\n*.log\n/src/*.py\n", 3),
    (".git/info/exclude", "train*\n", 1),
]


@pytest.mark.parametrize("ignore_file, text, line", IGNORED, ids=[f"{f}:{n}" for f, _, n in IGNORED])
def test_an_untracked_script_git_ignores_is_refused_naming_the_rule(work_tree, tmp_path, ignore_file, text, line):
    git(work_tree, "rm", "-q", "--cached", "src/train.py")
    (work_tree / ignore_file).write_text(text)
    plan = plan_in(work_tree, tmp_path / "runs")
    error = refused_before_writing(plan, tmp_path / "runs")
    rule = text.splitlines()[line - 1]
    assert error.file == str(work_tree / ignore_file) and error.line == line
    assert f"'{rule}'" in error.message and "src/train.py" in error.message
    assert f"{work_tree / ignore_file}:{line}: " in str(error)


def test_a_tracked_script_an_ignore_rule_covers_is_still_copied(work_tree, tmp_path):
    (work_tree / "src" / ".gitignore").write_text("train.py\n")
    found = bundle.check_inputs(plan_in(work_tree, tmp_path / "runs"))
    assert found is not None and "src/train.py" in {n for n, _ in found.files}


def test_a_script_in_a_folder_of_a_nested_repository_git_ignores(work_tree, tmp_path):
    """A repository inside another: the snapshot copies the inner one, whose rule is named."""
    sub = work_tree / "vendor"
    (sub / "tools").mkdir(parents=True)
    (sub / "tools" / "run.py").write_text("pass\n")
    git(sub, "init", "-q", "-b", "main")
    (sub / ".gitignore").write_text("tools/\n")
    plan = plan_in(work_tree, tmp_path / "runs", entry="script: vendor/tools/run.py")
    assert plan.code is not None and plan.code.source == str(sub)
    error = refused_before_writing(plan, tmp_path / "runs")
    assert error.file == str(sub / ".gitignore") and error.line == 1 and "tools/run.py" in error.message


def module_tree(work_tree: Path) -> None:
    (work_tree / "pkg" / "sub").mkdir(parents=True)
    (work_tree / "pkg" / "__init__.py").write_text("")
    (work_tree / "pkg" / "main.py").write_text("print('main')\n")
    (work_tree / "pkg" / "sub" / "__main__.py").write_text("print('sub')\n")   # a namespace package
    (work_tree / "tool.py").write_text("print('tool')\n")


@pytest.mark.parametrize("module, exclude, left_out", [
    ("pkg.main", "*.py", "pkg/__init__.py"),
    ("pkg.main", "main.py", "pkg/main.py"),
    ("pkg.main", "pkg", "pkg/__init__.py"),
    ("pkg", "__main__.py", None),                     # pkg has no __main__: nothing of it is left out
    ("pkg.sub", "__main__.py", "pkg/sub/__main__.py"),
    ("pkg.sub", "__init__.py", "pkg/__init__.py"),
    ("tool", "t*", "tool.py"),
    ("json", "*.py", None),                           # not in the tree: imported from elsewhere
    ("pkg.missing", "*.py", None),                    # not in the tree either
])
def test_an_exclude_that_leaves_out_the_module_is_refused(work_tree, tmp_path, module, exclude, left_out):
    module_tree(work_tree)
    plan = plan_in(work_tree, tmp_path / "runs", "local-slurm", f"code.exclude=['{exclude}']",
                   entry=f"module: {module}")
    assert plan.code is not None and plan.code.module == module
    if left_out is None:
        assert bundle.check_inputs(plan) is not None
        return
    error = refused_before_writing(plan, tmp_path / "runs")
    assert error.key == "code.exclude" and error.file == plan.experiment_file
    assert f"'{exclude}'" in error.message and left_out in error.message
    assert f"entrypoint.module {module}" in error.message


def test_a_module_git_ignores_is_refused_naming_the_rule(work_tree, tmp_path):
    module_tree(work_tree)
    (work_tree / ".gitignore").write_text("data/\n*.log\n/pkg/\n")
    plan = plan_in(work_tree, tmp_path / "runs", entry="module: pkg.main")
    error = refused_before_writing(plan, tmp_path / "runs")
    assert (error.file, error.line) == (str(work_tree / ".gitignore"), 3) and "'/pkg/'" in error.message
    assert "pkg/__init__.py" in error.message


def test_a_symlinked_package_is_copied_as_the_link_and_taken(work_tree, tmp_path):
    module_tree(work_tree)
    (work_tree / "alias").symlink_to("pkg")
    plan = plan_in(work_tree, tmp_path / "runs", entry="module: alias.main")
    found = bundle.check_inputs(plan)
    assert found is not None and "alias" in {n for n, _ in found.files}


def test_a_script_under_a_folder_never_copied_is_refused(tmp_path):
    """Without git, a script inside __pycache__: never copied, said as the entry point's fault."""
    root = tmp_path / "plain"
    (root / "__pycache__").mkdir(parents=True)
    (root / "__pycache__" / "train.py").write_text("pass\n")
    code = dataclasses.replace(code_for(root, tmp_path / "dest", git_tree=False),
                               script=str(root / "__pycache__" / "train.py"))
    with pytest.raises(ConfigError) as err:
        snapshot.check(code, "exp.yaml")
    assert err.value.key == "entrypoint.script" and "__pycache__/train.py" in err.value.message
    assert not (tmp_path / "dest").exists()


@pytest.mark.parametrize("sweep", [(), ("--sweep", "hparams.a=1,2")])
def test_a_git_ignored_script_from_the_command_line_exits_2_nothing_written(work_tree, tmp_path, isolated_env,
                                                                              sweep):
    git(work_tree, "rm", "-q", "--cached", "src/train.py")
    (work_tree / ".gitignore").write_text("data/\n*.log\ntrain.py\n")
    plan_in(work_tree, tmp_path / "unused")            # writes exp.yaml
    proc = subprocess.run([sys.executable, "-m", "launcher.cli", "submit", str(work_tree / "exp.yaml"), "--site",
                           "local-slurm", "--dry-run", "--runs-dir", str(tmp_path / "runs"), *sweep],
                          cwd=work_tree, env=isolated_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert f"{work_tree / '.gitignore'}:3: " in proc.stderr and "'train.py'" in proc.stderr
    assert "src/train.py" in proc.stderr and "Traceback" not in proc.stderr and proc.stdout == ""
    assert not (tmp_path / "runs").exists()

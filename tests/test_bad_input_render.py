"""Resolution's value checks on what reaches rendered files: sbatch extras that would
replace glaunch's own directives, memory Slurm would read as "all of it", ~user, mounts,
images, modules, setup lines, the raw `deepspeed:` block. Each bad value exits 2 with a
message naming the file and the key, writes nothing, and shows no traceback."""

from __future__ import annotations

import json
import sys

import pytest

from launcher import cli
from launcher.config.sites import load_site
from launcher.errors import ConfigError
from launcher.resolution import resolve as resolve_module
from launcher.resolution.strategy import inspect_factory
from launcher.schedulers.slurm.script import slurm_mem

SITE = """\
name: mysite
scheduler: slurm
default_partition: gpu
partitions:
  gpu: {gpus_per_node: 4, gpu_mem_gb: 80, cpus_per_node: 32, mem_gb: 256, max_nodes: 8}
"""
EXP = """\
name: good
entrypoint: {script: train.py}
resources: {nodes: 2, time: "01:00:00"}
"""
DS = "strategy: {name: deepspeed, zero_stage: 2}\nbatch: {micro_size: 2}\n"


def run_cli(monkeypatch, capsys, argv):
    monkeypatch.setattr(sys, "argv", argv)
    try:
        cli.main()
        code = 0
    except SystemExit as exc:
        code = exc.code or 0
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def workdir(tmp_path, monkeypatch, isolated_env):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    (tmp_path / "site_configs").mkdir()
    (tmp_path / "site_configs" / "mysite.yaml").write_text(SITE)
    (tmp_path / "exp.yaml").write_text(EXP)
    return tmp_path


def dry_run(workdir, monkeypatch, capsys, *args, exp_extra="", site_extra=""):
    (workdir / "exp.yaml").write_text(EXP + exp_extra)
    (workdir / "site_configs" / "mysite.yaml").write_text(SITE + site_extra)
    runs = workdir / "runs"
    code, out, err = run_cli(monkeypatch, capsys, ["glaunch", "submit", "exp.yaml", "--site", "mysite", "--dry-run",
                                                   "--json", "--runs-dir", str(runs), *args])
    assert "Traceback" not in out + err
    if code != 0:
        assert code == 2, err
        assert not runs.exists(), "nothing may be written for bad input"
    return code, out, err


def bundle(out):
    from pathlib import Path

    run_dir = Path(json.loads(out)["run_dir"])
    return {p.name: p.read_text() for p in run_dir.iterdir() if p.is_file()}


# --- sbatch extras ---------------------------------------------------------------------------

@pytest.mark.parametrize("key", sorted(resolve_module.OWN_SBATCH_OPTIONS))
def test_sbatch_extra_may_not_replace_an_own_directive(key, workdir, monkeypatch, capsys):
    code, _, err = dry_run(workdir, monkeypatch, capsys, site_extra=f"sbatch: {{{key}: x}}\n")
    assert code == 2
    assert "mysite.yaml" in err and f"sbatch.{key}" in err


@pytest.mark.parametrize("key,own", [("parti", "partition"), ("ti", "time"), ("nod", "nodes"), ("out", "output"),
                                     ("acc", "account"), ("signa", "signal"), ("gpus-per-n", "gpus-per-node")])
def test_sbatch_extra_may_not_abbreviate_an_own_directive(key, own, workdir, monkeypatch, capsys):
    code, _, err = dry_run(workdir, monkeypatch, capsys, site_extra=f"sbatch: {{{key}: x}}\n")
    assert code == 2 and f"sbatch.{key}" in err and f"--{own}" in err


def test_own_directive_error_names_the_profile_key_to_use(workdir):
    import dataclasses

    from launcher.config.sitechecks import check_site

    (workdir / "good.yaml").write_text(SITE)
    loaded = load_site(str(workdir / "good.yaml"), workdir, {})
    for key, instead in [("time", "resources.time"), ("nodes", "resources.nodes"), ("mem", "resources.mem_gb"),
                         ("gres", "resources.gpus_per_node"), ("signal", "requeue.signal_lead_s"),
                         ("tasks-per-node", "launcher"), ("array", "--sweep")]:
        site = dataclasses.replace(loaded.config, sbatch={key: "1"})
        with pytest.raises(ConfigError) as info:
            check_site(site, loaded.provenance)
        assert info.value.key == f"sbatch.{key}" and instead in info.value.message


def test_sbatch_extras_that_add_are_written(workdir, monkeypatch, capsys):
    code, out, err = dry_run(workdir, monkeypatch, capsys,
                             site_extra="sbatch: {exclusive: true, mail-type: END, uenv: 'pytorch/v2.8.0:/user-env', "
                                        "comment: 'a \"b\" \\ #c', hint: false}\n")
    assert code == 0, err
    job = bundle(out)["job.sbatch"]
    assert "#SBATCH --exclusive\n" in job and "#SBATCH --mail-type=END\n" in job
    assert "#SBATCH --uenv=pytorch/v2.8.0:/user-env\n" in job
    assert '#SBATCH --comment="a \\"b\\" \\\\ #c"\n' in job
    assert "--hint" not in job
    # glaunch's own directives are there once each
    for own in ("nodes", "time", "output", "signal"):
        assert job.count(f"#SBATCH --{own}=") == 1


# --- memory -----------------------------------------------------------------------------------

@pytest.mark.parametrize("mem,expected", [(100, "100G"), (0.5, "512M"), (1.3, "1332M"), (0.001, "2M"),
                                          (1 / 1024, "1M")])
def test_slurm_mem_never_rounds_below_the_request_or_to_zero(mem, expected):
    assert slurm_mem(mem) == expected


@pytest.mark.parametrize("mem", ["0.0001", "0.0009", "1e-300"])
def test_memory_below_one_mib_is_refused(mem, workdir, monkeypatch, capsys):
    code, _, err = dry_run(workdir, monkeypatch, capsys, f"resources.mem_gb={mem}")
    assert code == 2 and "resources.mem_gb" in err and "1 MiB" in err


def test_small_memory_is_rendered_in_mib(workdir, monkeypatch, capsys):
    code, out, err = dry_run(workdir, monkeypatch, capsys, "resources.mem_gb=0.25")
    assert code == 0, err
    assert "#SBATCH --mem=256M\n" in bundle(out)["job.sbatch"]


# --- ~ in paths ---------------------------------------------------------------------------------

def test_tilde_user_is_refused_not_glued_to_home(workdir, monkeypatch, capsys):
    code, _, err = dry_run(workdir, monkeypatch, capsys, "checkpoint.dir=~bob/ck")
    assert code == 2 and "checkpoint.dir" in err and "~bob" in err and "full path" in err


@pytest.mark.parametrize("path,expected", [("~/", ""), ("~/ck", "/ck"), ("~//ck/..", "")])
def test_tilde_and_tilde_slash_are_home(path, expected, workdir, monkeypatch, capsys):
    code, out, err = dry_run(workdir, monkeypatch, capsys, f"checkpoint.dir={path}")
    assert code == 0, err
    home = str(workdir / "home")
    assert f"export GLAUNCH_CHECKPOINT_DIR={home}{expected}\n" in bundle(out)["env.sh"]


def test_tilde_without_home_is_refused(workdir, monkeypatch, capsys):
    monkeypatch.delenv("HOME")
    code, _, err = dry_run(workdir, monkeypatch, capsys, "checkpoint.dir=~/ck")
    assert code == 2 and "checkpoint.dir" in err and "HOME" in err


def test_double_dollar_in_a_path_is_a_dollar(workdir, monkeypatch, capsys):
    code, out, err = dry_run(workdir, monkeypatch, capsys, "checkpoint.dir=/ck/$$HOME")
    assert code == 0, err
    assert "export GLAUNCH_CHECKPOINT_DIR='/ck/$HOME'\n" in bundle(out)["env.sh"]


# --- containers, modules, setup, python -------------------------------------------------------

PYXIS = "container: {runtime: pyxis, image: 'nvcr.io#nvidia/pytorch:24.09-py3', mounts: [%s]}\n"


@pytest.mark.parametrize("mounts,key", [
    ("'/a,/b'", "container.mounts[0]"), ("'/a:/b:ro:x'", "container.mounts[0]"), ("'rel:/b'", "container.mounts[0]"),
    ("'$SCRATCH:/scratch'", "container.mounts[0]"), ("'/a:'", "container.mounts[0]"),
    ("/ok, '/a:b'", "container.mounts[1]"),
])
def test_bad_mounts_are_refused(mounts, key, workdir, monkeypatch, capsys):
    code, _, err = dry_run(workdir, monkeypatch, capsys, site_extra=PYXIS % mounts)
    assert code == 2 and "mysite.yaml" in err and key in err


def test_good_mounts_are_kept_whole(workdir, monkeypatch, capsys):
    code, out, err = dry_run(workdir, monkeypatch, capsys, site_extra=PYXIS % "/data, '/scratch:/s:ro'")
    assert code == 0, err
    mounts = next(w for w in bundle(out)["job.sbatch"].split() if w.startswith("--container-mounts="))
    assert mounts.split("=", 1)[1].split(",")[:2] == ["/data", "/scratch:/s:ro"]


@pytest.mark.parametrize("where,args", [
    ("working directory", []), ("--runs-dir", ["--runs-dir", "RUNS"]), ("checkpoint.dir", ["checkpoint.dir=CK"]),
])
@pytest.mark.parametrize("bad", [",", ":"])
def test_paths_that_become_mounts_may_not_hold_separators(where, args, bad, tmp_path, monkeypatch, capsys,
                                                          isolated_env):
    work = tmp_path / (f"w{bad}d" if where == "working directory" else "w")
    work.mkdir()
    (work / "train.py").write_text("")
    (work / "exp.yaml").write_text(EXP)
    (work / "site.yaml").write_text(SITE + PYXIS % "/data")
    monkeypatch.chdir(work)
    args = [a.replace("RUNS", str(tmp_path / f"r{bad}s")).replace("CK", f"/ck{bad}x") for a in args]
    runs = [] if "--runs-dir" in args else ["--runs-dir", str(tmp_path / "runs")]
    code, out, err = run_cli(monkeypatch, capsys, ["glaunch", "submit", "exp.yaml", "--site", "./site.yaml",
                                                   "--dry-run", *runs, *args])
    assert code == 2, out
    assert where in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("image", ["-rm", "a b", "a,b", "", "x\x1by"])
def test_bad_images_are_refused(image, workdir, monkeypatch, capsys):
    code, _, err = dry_run(workdir, monkeypatch, capsys,
                           site_extra=f"container: {{runtime: apptainer, image: {json.dumps(image)}}}\n")
    assert code == 2 and "container.image" in err


@pytest.mark.parametrize("module", ["-f", "a b", "x;y", "$(id)", "", "cuda\n12"])
def test_bad_module_names_are_refused(module, workdir, monkeypatch, capsys):
    code, _, err = dry_run(workdir, monkeypatch, capsys, site_extra=f"modules: [ok/1, {json.dumps(module)}]\n")
    assert code == 2 and "modules[1]" in err


def test_module_names_modules_use_are_accepted(workdir, monkeypatch, capsys):
    names = ["cuda/12.4", "Stages/2024", "py-torch@2.1.0%gcc", "gcc+cuda", "nvidia/nvhpc-hpcx-cuda12/24.3"]
    code, out, err = dry_run(workdir, monkeypatch, capsys, site_extra=f"modules: {json.dumps(names)}\n")
    assert code == 0, err
    for name in names:
        assert f"module load {name}\n" in bundle(out)["env.sh"]


@pytest.mark.parametrize("line", ["echo \x1b[31m", "a\rb", "x\x9by", "bell\x07"])
def test_setup_lines_may_not_hold_control_characters(line, workdir, monkeypatch, capsys):
    code, _, err = dry_run(workdir, monkeypatch, capsys, site_extra=f"setup: [{json.dumps(line)}]\n")
    assert code == 2 and "setup[0]" in err


def test_setup_lines_keep_tabs_and_newlines(workdir, monkeypatch, capsys):
    line = "if true; then\n\techo ok\nfi"
    code, out, err = dry_run(workdir, monkeypatch, capsys, site_extra=f"setup: [{json.dumps(line)}]\n")
    assert code == 0, err
    assert line in bundle(out)["env.sh"]


@pytest.mark.parametrize("python", ["-c x", "'' -u", "'py]'", "'a\\tb'"])
def test_python_must_start_with_an_interpreter(python, workdir, monkeypatch, capsys):
    code, _, err = dry_run(workdir, monkeypatch, capsys, site_extra=f"python: {json.dumps(python)}\n")
    assert code == 2 and "python" in err


# --- the raw deepspeed block ----------------------------------------------------------------

@pytest.mark.parametrize("block,key", [
    ("{zero_optimization: {stage: 7}}", "deepspeed.zero_optimization.stage"),
    ("{zero_optimization: {stage: true}}", "deepspeed.zero_optimization.stage"),
    ("{zero_optimization: {stage: 3}}", "deepspeed.zero_optimization.stage"),      # strategy says 2
    ("{zero_optimization: 3}", "deepspeed.zero_optimization"),
    ("{zero_optimization: {offload_optimizer: {device: gpu}}}", "deepspeed.zero_optimization.offload_optimizer.device"),
    ("{zero_optimization: {offload_optimizer: {device: nvme}}}",
     "deepspeed.zero_optimization.offload_optimizer.nvme_path"),
    ("{zero_optimization: {offload_param: {device: cpu}}}", "deepspeed.zero_optimization.offload_param.device"),
    ("{zero_optimization: {offload_optimizer: cpu}}", "deepspeed.zero_optimization.offload_optimizer"),
    ("{fp16: {enabled: true}, bf16: {enabled: true}}", "deepspeed.fp16.enabled"),
    ("{bf16: {enabled: true}}", "deepspeed.bf16.enabled"),                             # precision is fp32
    ("{fp16: {enabled: 'yes'}}", "deepspeed.fp16.enabled"),
    ("{fp16: true}", "deepspeed.fp16"),
    ("{train_batch_size: 7}", "deepspeed.train_batch_size"),
    ("{train_micro_batch_size_per_gpu: 0}", "deepspeed.train_micro_batch_size_per_gpu"),
    ("{gradient_clipping: .nan}", "deepspeed.gradient_clipping"),
    ("{optimizer: {params: {lr: .inf}}}", "deepspeed.optimizer.params.lr"),
    ("{optimizer: {params: {betas: [0.9, -.inf]}}}", "deepspeed.optimizer.params.betas[1]"),
])
def test_deepspeed_block_is_checked_after_merging(block, key, workdir, monkeypatch, capsys):
    code, _, err = dry_run(workdir, monkeypatch, capsys, exp_extra=DS + f"deepspeed: {block}\n")
    assert code == 2, err
    assert "exp.yaml" in err and key in err


def test_precision_mismatch_in_the_block_is_refused(workdir, monkeypatch, capsys):
    code, _, err = dry_run(workdir, monkeypatch, capsys, "precision=bf16",
                           exp_extra=DS + "deepspeed: {bf16: {enabled: false}}\n")
    assert code == 2 and "deepspeed.bf16.enabled" in err


def test_consistent_deepspeed_block_is_merged(workdir, monkeypatch, capsys):
    code, out, err = dry_run(workdir, monkeypatch, capsys, "precision=bf16", exp_extra=DS + (
        "deepspeed: {gradient_clipping: 1.0, zero_optimization: {stage: 2, overlap_comm: true, "
        "offload_optimizer: {device: cpu}}, bf16: {enabled: true}}\n"))
    assert code == 0, err
    ds = json.loads(bundle(out)["ds_config.json"])
    assert ds["gradient_clipping"] == 1.0 and ds["zero_optimization"]["overlap_comm"] is True
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"


def test_ds_config_json_never_holds_nan_or_raw_control_characters():
    import dataclasses

    from launcher.rendering.render import render_ds_config

    @dataclasses.dataclass
    class Plan:
        ds_config: dict
        experiment_file: str = "exp.yaml"

    with pytest.raises(ConfigError) as info:
        render_ds_config(Plan({"a": float("nan")}))
    assert info.value.key == "deepspeed"
    text = render_ds_config(Plan({"path": "a\x7fb\x1b\x9b"}))
    assert all(c.isprintable() or c == "\n" for c in text) and json.loads(text)["path"] == "a\x7fb\x1b\x9b"


# --- the planner's inputs -------------------------------------------------------------------

def test_model_factory_without_torch_is_a_config_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)      # as if torch were not installed
    monkeypatch.setitem(sys.modules, "fake_models", type(sys)("fake_models"))
    sys.modules["fake_models"].build = lambda: None
    with pytest.raises(ValueError, match="needs torch installed"):
        inspect_factory("fake_models:build")


@pytest.mark.parametrize("params", [".nan", ".inf", "-.inf", "0.5"])
def test_plan_refuses_non_finite_model_size(params, workdir, monkeypatch, capsys):
    (workdir / "exp.yaml").write_text(EXP + f"model: {{params: {params}}}\n")
    (workdir / "site_configs" / "mysite.yaml").write_text(SITE)
    code, out, err = run_cli(monkeypatch, capsys, ["glaunch", "plan", "exp.yaml", "--site", "mysite", "--json"])
    assert code == 2 and "model.params" in err and "Traceback" not in err

"""Run directories that were damaged or tampered with (issue 11), through the real CLI.

A real 8-step ZeRO-2 run on 2 gloo processes (checkpoints at steps 4, 6 and 8) is made once; each
test damages a copy.
- Hostile: a pickle whose payload would create a marker file. Someone who shares a run directory can
  also rewrite `bertpipe.json`, so the poisoned file's size and sha256 are recorded there too: it
  passes the integrity check and must be refused for what it holds, by every entry point that reads
  a run (`export`, `features`, `finetune`, `pretrain --resume`, `checkpoint.init_from`), in one line
  naming the file, before any training.
- Damaged: `latest` gone, a model file cut short, metadata that does not parse, a torn last line in
  metrics.jsonl: `--resume` continues from the newest intact checkpoint with the uninterrupted run's
  losses, and says which one it skipped.
- `export --out` never writes over what bertpipe did not write.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from launch.checkpoint_dirs import sealed
from repo_paths import GLUE
from zero2_run import STEPS, TRAIN, bertpipe, zero2_run

@pytest.fixture(scope="module")
def run(small_corpus, tmp_path_factory) -> Path:
    return zero2_run(small_corpus, tmp_path_factory)


def copy_run(run: Path, dest: Path) -> Path:
    return Path(shutil.copytree(run, dest, ignore=shutil.ignore_patterns("export", ".bertpipe.lock")))


class Payload:
    """Unpickling this would create `marker`: what a hostile checkpoint does, harmlessly."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').close()",)


def poison(run: Path, name: str, marker: Path) -> Path:
    """The payload added to file `name` of the newest checkpoint, recorded in its bertpipe.json."""
    from launch.pretrain.hf_export import load_checkpoint_file
    from pipeline.manifest import sha256_file

    folder = run / "checkpoints" / f"global_step{STEPS}"
    path = folder / name
    state = load_checkpoint_file(path)
    state["payload"] = Payload(marker)
    torch.save(state, path)
    meta = json.loads((folder / "bertpipe.json").read_text())
    meta["files"][name] = {"size": path.stat().st_size, "sha256": sha256_file(path)}
    (folder / "bertpipe.json").write_text(json.dumps(sealed(meta)))  # the records and their seal rewritten too
    return path


def assert_refused(done: subprocess.CompletedProcess, path: Path, marker: Path) -> None:
    output = done.stdout + done.stderr
    assert done.returncode != 0, output[-3000:]
    assert not marker.exists(), "the pickle's payload ran"
    assert "Traceback" not in output and "weights_only" not in output, output[-3000:]
    lines = [line for line in output.splitlines() if str(path) in line]
    assert len(lines) == 1, output[-3000:]
    assert "refused to load" in lines[0] and "builtins.exec" in lines[0] and "could run code" in lines[0]


def entry_point(command: str, checkpoint: Path, corpus: Path, tmp: Path) -> list[object]:
    """The command line of one entry point that reads `checkpoint`."""
    texts = tmp / "texts.txt"
    texts.write_text("the captain was at sea.\n")
    return {
        "export": ["export", checkpoint, "--out", tmp / "hf"],
        "features": ["features", "--checkpoint", checkpoint, "--input", texts, "--out", tmp / "feats"],
        "finetune": ["finetune", "--task", "sst2", "--data-dir", GLUE, "--checkpoint", checkpoint, "--out",
                     tmp / "sst2", "--max-train-samples", "16", "--epochs", "1", "--no-progress", "--no-save-model"],
        # The run's own launch, as a user resumes it: 2 processes, rank 0 checks, both stop.
        "pretrain --resume": ["pretrain", "--data", corpus, "--out", checkpoint, "--nproc", "2", *TRAIN, "--resume"],
        "init_from": ["pretrain", "--data", corpus, "--out", tmp / "phase2", "--nproc", "1", *TRAIN,
                      "--max-steps", "2", "--checkpoint.init-from", checkpoint],
    }[command]


FILES = {"model states": "mp_rank_00_model_states.pt",
         "optimizer states": "zero_pp_rank_1_mp_rank_00_optim_states.pt",
         "RNG states": "rng_rank0.pt"}


@pytest.mark.slow
@pytest.mark.parametrize("command", ["export", "features", "finetune", "pretrain --resume", "init_from"])
@pytest.mark.parametrize("kind", list(FILES))
def test_a_pickle_in_a_run_dir_is_refused_naming_the_file(run, small_corpus, tmp_path, kind, command):
    hostile = copy_run(run, tmp_path / "run")
    marker = tmp_path / "PAYLOAD_RAN"
    path = poison(hostile, FILES[kind], marker)
    done = bertpipe(*entry_point(command, hostile, small_corpus, tmp_path))
    assert_refused(done, path, marker)
    assert not (tmp_path / "phase2" / "checkpoints").exists() and not (hostile / "export").exists()


@pytest.fixture
def hostile_hf_dir(tiny_checkpoint, tmp_path) -> tuple[Path, Path, Path]:
    """An HF directory whose only weights are a `pytorch_model.bin` carrying the payload."""
    from safetensors.torch import load_file

    hf = Path(shutil.copytree(tiny_checkpoint, tmp_path / "hf_model"))
    state = load_file(hf / "model.safetensors")
    (hf / "model.safetensors").unlink()
    marker = tmp_path / "PAYLOAD_RAN"
    torch.save({**state, "payload": Payload(marker)}, hf / "pytorch_model.bin")
    return hf, hf / "pytorch_model.bin", marker


@pytest.mark.slow
@pytest.mark.parametrize("command", ["features", "finetune", "init_from"])
def test_a_pickle_in_an_hf_pytorch_model_bin_is_refused(hostile_hf_dir, small_corpus, tmp_path, command):
    hf, path, marker = hostile_hf_dir
    assert_refused(bertpipe(*entry_point(command, hf, small_corpus, tmp_path)), path, marker)


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_a_legacy_pickle_file_and_a_cut_short_file_are_refused_in_one_line(tmp_path):
    """The same one path for `torch.save`'s old non-zip format and for a file cut short."""
    import pickle

    from model.torch_files import check_torch_file, load_torch_file

    marker = tmp_path / "PAYLOAD_RAN"
    legacy = tmp_path / "pytorch_model.bin"
    for protocol, why in ((2, "it references exec"), (4, "it is not a file of tensors")):
        legacy.write_bytes(pickle.dumps(Payload(marker), protocol=protocol))
        for check in (check_torch_file, load_torch_file):
            with pytest.raises(ValueError, match=rf"pytorch_model.bin: refused to load: {why}"):
                check(legacy)
    cut = tmp_path / "cut.pt"
    torch.save({"w": torch.ones(1000)}, cut)
    cut.write_bytes(cut.read_bytes()[:1500])
    for check in (check_torch_file, load_torch_file):
        with pytest.raises(ValueError, match=r"cut.pt is truncated or not a PyTorch tensor file"):
            check(cut)
    # An empty file (EOFError with no message) and text (a KeyError from the pickle memo): the same one line.
    for content, detail in ((b"", "EOFError"), (b"hello\n", "KeyError")):
        cut.write_bytes(content)
        for check in (check_torch_file, load_torch_file):
            with pytest.raises(ValueError, match=rf"cut.pt is truncated or not a PyTorch tensor file \({detail}"):
                check(cut)
    cut.unlink()  # a file that is not there is said so, not "truncated"
    for check in (check_torch_file, load_torch_file):
        with pytest.raises(ValueError, match=r"cut.pt does not exist$"):
            check(cut)
    assert not marker.exists()


# ---- damaged run directories: verify and fall back ------------------------------------------------


def metrics(run: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert len({r["step"] for r in records}) == len(records), "a step appears twice in metrics.jsonl"
    return {r["step"]: r["loss"] for r in records}


def stopped_after(run: Path, dest: Path, saved: int, logged: int) -> Path:
    """A copy of `run` as a run killed after saving step `saved` and logging step `logged`, its last
    metrics line torn mid-write."""
    out = copy_run(run, dest)
    for tag in (out / "checkpoints").glob("global_step*"):
        if int(tag.name.removeprefix("global_step")) > saved:
            shutil.rmtree(tag)
    (out / "checkpoints" / "latest").write_text(f"global_step{saved}\n")
    lines = (out / "metrics.jsonl").read_text().splitlines()[:logged + 1]
    (out / "metrics.jsonl").write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:25])
    return out


@pytest.mark.slow
def test_an_out_that_is_a_file_is_one_line_and_exit_2_from_the_cli_and_a_launched_rank(small_corpus, tmp_path):
    # It was a ValueError traceback, exit 1: a fault, which a scheduler retries.
    from launch.pretrain.launcher import free_port

    afile = tmp_path / "afile"
    afile.write_text("mine")
    done = bertpipe("pretrain", "--data", small_corpus, "--out", afile, "--nproc", "1", "--config", "tiny")
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        f"bertpipe pretrain: error: --out {afile} is a file; pass a directory"]
    env = dict(os.environ, OMP_NUM_THREADS="1", RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
               MASTER_PORT=str(free_port()))
    done = subprocess.run([sys.executable, "-m", "launch.pretrain", "--data", str(small_corpus), "--out", str(afile),
                           "--config", "tiny"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert f"--out {afile} is a file; pass a directory" in done.stderr and afile.read_text() == "mine"


def test_resume_names_the_model_field_that_differs_allows_how_the_model_runs_and_refuses_fewer_steps(
        run, small_corpus, tmp_path):
    # The whole model section was compared: turning activation checkpointing on after running out of memory
    # was refused (with two dicts printed); and --max-steps below the run's step "finished" and rewrote config.yaml.
    out = stopped_after(run, tmp_path / "run", saved=6, logged=6)
    for extra, message in [(["--model.fields", "hidden_dropout_prob=0.0"],
                            "model.fields.hidden_dropout_prob differs from the checkpoint's (None there, 0.0 now)"),
                           (["--max-steps", "4"], "the run is at step 6 already; --max-steps 4 is behind it"),
                           # What orders and draws the samples: changed, the resumed run would see others.
                           (["--data.seed", "7"], "data.seed differs from the checkpoint's"),
                           (["--data.global-batch-size", "16"], "data.global_batch_size differs from the checkpoint's"),
                           (["--optim.name", "adamw"], "optim.name differs from the checkpoint's ('lamb' there")]:
        done = bertpipe("pretrain", "--data", small_corpus, "--out", out, "--nproc", "1", *TRAIN, *extra, "--resume")
        assert done.returncode == 2 and message in done.stderr, done.stderr[-3000:]
    assert "total_steps: 8" in (out / "config.yaml").read_text()
    done = bertpipe("pretrain", "--data", small_corpus, "--out", out, "--nproc", "2", *TRAIN,
                    "--model.activation-checkpointing", "true", "--resume")
    assert done.returncode == 0 and "resumed from global_step6" in done.stderr, done.stderr[-3000:]
    assert metrics(out) == metrics(run)  # recomputing activations changes no loss


def test_resume_without_latest_continues_from_the_newest_checkpoint_replacing_links_not_their_targets(
        run, small_corpus, tmp_path):
    out = stopped_after(run, tmp_path / "run", saved=6, logged=7)
    (out / "checkpoints" / "latest").unlink()
    # A run branched with `cp -rs`: its files are links into the original, which the resume must not rewrite
    # (ds_config.json and vocab.txt were written through them, and a dangling marker link to where it points).
    theirs = {name: tmp_path / f"original-{name}" for name in ("ds_config.json", "vocab.txt", ".bertpipe-run")}
    for name, target in theirs.items():
        if name != ".bertpipe-run":
            target.write_text(f"the original run's {name}\n")
        (out / name).unlink()
        (out / name).symlink_to(target)
    done = bertpipe("pretrain", "--data", small_corpus, "--out", out, "--nproc", "2", *TRAIN, "--resume")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "latest is missing: using the newest complete checkpoint, global_step6" in done.stderr
    assert "resumed from global_step6" in done.stderr and "last line was cut short" in done.stderr
    # The history is kept, and the steps after the checkpoint are the uninterrupted run's, bit for bit.
    assert metrics(out) == metrics(run)
    assert not (tmp_path / "original-.bertpipe-run").exists()
    for name in ("ds_config.json", "vocab.txt"):
        assert theirs[name].read_text() == f"the original run's {name}\n"
        assert not (out / name).is_symlink() and (out / name).read_bytes() == (run / name).read_bytes()


@pytest.mark.slow
def test_resume_skips_a_cut_short_checkpoint_for_the_previous_one(run, small_corpus, tmp_path):
    out = stopped_after(run, tmp_path / "run", saved=6, logged=6)
    model_file = out / "checkpoints" / "global_step6" / "mp_rank_00_model_states.pt"
    model_file.write_bytes(model_file.read_bytes()[:100_000])
    earlier = out / "checkpoints" / "damaged-global_step6"  # set aside by an earlier resume: kept as it is
    earlier.mkdir()
    (earlier / "note").write_text("inspect me")
    done = bertpipe("pretrain", "--data", small_corpus, "--out", out, "--nproc", "2", *TRAIN, "--resume")
    assert done.returncode == 0, done.stderr[-3000:]
    skipped = [line for line in done.stderr.splitlines() if "skipped" in line]
    assert len(skipped) == 1 and str(model_file) in skipped[0] and "has 100000 bytes" in skipped[0], skipped
    assert "resumed from global_step4" in done.stderr
    assert metrics(out) == metrics(run)
    # Set aside, not counted by keep_last: a damaged newer folder used to be kept in place of sound ones
    # (saves at other steps than its own never replaced it) while those were deleted.
    aside = out / "checkpoints" / "damaged-global_step6.1"
    assert (aside / "mp_rank_00_model_states.pt").stat().st_size == 100_000
    assert (earlier / "note").read_text() == "inspect me"
    assert f"moved to {aside}" in done.stderr
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("global_step")) == [
        "global_step4", "global_step6", "global_step8"]


@pytest.mark.slow
def test_resume_with_new_optimizer_settings_and_more_steps_uses_them_from_its_first_update(run, small_corpus, tmp_path):
    """DeepSpeed's load put the checkpoint's lr, betas, eps and weight decay back, and the lr its old
    schedule ended on: extended with --max-steps, the first update ran at lr 0 with the old peak lr."""
    from launch.config import load_config
    from launch.pretrain.pretrain_config import PretrainConfig
    from launch.pretrain.hf_export import load_checkpoint_file
    from launch.pretrain.schedule import lr_multiplier

    out = copy_run(run, tmp_path / "run")
    longer = [*TRAIN, "--max-steps", "12", "--optim.lr", "0.003", "--optim.beta2", "0.98"]
    done = bertpipe("pretrain", "--data", small_corpus, "--out", out, "--nproc", "2", *longer, "--resume")
    assert done.returncode == 0, done.stderr[-3000:]
    assert ("optim.lr 0.01 there, 0.003 now; optim.beta2 0.999 there, 0.98 now; schedule.total_steps 8 there, 12 now: "
            "from step 8 the run follows its own settings") in done.stderr
    cfg = load_config(PretrainConfig, str(out / "config.yaml"))
    assert cfg.optim.lr == 0.003 and cfg.schedule.total_steps == 12
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    lrs = {r["step"]: r["lr"] for r in records if r["step"] > STEPS}
    assert lrs == pytest.approx({s: 0.003 * lr_multiplier(s - 1, cfg.schedule) for s in range(9, 13)}, rel=1e-6)
    optim_file = next((out / "checkpoints" / "global_step12").glob("*optim_states.pt"))
    state = load_checkpoint_file(optim_file)  # the code base's one torch.load: tensors and DeepSpeed's records only
    groups = state["optimizer_state_dict"]["base_optimizer_state"]["param_groups"]
    assert [g["betas"] for g in groups] == [(0.9, 0.98)] * 2 and [g["weight_decay"] for g in groups] == [0.01, 0.0]


def test_a_config_yaml_cut_short_since_is_refused_on_resume_in_one_line_naming_it(run, small_corpus, tmp_path):
    """RUN/config.yaml cut short (an interrupted copy of the run) still parses: the resume took the defaults for
    what was cut (saving every 1,000 steps, not 2), and a value cut mid-way (beta1: 0.9 -> 0) as the run's,
    with one warning that did not name the file, and saved them into its next checkpoint."""
    out = copy_run(run, tmp_path / "run")
    text = (out / "config.yaml").read_text()
    for cut in (text[:text.index("checkpoint:")], text[:text.index("beta1: 0.9") + len("beta1: 0")]):
        (out / "config.yaml").write_text(cut)
        done = bertpipe("pretrain", "--data", small_corpus, "--out", out, "--nproc", "2", "--max-steps", "9", "--resume")
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
        last = done.stderr.strip().splitlines()[-1]
        assert f"{out / 'config.yaml'} lacks " in last and "which bertpipe writes there: cut short" in last, last
        assert (out / "config.yaml").read_text() == cut  # nothing ran, nothing rewritten
        assert not (out / "checkpoints" / "global_step9").exists()


def test_metadata_that_does_not_parse_names_its_file(run, tmp_path):
    out = copy_run(run, tmp_path / "run")
    meta = out / "checkpoints" / f"global_step{STEPS}" / "bertpipe.json"
    meta.write_text("garbage {")
    done = bertpipe("export", out, "--out", tmp_path / "hf", "--tag", f"global_step{STEPS}")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"{meta} is not valid JSON" in done.stderr.strip().splitlines()[-1]
    # Without --tag the damaged checkpoint is skipped, named, and the previous one exported.
    done = bertpipe("export", out, "--out", tmp_path / "hf")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"skipped: {meta} is not valid JSON" in done.stderr
    assert json.loads((tmp_path / "hf" / "bertpipe_export.json").read_text())["tag"] == f"global_step{STEPS - 2}"


def test_metadata_edited_since_the_save_is_damage_named_in_one_line(run, tmp_path):
    """bertpipe.json is the one file of a checkpoint its file records cannot cover: an edit there (hidden_size)
    was read as it was, and export died in load_state_dict with a traceback."""
    out = copy_run(run, tmp_path / "run")
    meta = out / "checkpoints" / f"global_step{STEPS}" / "bertpipe.json"
    edited = json.loads(meta.read_text())
    edited["bert_config"]["hidden_size"] *= 2
    meta.write_text(json.dumps(edited))
    done = bertpipe("export", out, "--out", tmp_path / "hf", "--tag", f"global_step{STEPS}")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert f"{meta} does not match the sha256 it records of itself" in done.stderr.strip().splitlines()[-1]
    done = bertpipe("export", out, "--out", tmp_path / "hf")  # without --tag: skipped, named, the one before it
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"skipped: {meta} does not match the sha256" in done.stderr
    assert json.loads((tmp_path / "hf" / "bertpipe_export.json").read_text())["tag"] == f"global_step{STEPS - 2}"
    # Metadata saved before the seal, edited: still one line, naming the file or the checkpoint.
    for hidden_size in ("64", edited["bert_config"]["hidden_size"]):
        edited.pop("meta_sha256", None)
        edited["bert_config"]["hidden_size"] = hidden_size
        meta.write_text(json.dumps(edited))
        done = bertpipe("export", out, "--out", tmp_path / "hf2", "--tag", f"global_step{STEPS}")
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
        assert f"global_step{STEPS}" in done.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_resume_refuses_another_zero_stage_or_dtype_in_one_line_leaving_the_config(run, small_corpus, tmp_path):
    """DeepSpeed's state files differ per ZeRO stage and dtype: a changed one used to fail inside
    DeepSpeed (a bare AssertionError, a missing bf16_zero_* file) after config.yaml was rewritten."""
    out = copy_run(run, tmp_path / "run")
    config = (out / "config.yaml").read_bytes()
    train = [a if a != "2" or TRAIN[i - 1] != "--zero.stage" else "3" for i, a in enumerate(TRAIN)]
    for flags, key in ((train, "zero.stage"), ([*TRAIN, "--precision.dtype", "bf16"], "precision.dtype")):
        done = bertpipe("pretrain", "--data", small_corpus, "--out", out, "--nproc", "1", *flags, "--resume")
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
        assert f"{key} differs from the checkpoint's" in done.stderr.strip().splitlines()[-1]
        assert (out / "config.yaml").read_bytes() == config


@pytest.mark.slow
def test_init_from_refuses_a_checkpoint_of_another_architecture(run, small_corpus, tmp_path):
    """The run's config is the model's one description, so a resume rebuilds exactly what was trained:
    a phase-1 run of another shape is refused, not trained under the wrong name."""
    flags = [*TRAIN[:TRAIN.index("--max-steps")], "--max-steps", "1", "--checkpoint.init-from", run]
    done = bertpipe("pretrain", "--data", small_corpus, "--out", tmp_path / "p2", *flags, "--model.preset", "mini")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert "is not the model this config describes (hidden_size 64 there, 256 here" in last, last


# ---- export --out --------------------------------------------------------------------------------


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in folder.rglob("*") if p.is_file()}


def test_export_out_never_writes_over_what_bertpipe_did_not_write(run, tmp_path):
    out = copy_run(run, tmp_path / "runs" / "run")
    foreign = tmp_path / "sst2"  # e.g. a fine-tuning output folder
    foreign.mkdir()
    (foreign / "metrics.json").write_text("{}")
    (foreign / "config.json").write_text('{"mine": true}')
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "notes.txt").write_text("keep me")
    before = {d: snapshot(d) for d in (out, foreign, workdir)}

    refusals = {
        (str(foreign),): "is not empty and holds no export of",
        (str(out), "--overwrite"): "is the run directory",
        (str(out / "checkpoints"), "--overwrite"): "lies inside the run directory",
        (str(tmp_path / "runs"), "--overwrite"): "is the run directory",  # its parent
        (".", "--overwrite"): "is the working directory",
    }
    for args, why in refusals.items():
        done = bertpipe("export", out, "--out", *args, cwd=workdir)
        assert done.returncode == 2 and why in done.stderr, (args, done.stderr[-2000:])
        assert {d: snapshot(d) for d in (out, foreign, workdir)} == before, args
    assert not list(tmp_path.glob("**/.sst2-*")) and not (out / "export").exists()

    # --overwrite writes the export's files; the folder's own files it did not write stay.
    done = bertpipe("export", out, "--out", foreign, "--overwrite")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (foreign / "metrics.json").read_text() == "{}" and (foreign / "model.safetensors").is_file()
    assert "bertpipe did not write, left as they are: metrics.json" in done.stderr
    assert "replacing 1 file(s) bertpipe did not write, or that were changed since, with the export's: config.json" \
        in done.stderr
    # An earlier export of the same run is replaced without --overwrite; a file of it edited since is named, and
    # one the marker lists but the new export does not write is removed only as bertpipe wrote it.
    (foreign / "README.md").write_text("my notes on this model\n")
    marker = json.loads((foreign / "bertpipe_export.json").read_text())
    (foreign / "extra.txt").write_text("mine now")
    marker["files"].append("extra.txt")  # listed, but not recorded as bertpipe wrote it
    (foreign / "bertpipe_export.json").write_text(json.dumps(marker))
    done = bertpipe("export", out, "--out", foreign)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "that were changed since, with the export's: README.md" in done.stderr
    assert (foreign / "extra.txt").read_text() == "mine now"


@pytest.mark.slow
def test_pretrain_out_never_writes_over_what_bertpipe_did_not_write(small_corpus, tmp_path):
    """A folder holding the user's own config.yaml and vocab.txt (names a run writes) is refused as it is;
    a run directory bertpipe made (its marker) is reused."""
    mine = tmp_path / "exp1"
    mine.mkdir()
    (mine / "config.yaml").write_text("# my experiment's settings\n")
    (mine / "vocab.txt").write_text("my vocabulary\n")
    before = snapshot(mine)
    for extra in ([], ["--resume"]):
        done = bertpipe("pretrain", "--data", small_corpus, "--out", mine, *TRAIN, "--max-steps", "2", *extra)
        assert done.returncode == 2, done.stderr[-2000:]
        assert "holds config.yaml, vocab.txt, which `bertpipe pretrain` did not write" in done.stderr
        assert snapshot(mine) == before and "Traceback" not in done.stderr
    # A run that stopped before its first checkpoint left only its own files and marker: a rerun may
    # write over them.
    ours = tmp_path / "run"
    done = bertpipe("pretrain", "--data", small_corpus, "--out", ours, *TRAIN, "--max-steps", "2")
    assert done.returncode == 0, done.stderr[-2000:]
    shutil.rmtree(ours / "checkpoints")
    done = bertpipe("pretrain", "--data", small_corpus, "--out", ours, *TRAIN, "--max-steps", "2")
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_pickle_naming_a_blocked_module_is_refused_naming_it(tmp_path):
    """torch words os/subprocess globals differently ("whose module posix is blocked"): the refusal still
    names the global and says why, rather than echoing torch's advice to set weights_only=False."""
    import os

    from model.torch_files import check_torch_file, load_torch_file

    path = tmp_path / "optim_states.pt"
    torch.save({"hook": os.system}, path)
    for check in (check_torch_file, load_torch_file):
        with pytest.raises(ValueError, match=rf"optim_states.pt: refused to load: it references {os.system.__module__}.system, "
                                             r"which is not a tensor .*could run code"):
            check(path)


def _weights(folder: Path) -> bytes:
    return (folder / "model.safetensors").read_bytes()


def test_the_export_cache_follows_the_checkpoint_it_was_made_from(run, tmp_path):
    """A run resolves to `RUN/export/<tag>` only while that export is of this very checkpoint: not
    another tag's export placed under its name, nor the export of a checkpoint since retrained under it."""
    from launch.export_dirs import resolve_checkpoint

    out = copy_run(run, tmp_path / "run")
    fresh = bertpipe("export", out, "--out", tmp_path / "step8")
    assert fresh.returncode == 0, fresh.stderr[-2000:]
    cached = out / "export" / "global_step8"
    done = bertpipe("export", out, "--tag", "global_step4", "--out", cached)
    assert done.returncode == 0, done.stderr[-2000:]
    assert _weights(cached) != _weights(tmp_path / "step8")
    assert resolve_checkpoint(out) == cached and _weights(cached) == _weights(tmp_path / "step8")  # exported again

    # Retrained under the same tag: its metadata (which records every file's sha256) changes.
    meta = out / "checkpoints" / "global_step8" / "bertpipe.json"
    meta.write_text(json.dumps(sealed({**json.loads(meta.read_text()), "retrained": True})))
    before = json.loads((cached / "bertpipe_export.json").read_text())["checkpoint_sha256"]
    assert resolve_checkpoint(out) == cached
    assert json.loads((cached / "bertpipe_export.json").read_text())["checkpoint_sha256"] != before

    # The export itself changed since it was written (a damaged byte): made again, not read back as it is.
    good = _weights(cached)
    damaged = bytearray(good)
    damaged[-100] ^= 0xFF
    (cached / "model.safetensors").write_bytes(bytes(damaged))
    assert resolve_checkpoint(out) == cached and _weights(cached) == good

    # Its marker unreadable: nothing proves the files there are ours, so they are not replaced, and the
    # message says what to do (it advised --overwrite, which finetune and features do not have).
    (cached / "bertpipe_export.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"holds files that are not an export of .*move it aside and rerun"):
        resolve_checkpoint(out)
    assert _weights(cached) == good


def test_an_export_changed_since_it_was_written_is_refused_naming_the_file(run, tmp_path):
    """What we wrote is what we read back: a flipped bit in an export's weights loaded silently (features wrote
    -inf, finetune scored chance), though its marker records every file's sha256. The model card is the
    user's to edit; without the marker the folder is the user's own."""
    from launch.export_dirs import EXPORT_MARKER, resolve_checkpoint

    hf = tmp_path / "hf"
    assert bertpipe("export", run, "--out", hf).returncode == 0
    (hf / "README.md").write_text("my notes on this model\n")
    assert resolve_checkpoint(hf) == hf

    good = (hf / "model.safetensors").read_bytes()
    damaged = bytearray(good)
    damaged[-100] ^= 0x40
    (hf / "model.safetensors").write_bytes(bytes(damaged))
    for command in ("features", "finetune"):
        done = bertpipe(*entry_point(command, hf, None, tmp_path))
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
        last = done.stderr.strip().splitlines()[-1]
        assert f"{hf / 'model.safetensors'} is not the file bertpipe exported" in last, last
        assert f"delete {hf / EXPORT_MARKER}" in last, last
    (hf / "model.safetensors").write_bytes(good)

    vocab = (hf / "vocab.txt").read_text(encoding="utf-8")
    (hf / "vocab.txt").write_text(vocab.replace("[MASK]", "[MASQ]"), encoding="utf-8")
    with pytest.raises(ValueError, match=r"vocab\.txt is not the file bertpipe exported"):
        resolve_checkpoint(hf)
    (hf / EXPORT_MARKER).unlink()  # changed on purpose: the user's folder now, read as any HF directory
    assert resolve_checkpoint(hf) == hf


def test_a_checkpoint_pruned_while_it_is_exported_is_said_so(run, tmp_path, monkeypatch):
    # Exporting a run that is still training: the trainer pruned the checkpoint export had chosen, and export
    # said "bertpipe.json is missing (the save did not finish)", or showed a FileNotFoundError's traceback.
    import launch.pretrain.hf_export as hf_export
    from launch.export_dirs import export_run

    out = copy_run(run, tmp_path / "run")
    real = hf_export.write_export

    def pruned_first(ckpt_dir, tag, *args):  # what the trainer's `_prune` does, between choosing and reading
        shutil.rmtree(ckpt_dir / tag)
        return real(ckpt_dir, tag, *args)

    monkeypatch.setattr(hf_export, "write_export", pruned_first)
    with pytest.raises(ValueError, match=rf"checkpoint {re.escape(str(out / 'checkpoints' / 'global_step8'))} was removed "
                                         r"while it was exported .*; export again"):
        export_run(out, tmp_path / "hf")
    assert not (tmp_path / "hf").exists() and not list(tmp_path.glob(".hf.bertpipe-partial-*"))


def test_an_export_is_readable_as_the_umask_allows_and_has_one_writer(run, tmp_path):
    import stat

    from pipeline.output_lock import OutputLock

    umask = os.umask(0)
    os.umask(umask)
    out = tmp_path / "hf"
    done = bertpipe("export", run, "--out", out)
    assert done.returncode == 0, done.stderr[-2000:]
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask  # mkdtemp's 0700 would hide it from other users
    assert {stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()} == {0o666 & ~umask}

    # A second export into the same --out while one is writing is refused, not interleaved.
    with OutputLock(out, "export", lock_file=tmp_path / ".hf.bertpipe.lock"):
        done = bertpipe("export", run, "--out", out)
    assert done.returncode == 2 and f"{out} is being written by `bertpipe export`" in done.stderr, done.stderr[-2000:]


def test_a_run_whose_export_cannot_be_written_says_how_to_export_it(run, tmp_path):
    from launch.export_dirs import resolve_checkpoint

    out = copy_run(run, tmp_path / "run")
    (out / "export").write_text("a file of the user's")
    with pytest.raises(ValueError, match=r"cannot write the export of .* run `bertpipe export .* --out DIR` with a "
                                         r"writable DIR and pass DIR instead"):
        resolve_checkpoint(out)
    assert (out / "export").read_text() == "a file of the user's"


@pytest.mark.slow
def test_resume_takes_a_rebuild_of_its_corpus_elsewhere_and_refuses_another_corpus(run, small_corpus, tmp_path):
    out = copy_run(run, tmp_path / "run")
    moved = Path(shutil.copytree(small_corpus, tmp_path / "moved"))
    manifest = json.loads((moved / "manifest.json").read_text())
    manifest["config"]["out"] = str(moved)  # all a byte-identical rebuild into another --out changes
    (moved / "manifest.json").write_text(json.dumps(manifest))
    done = bertpipe("pretrain", "--data", moved, "--out", out, "--nproc", "2", *TRAIN, "--resume")
    assert done.returncode == 0, done.stderr[-3000:]

    manifest["masked_lm_prob"] = 0.2  # another corpus: made with other settings
    (moved / "manifest.json").write_text(json.dumps(manifest))
    done = bertpipe("pretrain", "--data", moved, "--out", out, "--nproc", "2", *TRAIN, "--resume")
    assert done.returncode == 2, done.stderr[-3000:]
    assert f"--data {moved} is not the corpus this run was trained on ({small_corpus}:" in done.stderr
    # Checked on rank 0 for both, so said once, and both ranks leave the group (an exit with it open could
    # abort: exit 134 in place of 2)
    assert done.stderr.count("is not the corpus this run was trained on") == 1, done.stderr[-3000:]



def test_a_fresh_start_on_a_run_with_checkpoints_is_refused_once_for_both_ranks(run, small_corpus, tmp_path):
    out = copy_run(run, tmp_path / "run")
    done = bertpipe("pretrain", "--data", small_corpus, "--out", out, "--nproc", "2", *TRAIN)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.count("already has checkpoints; pass --resume to continue it") == 1, done.stderr[-3000:]

def test_runs_resolved_at_once_export_once_the_others_wait(run, tmp_path, caplog):
    # Sweep trials resolve the same run together: each exported it into RUN/export/<tag>, replacing files
    # under the others' feet. Now one holds the export's lock and the others wait for it.
    import logging
    import socket
    import subprocess
    import sys
    import threading

    from launch.export_dirs import export_lock_file, resolve_checkpoint

    out = copy_run(run, tmp_path / "run")
    target = out / "export" / "global_step8"
    target.parent.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    lock = export_lock_file(target)
    lock.write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname(), "command": "export", "since": "then"}))
    threading.Timer(3.0, lock.unlink).start()  # the other export finishes
    try:
        with caplog.at_level(logging.INFO, logger="launch.export_dirs"):
            assert resolve_checkpoint(out) == target
    finally:
        holder.kill()
        holder.wait()
    assert "waiting for the other export" in caplog.text and (target / "model.safetensors").is_file()
    assert not lock.exists()

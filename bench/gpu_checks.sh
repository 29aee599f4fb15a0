#!/usr/bin/env bash
# What a session with a lent GPU runs, in one call (docs/PERFORMANCE.md, "GPU correctness"):
#   1. the GPU fast paths against eager (tests/model/test_gpu_paths.py);
#   2. pre-training on CUDA as Kubernetes runs it (`python -m launch.pretrain.torchrun`, NCCL, bf16,
#      ZeRO-2): a user error exits 2; SIGTERM checkpoints and exits 143; --resume continues from there;
#   3. BERT-Large phase 2 (seq 512) against transformers: the preset, or each of VARIANTS (the bench's
#      flags; BENCH_ARGS: flags for all);
#   4. determinism on CUDA: a run killed and resumed gives the same losses, bit for bit, as one
#      uninterrupted run (bf16, ZeRO-2, varlen flash attention with dropout), with --deterministic and
#      without; and whether --deterministic changes the losses.
# PARTS (default "1 2 3 4") chooses the parts.
# Needs the DeepSpeed wheels in .whl and the corpora in .bench/large, built where Beam is (PERFORMANCE.md).
# Each part has its own time limit, so that one that hangs still leaves the others' results.
set -u
cd "$(dirname "$0")/.."
SITE=${SITE:-/tmp/site}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl || exit 1
export PYTHONPATH="$SITE:$PWD" PYTHONUNBUFFERED=1
CORPUS=.bench/large/seq128
WORK=$(mktemp -d)
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, deepspeed; print('torch', torch.__version__, 'deepspeed', deepspeed.__version__)"

part() { echo; echo "== $* ($(date +%T))"; }
expect() {  # expect CODE GOT WHAT
    if [ "$1" = "$2" ]; then echo "ok: $3 (exit $2)"; else echo "FAILED: $3: exit $2, expected $1"; fi
}

part1() {
    part "1. GPU fast paths"
    timeout 180 python3 -m pytest -q -p no:cacheprovider tests/model/test_gpu_paths.py 2>&1 | tail -n 4
}

part2() {
    part "2. pre-training on CUDA through launch.pretrain.torchrun"
    RUN=(python3 -m launch.pretrain.torchrun --standalone --nproc-per-node 1 --module launch.pretrain --config tiny
         --precision.dtype bf16 --zero.stage 2 --log.eval-every 0)
    timeout 120 "${RUN[@]}" --data "$WORK/no-corpus" --out "$WORK/x" >"$WORK/err.log" 2>&1
    expect 2 $? "a missing corpus is a user error"
    grep -m1 "has no manifest.json" "$WORK/err.log"
    timeout 300 "${RUN[@]}" --data "$CORPUS" --out "$WORK/run" --max-steps 100000 --save-every 0 >"$WORK/stop.log" 2>&1 &
    pid=$!
    for _ in $(seq 120); do  # until 20 steps are logged
        [ -f "$WORK/run/metrics.jsonl" ] && [ "$(wc -l <"$WORK/run/metrics.jsonl")" -ge 20 ] && break
        sleep 1
    done
    kill -TERM $pid
    wait $pid
    expect 143 $? "SIGTERM: a checkpoint, then 128 + 15"
    grep -E "stopped|checkpoint|GPU" "$WORK/stop.log" | tail -n 4
    STEP=$(tail -n 1 "$WORK/run/metrics.jsonl" | python3 -c "import json, sys; print(json.load(sys.stdin)['step'])")
    timeout 300 "${RUN[@]}" --data "$CORPUS" --out "$WORK/run" --resume --max-steps $((STEP + 20)) >"$WORK/resume.log" 2>&1
    expect 0 $? "--resume from step $STEP to $((STEP + 20))"
    grep -E "resum|from step" "$WORK/resume.log" | head -n 2
    tail -n 1 "$WORK/run/metrics.jsonl"
    grep -iE "traceback|warn" "$WORK"/*.log | grep -v "follows its own settings" && echo "FAILED: see the lines above"
    [ -n "${OUT:-}" ] && cp "$WORK"/*.log "$OUT"/ 2>/dev/null
}

part3() {
    part "3. BERT-Large phase 2 (seq 512) vs transformers"
    B=(python3 bench/pretrain_gpu.py --corpus-dir .bench/large --phases 512 --accumulation 4 --steps 6 ${BENCH_ARGS:-})
    # Each variant: the bench's flags, comma-separated ("preset": none); the table rows come first, then
    # the split and profile.
    for variant in ${VARIANTS:-preset}; do
        flags=${variant//,/ }
        [ "$variant" = preset ] && flags=
        name=$(echo "$variant" | tr -c 'a-z0-9\n' '-')
        timeout 200 "${B[@]}" $flags >"$WORK/bench512-$name.log" 2>&1
        echo "$variant: exit $?"; grep -E "^device|^ *512 |split" "$WORK/bench512-$name.log"
    done
    [ -n "${OUT:-}" ] && cp "$WORK"/bench512-*.log "$OUT"/
}

part4() {
    part "4. determinism on CUDA: reruns and a resume"
    D=(python3 -m launch.pretrain.torchrun --standalone --nproc-per-node 1 --module launch.pretrain --config tiny
       --data "$CORPUS" --precision.dtype bf16 --zero.stage 2 --log.eval-every 0 --log.tensorboard false
       --model.fields varlen_dropout=true hidden_dropout_prob=0.1 attention_probs_dropout_prob=0.1
       --max-steps 200 --save-every 100)
    for mode in det free; do
        flag=; [ $mode = det ] && flag=--deterministic
        local t0=$SECONDS
        timeout 150 "${D[@]}" $flag --out "$WORK/$mode-a" >"$WORK/$mode-a.log" 2>&1
        expect 0 $? "$mode: 200 steps uninterrupted in $((SECONDS - t0)) s"
        # The other run: torchrun killed (SIGKILL) once step 110 is logged, past the checkpoint at 100; its
        # worker dies with it (it used to train on as an orphan, in a session of its own, to the end).
        "${D[@]}" $flag --out "$WORK/$mode-b" >"$WORK/$mode-b.log" 2>&1 &
        pid=$!
        for _ in $(seq 1200); do
            [ -f "$WORK/$mode-b/metrics.jsonl" ] && [ "$(wc -l <"$WORK/$mode-b/metrics.jsonl")" -ge 110 ] && break
            sleep 0.1
        done
        kill -KILL $pid
        wait $pid
        sleep 2
        echo "$mode: killed after step $(wc -l <"$WORK/$mode-b/metrics.jsonl"), latest $(cat "$WORK/$mode-b/checkpoints/latest")"
        pgrep -f "$WORK/$mode-b" >/dev/null && echo "FAILED: a worker outlived its killed torchrun"
        timeout 150 "${D[@]}" $flag --out "$WORK/$mode-b" --resume >"$WORK/$mode-b-resume.log" 2>&1
        expect 0 $? "$mode: --resume from step $(grep -o 'resumed from global_step[0-9]*' "$WORK/$mode-b-resume.log") to 200"
    done
    python3 - "$WORK" <<'PY'
import json, sys
from pathlib import Path
def losses(run):
    path = Path(sys.argv[1]) / run / "metrics.jsonl"
    if not path.is_file():
        return {}
    return {r["step"]: r["loss"] for r in map(json.loads, path.read_text().splitlines()) if "loss" in r}
for a, b, what in [("det-a", "det-b", "--deterministic: uninterrupted vs killed past 110, resumed from 100"),
                   ("free-a", "free-b", "without --deterministic: the same"),
                   ("det-a", "free-a", "uninterrupted, with vs without --deterministic")]:
    x, y = losses(a), losses(b)
    steps = sorted(set(x) & set(y))
    differ = [s for s in steps if x[s] != y[s]]
    worst = max((abs(x[s] - y[s]) / abs(x[s]) for s in steps), default=float("nan"))
    print(f"{what}: {len(steps)} steps in common, {len(differ)} differ (first {differ[:1]}), max rel diff {worst:.2e}")
    if steps:
        print(f"  step {steps[-1]}: {x[steps[-1]]!r} vs {y[steps[-1]]!r}")
PY
    grep -hiE "traceback|error|warn" "$WORK"/det-*.log "$WORK"/free-*.log | grep -v "follows its own settings" | sort | uniq -c | head -n 8
    [ -n "${OUT:-}" ] && cp "$WORK"/det-*.log "$WORK"/free-*.log "$OUT"/ 2>/dev/null
}

for n in ${PARTS:-1 2 3 4}; do "part$n"; done
part "done"

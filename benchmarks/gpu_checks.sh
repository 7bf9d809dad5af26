#!/usr/bin/env bash
# The GPU checks in one go on one CUDA machine, each record written to OUT_DIR as soon as it is measured, so a run
# cut short keeps what it finished. Steps (all by default, in this order):
#   tests     `pytest -m gpu`: the step and fine-tuning on CUDA, the fused head against full logits, attention leak
#             tests on every kernel the GPU offers;
#   finetune  fine-tuning throughput (210m, tweets, batch 32, 512 tokens, 100 steps) from one checkpoint, each case
#             twice in its own process (run 0 cold, as a fan-out trial's first steps are; run 1 warm): ours (CUDA
#             batch widths rounded to 64), ours with compiled blocks, transformers' Trainer, and ours padded per
#             batch to the longest;
#   mfu       the 610m step at 2,048 tokens (compiled, micro-batch 16), MLM and CLM, with its top kernels: the LM
#             head's fused cross-entropy as the step calls it, and with liger-kernel's defaults;
#   profile   one trial of ours under torch.profiler: the operators that take the host's and the device's time;
#   sweep     `sweeps/gpu.yaml` end to end on Ray in a fresh results folder (its console in sweep.log), then the
#             plain loop's 210m step at the sweep's shape (micro-batch 8, compiled, both objectives) on the same
#             machine, then the record of the two (`benchmarks/gpu_sweep_record.py`: gpu-sweep.json). Not in the
#             default steps: about 5 minutes on an H100, the shards prepared beforehand with
#             `python -m raybiphase prepare sweeps/gpu.yaml`.
# Needs the repository's dependencies (with the GPU image's torch) and `bench_train_gpu.py prepare` done once, on
# any machine (DATA_DIR, default .gpu/bench); fine-tuning reads the task data from the asset cache
# (`python -m raybiphase assets fetch`).
#   DATA_DIR=.gpu/bench bash benchmarks/gpu_checks.sh OUT_DIR [STEP...]
set -uo pipefail
out=${1:?usage: gpu_checks.sh OUT_DIR [tests] [finetune] [mfu] [profile] [sweep]}
shift
steps=${*:-tests finetune mfu profile}
data=${DATA_DIR:-.gpu/bench}
py=${PYTHON:-python3}
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ckpt=$work/hf  # one checkpoint for every fine-tuning run
failed=()

step() {  # step NAME COMMAND...: run it, say how it ended and how long it took; a failure is named at the end
    local name=$1 began=$SECONDS status
    shift
    echo "== $name: $*"
    "$@"
    status=$?
    echo "== $name: exit $status after $((SECONDS - began)) s"
    if [ "$status" != 0 ]; then failed+=("$name"); fi
}

finetune() {  # finetune NAME [OPTION...]: one case, ours or the Trainer's side twice in one process
    local name=$1 side=ours
    shift
    if [ "$name" = trainer ]; then side=trainer; fi
    step "finetune-$name" "$py" benchmarks/bench_finetune_gpu.py --data "$data" --hf-dir "$ckpt" \
        --sides "$side" "$side" --json "$out/ft-$name.json" "$@"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
for s in $steps; do
    case $s in
        tests) step gpu-tests "$py" -m pytest -m gpu -n 0 -p no:cacheprovider -q tests/pretrain/test_gpu.py \
                   tests/finetune/test_finetune.py ;;
        finetune) finetune bucketed; finetune compiled --compile; finetune trainer
                  finetune per-batch --pad-multiple 1 ;;
        mfu) step mfu-610m "$py" benchmarks/bench_train_gpu.py run --data "$data" --sizes 610m --modes plain \
                 --micro 16 --accum 1 --variants compile --steps 6 --objectives mlm clm --heads ours liger-defaults \
                 --profile --json "$out/mfu-610m.json" ;;
        sweep) step sweep bash -c "set -o pipefail; '$py' -m raybiphase.sweep sweeps/gpu.yaml \
                   --set sweep.storage='$work/results' 2>&1 | tee '$out/sweep.log'"  # a fresh folder: nothing resumed
               step plain-210m "$py" benchmarks/bench_train_gpu.py run --data "$data" --sizes 210m --modes plain \
                   --micro 8 --accum 1 --variants compile --steps 20 --objectives clm mlm --json "$out/plain-210m.json"
               step sweep-record "$py" benchmarks/gpu_sweep_record.py "$work/results/gpu" --log "$out/sweep.log" \
                   --plain "$out/plain-210m.json" --out "$out/gpu-sweep.json" ;;
        profile) step finetune-profile "$py" benchmarks/bench_finetune_gpu.py --data "$data" --hf-dir "$ckpt" \
                     --sides ours --profile ;;
        *) echo "gpu_checks.sh: unknown step '$s' (tests, finetune, mfu, profile, sweep)" >&2; exit 2 ;;
    esac
done
if [ ${#failed[@]} -gt 0 ]; then
    echo "gpu_checks.sh: failed: ${failed[*]}" >&2
    exit 1
fi

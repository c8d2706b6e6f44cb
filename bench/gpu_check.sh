#!/usr/bin/env bash
# The accelerator measurements of "Training speed on accelerators", as one script for one GPU.
#
#   OUT=/tmp/gpu-check bash bench/gpu_check.sh                        # every row, in this order
#   OUT=/tmp/gpu-check bash bench/gpu_check.sh llama_1_4b llama_600m  # some rows
#
# Rows; each is one command under its own timeout:
#   env         versions and devices (python, jax, torch, transformers)
#   llama_1_4b  bench/mfu.py: experiments.llama.llama_1_4b (1.43B), batch 8 x 2048, with the PyTorch peer;
#               no eval or final checkpoint, as in the run where the abort at exit was seen
#   llama_600m  llama_600m, batch 16 x 2048, with the peer
#   llama_150m  llama_150m, batch 16 x 2048, with the peer, an eval and a final checkpoint (a run's whole end)
#   moe         moe_1_4b_a600m (llama_600m's attention and FLOPs per token; 8 experts, 2 active),
#               batch 16 x 2048, ours only (the Mixtral peer: MOE_PEER=1)
#   tutorial    experiments/tutorials/train_tiny_model.py (offline): wall time of its training step,
#               compilation included, and of its first step
#   tiny        bench/mfu.py --tiny on CPU (not run by default): checks this script's plumbing anywhere
#
# Output: $OUT/results.jsonl gets one JSON line per row: bench/mfu.py's last line (the peer's figures
# and the ratio ours / peer included) plus "row", "rc" (exit status), "terminate_called" (whether
# stderr holds the abort-at-exit message), "wall_s" and "timeout_s". $OUT/<row>.log holds the row's
# stdout and stderr. GPU_CHECK_BUDGET_S (default 570) bounds the whole script: each row's timeout is
# cut to the time left, and a row left with under 60 s is recorded as skipped, not run. A peer that
# outruns its own --peer-timeout is recorded as such (peer.error) and our side still runs.
# PYTHON (default python3) is the interpreter; the repository's packages are put on PYTHONPATH.
set -u

: "${OUT:?set OUT to the folder that receives results.jsonl and the logs}"
mkdir -p "$OUT"
PY=${PYTHON:-python3}
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
export PYTHONPATH="$REPO:$REPO/lib/rigging/src:$REPO/lib/haliax/src:$REPO/lib/fray/src:$REPO/lib/iris/src:$REPO/lib/zephyr/src:$REPO/lib/levanter/src:$REPO/lib/marin/src${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
RESULTS="$OUT/results.jsonl"
BUDGET_S=${GPU_CHECK_BUDGET_S:-570}
STARTED=$(date +%s)
SCRATCH=$(mktemp -d)
trap 'rm -rf "$SCRATCH"' EXIT

# record ROW RC WALL_S TIMEOUT_S STDOUT_FILE LOG_FILE: append the row's JSON line.
record() {
    "$PY" - "$@" >>"$RESULTS" <<'PY'
import json, sys
row, rc, wall, timeout, stdout, log = sys.argv[1:7]
lines = [l for l in open(stdout, errors="replace").read().splitlines() if l.startswith("{")]
try:
    line = json.loads(lines[-1]) if lines else {}
except ValueError:
    line = {"unparsed": lines[-1][:2000]}
text = open(log, errors="replace").read()
print(json.dumps({"row": row, "rc": int(rc), "terminate_called": "terminate called" in text,
                  "wall_s": float(wall), "timeout_s": int(timeout), **line}))
PY
}

# run ROW TIMEOUT_S COMMAND...: run under the timeout (cut to the budget left), log, record.
run() {
    local row=$1 limit=$2; shift 2
    local left=$((BUDGET_S - ($(date +%s) - STARTED)))
    if ((left < limit)); then limit=$left; fi
    if ((limit < 60)); then
        echo "{\"row\": \"$row\", \"skipped\": \"only ${left}s of GPU_CHECK_BUDGET_S=$BUDGET_S left\"}" >>"$RESULTS"
        return
    fi
    local log="$OUT/$row.log" stdout="$SCRATCH/$row.out" start end rc
    echo "== $row (timeout ${limit}s): $*" | tee "$log"
    start=$(date +%s.%N)
    timeout -k 15 "$limit" "$@" >"$stdout" 2>>"$log"
    rc=$?
    end=$(date +%s.%N)
    cat "$stdout" >>"$log"
    record "$row" "$rc" "$("$PY" -c "print(round($end - $start, 1))")" "$limit" "$stdout" "$log"
    tail -n 1 "$RESULTS"
}

row_env() {
    run env 120 "$PY" -c '
import json, platform, jax
info = {"python": platform.python_version(), "jax": jax.__version__,
        "devices": [d.device_kind for d in jax.devices()], "platform": jax.devices()[0].platform}
try:
    import torch, transformers
    info.update(torch=torch.__version__, transformers=transformers.__version__,
                torch_device=torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")
except ImportError as e:
    info["torch"] = f"not importable: {e}"
import levanter.trainer, levanter.data, marin.execution.step_runner  # the repository imports here
print(json.dumps(info))'
}

row_tutorial() {
    local prefix
    prefix=$(mktemp -d "$SCRATCH/tutorial-XXXX")
    export MARIN_PREFIX=$prefix
    run tutorial 300 "$PY" experiments/tutorials/train_tiny_model.py
    unset MARIN_PREFIX
    # Replace the row's line by one with the timings read from its log and metrics.
    local base
    base=$(tail -n 1 "$RESULTS")
    "$PY" - "$prefix" "$OUT/tutorial.log" "$base" >"$SCRATCH/tutorial.json" <<'PY'
import glob, json, re, sys
prefix, log, base = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
text = open(log, errors="replace").read()
step = re.search(r"Step checkpoints/marin-nano-tinystories finished in ([0-9.]+)s", text)
base["train_step_s"] = float(step.group(1)) if step else None
rows = []
for path in glob.glob(f"{prefix}/checkpoints/marin-nano-tinystories-*/metrics.jsonl"):
    rows = [r for r in map(json.loads, open(path)) if "loss" in r]
if rows:
    base.update(first_step_s=round(rows[0]["wall_time"], 2), train_loop_s=round(rows[-1]["wall_time"], 2),
                steps=rows[-1]["step"], final_loss=rows[-1]["loss"], mfu_last_step=rows[-1].get("mfu"))
    if len(rows) > 1:
        tokens = rows[-1]["tokens"] - rows[0]["tokens"]
        base["tokens_per_s_after_first_step"] = round(tokens / (rows[-1]["wall_time"] - rows[0]["wall_time"]), 1)
print(json.dumps(base))
PY
    if [[ -s "$SCRATCH/tutorial.json" ]]; then
        sed -i '$ d' "$RESULTS" && cat "$SCRATCH/tutorial.json" >>"$RESULTS"
        tail -n 1 "$RESULTS"
    fi
}

MFU=("$PY" bench/mfu.py --steps 10 --warmup-steps 3)
rows=("$@")
((${#rows[@]})) || rows=(env llama_1_4b llama_600m llama_150m moe tutorial)
for row in "${rows[@]}"; do
    case $row in
        env) row_env ;;
        llama_1_4b) run llama_1_4b 330 "${MFU[@]}" --model llama_1_4b --batch 8 --seq-len 2048 --eval-batches 0 --no-checkpoint --peer-timeout 180 ;;
        llama_600m) run llama_600m 300 "${MFU[@]}" --model llama_600m --batch 16 --seq-len 2048 --eval-batches 0 --no-checkpoint --peer-timeout 160 ;;
        llama_150m) run llama_150m 200 "${MFU[@]}" --model llama_150m --batch 16 --seq-len 2048 --peer-timeout 100 ;;
        moe)
            peer=--no-peer
            [[ ${MOE_PEER:-0} == 1 ]] && peer=--peer
            run moe 240 "${MFU[@]}" --model moe_1_4b_a600m --batch 16 --seq-len 2048 --eval-batches 0 --no-checkpoint --peer-timeout 110 $peer ;;
        tutorial) row_tutorial ;;
        tiny) run tiny 120 "$PY" bench/mfu.py --tiny ;;
        *) echo "{\"row\": \"$row\", \"skipped\": \"unknown row\"}" >>"$RESULTS" ;;
    esac
done
echo "results: $RESULTS"

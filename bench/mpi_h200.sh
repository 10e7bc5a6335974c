#!/usr/bin/env bash
# Data-parallel training on the H200 (docs/DISTRIBUTED.md): two MPI ranks sharing the one GPU
# against one process on the same global batch, for SmolLM2-135M (train --model DIR), the
# Fashion-MNIST CNN and ResNet-50 (train --model resnet50 on Fashion-MNIST written as a 64 px
# image folder by `meganeura fashion-folder`, global batch 256). For each workload it runs
#   alone           meganeura train               (add_training's single program)
#   np1             mpirun -np 1 meganeura train  (gradient and update programs, host-staged
#                                                  gradients, a sum over one rank; one rank never
#                                                  cuts the gradient program into segments)
#   np2             mpirun -np 2 meganeura train  (two ranks on the one GPU, each bucket's sum
#                                                  started while backward runs the later segments)
#   np2-no-overlap  the same with MEGANEURA_OVERLAP_REDUCTION=0 (every sum after backward)
# and prints per run the step time, where a distributed step's time goes (gradient program,
# staging + sum across ranks after it, update program, from metrics.jsonl), the gradient
# program's segments, the buckets whose sum started during backward and the largest relative loss
# difference from `alone`. ResNet-50's batch norm normalises each rank's share alone (as DDP
# without SyncBatchNorm), so its two-rank runs are compared instead with one more run,
# resnet50-alone-acc2 (--batch 128 --accumulate 2: the same two shares, each normalised alone, one
# update), whose two losses a step average to the two ranks' loss. RUNS (default "alone np1 np2
# np2-no-overlap") picks the runs; RESNET_STEPS (default 30) ResNet-50's steps.
# Results go to $OUT (default /tmp/mpi-h200): one folder a run, its log, and summary.md.
#
# Needs: the binary built with MPI ($MEGANEURA, default .dev/bin/meganeura, plain or gzip'd) and
# Open MPI's mpirun, the machine's own where it has one (the H200 image has). Where it has none,
# put the debs of openmpi-bin, openmpi-common, libopenmpi3 and those of their dependencies the
# machine lacks in .dev/debs (on a Debian 12 machine: apt-get download openmpi-bin openmpi-common
# libopenmpi3 libhwloc15 libnuma1 libpciaccess0 libxnvctrl0 libevent-core-2.1-7
# libevent-pthreads-2.1-7 libpmix2 libfabric1 libucx0 libibverbs1 librdmacm1 libpsm2-2
# libpsm-infinipath1 libmunge2 libnl-3-200 libnl-route-3-200; `apt-cache depends --recurse
# openmpi-bin libopenmpi3` lists them all); they are unpacked beside the system's, not over it.
# SmolLM2-135M is made at its exact configuration with random weights by transformers (as
# bench/llama_parity_h200.py does) unless $SMOLLM2_DIR names a folder. Fashion-MNIST's idx files
# are read from $FASHION_DIR (default .dev/data). The whole script is sized to finish within ten
# minutes. Run from the repository root: OUT=$OUT bash bench/mpi_h200.sh
set -u
OUT=${OUT:-/tmp/mpi-h200}
BIN=${MEGANEURA:-.dev/bin/meganeura}
mkdir -p "$OUT"
if [ -d .gl ]; then for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig; fi
if [ -d .dev/debs ]; then
  mkdir -p /tmp/mglib && for f in .dev/debs/*.deb; do dpkg -x "$f" /tmp/mglib; done
  export LD_LIBRARY_PATH=/tmp/mglib/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
[ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ] &&
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export MEGANEURA_CACHE_DIR=/tmp/meganeura-cache PYTHONUNBUFFERED=1
[ -f "$BIN.gz" ] && gunzip -f "$BIN.gz"
chmod +x "$BIN"
if command -v mpirun > /dev/null; then
  # The machine's own Open MPI: its mpirun, plugins and libraries together, and the binary's
  # libmpi.so.40 from the same installation (Open MPI 4 and 5 keep that soname); one unpacked
  # beside it would mix two versions' libraries in one process.
  mpi_lib=$(dirname "$(dirname "$(readlink -f "$(command -v mpirun)")")")/lib
  ldconfig -p | grep -q libmpi.so.40 || export LD_LIBRARY_PATH=$mpi_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
elif [ -e /tmp/mglib/usr/bin/mpirun.openmpi ]; then
  # Open MPI finds its plugins and help files under the prefix it was unpacked to; the debs'
  # /usr/bin/mpirun is an alternatives link that points outside it.
  ln -sf mpirun.openmpi /tmp/mglib/usr/bin/mpirun
  export PATH=/tmp/mglib/usr/bin:$PATH OPAL_PREFIX=/tmp/mglib/usr
else
  echo "mpirun not found: install openmpi-bin or put its debs in .dev/debs (see the header)"
  exit 1
fi
echo "mpirun: $(command -v mpirun): $(mpirun --version 2>&1 | head -1)"
MPIRUN="mpirun --oversubscribe --allow-run-as-root --bind-to none"

# SmolLM2-135M and text to train it on.
SMOLLM2=${SMOLLM2_DIR:-$OUT/smollm2-135m}
if [ ! -f "$SMOLLM2/config.json" ]; then
  python3 bench/smollm2_folder.py "$SMOLLM2" tests/fixtures/tokenizer/smollm2_like/tokenizer.json
fi
python3 - "$OUT/text.jsonl" <<'EOF'
import json, random, sys
random.seed(0)
words = "the a dragonfly river stone light flew over under quietly seven green morning".split()
with open(sys.argv[1], "w") as f:
    for i in range(6000):
        f.write(json.dumps({"text": " ".join(random.choice(words) for _ in range(24))}) + "\n")
EOF

# Fashion-MNIST at 64 px as an image folder for ResNet-50: 4096 training images, 16 batches of 256.
FASHION64=$OUT/fashion64
[ -d "$FASHION64/train" ] ||
  "$BIN" fashion-folder "$FASHION64" --size 64 --data "${FASHION_DIR:-.dev/data}" --limit 4096
RESNET_STEPS=${RESNET_STEPS:-30}
RESNET=(--model resnet50 --data "$FASHION64/train" --validation 0 --size 64 --workers 8
  --log-every 1 --checkpoint-every 100000)

# run NAME LAUNCHER ARGUMENTS...: one training run into $OUT/NAME, within two minutes and within
# what is left of BUDGET seconds (default 560) since the script started, so that the summary is
# written inside one ten-minute call whatever hangs.
run() {
  local name=$1 launcher=$2 left=$((${BUDGET:-560} - SECONDS))
  shift 2
  rm -rf "${OUT:?}/$name"
  echo "== $name"
  if [ "$left" -lt 20 ]; then echo "skipped: the time budget is spent"; return; fi
  timeout $((left < 120 ? left : 120)) $launcher "$BIN" train "$@" --out "$OUT/$name" > "$OUT/$name.log" 2>&1
  echo "exit $?"; tail -2 "$OUT/$name.log"
}
for launcher in ${RUNS:-alone np1 np2 np2-no-overlap}; do
  case $launcher in
    alone) prefix="" ;;
    np1) prefix="$MPIRUN -np 1" ;;
    np2) prefix="$MPIRUN -np 2 -x MEGANEURA_OVERLAP_REDUCTION=1" ;;
    np2-no-overlap) prefix="$MPIRUN -np 2 -x MEGANEURA_OVERLAP_REDUCTION=0" ;;
    *) echo "unknown run $launcher (RUNS takes alone np1 np2 np2-no-overlap)"; exit 1 ;;
  esac
  run "smollm2-$launcher" "$prefix" --model "$SMOLLM2" --data "$OUT/text.jsonl" --seq 128 \
    --batch 8 --max-steps 40 --validation 0 --lr 1e-4 --log-every 1 --checkpoint-every 100000
  run "fashion-cnn-$launcher" "$prefix" --model cnn --data "${FASHION_DIR:-.dev/data}" --batch 64 \
    --max-steps 300 --log-every 1 --checkpoint-every 100000
  run "resnet50-$launcher" "$prefix" "${RESNET[@]}" --batch 256 --max-steps "$RESNET_STEPS"
done
run resnet50-alone-acc2 "" "${RESNET[@]}" --batch 128 --accumulate 2 \
  --max-steps $((2 * RESNET_STEPS))

python3 - "$OUT" <<'EOF' | tee "$OUT/summary.md"
import json, os, sys
out = sys.argv[1]
launchers = (("alone", 1, "-"), ("np1", 1, "-"), ("np2", 2, "yes"), ("np2-no-overlap", 2, "no"))
print("| workload | run | ranks | overlap | step ms | gradient program ms | staging + sum after it ms | update program ms | segments | sums during backward | max rel. loss diff vs alone |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
def losses(workload, launcher):
    path = os.path.join(out, f"{workload}-{launcher}", "metrics.jsonl")
    if not os.path.exists(path):
        return None
    return [json.loads(line) for line in open(path) if '"loss"' in line]
for workload, rate, per_step in (("smollm2", "tokens_per_second", 8 * 128), ("fashion-cnn", "images_per_second", 64), ("resnet50", "images_per_second", 256)):
    runs = {launcher: losses(workload, launcher) for launcher, _, _ in launchers}
    runs = {launcher: records for launcher, records in runs.items() if records}
    # ResNet-50 on two ranks against one process accumulating the two shares.
    accumulated = losses(workload, "alone-acc2") if workload == "resnet50" else None
    if accumulated:
        by_step = {r["step"]: r["loss"] for r in accumulated}
        pairs = {s // 2: (by_step[s - 1] + by_step[s]) / 2 for s in by_step if s % 2 == 0 and s - 1 in by_step}
    for launcher, ranks, overlap in launchers:
        records = runs.get(launcher)
        if not records:
            continue
        steady = records[5:] or records  # past the first steps (pipeline and cache warm-up)
        # The rates are means since the run's start: the seconds since then at each record give
        # the mean step time between the first steady record and the last.
        elapsed = lambda r: r["step"] * per_step / r[rate]
        first, last = steady[0], records[-1]
        step_ms = 1000.0 * (elapsed(last) - elapsed(first)) / (last["step"] - first["step"]) if last["step"] > first["step"] else 1000.0 * elapsed(last) / last["step"]
        mean = lambda key: sum(r.get(key, 0.0) for r in steady) / len(steady)
        keys = ("gradients_ms", "reduction_ms", "update_ms", "segments", "sums_during_backward")
        parts = [("%.2f" % mean(k) if k.endswith("_ms") else "%g" % mean(k)) if k in steady[0] else "-" for k in keys]
        diff = "-"
        reference = None
        if ranks == 2 and workload == "resnet50":
            reference = pairs if accumulated else None
        elif launcher != "alone" and "alone" in runs:
            reference = {r["step"]: r["loss"] for r in runs["alone"]}
        if reference:
            diff = "%.2e" % max(abs(r["loss"] - reference[r["step"]]) / abs(reference[r["step"]]) for r in records if r["step"] in reference)
            if ranks == 2 and workload == "resnet50":
                diff += " (vs alone-acc2)"
        print(f"| {workload} | {launcher} | {ranks} | {overlap} | {step_ms:.2f} | {' | '.join(parts)} | {diff} |")
EOF

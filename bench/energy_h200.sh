#!/usr/bin/env bash
# Calibrates the roofline report's power model (docs/ROOFLINE.md) on the H200 against the board
# power nvidia-smi reads:
#   board power = static_watts + joules_per_flop x FLOP/s + joules_per_byte x bytes/s
# It samples the power with nothing running (static power), then while each workload below runs
# for $SECONDS_EACH seconds (`meganeura inspect --roofline --repeat-seconds`, which prints the
# runs, seconds, FLOPs and bytes a run), averages each workload's power over its steady part
# (the first 2 s left out), fits the three coefficients by non-negative least squares and writes
# them to the file the binary reads for that device (energy-<device hash>.json in the kernel
# cache folder, printed by inspect). It prints the measured and the predicted power of each
# workload and the fit's coefficients; everything goes to $OUT (default /tmp/energy-h200):
# power-<name>.csv, run-<name>.json, fit.json and summary.md.
#
# Needs: the binary ($MEGANEURA, default .dev/bin/meganeura, plain or gzip'd), nvidia-smi,
# python3 with numpy. $GPU picks the nvidia-smi index (default 0). Run from the repository root:
#   OUT=/tmp/energy-h200 bash bench/energy_h200.sh
set -u
OUT=${OUT:-/tmp/energy-h200}
BIN=${MEGANEURA:-.dev/bin/meganeura}
GPU=${GPU:-0}
SECONDS_EACH=${SECONDS_EACH:-20}
[ -f "$BIN.gz" ] && gunzip -f "$BIN.gz"
chmod +x "$BIN"
mkdir -p "$OUT"

# name and inspect arguments: products and convolutions (compute), wide MLPs at small and large
# batch (bytes), training and inference.
WORKLOADS=(
  "cnn-train-512|--model cnn --mode train --batch 512"
  "cnn-infer-4096|--model cnn --mode infer --batch 4096"
  "mlp-train-8192|--model mlp --mode train --batch 8192"
  "mlp-infer-65536|--model mlp --mode infer --batch 65536"
  "cnn-train-64|--model cnn --mode train --batch 64"
  "mlp-train-256|--model mlp --mode train --batch 256"
)

sample_power() {  # $1: file; runs until killed
  exec nvidia-smi -i "$GPU" --query-gpu=timestamp,power.draw --format=csv,noheader,nounits \
    -lms 100 >"$1"
}

# Static power: nothing of ours running.
sample_power "$OUT/power-idle.csv" &
SAMPLER=$!
sleep "$SECONDS_EACH"
kill "$SAMPLER"
wait "$SAMPLER" 2>/dev/null
echo "{\"runs\": 0, \"seconds\": $SECONDS_EACH, \"flops_per_run\": 0, \"bytes_per_run\": 0}" \
  >"$OUT/run-idle.json"

for entry in "${WORKLOADS[@]}"; do
  name=${entry%%|*}
  arguments=${entry#*|}
  echo "== $name: meganeura inspect $arguments --roofline --repeat-seconds $SECONDS_EACH"
  # Build, cache the device's peaks and warm the kernel cache first, outside the sampled window.
  # shellcheck disable=SC2086
  "$BIN" inspect $arguments --roofline --repeat-seconds 1 >/dev/null || exit 1
  sample_power "$OUT/power-$name.csv" &
  SAMPLER=$!
  # shellcheck disable=SC2086
  "$BIN" inspect $arguments --roofline --repeat-seconds "$SECONDS_EACH" >"$OUT/run-$name.json"
  status=$?
  kill "$SAMPLER"
  wait "$SAMPLER" 2>/dev/null
  [ $status -eq 0 ] || { echo "$name failed"; exit 1; }
  cat "$OUT/run-$name.json"
done

python3 - "$OUT" <<'PY'
import csv, glob, json, os, sys
import numpy as np

out = sys.argv[1]
rows = []
model_path = None
for run_path in sorted(glob.glob(os.path.join(out, "run-*.json"))):
    name = os.path.basename(run_path)[4:-5]
    run = json.load(open(run_path))
    model_path = run.get("energy_model_path") or model_path
    watts = []
    with open(os.path.join(out, f"power-{name}.csv")) as f:
        for record in csv.reader(f):
            try:
                watts.append(float(record[1]))
            except (IndexError, ValueError):
                pass
    steady = watts[20:] if len(watts) > 40 else watts  # samples every 100 ms: skip 2 s
    if not steady:
        sys.exit(f"no power samples for {name}")
    seconds = run["seconds"]
    rows.append({
        "name": name,
        "watts": float(np.mean(steady)),
        "flops_per_second": run["runs"] * run["flops_per_run"] / seconds,
        "bytes_per_second": run["runs"] * run["bytes_per_run"] / seconds,
    })

design = np.array([[1.0, r["flops_per_second"], r["bytes_per_second"]] for r in rows])
power = np.array([r["watts"] for r in rows])
# Columns scaled to one another before solving; coefficients must not be negative: a column
# whose coefficient comes out negative is dropped and the rest refitted.
scale = np.maximum(np.abs(design).max(axis=0), 1e-30)
active = [0, 1, 2]
while True:
    solution, *_ = np.linalg.lstsq(design[:, active] / scale[active], power, rcond=None)
    coefficients = np.zeros(3)
    coefficients[active] = solution / scale[active]
    negative = [i for i in active if coefficients[i] < 0]
    if not negative:
        break
    active.remove(negative[0])
fit = {"static_watts": coefficients[0], "joules_per_flop": coefficients[1],
       "joules_per_byte": coefficients[2], "workloads": rows}
json.dump(fit, open(os.path.join(out, "fit.json"), "w"), indent=2)
lines = ["| workload | FLOP/s | B/s | measured W | predicted W |", "|---|---|---|---|---|"]
for r, row in zip(rows, design):
    lines.append(f"| {r['name']} | {r['flops_per_second']:.3g} | {r['bytes_per_second']:.3g} | "
                 f"{r['watts']:.1f} | {float(row @ coefficients):.1f} |")
lines.append("")
lines.append(f"static {coefficients[0]:.1f} W, {coefficients[1] * 1e12:.3f} pJ/FLOP, "
             f"{coefficients[2] * 1e12:.3f} pJ/byte")
open(os.path.join(out, "summary.md"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
if model_path:
    os.makedirs(os.path.dirname(model_path), exist_ok=True)
    json.dump({k: fit[k] for k in ("static_watts", "joules_per_flop", "joules_per_byte")},
              open(model_path, "w"), indent=2)
    print(f"power model written to {model_path}")
PY

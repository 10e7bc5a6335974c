#!/usr/bin/env bash
# One device call on the H200 (see docs/BENCHMARKS.md): device listing, compile times, the GPU
# test suite, kernel benchmarks against PyTorch (and the convolutions on their implicit GEMMs),
# and the Fashion-MNIST job against PyTorch.
# Expects the Release binaries in .dev/bin (stripped, plain or gzip'd), the dataset in .dev/data
# and loader debs in .gl: the device README's list plus vulkan-validationlayers (several GPU tests
# ask for validation and fail without the layer).
set -u
for f in .gl/*.deb; do dpkg -x "$f" / ; done
ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export VK_LAYER_PATH=/usr/share/vulkan/explicit_layer.d
export MEGANEURA_CACHE_DIR=/tmp/meganeura-cache
export PYTHONUNBUFFERED=1
bin=.dev/bin
# The device tool carries at most 64 MiB: two stripped builds, test_gpu, the loader debs and the
# dataset fit only gzip'd (about 4 MiB a binary instead of 10), so *.gz there is unpacked first.
for packed in "$bin"/*.gz; do
  [ -e "$packed" ] || continue
  gunzip -f "$packed" && chmod +x "${packed%.gz}"
done
# The device tool returns at most 8 files from $OUT: everything is written to $out and packed
# into one archive there at the end (bench/h200.sh's last lines).
out=$(mktemp -d)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee "$out/gpu.txt"
$bin/meganeura devices --verbose 2>&1 | tee "$out/devices.txt"
$bin/meganeura devices --bench-compile 2>&1 | tee -a "$out/devices.txt"
if [ "${RUN_TESTS:-1}" = 1 ]; then
  # One process for the whole suite, as CI runs it: it also checks that the drivers stay loaded
  # across the suite's many device openings (before 1f2a72a the NVIDIA driver refused new
  # instances after about 26 of them). TEST_SHARDS=N runs it in N processes at once instead
  # (bench/gpu_tests.sh), spreading the driver's kernel compilation over the cores.
  if [ "${TEST_SHARDS:-1}" -gt 1 ]; then
    bash bench/gpu_tests.sh $bin/test_gpu "$out/test_gpu_shards" '*' "$TEST_SHARDS" \
      > "$out/test_gpu.txt" 2>&1
  else
    $bin/test_gpu > "$out/test_gpu.txt" 2>&1
  fi
  echo "test_gpu exit $?" >> "$out/test_gpu.txt"
  grep -E "tests ran|PASSED  \]|FAILED  \]|SKIPPED \]|gpu tests:|test_gpu exit" "$out/test_gpu.txt" | tail -12
  # Every registered op on this device against the reference (cooperative-matrix cases too).
  if [ -x "$bin/test_conformance" ]; then
    $bin/test_conformance > "$out/test_conformance.txt" 2>&1
    echo "test_conformance exit $?" >> "$out/test_conformance.txt"
    grep -E "tests ran|PASSED  \]|FAILED  \]|test_conformance exit" "$out/test_conformance.txt" | tail -6
  fi
fi
if [ "${RUN_KERNELS:-1}" = 1 ]; then
  # One process per case family, so that a failing family leaves the others' rows.
  # KERNEL_FILTER=TEXT reruns only the cases whose name contains TEXT.
  : > "$out/kernels_meganeura.jsonl"
  if [ -n "${KERNEL_FILTER:-}" ]; then families=("$KERNEL_FILTER"); else
    families=(copy gemm smollm pointwise "row sum" softmax resnet whisper unet); fi
  for family in "${families[@]}"; do
    $bin/meganeura bench kernels --filter "$family" >> "$out/kernels_meganeura.jsonl" 2>&1
  done
  python3 bench/kernels_pytorch.py --filter "${KERNEL_FILTER:-}" > "$out/kernels_pytorch.jsonl" 2>&1
  python3 bench/compare.py "$out/kernels_meganeura.jsonl" "$out/kernels_pytorch.jsonl" | tee "$out/kernels_table.txt"
  python3 bench/compare.py "$out/kernels_meganeura.jsonl" "$out/kernels_pytorch.jsonl" --markdown > "$out/kernels_table.md"
  # Where the attention and ResNet cases spend their time, kernel by kernel; the convolutions
  # again on their implicit GEMMs, against the im2col route of the table.
  if [ -z "${KERNEL_FILTER:-}" ]; then
    $bin/meganeura bench kernels --filter whisper --profile --runs 10 2>&1 | grep -v '^{' \
      | tee "$out/attention_profile.txt"
    $bin/meganeura bench kernels --filter resnet --no-fast --profile --runs 10 2>&1 \
      | grep -v '^{' > "$out/resnet_profile.txt"
    for family in resnet unet; do
      MEGANEURA_IM2COL=0 $bin/meganeura bench kernels --filter "$family" --runs 10 2>&1 | grep -v '^{'
    done | tee "$out/implicit_convolutions.txt"
  fi
fi
if [ "${RUN_TRAIN:-1}" = 1 ]; then
  $bin/meganeura train --data .dev/data --out "$out/run" --epochs "${EPOCHS:-3}" > "$out/train.txt" 2>&1
  grep -E "img/s|accuracy|built|device" "$out/train.txt" | tail -6
  # Timestamps around every dispatch serialise them, so the profile comes from its own short run.
  $bin/meganeura train --data .dev/data --out "$out/profiled" --epochs 1 --limit 6400 \
    --trace "$out/train_trace.json" > "$out/train_profiled.txt" 2>&1
  python3 bench/trace_top.py "$out/train_trace.json" 12
  $bin/meganeura infer "$out/run/checkpoint.safetensors" --data .dev/data 2>&1 | tail -3 | tee "$out/infer.txt"
  # The GPU time of one inference batch, comparable with PyTorch's forward-only figure.
  $bin/meganeura infer "$out/run/checkpoint.safetensors" --data .dev/data \
    --trace "$out/infer_trace.json" 2>&1 | grep "^trace:" | tee -a "$out/infer.txt"
  python3 bench/trace_top.py "$out/infer_trace.json" 8
  # The fast precision path (cooperative matrices) on the same job, one epoch.
  $bin/meganeura train --data .dev/data --out "$out/fast" --epochs 1 --precision fast \
    > "$out/train_fast.txt" 2>&1
  grep -E "img/s|accuracy|precision" "$out/train_fast.txt" | tail -4
  python3 bench/fashion_pytorch.py --model cnn --batch 64 --steps 300 | tee "$out/fashion_pytorch.jsonl"
fi
# The test verdicts again, last, where a truncated log still shows them.
if [ -f "$out/test_gpu.txt" ]; then
  grep -E "tests ran|PASSED|FAILED  \]|gpu tests:|test_gpu exit" "$out/test_gpu.txt" | tail -6
fi
# The test log's verdicts and the kernel table come back as files of their own as well.
if [ -n "${OUT:-}" ]; then
  tar czf "$OUT/h200_results.tar.gz" -C "$out" .
  cp "$out"/kernels_table.md "$OUT/" 2>/dev/null
  grep -E "^\[ +(OK|FAILED|SKIPPED) +\]|tests ran|gpu tests:|test_gpu exit" "$out/test_gpu.txt" \
    > "$OUT/test_verdicts.txt" 2>/dev/null
fi
echo "results in $out${OUT:+ and $OUT/h200_results.tar.gz}"

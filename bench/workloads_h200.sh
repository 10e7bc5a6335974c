#!/usr/bin/env bash
# The device calls on the H200 behind docs/BENCHMARKS.md's Workloads section, one part a call
# (each fits the device tool's 10 minutes):
#   PART=parity  the five workloads' parity gates against the real libraries (transformers,
#                torchvision) or the project's twins, run side by side: bench/*_parity_h200.py
#   PART=bench   `meganeura bench workloads` against bench/workloads_pytorch.py (eager, or
#                eager and compiled with COMPILE=1), joined by bench/compare.py --workloads;
#                FILTER=NAME runs one workload (the five together take longer than one call),
#                PRECISION=strict|fast one precision, PYTORCH=0 skips PyTorch's side
#   PART=demo    DEMO=resnet|unet|whisper|smolvla: that workload's demo script at its full size
#                (Fashion-MNIST from .dev/data for the ResNet and U-Net demos); two demos can run
#                side by side after a first call has unpacked (PART=none unpacks and does nothing
#                else)
# Expects the stripped binaries (plain or gzip'd) in .dev/bin: meganeura, llama_parity,
# whisper_parity, unet_parity and test_parity; the loader debs in .gl; libpcre2-8's deb in
# .dev/debs (unpacked beside the system's, not over it); other run-time libraries the machine
# lacks (libsndfile's) in .dev/lib; for a build with MPI on a machine without Open MPI, its
# run-time libraries in .dev/mpi-lib; for the Whisper demo, espeak-ng packed in .dev/espeak.tar.xz
# (the espeak-ng binary, the libraries it links and its English data). bench/device_kit.sh makes
# all of it but espeak's archive. Results go to $OUT.
set -u
part=${PART:-parity}
# Unpacking is done once a machine, so that a second part can run beside a first one.
if [ ! -e /tmp/mg-unpacked ]; then
  for f in .gl/*.deb; do dpkg -x "$f" / ; done
  ldconfig
  mkdir -p /tmp/mglib && for f in .dev/debs/*.deb; do dpkg -x "$f" /tmp/mglib; done
  for packed in .dev/bin/*.gz; do gunzip -f "$packed"; done
  chmod +x .dev/bin/*
  touch /tmp/mg-unpacked
fi
export LD_LIBRARY_PATH=/tmp/mglib/usr/lib/x86_64-linux-gnu:$PWD/.dev/lib
# Open MPI's run-time libraries for a binary built with MPI, where the machine has none of its own.
ldconfig -p | grep -q libmpi.so.40 || LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$PWD/.dev/mpi-lib
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export MEGANEURA_CACHE_DIR=/tmp/meganeura-cache PYTHONUNBUFFERED=1
# The layout the parity scripts expect of a build folder.
bin=/tmp/mgbuild
mkdir -p $bin/bench $bin/tests
for name in meganeura llama_parity; do cp .dev/bin/$name $bin/ 2>/dev/null; done
for name in whisper_parity unet_parity; do cp .dev/bin/$name $bin/bench/ 2>/dev/null; done
cp .dev/bin/test_parity $bin/tests/ 2>/dev/null

if [ "$part" = parity ]; then
  timeout 430 python3 bench/llama_parity_h200.py $bin tests/fixtures/tokenizer/smollm2_like/tokenizer.json \
    /tmp/llama-parity > $OUT/parity_smollm2.txt 2>&1 &
  timeout 430 python3 bench/whisper_parity_h200.py $bin tests/fixtures/audio/speech_16k.wav \
    /tmp/whisper-parity > $OUT/parity_whisper.txt 2>&1 &
  timeout 430 python3 bench/resnet_parity_h200.py $bin/tests/test_parity /tmp/resnet50-parity \
    --precision both > $OUT/parity_resnet.txt 2>&1 &
  timeout 430 python3 bench/unet_parity_h200.py $bin/bench /tmp/unet-parity > $OUT/parity_unet.txt 2>&1 &
  timeout 430 python3 bench/smolvla_parity_h200.py --out /tmp/smolvla-parity --binary $bin/tests/test_parity \
    > $OUT/parity_smolvla.txt 2>&1 &
  wait
  for f in $OUT/parity_*.txt; do echo "== $f"; tail -12 "$f"; done
fi

if [ "$part" = bench ]; then
  compile=--no-compile
  [ "${COMPILE:-0}" = 1 ] && compile=
  timeout 250 $bin/meganeura bench workloads --runs ${RUNS:-10} ${FILTER:+--filter $FILTER} \
    ${PRECISION:+--precision $PRECISION} \
    > $OUT/workloads_meganeura.jsonl 2> $OUT/workloads_meganeura.err
  tail -12 $OUT/workloads_meganeura.jsonl | grep -v "^{"
  [ "${PYTORCH:-1}" = 1 ] && timeout 250 python3 bench/workloads_pytorch.py --runs ${RUNS:-10} $compile ${FILTER:+--filter $FILTER} \
    > $OUT/workloads_pytorch.jsonl 2> $OUT/workloads_pytorch.err
  tail -3 $OUT/workloads_pytorch.err
  python3 bench/compare.py --workloads $OUT/workloads_meganeura.jsonl \
    $(ls $OUT/workloads_pytorch.jsonl 2>/dev/null) \
    | tee $OUT/workloads_table.md
fi

if [ "$part" = demo ]; then
  # The machine has no espeak-ng: use the one packed from Debian's packages (binary, libraries
  # and English data) in .dev/espeak.tar.xz, behind a wrapper so its libraries stay its own.
  if ! command -v espeak-ng >/dev/null && [ -e .dev/espeak.tar.xz ]; then
    tar xJf .dev/espeak.tar.xz -C /tmp
    mkdir -p /tmp/espeak-bin
    printf '#!/bin/sh\nLD_LIBRARY_PATH=/tmp/espeakpack/lib ESPEAK_DATA_PATH=/tmp/espeakpack exec /tmp/espeakpack/espeak-ng "$@"\n' \
      > /tmp/espeak-bin/espeak-ng
    chmod +x /tmp/espeak-bin/espeak-ng
    export PATH=/tmp/espeak-bin:$PATH
  fi
  export MEGANEURA=$bin/meganeura FASHION_MNIST=$PWD/.dev/data
  case "${DEMO:-}" in
    resnet) RESNET_DEMO_FULL=1 RESNET_DEMO_DIR=/tmp/resnet-demo bash scripts/resnet_demo.sh ;;
    unet) UNET_DEMO=full UNET_DEMO_OUT=/tmp/unet-demo bash scripts/unet_demo.sh ;;
    whisper) PYTHON=python3 WHISPER_DEMO_SIZE=tiny bash scripts/whisper_demo.sh /tmp/whisper-demo ;;
    smolvla) SMOLVLA_DEMO_SIZE=full SMOLVLA_DEMO_OUT=/tmp/smolvla-demo bash scripts/smolvla_demo.sh ;;
    *) echo "DEMO=resnet|unet|whisper|smolvla" >&2; exit 2 ;;
  esac > $OUT/demo_${DEMO}.txt 2>&1
  echo "demo exit $?" >> $OUT/demo_${DEMO}.txt
  # Named per demo, so that two demos can run side by side into one $OUT.
  case "$DEMO" in
    resnet) run=/tmp/resnet-demo/run ;; unet) run=/tmp/unet-demo/unet ;;
    whisper) run=/tmp/whisper-demo/run ;; smolvla) run=/tmp/smolvla-demo/run ;;
  esac
  cp "$run"/metrics.jsonl $OUT/${DEMO}_metrics.jsonl 2>/dev/null
  cp "$run"/training.png $OUT/${DEMO}_training.png 2>/dev/null
  cp /tmp/unet-demo/unet/samples.png $OUT/ 2>/dev/null
  grep -v "^epoch" $OUT/demo_${DEMO}.txt | tail -15
fi

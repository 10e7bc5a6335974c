#!/usr/bin/env bash
# One device call on the H200 for the workloads (docs/BENCHMARKS.md, Workloads): the SmolLM2-135M
# parity gates against transformers, the workload benchmark against PyTorch, and the ResNet
# tensor-name fixture. Expects, as bench/h200.sh does, the stripped binaries meganeura and
# llama_parity in .dev/bin (plain or gzip'd), the loader debs in .gl and libpcre2-8's deb in
# .dev/debs (unpacked beside the system's, not over it). Results go to $OUT.
set -u
for f in .gl/*.deb; do dpkg -x "$f" / ; done
ldconfig
mkdir -p /tmp/mglib && for f in .dev/debs/*.deb; do dpkg -x "$f" /tmp/mglib; done
export LD_LIBRARY_PATH=/tmp/mglib/usr/lib/x86_64-linux-gnu
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
export MEGANEURA_CACHE_DIR=/tmp/meganeura-cache PYTHONUNBUFFERED=1
for packed in .dev/bin/*.gz; do gunzip -f "$packed"; done; chmod +x .dev/bin/*
timeout 60 python3 tests/parity/resnet_reference_names.py > $OUT/resnet_names.txt 2>&1; tail -2 $OUT/resnet_names.txt
cp tests/fixtures/resnet/reference_names.json $OUT/ 2>/dev/null
timeout 150 python3 bench/llama_parity_h200.py .dev/bin tests/fixtures/tokenizer/smollm2_like/tokenizer.json /tmp/parity > $OUT/parity.txt 2>&1; tail -9 $OUT/parity.txt
timeout 170 .dev/bin/meganeura bench workloads --runs 20 > $OUT/workloads_meganeura.jsonl 2> $OUT/workloads_meganeura.err; tail -3 $OUT/workloads_meganeura.jsonl
timeout 170 python3 bench/workloads_pytorch.py --runs 20 > $OUT/workloads_pytorch.jsonl 2> $OUT/workloads_pytorch.err
python3 bench/compare.py --workloads $OUT/workloads_meganeura.jsonl $OUT/workloads_pytorch.jsonl | tee $OUT/workloads_table.md

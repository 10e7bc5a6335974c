#!/usr/bin/env bash
# Assembles, on a Debian 12 development machine, what the device scripts (bench/h200.sh,
# bench/workloads_h200.sh, bench/mpi_h200.sh, bench/soak_h200.sh) expect beside the working tree,
# for the device tool to carry as `.dev` and `.gl`:
#   .gl            the Vulkan loader and GL dispatch debs the device machine lacks, and
#                  vulkan-validationlayers (GPU tests that ask for validation need it)
#   .dev/debs      libpcre2-8's deb (unpacked beside the machine's own)
#   .dev/lib       libsndfile and its codec libraries
#   .dev/mpi-lib   Open MPI's run-time libraries, for a build with MPI on a machine without them
#   .dev/bin       the Release binaries of ./build, stripped and gzip'd (the tool carries 64 MiB);
#                  emptied first
#   .dev/data      with DATA=1 only (bench/h200.sh's training job, the ResNet and U-Net demos,
#                  bench/mpi_h200.sh): the Fashion-MNIST idx files from Debian's
#                  dataset-fashion-mnist; they take half the tool's 64 MiB, so run the device
#                  scripts that need them with fewer binaries (BINARY arguments)
# Not made here: .dev/espeak.tar.xz, which only the Whisper demo needs (bench/workloads_h200.sh).
# Needs the build (bash scripts/build.sh) and the packages of scripts/setup.sh; downloads the
# debs with apt-get (network to Debian's mirror). Idempotent; run from the repository root:
#   bash bench/device_kit.sh [BINARY ...]   (default: the six the device scripts use)
set -euo pipefail
cd "$(dirname "$0")/.."
binaries=("$@")
[ ${#binaries[@]} -gt 0 ] || binaries=(meganeura bench/llama_parity bench/whisper_parity
  bench/unet_parity tests/test_parity tests/test_gpu)
for binary in "${binaries[@]}"; do
  [ -x "build/$binary" ] || { echo "device_kit: build/$binary is missing: run bash scripts/build.sh" >&2; exit 1; }
done

mkdir -p .gl .dev/debs .dev/lib .dev/mpi-lib .dev/bin
rm -f .dev/bin/*
lists=$(mktemp -d)
trap 'rm -rf "$lists"' EXIT
apt_options=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists="$lists")
mkdir -p "$lists/partial"
apt-get "${apt_options[@]}" update -q > /dev/null 2>&1
(cd .gl && apt-get "${apt_options[@]}" download -q libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 \
  libglx0 libgles2 vulkan-validationlayers 2> /dev/null)
(cd .dev/debs && apt-get "${apt_options[@]}" download -q libpcre2-8-0 2> /dev/null)

library_dir=/usr/lib/x86_64-linux-gnu
copy_with_dependencies() {  # destination, libraries: each with the libraries it links but the C
  # and C++ run-time libraries and zlib, which every machine has
  local destination=$1
  shift
  for library in "$@"; do
    cp -L "$library_dir/$library" "$destination/"
    ldd "$library_dir/$library" | awk '$3 ~ /^\// {print $3}' |
      grep -Ev '/(libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s|libz|ld-linux[^/]*)\.so' |
      while read -r dependency; do cp -L "$dependency" "$destination/"; done
  done
}
copy_with_dependencies .dev/lib libsndfile.so.1
copy_with_dependencies .dev/mpi-lib libmpi.so.40 libmpi_cxx.so.40

for binary in "${binaries[@]}"; do
  name=$(basename "$binary")
  strip -o ".dev/bin/$name" "build/$binary"
  gzip -f ".dev/bin/$name"
done

if [ "${DATA:-0}" = 1 ]; then
  mkdir -p .dev/data
  cp /usr/share/datasets/fashion-mnist/*-ubyte.gz .dev/data/
fi
du -sh .gl .dev | tr '\n' ' '
echo "(carry [\".dev\", \".gl\"]: at most 64 MiB together)"

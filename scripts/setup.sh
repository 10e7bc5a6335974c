#!/usr/bin/env bash
# Installs every Debian 12 package Meganeura needs to build, test and run. Idempotent.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git clang-format clang libclang-rt-dev
  libvulkan-dev mesa-vulkan-drivers vulkan-validationlayers vulkan-tools
  glslang-dev glslang-tools spirv-tools
  libgtest-dev zlib1g-dev nlohmann-json3-dev libsndfile1-dev libpcre2-dev libstb-dev
  dataset-fashion-mnist
  libopenmpi-dev openmpi-bin
  python3 python3-numpy python3-torch
  espeak-ng
)

missing=()
for package in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} packages already installed"
  exit 0
fi

sudo_cmd=()
if [ "$(id -u)" -ne 0 ]; then
  sudo_cmd=(sudo)
fi
echo "setup: installing ${missing[*]}"
"${sudo_cmd[@]}" apt-get update -q
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"

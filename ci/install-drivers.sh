#!/usr/bin/env bash
# Installs the software drivers that make every unirt backend testable without a GPU:
#   - Mesa's lavapipe (Vulkan) and llvmpipe (GL/EGL) for the wgpu backend;
#   - Debian's non-free NVRTC (compiles CUDA C on the host) and libcuda1 (answers cuInit with
#     CUDA_ERROR_NO_DEVICE) for the CUDA backend;
#   - a C compiler and valgrind for the C ABI tests.
# Needs root and apt; without them it says what it skipped and returns 0, so the tests still run
# (the backends whose drivers are missing show up as ignored tests with the reason).
set -u
pkgs_main=(mesa-vulkan-drivers libvulkan1 libegl1 libegl-mesa0 libgl1-mesa-dri gcc valgrind)
pkgs_nonfree=(libnvrtc11.2 libnvrtc-builtins11.8 libcuda1)

if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-drivers: no apt-get here; skipping driver installation" >&2
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "install-drivers: not root; skipping driver installation" >&2
  exit 0
fi

missing=()
for p in "${pkgs_main[@]}" "${pkgs_nonfree[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-drivers: everything already installed"
  exit 0
fi

# Enable contrib and non-free for NVRTC and libcuda1 (deb822 sources or the classic list).
if [ -f /etc/apt/sources.list.d/debian.sources ]; then
  if ! grep -q 'non-free' /etc/apt/sources.list.d/debian.sources; then
    sed -i -E 's/^Components: (.*)$/Components: \1 contrib non-free non-free-firmware/' \
      /etc/apt/sources.list.d/debian.sources
  fi
elif [ -f /etc/apt/sources.list ] && ! grep -q 'non-free' /etc/apt/sources.list; then
  sed -i -E 's/^(deb .* main)$/\1 contrib non-free non-free-firmware/' /etc/apt/sources.list
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq || echo "install-drivers: apt-get update failed" >&2
apt-get install -y -qq --no-install-recommends "${pkgs_main[@]}" >/dev/null \
  || echo "install-drivers: could not install ${pkgs_main[*]}" >&2
# libcuda1's maintainer scripts want the NVIDIA kernel module for nothing at test time;
# --no-install-recommends keeps the kernel module packages out.
apt-get install -y -qq --no-install-recommends "${pkgs_nonfree[@]}" >/dev/null \
  || echo "install-drivers: could not install ${pkgs_nonfree[*]}" >&2
exit 0

#!/usr/bin/env bash
# Installs what is missing (Debian packages via apt-get, Python packages via pip), then
# configures and builds Parallax into ./build. Idempotent and quiet when everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."

DEB_PACKAGES=(meson ninja-build g++ pkg-config libomp-dev libtomlplusplus-dev catch2 libcli11-dev
              libfmt-dev nlohmann-json3-dev libhdf5-dev libhdf5-openmpi-dev libopenmpi-dev
              openmpi-bin libdnnl-dev)
PY_MODULES=(numpy h5py pytest)

missing=()
for p in "${DEB_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "setup: installing Debian packages: ${missing[*]}"
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PYTHON="${PYTHON:-python3}"
pymissing=()
for m in "${PY_MODULES[@]}"; do
    "$PYTHON" -c "import $m" 2>/dev/null || pymissing+=("$m")
done
if ((${#pymissing[@]})); then
    echo "setup: installing Python packages: ${pymissing[*]}"
    "$PYTHON" -m pip install -q "${pymissing[@]}"
fi

if [ ! -f build/build.ninja ]; then
    meson setup build --buildtype=release >/dev/null
fi
ninja -C build >/dev/null || ninja -C build

#!/usr/bin/env bash
# Installs what is missing (Debian packages via apt-get, Python packages via pip), then
# configures and builds Parallax into ./build. Idempotent and quiet when everything is there.
set -euo pipefail
cd "$(dirname "$0")/.."

DEB_PACKAGES=(meson ninja-build g++ pkg-config libomp-dev libtomlplusplus-dev catch2 libcli11-dev
              libfmt-dev nlohmann-json3-dev libhdf5-dev libhdf5-openmpi-dev libopenmpi-dev
              openmpi-bin libdnnl-dev libimgui-dev libglfw3-dev libgl-dev xvfb xdotool)
# Python packages as "import name:pip name" (they differ for some). meson-python is installed
# without its dependency on PyPI's meson, which would shadow Debian's meson on PATH (and
# reconfigure every build tree with another meson version); its other dependencies are listed.
PY_MODULES=(numpy h5py pytest pybind11 packaging pyproject_metadata:pyproject-metadata
            mesonpy:meson-python nbformat nbclient ipykernel matplotlib ml_dtypes)
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
export PIP_ROOT_USER_ACTION=ignore  # CI runs as root, outside a virtual environment
pymissing=()
for entry in "${PY_MODULES[@]}"; do
    module="${entry%%:*}"
    package="${entry#*:}"
    "$PYTHON" -c "import $module" 2>/dev/null || pymissing+=("$package")
done
if ((${#pymissing[@]})); then
    echo "setup: installing Python packages: ${pymissing[*]}"
    # meson-python goes last: installed first, its missing PyPI meson would make every later pip
    # install print a resolver ERROR about it (a warning: Debian's meson is the one used).
    others=()
    mesonpy=0
    for p in "${pymissing[@]}"; do
        if [ "$p" = meson-python ]; then mesonpy=1; else others+=("$p"); fi
    done
    if ((${#others[@]})); then "$PYTHON" -m pip install -q "${others[@]}"; fi
    if ((mesonpy)); then "$PYTHON" -m pip install -q --no-deps meson-python; fi
fi

# The Python module is built in build/ with everything else, for this interpreter (a native file
# names it; a build/ set up for another Python, without the module, is set up again).
python_exe=$("$PYTHON" -c 'import sys; print(sys.executable)')
if [ -f build/build.ninja ] && ! grep -qs "^python = '$python_exe'$" build/python-native.ini; then
    echo "setup: build/ was set up for another Python; setting it up again for $python_exe"
    rm -rf build
fi
if [ ! -f build/build.ninja ]; then
    mkdir -p build
    printf "[binaries]\npython = '%s'\n" "$python_exe" > build/python-native.ini
    meson setup build --buildtype=release --native-file build/python-native.ini >/dev/null
fi
ninja -C build >/dev/null || ninja -C build

# `import parallax` loads build/'s module: an editable install (meson-python) over build/, made
# once per checkout; importing it runs `ninja python` there, which finds nothing to do after the
# build above. Without build isolation, so that it uses the packages above and Debian's meson.
where=$("$PYTHON" -c 'import os, parallax; print(os.path.realpath(os.path.dirname(parallax.__file__)))' \
        2>/dev/null || true)
if [ "$where" != "$(pwd -P)/build/bindings" ]; then
    echo "setup: installing the Python module parallax (editable, over build/)"
    "$PYTHON" -m pip install -q --no-build-isolation -e . -Cbuild-dir=build
    "$PYTHON" -c "import parallax" || { echo "setup: import parallax fails"; exit 1; }
fi

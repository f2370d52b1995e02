#!/usr/bin/env bash
# Installs what is missing (Debian packages via apt-get, Python packages via pip), then
# configures build/ with meson and builds what was asked for. Idempotent: a second run checks,
# finds nothing to do and takes seconds.
#
#   scripts/setup.sh            the `parallax` executable (what the quick start runs)
#   scripts/setup.sh --gui      and the workbench (parallax-gui, which `parallax gui` starts)
#   scripts/setup.sh --python   and the Python module, installed in editable mode over build/
#   scripts/setup.sh --all      everything the test command needs: the above, the test suites,
#                               the benchmarks, and the packages the tests use (Xvfb, Jupyter,
#                               torch and transformers)
#
# Each phase prints its name and, when it did something, how long it took.
set -euo pipefail
cd "$(dirname "$0")/.."

want_gui=0 want_python=0 want_all=0
for arg in "$@"; do
    case "$arg" in
        --gui) want_gui=1 ;;
        --python) want_python=1 ;;
        --all) want_all=1 want_gui=1 want_python=1 ;;
        *) echo "setup: unknown option '$arg' (use --gui, --python or --all)" >&2; exit 2 ;;
    esac
done

# What the `parallax` executable needs to build (the library, MPI, HDF5, oneDNN, the CLI).
DEB_CORE=(meson ninja-build g++ pkg-config libtomlplusplus-dev libcli11-dev libfmt-dev
          nlohmann-json3-dev libhdf5-dev libhdf5-openmpi-dev libopenmpi-dev openmpi-bin
          libdnnl-dev)
DEB_GUI=(libimgui-dev libglfw3-dev libgl-dev)
# mpirun starts its local ranks through its ssh launcher's code, which looks for ssh even then.
DEB_TESTS=(catch2 xvfb xdotool openssh-client)
# Python packages as "import name:pip name" (they differ for some). meson-python is installed
# without its dependency on PyPI's meson, which would shadow Debian's meson on PATH (and
# reconfigure every build tree with another meson version); its other dependencies are listed.
PY_MODULE=(numpy ml_dtypes pybind11 packaging pyproject_metadata:pyproject-metadata
           mesonpy:meson-python)
PY_TESTS=(h5py pytest xdist:pytest-xdist nbformat nbclient ipykernel matplotlib mypy)
# The comparison with Hugging Face transformers (tests/python/test_transformers_gpt2.py) only: the
# library never imports them. PyPI's torch brings its CUDA libraries (about 4 GB installed; 97 s
# on a developer's machine), so they are the test set-up's, never the quick start's.
PY_TESTS+=(torch transformers)

t_all=$SECONDS
t_phase=$SECONDS
phase() { echo "setup: $*"; t_phase=$SECONDS; }
took() { echo "setup:   done in $((SECONDS - t_phase)) s"; }

deb=()  # beyond DEB_CORE
((want_gui)) && deb+=("${DEB_GUI[@]}")
((want_all)) && deb+=("${DEB_TESTS[@]}")
PYTHON="${PYTHON:-python3}"
if ((want_python)); then
    # Debian's own python3 comes without pip and without the headers an extension module needs.
    "$PYTHON" -m pip --version >/dev/null 2>&1 || deb+=(python3-pip)
    inc=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["include"])' 2>/dev/null ||
          true)
    [ -n "$inc" ] && [ -f "$inc/Python.h" ] || deb+=(python3-dev)
fi
installed_debs=0
apt_updated=0
# Installs the missing ones of "$@"; $1 is "--no-install-recommends" or "".
apt_install() {
    local how="$1"
    shift
    local missing=() p
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
            missing+=("$p")
    done
    ((${#missing[@]})) || return 0
    phase "installing Debian packages (apt-get): ${missing[*]}"
    local sudo=""
    [ "$(id -u)" -ne 0 ] && sudo="sudo"
    ((apt_updated)) || $sudo apt-get update -qq
    apt_updated=1
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $how "${missing[@]}" >/dev/null
    installed_debs=1
    took
}
# The executable's packages without Debian's recommendations (documentation, optional tools):
# the quick start's download. The workbench's and the tests' with them (Xvfb needs its fonts).
apt_install --no-install-recommends "${DEB_CORE[@]}"
apt_install "" ${deb[@]+"${deb[@]}"}

if ((want_python)); then
    export PIP_ROOT_USER_ACTION=ignore  # CI runs as root, outside a virtual environment
    # Debian's python3 refuses pip outside a virtual environment (PEP 668); these packages are
    # this checkout's test and build tools, installed for the user who runs the set-up.
    stdlib=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
    [ -f "$stdlib/EXTERNALLY-MANAGED" ] && export PIP_BREAK_SYSTEM_PACKAGES=1
    modules=("${PY_MODULE[@]}")
    ((want_all)) && modules+=("${PY_TESTS[@]}")
    pymissing=()
    for entry in "${modules[@]}"; do
        module="${entry%%:*}"
        package="${entry#*:}"
        "$PYTHON" -c "import $module" 2>/dev/null || pymissing+=("$package")
    done
    if ((${#pymissing[@]})); then
        phase "installing Python packages (pip): ${pymissing[*]}"
        # meson-python goes last: installed first, its missing PyPI meson would make every later
        # pip install print a resolver ERROR about it (a warning: Debian's meson is the one used).
        others=()
        mesonpy=0
        for p in "${pymissing[@]}"; do
            if [ "$p" = meson-python ]; then mesonpy=1; else others+=("$p"); fi
        done
        if ((${#others[@]})); then "$PYTHON" -m pip install -q "${others[@]}"; fi
        if ((mesonpy)); then "$PYTHON" -m pip install -q --no-deps meson-python; fi
        took
    fi
fi

# build/ is set up for one interpreter (a native file names it: the Python module is built for
# it); a build/ set up for another Python is set up again.
python_exe=$("$PYTHON" -c 'import sys; print(sys.executable)')
if [ -f build/build.ninja ] && ! grep -qs "^python = '$python_exe'$" build/python-native.ini; then
    echo "setup: build/ was set up for another Python; setting it up again for $python_exe"
    rm -rf build
fi
has_target() { ninja -C build -t query "$1" >/dev/null 2>&1; }
if [ ! -f build/build.ninja ]; then
    phase "configuring build/ (meson)"
    mkdir -p build
    printf "[binaries]\npython = '%s'\n" "$python_exe" > build/python-native.ini
    meson setup build --buildtype=release --native-file build/python-native.ini >/dev/null
    took
elif { ((want_gui)) && ! has_target app/parallax-gui; } ||
     { ((want_python)) && ! has_target python; } || ((installed_debs && want_all)); then
    # Set up without the packages just installed: meson looks for them again.
    phase "configuring build/ again (meson), with the packages just installed"
    meson setup --reconfigure build >/dev/null
    took
fi

# ninja shows its progress on one line in a terminal, one line per step in a log.
build() {
    phase "building $1"
    shift
    NINJA_STATUS="setup:   [%f/%t] " ninja -C build "$@" ||
        { echo "setup: the build failed; the lines above say why" >&2; exit 1; }
    took
}
if ((want_all)); then
    build "everything (the executables, the Python module, the test suites, the benchmarks)"
else
    targets=(app/parallax)
    ((want_gui)) && targets+=(app/parallax-gui)
    ((want_python)) && targets+=(python)
    if ninja -C build -n "${targets[@]}" | grep -q "^ninja: no work to do"; then
        echo "setup: build/ is up to date (${targets[*]})"
    else
        build "${targets[*]}" "${targets[@]}"
    fi
fi

# `import parallax` loads build/'s module: an editable install (meson-python) over build/, made
# once per checkout; importing it runs `ninja python` there (the module and the executable), so
# an edited source is rebuilt on the next import. Without build isolation, so that it uses the
# packages above and Debian's meson.
if ((want_python)); then
    where=$("$PYTHON" -c \
        'import os, parallax._core as c; print(os.path.realpath(os.path.dirname(c.__file__)))' \
        2>/dev/null || true)
    if [ "$where" != "$(pwd -P)/build/bindings" ]; then
        phase "installing the Python module parallax (editable, over build/)"
        "$PYTHON" -m pip install -q --no-build-isolation -e . -Cbuild-dir=build
        "$PYTHON" -c "import parallax" || { echo "setup: import parallax fails"; exit 1; }
        took
    fi
    # The package is typed (bindings/python/parallax, py.typed). Type checkers cannot see
    # through the editable install's import hook, so a .pth file in site-packages puts the
    # checkout's package folder on their path (mypy and pyright read .pth files; at run time the
    # import hook comes first, and loads the same files).
    "$PYTHON" - "$(pwd -P)/bindings/python" <<'PY'
import os, site, sys, sysconfig
folder = sysconfig.get_paths()["purelib"]
if not os.access(folder, os.W_OK):
    folder = site.getusersitepackages()
    os.makedirs(folder, exist_ok=True)
old = os.path.join(folder, "parallax-stubs.pth")  # the stub-only package an older set-up named
if os.path.exists(old):
    os.remove(old)
pth = os.path.join(folder, "parallax-typing.pth")
line = sys.argv[1] + "\n"
if not os.path.exists(pth) or open(pth).read() != line:
    with open(pth, "w") as f:
        f.write(line)
    print("setup: the typed package (bindings/python) is on type checkers' path: " + pth)
PY
fi
echo "setup: ready ($((SECONDS - t_all)) s)"

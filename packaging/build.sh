#!/usr/bin/env bash
# Build the DuplexCadence one-folder bundle and its tarball (`make package` runs this).
#
#   packaging/build.sh              -> dist/duplexcadence/  and  dist/duplexcadence-<version>-linux-<arch>-<variant>.tar.gz
#
# PY (default .venv/bin/python) must have the app installed (`pip install -e '.[package]'`). Its torch
# decides the variant: the CPU wheel gives "cpu", a CUDA wheel "cu<version>" (see README, Packaging).
# Build outputs stay in build/pyinstaller-<variant> and dist/. Prints the bundle size and the build time.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PY:-$ROOT/.venv/bin/python}
cd "$ROOT"

die() { echo "build.sh: error: $*" >&2; exit 1; }
[ -x "$PY" ] || die "no Python at $PY (run 'make venv' first or set PY=...)"
"$PY" -c "import PyInstaller" 2>/dev/null || die "PyInstaller is not installed: $PY -m pip install -e '.[package]'"
[ -f assets/duplexcadence.png ] && [ -f assets/duplexcadence.svg ] || die "assets/duplexcadence.{png,svg} missing"
[ -f NOTICE ] || die "NOTICE missing (the peers our models follow; it ships with the bundle)"

VERSION=$("$PY" -c "import importlib.metadata as m; print(m.version('duplexcadence'))")
VARIANT=$("$PY" -c "import torch; v = torch.version.cuda; print('cu' + v.replace('.', '') if v else 'cpu')")
NAME=duplexcadence-$VERSION-linux-$(uname -m)-$VARIANT
BUNDLE=dist/duplexcadence

start=$(date +%s)
echo "building $NAME (PyInstaller, one folder) ..."
"$PY" -m PyInstaller --noconfirm --log-level WARN --workpath "build/pyinstaller-$VARIANT" --distpath dist \
  packaging/duplexcadence.spec
install -m 644 packaging/duplexcadence.desktop "$BUNDLE/duplexcadence.desktop"
install -m 755 packaging/install-desktop-entry.sh "$BUNDLE/install-desktop-entry.sh"
install -m 644 NOTICE "$BUNDLE/NOTICE"
echo "$NAME" > "$BUNDLE/VERSION"

# The bundle must start by itself before it is shipped.
QT_QPA_PLATFORM=offscreen "$BUNDLE/duplexcadence" --help >/dev/null || die "the bundled app does not start"

echo "packing dist/$NAME.tar.gz ..."
rm -f "dist/$NAME.tar.gz"
tar -C dist --transform "flags=rh;s,^duplexcadence,$NAME," -cf - duplexcadence | gzip -6 > "dist/$NAME.tar.gz"
elapsed=$(( $(date +%s) - start ))

bundle_mb=$(du -sm "$BUNDLE" | cut -f1)
tar_mb=$(du -sm "dist/$NAME.tar.gz" | cut -f1)
printf '{"name": "%s", "bundle_mb": %d, "tarball_mb": %d, "build_s": %d}\n' \
  "$NAME" "$bundle_mb" "$tar_mb" "$elapsed" | tee dist/package-info.json
echo "bundle: $BUNDLE ($bundle_mb MB), tarball: dist/$NAME.tar.gz ($tar_mb MB), built in ${elapsed}s"

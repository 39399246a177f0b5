#!/usr/bin/env bash
# Install (or remove) the DuplexCadence desktop entry and icon for the current user.
#
#   ./install-desktop-entry.sh [BUNDLE_DIR]     install; BUNDLE_DIR defaults to this script's folder
#   ./install-desktop-entry.sh --uninstall      remove what an install wrote
#
# Run it from the unpacked tarball (the script sits next to the `duplexcadence` executable) or from a
# source checkout as `packaging/install-desktop-entry.sh dist/duplexcadence`. Writes under
# ${XDG_DATA_HOME:-~/.local/share}: applications/duplexcadence.desktop (Exec = the bundle's absolute
# path) and icons/hicolor/{scalable,256x256}/apps/duplexcadence.{svg,png}. Needs no root.
set -euo pipefail

APP=duplexcadence
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
DATA=${XDG_DATA_HOME:-$HOME/.local/share}
DESKTOP_DIR=$DATA/applications
ICON_DIR=$DATA/icons/hicolor

die() { echo "install-desktop-entry: error: $*" >&2; exit 1; }

refresh_caches() {
  if command -v update-desktop-database >/dev/null 2>&1; then
    update-desktop-database -q "$DESKTOP_DIR" 2>/dev/null || true
  fi
  if command -v gtk-update-icon-cache >/dev/null 2>&1; then
    gtk-update-icon-cache -q -t "$ICON_DIR" 2>/dev/null || true
  fi
}

uninstall() {
  rm -f "$DESKTOP_DIR/$APP.desktop" "$ICON_DIR/scalable/apps/$APP.svg" "$ICON_DIR/256x256/apps/$APP.png"
  refresh_caches
  echo "removed the $APP desktop entry and icons from $DATA"
}

install_entry() {
  local bundle exe template assets
  bundle=$(cd "$1" 2>/dev/null && pwd) || die "no such folder: $1"
  exe=$bundle/$APP
  template=$HERE/$APP.desktop
  assets=$bundle/_internal/assets
  [ -x "$exe" ] || die "$bundle has no '$APP' executable (pass the unpacked bundle folder)"
  [ -f "$template" ] || die "desktop entry template $template is missing"
  [ -f "$assets/$APP.png" ] && [ -f "$assets/$APP.svg" ] || die "icons missing in $assets"
  # Exec is written in double quotes (spaces are fine); these characters would need escaping.
  case "$exe" in *[\"\`\$\\]*|*$'\n'*) die "the bundle path must not contain \" \` \$ \\ or newlines: $exe";; esac

  mkdir -p "$DESKTOP_DIR" "$ICON_DIR/scalable/apps" "$ICON_DIR/256x256/apps"
  install -m 644 "$assets/$APP.svg" "$ICON_DIR/scalable/apps/$APP.svg"
  install -m 644 "$assets/$APP.png" "$ICON_DIR/256x256/apps/$APP.png"
  local tmp
  tmp=$(mktemp --suffix=.desktop "$DESKTOP_DIR/.$APP.XXXXXX")
  sed -e "s|^Exec=.*|Exec=\"$exe\"|" -e "s|^TryExec=.*|TryExec=$exe|" "$template" > "$tmp"
  if command -v desktop-file-validate >/dev/null 2>&1 && ! desktop-file-validate "$tmp"; then
    rm -f "$tmp"
    die "the generated desktop entry did not validate"
  fi
  chmod 644 "$tmp"
  mv "$tmp" "$DESKTOP_DIR/$APP.desktop"
  refresh_caches
  echo "installed $DESKTOP_DIR/$APP.desktop -> $exe"
}

case "${1:-}" in
  -h|--help) sed -n '2,10s/^# \{0,1\}//p' "${BASH_SOURCE[0]}" ;;
  --uninstall) [ $# -eq 1 ] || die "--uninstall takes no other argument"; uninstall ;;
  -*) die "unknown option $1 (see --help)" ;;
  *) [ $# -le 1 ] || die "expected at most one BUNDLE_DIR (see --help)"; install_entry "${1:-$HERE}" ;;
esac

#!/usr/bin/env bash
# Service install of dshd (README "systemd"), run by `make install-system|install-user|
# uninstall-system|uninstall-user`.
#
# Theory of operation: dshd gets a virtualenv of its own (`python3 -m venv`, then a non-editable
# `pip install .` into it), so Debian's python is never touched (PEP 668). The units are
# generated from the templates in systemd/ (@BINDIR@ = the venv's bin, @DOCDIR@ = where the
# README and docs/ are installed, so Documentation= exists, @TIMEOUT_STOP_SEC@ = dshd's
# stop_timeout_seconds default plus its margin, asked of the installed dshd). Every path the install creates
# (files, symlinks, directories, the venv, the group) is appended to a manifest in the prefix
# as it is created; uninstall reads it and removes exactly those, newest first, and nothing
# else: session state (/var/lib/dsh, ~/.local/state/dsh) and config files are never touched.
# A unit file, doc directory or symlink that exists but is not in the manifest is someone
# else's: the install refuses to overwrite it. Re-running an install upgrades in place.
#
# Locations (environment; the Makefile passes its variables):
#   system: PREFIX=/opt/dsh  UNITDIR=/etc/systemd/system  DOCDIR=/usr/share/doc/dsh
#   user:   USER_PREFIX=~/.local/share/dsh  USER_UNITDIR=~/.config/systemd/user
#           USER_BINDIR=~/.local/bin  (docs go to USER_PREFIX/doc)
# systemctl daemon-reload (and, on uninstall, disable --now) runs only when systemd is PID 1
# (/run/systemd/system exists) and the units are in the directory systemd reads.
set -euo pipefail

action=${1:?usage: install.sh install-system|uninstall-system|install-user|uninstall-user}
src=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-python3}

case $action in
  *-system)
    scope=system
    prefix=${PREFIX:-/opt/dsh}
    unitdir=${UNITDIR:-/etc/systemd/system}
    docdir=${DOCDIR:-/usr/share/doc/dsh}
    bindir=
    std_unitdir=/etc/systemd/system
    systemctl=(systemctl)
    ;;
  *-user)
    scope=user
    prefix=${USER_PREFIX:-${XDG_DATA_HOME:-$HOME/.local/share}/dsh}
    unitdir=${USER_UNITDIR:-${XDG_CONFIG_HOME:-$HOME/.config}/systemd/user}
    docdir=$prefix/doc
    bindir=${USER_BINDIR:-$HOME/.local/bin}
    std_unitdir=${XDG_CONFIG_HOME:-$HOME/.config}/systemd/user
    systemctl=(systemctl --user)
    ;;
  *) echo "install.sh: unknown action $action" >&2; exit 2 ;;
esac
venv=$prefix/venv
manifest=$prefix/install-manifest

say() { echo "dsh: $*"; }
die() { echo "dsh: $*" >&2; exit 1; }

manager_reachable() {
  if [ "$scope" = system ]; then [ -d /run/systemd/system ]
  else [ -d /run/systemd/system ] && "${systemctl[@]}" show-environment >/dev/null 2>&1; fi
}

units_are_read() { [ "$unitdir" = "$std_unitdir" ]; }

recorded() { [ -f "$manifest" ] && grep -qxF "$1 $2" "$manifest"; }

record() { recorded "$1" "$2" || echo "$1 $2" >>"$manifest"; }

# mkdir -p that records each directory it creates (uninstall removes them if empty).
make_dirs() {
  local dir=$1 missing=()
  while [ ! -d "$dir" ]; do missing=("$dir" "${missing[@]}"); dir=$(dirname "$dir"); done
  for dir in "${missing[@]}"; do
    mkdir -m 0755 "$dir"
    [ -f "$manifest" ] && record d "$dir" || pending_dirs+=("$dir")
  done
}

# Refuse to overwrite what an earlier install did not create.
claim() {
  local kind=$1 path=$2
  if { [ -e "$path" ] || [ -L "$path" ]; } && ! recorded "$kind" "$path"; then
    die "$path exists and was not installed by 'make $action'; move it away first"
  fi
}

render() {  # template → unit with @BINDIR@, @DOCDIR@ and @TIMEOUT_STOP_SEC@ filled in
  local timeout_stop
  # stop_timeout_seconds' default plus the margin, from the dshd just installed (dshd.service).
  timeout_stop=$("$venv/bin/python" -m dshd.service) || die "cannot read dshd's stop timeout"
  sed -e "s|@BINDIR@|$venv/bin|g" -e "s|@DOCDIR@|$docdir|g" \
      -e "s|@TIMEOUT_STOP_SEC@|$timeout_stop|g" "$1" >"$2.tmp"
  chmod 0644 "$2.tmp"
  mv -f "$2.tmp" "$2"
}

install_service() {
  if [ "$scope" = system ] && [ "$(id -u)" != 0 ]; then
    die "install-system needs root: sudo make install-system"
  fi
  "$python" -m venv --help >/dev/null 2>&1 ||
    die "python3 -m venv is missing: apt-get install -y python3-venv"
  # Refuse before touching anything when a target is someone else's.
  claim f "$unitdir/dshd.service"
  claim f "$unitdir/dshd.socket"
  claim t "$docdir"
  for exe in dsh dshd; do [ -z "$bindir" ] || claim l "$bindir/$exe"; done
  pending_dirs=()
  make_dirs "$prefix"
  touch "$manifest"
  for d in "${pending_dirs[@]}"; do record d "$d"; done
  if [ ! -x "$venv/bin/python" ]; then
    claim t "$venv"
    "$python" -m venv "$venv"
    record t "$venv"
  fi
  say "installing dsh into $venv (pip install, not editable)"
  # Build from a copy: an in-tree build writes build/ and dsh.egg-info into the checkout, under
  # the feet of an editable install (make test) that shares it.
  staging=$(mktemp -d)
  trap 'rm -rf "$staging"' EXIT
  cp -a "$src/pyproject.toml" "$src/README.md" "$src/protocol" "$src/dshd" "$src/client" "$staging/"
  "$venv/bin/pip" install -q --disable-pip-version-check --upgrade "$staging"
  rm -rf "$staging"
  if [ "$scope" = system ] && ! getent group dsh >/dev/null; then
    groupadd --system dsh
    record g dsh
    say "created group dsh (members may use /run/dsh/dshd.sock)"
  fi
  claim t "$docdir"
  make_dirs "$(dirname "$docdir")"
  rm -rf "$docdir.tmp"
  mkdir -p "$docdir.tmp"
  cp "$src/README.md" "$docdir.tmp/"
  cp -r "$src/docs" "$docdir.tmp/docs"
  rm -rf "$docdir"
  mv "$docdir.tmp" "$docdir"
  chmod -R u=rwX,go=rX "$docdir"
  record t "$docdir"
  make_dirs "$unitdir"
  local tmpl_dir=$src/systemd
  [ "$scope" = user ] && tmpl_dir=$src/systemd/user
  claim f "$unitdir/dshd.service"
  claim f "$unitdir/dshd.socket"
  render "$tmpl_dir/dshd.service.in" "$unitdir/dshd.service"
  record f "$unitdir/dshd.service"
  install -m 0644 "$tmpl_dir/dshd.socket" "$unitdir/dshd.socket"
  record f "$unitdir/dshd.socket"
  if [ -n "$bindir" ]; then
    make_dirs "$bindir"
    for exe in dsh dshd; do
      claim l "$bindir/$exe"
      ln -sfn "$venv/bin/$exe" "$bindir/$exe"
      record l "$bindir/$exe"
    done
  fi
  say "units: $unitdir/dshd.service, $unitdir/dshd.socket (ExecStart=$venv/bin/dshd ...)"
  if [ ! -d /run/systemd/system ]; then
    say "systemd is not PID 1 here: no daemon-reload was run; the units take effect when" \
        "systemd next starts and reads $unitdir"
  elif ! units_are_read; then
    say "the units are in $unitdir, not $std_unitdir: no daemon-reload was run"
  elif ! manager_reachable; then
    say "no user manager answers (systemctl --user): run 'systemctl --user daemon-reload' in your session"
  else
    "${systemctl[@]}" daemon-reload
    say "systemd reloaded; start it with: ${systemctl[*]} enable --now dshd.socket"
  fi
}

uninstall_service() {
  [ -f "$manifest" ] || die "nothing to uninstall: no $manifest (was 'make ${action#un}' run with these locations?)"
  if [ "$scope" = system ] && [ "$(id -u)" != 0 ]; then
    die "uninstall-system needs root: sudo make uninstall-system"
  fi
  if manager_reachable && units_are_read && recorded f "$unitdir/dshd.service"; then
    "${systemctl[@]}" disable --now dshd.socket dshd.service || true
  fi
  local entries kind path
  entries=$(tac "$manifest")
  rm -f "$manifest"
  while read -r kind path; do
    case $kind in
      f) rm -f "$path" ;;
      l) if [ -L "$path" ]; then rm -f "$path"; fi ;;
      t) rm -rf "$path" ;;
      d) rmdir "$path" 2>/dev/null || say "kept $path (not empty)" ;;
      g) groupdel "$path" || say "could not remove group $path" ;;
    esac
  done <<<"$entries"
  if manager_reachable && units_are_read; then "${systemctl[@]}" daemon-reload; fi
  say "removed the $scope install under $prefix; session state and config files are kept"
}

case $action in
  install-*) install_service ;;
  uninstall-*) uninstall_service ;;
esac

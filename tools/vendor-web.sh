#!/bin/sh
# Vendor the page's JavaScript dependencies from the npm registry (issue 16: no build step at
# run time, nothing fetched at run or test time). `npm pack` fetches the pinned tarballs into a
# temporary directory; only the files the page loads are copied into
# client/web/static/vendor/xterm/, with each package's LICENSE and a VERSIONS file naming the
# package, its version and the registry's integrity hash. The result is committed; run this
# (`make vendor-web`) only to move the pins, then commit the diff.
set -eu
XTERM_VERSION=6.0.0
FIT_VERSION=0.11.0
here=$(cd "$(dirname "$0")/.." && pwd)
dest="$here/client/web/static/vendor/xterm"
command -v npm >/dev/null || { echo "vendor-web: npm is not installed (apt-get install -y npm)"; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cd "$tmp"
npm pack --silent "@xterm/xterm@$XTERM_VERSION" "@xterm/addon-fit@$FIT_VERSION" >/dev/null
mkdir xterm fit
tar xzf "xterm-xterm-$XTERM_VERSION.tgz" -C xterm
tar xzf "xterm-addon-fit-$FIT_VERSION.tgz" -C fit
mkdir -p "$dest"
rm -f "$dest"/*
cp xterm/package/lib/xterm.js xterm/package/css/xterm.css "$dest/"
cp xterm/package/LICENSE "$dest/LICENSE"
cp fit/package/lib/addon-fit.js "$dest/"
cp fit/package/LICENSE "$dest/LICENSE.addon-fit"
{
  echo "# name version integrity (npm view NAME@VERSION dist.integrity); written by tools/vendor-web.sh"
  echo "@xterm/xterm $XTERM_VERSION $(npm view "@xterm/xterm@$XTERM_VERSION" dist.integrity)"
  echo "@xterm/addon-fit $FIT_VERSION $(npm view "@xterm/addon-fit@$FIT_VERSION" dist.integrity)"
} > "$dest/VERSIONS"
# The source maps are not vendored: drop the comment that points at them.
sed -i '/^\/\/# sourceMappingURL=/d' "$dest/xterm.js" "$dest/addon-fit.js"
echo "vendor-web: $(ls "$dest" | tr '\n' ' ')in $dest"

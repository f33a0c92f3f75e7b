#!/usr/bin/env bash
# The step-level peer of docs/validation.md's "A step-level peer" case: inference-lab, a
# discrete-event simulator of vLLM's scheduler step by step (MIT, crates.io), installed from
# crates.io at a pinned version with its own lock file, into a cache outside the clone. The
# validation test (tests/integration/peer_calibration.rs) runs it when it is installed and
# skips, saying so, when it is not; nothing is downloaded at test time.
#
#   deploy/inference-lab/install.sh install   # builds it once (~4 min on 2 cores), prints the binary
#   deploy/inference-lab/install.sh check     # exit 0 when the pinned version is installed
#   deploy/inference-lab/install.sh path      # prints where the binary is (installed or not)
#
# $ROUTELAB_CACHE (default ~/.cache/routelab) holds it, as for deploy/real-engine/llama.sh.
set -euo pipefail

VERSION=1.0.0
CACHE=${ROUTELAB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/routelab}
ROOT=$CACHE/inference-lab-$VERSION
BIN=$ROOT/bin/inference-lab

installed() { [ -x "$BIN" ] && "$BIN" --version 2>/dev/null | grep -q " $VERSION\$"; }

case "${1:-}" in
  check) installed ;;
  path) echo "$BIN" ;;
  install)
    if ! installed; then
      command -v cargo >/dev/null || { echo "install.sh: cargo is needed" >&2; exit 2; }
      echo "install.sh: building inference-lab $VERSION into $ROOT (once)" >&2
      cargo install --quiet --locked --version "=$VERSION" --root "$ROOT" inference-lab >&2
      installed || { echo "install.sh: $BIN does not report version $VERSION" >&2; exit 2; }
    fi
    echo "$BIN"
    ;;
  *) echo "usage: $0 install|check|path" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# toxiproxy v2.5.0 (`make toxiproxy`, run by `make test`): built from the Go module proxy into
# ~/.cache/orderly, checksum-pinned, for the zombie-worker test (tests/chaos/test_zombie_worker.py),
# which puts it between one worker and Kafka and cuts that worker's traffic. Like deploy/helm/tools.sh:
# the module's content hash (go.sum's h1:, checked by the Go toolchain against the checksum database
# and here against TOXIPROXY_SUM) and the built binary's SHA-256, recorded at build time next to it and
# checked at every later run (a changed or truncated binary is rebuilt, never used).
# Prints the toxiproxy-server binary's path; with --check, only if it is already built (else exit 1,
# and the test fails: a test never builds).
set -euo pipefail

MODULE=github.com/Shopify/toxiproxy/v2
VERSION=v2.5.0
SUM="h1:i4LPT+qrSlKNtQf5QliVjdP08GyAH8+BUIc9gT0eahc="

command -v go >/dev/null || { echo "toxiproxy: no Go toolchain on PATH (toxiproxy is built from the Go module proxy)" >&2; exit 1; }
GO_VERSION=$(go env GOVERSION)
CACHE="$HOME/.cache/orderly/toxiproxy-$VERSION-$GO_VERSION"
SERVER="$CACHE/bin/toxiproxy-server"
STAMP="$CACHE/toxiproxy.sha256"

usable() {
  [ -x "$SERVER" ] && [ -s "$STAMP" ] && (cd "$CACHE/bin" && sha256sum --check --status "$STAMP") \
    && go version -m "$SERVER" | grep -qxF "$(printf '\tmod\t%s\t%s\t%s' "$MODULE" "$VERSION" "$SUM")"
}

if [ "${1:-}" = --check ]; then
  usable || { echo "toxiproxy: no toxiproxy-server $VERSION at $SERVER: run make toxiproxy" >&2; exit 1; }
  echo "$SERVER"; exit 0
fi
if ! usable; then
  for variable in GONOSUMDB GONOSUMCHECK GOPRIVATE GOINSECURE GOFLAGS; do
    case "$(go env "$variable")" in *insecure*|*Shopify*|*"*"*) echo "toxiproxy: $variable=$(go env "$variable") would skip the module checksums; unset it" >&2; exit 1;; esac
  done
  [ "$(go env GOSUMDB)" != off ] || { echo "toxiproxy: GOSUMDB=off would skip the module checksums; unset it" >&2; exit 1; }
  sum=$(cd /tmp && go mod download -json "$MODULE@$VERSION" | sed -n 's/^\t"Sum": "\(.*\)",$/\1/p')
  [ "$sum" = "$SUM" ] || { echo "toxiproxy: $MODULE@$VERSION has sum '$sum', pinned $SUM" >&2; exit 1; }
  rm -rf "$CACHE" && mkdir -p "$CACHE/bin"
  start=$(date +%s)
  (cd /tmp && flock /tmp/orderly-heavy.lock env GOBIN="$CACHE/bin" GOFLAGS="-trimpath -buildvcs=false -mod=readonly" \
     go install "$MODULE/cmd/server@$VERSION")
  mv "$CACHE/bin/server" "$SERVER"
  (cd "$CACHE/bin" && sha256sum toxiproxy-server > "$STAMP")
  echo "toxiproxy: built toxiproxy-server $VERSION with $GO_VERSION in $(( $(date +%s) - start )) s" >&2
  usable || { echo "toxiproxy: the built server is not $MODULE $VERSION $SUM (go version -m)" >&2; exit 1; }
fi
echo "$SERVER"

#!/usr/bin/env bash
# The chart's tools (`make helm-tools`, docs/deploy-kubernetes.md): helm v4.3.2 built from the Go module
# proxy into ~/.cache/orderly, checksum-pinned. tests/integration/test_helm_chart.py runs it and fails
# (never skips) without it. The Kubernetes 1.31 schemas come from the kubernetes-validate wheel
# (pyproject.toml's dev extra), offline; the Prometheus Operator's CRD models from operator-models.txt
# (hash-checked wheels) into ~/.cache/orderly, with $PYTHON's pip (make passes the virtualenv's).
#
# The pins: the module's content hash (go.sum's h1:, checked by the Go toolchain against the checksum
# database, and here against HELM_SUM), and the built binary's SHA-256, recorded at build time next to
# it and checked at every later run (a changed or truncated binary is rebuilt, never used).
# Prints the helm binary's path; with --check, only if it is already built (else exit 1, and the test
# fails). A cold build takes 2 to 3.5 minutes on 2 cores, a warm one 12 s (docs/deploy-kubernetes.md,
# "Tests and tools"); later runs reuse the binary in 0.2 s.
set -euo pipefail

HELM_MODULE=helm.sh/helm/v4
HELM_VERSION=v4.3.2
HELM_SUM="h1:zdd8DgKTlLrlYIzdoAntDHLH0V3RkgNIpQ3yjzuD84M="

command -v go >/dev/null || { echo "helm-tools: no Go toolchain on PATH (helm is built from the Go module proxy)" >&2; exit 1; }
GO_VERSION=$(go env GOVERSION)
CACHE="$HOME/.cache/orderly/helm-$HELM_VERSION-$GO_VERSION"
HELM="$CACHE/bin/helm"
STAMP="$CACHE/helm.sha256"
# the operator's CRD models (operator-models.txt), under the hash of the file that pins them
MODELS_PIN="$(dirname "$0")/operator-models.txt"
MODELS="$HOME/.cache/orderly/operator-models-$(sha256sum "$MODELS_PIN" | cut -c1-12)"

models_usable() {
  [ -f "$MODELS/.installed" ] && [ -d "$MODELS/cloudcoil/models/prometheus_operator" ]
}

usable() {
  [ -x "$HELM" ] && [ -s "$STAMP" ] && (cd "$CACHE/bin" && sha256sum --check --status "$STAMP") \
    && go version -m "$HELM" | grep -qxF "$(printf '\tmod\t%s\t%s\t%s' "$HELM_MODULE" "$HELM_VERSION" "$HELM_SUM")"
}

if [ "${1:-}" = --check ]; then  # the tests: helm's path and the models' folder, or fail (never build in a test)
  usable || { echo "helm-tools: no helm $HELM_VERSION at $HELM: run make helm-tools" >&2; exit 1; }
  models_usable || { echo "helm-tools: no operator CRD models in $MODELS: run make helm-tools" >&2; exit 1; }
  echo "$HELM"; echo "$MODELS"; exit 0
fi
if ! models_usable; then
  rm -rf "$MODELS"
  "${PYTHON:-python3}" -m pip install --quiet --disable-pip-version-check --root-user-action=ignore --no-deps --require-hashes --target "$MODELS" \
    -r "$MODELS_PIN"
  touch "$MODELS/.installed"
fi
if ! usable; then
  # No way around the checksum database: nothing may exempt helm's modules from it.
  for variable in GONOSUMDB GONOSUMCHECK GOPRIVATE GOINSECURE GOFLAGS; do
    case "$(go env "$variable")" in *insecure*|*helm.sh*|*k8s.io*|*"*"*) echo "helm-tools: $variable=$(go env "$variable") would skip the module checksums; unset it" >&2; exit 1;; esac
  done
  [ "$(go env GOSUMDB)" != off ] || { echo "helm-tools: GOSUMDB=off would skip the module checksums; unset it" >&2; exit 1; }
  sum=$(cd /tmp && go mod download -json "$HELM_MODULE@$HELM_VERSION" | sed -n 's/^\t"Sum": "\(.*\)",$/\1/p')
  [ "$sum" = "$HELM_SUM" ] || { echo "helm-tools: $HELM_MODULE@$HELM_VERSION has sum '$sum', pinned $HELM_SUM" >&2; exit 1; }
  rm -rf "$CACHE" && mkdir -p "$CACHE/bin"
  start=$(date +%s)
  # the heavy lock: two cores are shared with the other heavy jobs (helper-brief); -trimpath for a
  # binary that does not depend on where the module cache is
  (cd /tmp && flock /tmp/orderly-heavy.lock env GOBIN="$CACHE/bin" GOFLAGS="-trimpath -buildvcs=false -mod=readonly" \
     go install "$HELM_MODULE/cmd/helm@$HELM_VERSION")
  (cd "$CACHE/bin" && sha256sum helm > "$STAMP")
  echo "helm-tools: built helm $HELM_VERSION with $GO_VERSION in $(( $(date +%s) - start )) s" >&2
  usable || { echo "helm-tools: the built helm is not $HELM_MODULE $HELM_VERSION $HELM_SUM (go version -m)" >&2; exit 1; }
fi
echo "$HELM"

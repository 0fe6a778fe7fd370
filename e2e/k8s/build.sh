#!/usr/bin/env bash
# Build the binaries of a real Kubernetes control plane for the e2e tests, from Go modules.
#
# Usage:
#   bash e2e/k8s/build.sh             # build whatever is missing or has the wrong version
#   bash e2e/k8s/build.sh --force     # rebuild everything
#   bash e2e/k8s/build.sh kubectl helm   # only these components
#
# Components: etcd etcdctl kube-apiserver kube-controller-manager kube-scheduler kubectl
#             kwok helm kwok-stages
#
# Everything lives outside the repository, in ${VERTUMNUS_K8S_CACHE:-$HOME/.cache/vertumnus-k8s}:
#   bin/          the binaries (and nothing else)
#   kwok-stages/  kwok's Stage YAMLs, copied from its module so runs need no module cache
#   src/k8s/      the scratch Go module that builds Kubernetes
#   logs/         one build log per component
# GOPATH / GOCACHE keep Go's defaults (~/go, ~/.cache/go-build).
#
# Needs: Go >= 1.26 and the Go module proxy (nothing else from the network).
# A cold build takes ~20 minutes on 2 cores (kube-apiserver alone ~10); a run with
# everything built only checks versions and takes a few seconds. A component whose
# binary exists and reports the expected version is skipped.
set -euo pipefail

K8S_VERSION=v1.37.2           # k8s.io/kubernetes; staging modules are at v0.${K8S_VERSION#v1.}
ETCD_VERSION=v3.7.3
KWOK_VERSION=v0.8.0
HELM_VERSION=v3.22.0

CACHE="${VERTUMNUS_K8S_CACHE:-$HOME/.cache/vertumnus-k8s}"
BIN="$CACHE/bin"
LOGS="$CACHE/logs"
SRC="$CACHE/src/k8s"
STAGES="$CACHE/kwok-stages"

ALL=(etcd etcdctl kwok kwok-stages helm kubectl kube-scheduler kube-controller-manager kube-apiserver)

say() { printf '[build.sh] %s\n' "$*"; }
die() { printf '[build.sh] ERROR: %s\n' "$*" >&2; exit 1; }

force=0
wanted=()
for arg in "$@"; do
    case "$arg" in
        --force) force=1 ;;
        -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        -*) die "unknown option $arg (see --help)" ;;
        *) [[ " ${ALL[*]} " == *" $arg "* ]] || die "unknown component '$arg'; known: ${ALL[*]}"
           wanted+=("$arg") ;;
    esac
done
[[ ${#wanted[@]} -gt 0 ]] || wanted=("${ALL[@]}")

command -v go >/dev/null || die "the Go toolchain (go >= 1.26) is not on PATH; install it first"
mkdir -p "$BIN" "$LOGS" "$CACHE/src"

# Two concurrent builds (a human and a pytest session) would race on the same files.
if command -v flock >/dev/null; then
    exec 9>"$CACHE/.build.lock"
    flock -n 9 || { say "another build.sh holds $CACHE/.build.lock; waiting for it"; flock 9; }
fi

export CGO_ENABLED=0
# A fixed date keeps the link step cacheable (go's cache keys include the ldflags).
BUILD_DATE=1970-01-01T00:00:00Z
k8s_ldflags() {
    local flags="-s -w" pkg
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        flags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$(cut -d. -f2 <<<"$K8S_VERSION")"
        flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$BUILD_DATE"
    done
    printf '%s' "$flags"
}

# The version a binary reports, compared with what this script builds; skipping relies on it.
has_version() {
    local name=$1 path="$BIN/$1" out
    if [[ "$name" == kwok-stages ]]; then
        [[ -f "$STAGES/.version" && "$(cat "$STAGES/.version")" == "$KWOK_VERSION" ]]
        return
    fi
    [[ -x "$path" ]] || return 1
    case "$name" in
        kubectl) out=$("$path" version --client 2>/dev/null) || return 1
                 [[ "$out" == *"Client Version: $K8S_VERSION"* ]] ;;
        kube-*)  out=$("$path" --version 2>/dev/null) || return 1
                 [[ "$out" == "Kubernetes $K8S_VERSION" ]] ;;
        etcd)    out=$("$path" --version 2>/dev/null) || return 1
                 [[ "$out" == *"etcd Version: ${ETCD_VERSION#v}"* ]] ;;
        etcdctl) out=$("$path" version 2>/dev/null) || return 1
                 [[ "$out" == *"etcdctl version: ${ETCD_VERSION#v}"* ]] ;;
        kwok)    out=$("$path" --version 2>/dev/null) || return 1
                 [[ "$out" == *"$KWOK_VERSION "* ]] ;;
        helm)    out=$("$path" version --short 2>/dev/null) || return 1
                 [[ "$out" == "$HELM_VERSION"* ]] ;;
    esac
}

# `go install mod/pkg@version` into a temporary GOBIN, then move the result into bin/ under
# our name (go names a /v3 package after the element before it, e.g. etcd's "server").
go_install() {
    local name=$1 pkg=$2 ldflags=$3 tmp
    tmp=$(mktemp -d "$CACHE/.gobin.XXXXXX")
    GOBIN="$tmp" go install -trimpath -ldflags "$ldflags" "$pkg"
    local built
    built=$(find "$tmp" -maxdepth 1 -type f | head -n1)
    [[ -n "$built" ]] || { rm -rf "$tmp"; echo "go install produced no binary" >&2; return 1; }
    mv -f "$built" "$BIN/$name"
    rm -rf "$tmp"
}

# etcd's go.mod replaces its sibling modules with ../ paths, which `go install pkg@version`
# refuses; a scratch module requiring it (where those replaces do not apply, and the siblings
# resolve to the same release) builds the same code. One module per binary, so neither
# raises the other's dependencies.
build_in_scratch_module() {
    local name=$1 pkg=$2 version=$3 dir="$CACHE/src/$1"
    if [[ ! -f "$dir/.prepared" || "$(cat "$dir/.prepared")" != "$version" ]]; then
        rm -rf "$dir"
        mkdir -p "$dir"
        printf '// Generated by e2e/k8s/build.sh.\nmodule vertumnus.local/%s-build\n\ngo 1.26\n' "$name" >"$dir/go.mod"
        (cd "$dir" && go get "$pkg@$version")
        echo "$version" >"$dir/.prepared"
    fi
    (cd "$dir" && go build -trimpath -ldflags "-s -w" -o "$BIN/.$name.tmp" "$pkg")
    mv -f "$BIN/.$name.tmp" "$BIN/$name"
}

# The scratch module that pins k8s.io/kubernetes and points every staging module
# (required at v0.0.0 by kubernetes' go.mod, resolved by ./staging there) at its release.
prepare_k8s_module() {
    [[ -f "$SRC/.prepared" && "$(cat "$SRC/.prepared")" == "$K8S_VERSION" ]] && return 0
    say "preparing the scratch module in $SRC (downloads Kubernetes' dependencies)"
    rm -rf "$SRC"
    mkdir -p "$SRC"
    local gomod staging_version="v0.${K8S_VERSION#v1.}"
    gomod=$(cd "$SRC" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
        sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
    [[ -f "$gomod" ]] || { echo "could not download k8s.io/kubernetes@$K8S_VERSION's go.mod" >&2; return 1; }
    {
        echo "// Generated by e2e/k8s/build.sh: builds Kubernetes $K8S_VERSION from modules."
        echo "module vertumnus.local/k8s-build"
        echo
        echo "go $(sed -n 's/^go \([0-9.]*\)$/\1/p' "$gomod")"
        echo
        echo "require k8s.io/kubernetes $K8S_VERSION"
        echo
        # sample-cli-plugin and sample-controller are not required by kubernetes (and the
        # proxy refuses them), so they never appear in this list.
        awk '/^[[:space:]]+k8s\.io\/[A-Za-z0-9._-]+ v0\.0\.0$/ {print $1}' "$gomod" | sort -u |
            while read -r mod; do echo "replace $mod => $mod $staging_version"; done
    } >"$SRC/go.mod"
    (cd "$SRC" && go get "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION" \
        "k8s.io/kubernetes/cmd/kube-scheduler@$K8S_VERSION" \
        "k8s.io/kubernetes/cmd/kube-controller-manager@$K8S_VERSION" \
        "k8s.io/kubernetes/cmd/kubectl@$K8S_VERSION")
    echo "$K8S_VERSION" >"$SRC/.prepared"
}

build_k8s() {
    local name=$1
    prepare_k8s_module
    (cd "$SRC" && go build -trimpath -ldflags "$(k8s_ldflags)" -o "$BIN/.$name.tmp" "k8s.io/kubernetes/cmd/$name")
    mv -f "$BIN/.$name.tmp" "$BIN/$name"
}

copy_kwok_stages() {
    local dir
    dir="$(go env GOMODCACHE)/sigs.k8s.io/kwok@$KWOK_VERSION"
    [[ -d "$dir" ]] || go mod download "sigs.k8s.io/kwok@$KWOK_VERSION"
    dir+=/kustomize/stage
    rm -rf "$STAGES"
    mkdir -p "$STAGES"
    # kustomization.yaml files are not Stages; kwok would reject them.
    cp "$dir/node/fast/node-initialize.yaml" \
       "$dir"/node/heartbeat-with-lease/node-*.yaml \
       "$dir/pod/fast/pod-ready.yaml" "$dir/pod/fast/pod-complete.yaml" "$dir/pod/fast/pod-delete.yaml" \
       "$STAGES/"
    chmod u+w "$STAGES"/*.yaml   # the module cache is read-only; keep the copies removable
    echo "$KWOK_VERSION" >"$STAGES/.version"
    ls "$STAGES"
}

build_component() {
    case "$1" in
        etcd)    build_in_scratch_module etcd go.etcd.io/etcd/server/v3 "$ETCD_VERSION" ;;
        etcdctl) build_in_scratch_module etcdctl go.etcd.io/etcd/etcdctl/v3 "$ETCD_VERSION" ;;
        kwok)    go_install kwok "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" "-s -w" ;;
        helm)    go_install helm "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" \
                     "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean" ;;
        kwok-stages) copy_kwok_stages ;;
        kube-*|kubectl) build_k8s "$1" ;;
    esac
}

total_start=$SECONDS
for name in "${wanted[@]}"; do
    if [[ $force -eq 0 ]] && has_version "$name"; then
        say "$name: up to date, skipped"
        continue
    fi
    log="$LOGS/$name.log"
    say "$name: building (log: $log)"
    start=$SECONDS
    # A subshell, not `if ! build_component`: bash ignores `set -e` inside a function that is
    # called as a condition, so a failing step in the middle would go unnoticed.
    set +e
    (set -e; build_component "$name") >"$log" 2>&1
    rc=$?
    set -e
    if [[ $rc -ne 0 ]]; then
        printf '[build.sh] ERROR: building %s failed after %d s; last lines of %s:\n' \
            "$name" $((SECONDS - start)) "$log" >&2
        tail -n 25 "$log" | sed 's/^/    /' >&2
        die "build of $name failed (full log: $log)"
    fi
    has_version "$name" || die "$name was built but does not report the expected version (log: $log)"
    say "$name: built in $((SECONDS - start)) s"
done
say "all done in $((SECONDS - total_start)) s; binaries in $BIN"

#!/usr/bin/env bash
# Build the gpt2dist image from containers/Dockerfile, then stamp it with where it came from:
# labels and /opt/gpt2dist/image.json name the base it was built on (the reference, and the ID
# and digests as the engine reports them) and the ID of the built image. gpt2dist doctor and every
# run.json read that file inside the image. An image cannot hold its own ID (the ID is a hash of
# its content), so the stamp names the image it was added to: `content_id`, the image that
# `podman/docker image inspect` shows under the label org.gpt2dist.content-id.
#
# Usage: containers/build_image.sh [--variant gpu|cpu] [--base IMAGE] [--tag TAG]
#        (defaults: gpu, nvcr.io/nvidia/pytorch:25.05-py3, gpt2dist:25.05 or gpt2dist:25.05-cpu)
# Env:   ENGINE      podman or docker (default: podman when installed)
#        PIP_CERT    a CA bundle for pip where a proxy re-signs TLS (podman: mounted for the build)
#        GPT2DIST_WHEEL_CACHE  podman: the host folder mounted as the build's wheel cache, so
#                    Horovod compiles once per toolchain (default ~/.cache/gpt2dist/wheels)
#        APEX_SRC    podman: Apex's source (.tar.gz of tag 25.05) mounted into the gpu build, for machines
#                    that cannot reach GitHub
set -euo pipefail
cd "$(dirname "$0")/.."

die() { echo "error: build_image: $*" >&2; exit 2; }
variant=gpu base=nvcr.io/nvidia/pytorch:25.05-py3 tag=
while [[ $# -gt 0 ]]; do
  case $1 in
    --variant) variant=${2:-}; shift 2 ;;
    --base) base=${2:-}; shift 2 ;;
    --tag) tag=${2:-}; shift 2 ;;
    *) die "unknown argument '$1' (use --variant gpu|cpu, --base IMAGE, --tag TAG)" ;;
  esac
done
[[ $variant == gpu || $variant == cpu ]] || die "--variant is '$variant'; use gpu or cpu"
[[ -n $base ]] || die "--base needs an image reference"
tag=${tag:-gpt2dist:25.05$([[ $variant == cpu ]] && echo -cpu)}
engine=${ENGINE:-$(command -v podman >/dev/null && echo podman || echo docker)}
command -v "$engine" >/dev/null || die "$engine not found; install podman or docker, or set ENGINE"

# Build from exactly the base that was inspected: pull it once, then never again during the build.
"$engine" image inspect "$base" >/dev/null 2>&1 || "$engine" pull "$base" \
  || die "the base image '$base' is neither here nor pullable; pass --base"
base_id=$("$engine" image inspect --format '{{.Id}}' "$base")
base_digests=$("$engine" image inspect --format '{{join .RepoDigests " "}}' "$base")

work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
args=(-f containers/Dockerfile --build-arg "BASE_IMAGE=$base" --build-arg "VARIANT=$variant" --iidfile "$work/content.id")
if [[ $engine == podman ]]; then
  wheels=${GPT2DIST_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpt2dist/wheels}
  mkdir -p "$wheels"
  args+=(--format docker --pull=never --network host -v "$wheels:/opt/gpt2dist/wheels")
  if [[ -n ${PIP_CERT:-} ]]; then
    [[ -f $PIP_CERT ]] || die "PIP_CERT names '$PIP_CERT', which is not a file"
    args+=(-v "$PIP_CERT:/run/pip-ca.crt:ro" --build-arg PIP_CERT=/run/pip-ca.crt)
  fi
  if [[ -n ${APEX_SRC:-} ]]; then
    [[ -f $APEX_SRC ]] || die "APEX_SRC names '$APEX_SRC', which is not a file (Apex's .tar.gz)"
    args+=(-v "$(realpath "$APEX_SRC"):/run/apex-src.tar.gz:ro" --build-arg APEX_SRC=/run/apex-src.tar.gz)
  fi
elif [[ -n ${APEX_SRC:-} ]]; then
  die "APEX_SRC is mounted into the build, which only podman does here; use ENGINE=podman or a reachable GitHub"
fi
"$engine" build "${args[@]}" . || die "the $variant image did not build (the step that failed is above)"
content_id=$(cat "$work/content.id")

revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
created=$(date -u +%Y-%m-%dT%H:%M:%SZ)
json_list() { local out="" item; for item in "$@"; do out+="${out:+, }\"$item\""; done; echo "[$out]"; }
# shellcheck disable=SC2086  # the digests are space-separated on purpose
cat > "$work/image.json" <<JSON
{"variant": "$variant", "content_id": "$content_id", "revision": "$revision", "created": "$created",
 "engine": "$engine", "base": {"name": "$base", "id": "$base_id", "digests": $(json_list $base_digests)}}
JSON
cat > "$work/Containerfile" <<STAMP
FROM $content_id
LABEL org.opencontainers.image.base.name="$base" org.gpt2dist.base.id="$base_id" \\
      org.gpt2dist.content-id="$content_id" org.gpt2dist.variant="$variant" \\
      org.opencontainers.image.revision="$revision" org.opencontainers.image.created="$created"
COPY image.json /opt/gpt2dist/image.json
STAMP
replaced=$("$engine" image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
"$engine" build -q -t "$tag" --iidfile "$work/image.id" -f "$work/Containerfile" "$work" >/dev/null
# The image this tag named before, untagged now: removed unless something still uses it.
if [[ -n $replaced && $(cat "$work/image.id") != *"$replaced"* ]]; then
  "$engine" rmi "$replaced" >/dev/null 2>&1 || true
fi
echo "build_image: $tag is $(cat "$work/image.id") ($variant, content $content_id, base $base $base_id)"

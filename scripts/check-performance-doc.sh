#!/usr/bin/env bash
# Checks that docs/performance.md is not stale: the commit it states ("from commit `abc1234`")
# must be an ancestor of HEAD, with at most MAX_BEHIND non-merge commits since then that touch
# the compute code (mixer-core, mixer-cpu, mixer-cuda, registry sources). Regenerate the doc
# with scripts/performance.sh on a quiet machine when this fails.
set -euo pipefail
cd "$(dirname "$0")/.."
doc=docs/performance.md
max_behind=${MAX_BEHIND:-25}
commit=$(tr '\n' ' ' <"$doc" | grep -o -m1 'from commit `[0-9a-f]\{7,40\}`' | grep -o '[0-9a-f]\{7,40\}' | head -n1 || true)
if [ -z "$commit" ]; then
  echo "error: $doc does not state the commit it was generated from (\"from commit \`<hash>\`\")" >&2
  exit 1
fi
if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
  echo "error: $doc names commit $commit, which is not in this repository (shallow clone? fetch the history)" >&2
  exit 1
fi
if ! git merge-base --is-ancestor "$commit" HEAD; then
  echo "error: $doc was generated from $commit, which is not an ancestor of HEAD; regenerate it with scripts/performance.sh" >&2
  exit 1
fi
behind=$(git rev-list --count --no-merges "$commit..HEAD" -- mixer-core/src mixer-cpu/src mixer-cuda/src mixer-cuda/kernels registry/src)
if [ "$behind" -gt "$max_behind" ]; then
  echo "error: $doc was generated from $commit, $behind commits to the compute code ago (at most $max_behind allowed); regenerate it with scripts/performance.sh on a quiet machine" >&2
  exit 1
fi
echo "$doc: generated from $commit, $behind compute-code commits behind HEAD (at most $max_behind allowed)"

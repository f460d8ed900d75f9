#!/usr/bin/env bash
# The documentation's commands as a user runs them (CTest: docs_commands): every ```sh block of
# docs/distributed.md and docs/sequence-parallel.md, in the page's order, from the repository root
# after the README's build, each block a `bash -e -o pipefail` script, so that any command of it
# that exits non-zero fails the test, which names the page, the block and its output.
#
# - The root is a scratch folder holding links to the repository's top-level entries (build/ and
#   runs/ left out), so the commands' outputs (runs/...) land there, never in the checkout; later
#   blocks of a page see the files of earlier ones, as the reader's shell would.
# - `./build/clattn` is replaced by the binary under test ($1); `../shared/data` from that root is a
#   link to the real data (CLATTN_DATA, else the checkout's ../shared/data). Without the data the
#   blocks that read it are skipped, or fail where the data is required (CI, CLATTN_REQUIRE_DATA).
# - Markers: a block whose info string is exactly `sh` runs. `sh multinode` (it needs a cluster:
#   hostfiles, SLURM) and `sh long` (minutes of compute or gigabytes per rank: the measured
#   figures) are not run, only read by `bash -n`; any other word after `sh` is a failure, so
#   that a misspelt marker cannot skip a block unnoticed.
# - Root: CI runs this as root. The pages tell a root user to pass --allow-run-as-root to mpirun,
#   so the test unsets OMPI_ALLOW_RUN_AS_ROOT and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM: a page's mpirun
#   line without the flag fails here as it would for that user. Nothing else of Open MPI is set
#   (no btl choice, no oversubscription): the pages' flags must suffice.
# Usage: bash tests/cli/docs_commands.sh /path/to/clattn
set -u
bin=${1:?usage: docs_commands.sh /path/to/clattn}
bin=$(cd "$(dirname "$bin")" && pwd)/$(basename "$bin")
source "$(dirname "$0")/lib.sh"
src=$(cd "$(dirname "$0")/../.." && pwd)
pages=(docs/distributed.md docs/sequence-parallel.md)
t_start=$SECONDS
command -v mpirun >/dev/null || { bad "mpirun not found (scripts/install-deps.sh installs openmpi-bin)"; finish "docs commands: "; exit; }
unset OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM

root=$dir/repo
mkdir -p "$root" "$dir/shared" "$dir/blocks"
for e in "$src"/* "$src"/.[!.]*; do
  [ -e "$e" ] || continue
  case ${e##*/} in build | runs | .git) continue ;; esac
  ln -s "$e" "$root/${e##*/}"
done
have_data=1
need_data "the blocks that read ../shared/data" tinyshakespeare/input.txt || have_data=0
[ -d "$data" ] && ln -s "$(cd "$data" && pwd)" "$dir/shared/data"
quoted_bin=$(printf '%q' "$bin")

for page in "${pages[@]}"; do
  name=$(basename "$page" .md)
  # Each ```sh block to blocks/NAME.NN, its first line number to .line and its marker to .info.
  if ! awk -v out="$dir/blocks/$name" '
      !inb && /^```sh([ \t]|$)/ {
        inb = 1; n++; start = NR; f = sprintf("%s.%02d", out, n)
        info = substr($0, 6); gsub(/^[ \t]+|[ \t]+$/, "", info)
        print NR > (f ".line"); print info > (f ".info"); printf "" > f; next
      }
      inb && /^```[ \t]*$/ { inb = 0; close(f); close(f ".line"); close(f ".info"); next }
      inb { print > f }
      END { if (inb) { print "the ```sh block at line " start " is never closed" > "/dev/stderr"; exit 1 } }
    ' "$src/$page" 2>"$dir/err"; then
    bad "$page: $(cat "$dir/err")"
    continue
  fi
  ran=0
  for b in "$dir/blocks/$name".[0-9][0-9]; do
    [ -e "$b" ] || continue
    line=$(cat "$b.line")
    info=$(cat "$b.info")
    what="$page, the sh block at line $line"
    case $info in
      "") ;;
      multinode | long)
        # Not run, but read by bash: a broken quote or here-document still fails.
        if bash -n "$b" 2>"$dir/err"; then ok; echo "skipped $what (sh $info; its syntax checked)"
        else bad "$what (sh $info): not valid bash: $(cat "$dir/err")"; fi
        continue ;;
      *) bad "$what: unknown marker 'sh $info' (sh, sh multinode or sh long)"; continue ;;
    esac
    if [ "$have_data" = 0 ] && grep -q '\.\./shared/data' "$b"; then
      echo "skipped $what: it reads ../shared/data"
      continue
    fi
    text=$(cat "$b")
    printf '%s\n' "${text//.\/build\/clattn/$quoted_bin}" >"$b.run"
    t0=$SECONDS
    (cd "$root" && timeout 300 bash -e -o pipefail "$b.run") </dev/null >"$b.out" 2>&1
    rc=$?
    ran=$((ran + 1))
    if [ "$rc" = 0 ]; then
      ok
      echo "ok: $what ($((SECONDS - t0)) s)"
    else
      bad "$what: exit $rc$([ "$rc" = 124 ] && echo ' (timed out after 300 s)'); the block:
$(cat "$b")
its output (the end):
$(tail -c 2000 "$b.out")"
    fi
  done
  [ "$ran" -gt 0 ] || [ "$have_data" = 0 ] || bad "$page: no sh block ran (is the page's fence still \`\`\`sh?)"
done
echo "docs commands: $((SECONDS - t_start)) s"
finish "docs commands: "

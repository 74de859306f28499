#!/usr/bin/env bash
# Runs `python -m launch.train --distributed` on every worker of a Cloud TPU VM slice (DESIGN 3.8): creates the
# slice or reuses it, copies the code (a git archive of --ref, or a git clone of --repo at --ref on every worker),
# installs it (launch/setup_venv.sh run, then the tpu extra: jax[tpu]), and runs the same command on all workers at
# once with `gcloud compute tpus tpu-vm ssh --worker=all`, their logs streamed here (and kept in ~/evolver-train.log
# on each worker).
#
#   bash launch/tpu_pod.sh --name=my-v5p --zone=us-east5-a --accelerator=v5p-64 \
#     --gin_file=gin_configs/real/qwen2_5_7b_grpo_exp_v5p64.gin --model_dir=gs://my-bucket/runs/qwen7b \
#     --gin_bindings="HF_CHECKPOINT='/data/Qwen2.5-7B-Instruct'"
#   bash launch/tpu_pod.sh --dry_run     # prints the commands (placeholder names where none are given), runs nothing
#
# Flags (--flag=value or --flag value):
#   --name NAME           the TPU VM slice
#   --zone ZONE           its zone
#   --project PROJECT     its project (default: gcloud's configured one)
#   --accelerator TYPE    slice type (default v5p-64)
#   --version VERSION     TPU VM runtime (default by accelerator: v5p v2-alpha-tpuv5, v5litepod v2-alpha-tpuv5-lite,
#                         v6e v2-alpha-tpuv6e, v4 tpu-ubuntu2204-base)
#   --create | --reuse    create the slice, or use an existing one (default: create it unless it exists)
#   --gin_file FILE       repeatable, passed to launch.train as given (paths relative to the repository)
#   --gin_bindings B      repeatable, passed to launch.train as given
#   --model_dir DIR       the run directory, shared by the workers (gs://...): MODEL_DIR
#   --ref REF             what to run (default HEAD): only committed code travels
#   --repo URL            clone URL on every worker instead of copying an archive from here
#   --remote_dir DIR      where the code lives on the workers (default evolver, under the home directory)
#   --dry_run             print every command, one per line, shell-quoted, and run nothing
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

usage() {
  sed -n '/^# Flags/,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2
}

die() {
  echo "tpu_pod.sh: error: $*" >&2
  exit 2
}

NAME="" ZONE="" PROJECT="" ACCELERATOR="v5p-64" VERSION="" MODE="auto" MODEL_DIR="" REF="HEAD" REPO=""
REMOTE_DIR="evolver" DRY_RUN=0
GIN_FILES=() GIN_BINDINGS=()

while [ $# -gt 0 ]; do
  arg="$1"
  shift
  case "$arg" in
    --dry_run) DRY_RUN=1; continue ;;
    --create) MODE="create"; continue ;;
    --reuse) MODE="reuse"; continue ;;
    -h|--help) usage; exit 0 ;;
    --*=*) flag="${arg%%=*}" value="${arg#*=}" ;;
    --*)
      flag="$arg"
      case "$flag" in
        --name|--zone|--project|--accelerator|--version|--gin_file|--gin_bindings|--model_dir|--ref|--repo|--remote_dir)
          [ $# -gt 0 ] || die "$flag needs a value"
          value="$1"
          shift ;;
        *) usage; die "unknown flag $flag" ;;
      esac ;;
    *) usage; die "unexpected argument '$arg' (flags are --name=VALUE ...)" ;;
  esac
  case "$flag" in
    --name) NAME="$value" ;;
    --zone) ZONE="$value" ;;
    --project) PROJECT="$value" ;;
    --accelerator) ACCELERATOR="$value" ;;
    --version) VERSION="$value" ;;
    --gin_file) GIN_FILES+=("$value") ;;
    --gin_bindings) GIN_BINDINGS+=("$value") ;;
    --model_dir) MODEL_DIR="$value" ;;
    --ref) REF="$value" ;;
    --repo) REPO="$value" ;;
    --remote_dir) REMOTE_DIR="$value" ;;
    *) usage; die "unknown flag $flag" ;;
  esac
done

# Placeholders stand in for what a dry run was not told; a real run must be told.
if [ "$DRY_RUN" = 1 ]; then
  NAME="${NAME:-TPU_NAME}" ZONE="${ZONE:-ZONE}" MODEL_DIR="${MODEL_DIR:-gs://BUCKET/evolver-run}"
  [ ${#GIN_FILES[@]} -gt 0 ] || GIN_FILES=("gin_configs/real/qwen2_5_7b_grpo_exp_v5p64.gin")
else
  [ -n "$NAME" ] || die "give --name=NAME (the TPU VM slice), or --dry_run to see the commands"
  [ -n "$ZONE" ] || die "give --zone=ZONE"
  [ -n "$MODEL_DIR" ] || die "give --model_dir=gs://BUCKET/RUN (a directory every worker writes to)"
  [ ${#GIN_FILES[@]} -gt 0 ] || die "give at least one --gin_file"
  command -v gcloud >/dev/null 2>&1 || die "gcloud not found: install the Google Cloud SDK \
(https://cloud.google.com/sdk/docs/install) and log in (gcloud auth login); --dry_run prints the commands without it"
fi
case "$MODEL_DIR" in *"'"*) die "--model_dir must not contain a single quote: $MODEL_DIR" ;; esac
case "$REMOTE_DIR" in /*|*" "*|*"'"*|"") die "--remote_dir must be a relative path without spaces or quotes" ;; esac

if [ -z "$VERSION" ]; then
  case "$ACCELERATOR" in
    v5p-*) VERSION="v2-alpha-tpuv5" ;;
    v5litepod-*|v5e-*) VERSION="v2-alpha-tpuv5-lite" ;;
    v6e-*) VERSION="v2-alpha-tpuv6e" ;;
    v4-*) VERSION="tpu-ubuntu2204-base" ;;
    *) die "no default runtime for --accelerator=$ACCELERATOR: give --version" ;;
  esac
fi

# --- the commands -------------------------------------------------------------------------------------------------

LOCATION=(--zone="$ZONE")
[ -z "$PROJECT" ] || LOCATION+=(--project="$PROJECT")

# Words quoted for a POSIX shell, one line, readably: a word as it is when safe; else in single quotes, or, when it
# holds a single quote, in double quotes (\ and " escaped) unless it also holds $ or ` (then single quotes, each
# ' as '"'"'); a flag's value is quoted after its `=`.
quote() {
  local out="" word prefix
  for word in "$@"; do
    prefix=""
    if [[ "$word" =~ ^(--[A-Za-z0-9_-]+=)(.*)$ ]]; then
      prefix="${BASH_REMATCH[1]}" word="${BASH_REMATCH[2]}"
    fi
    if [[ -n "$word" && "$word" =~ ^[A-Za-z0-9_@%+=:,./-]+$ ]]; then
      out+="$prefix$word "
    elif [[ "$word" != *"'"* ]]; then
      out+="$prefix'$word' "
    elif [[ "$word" != *[\$\`]* ]]; then
      word="${word//\\/\\\\}" word="${word//\"/\\\"}"
      out+="$prefix\"$word\" "
    else
      out+="$prefix'${word//\'/\'\"\'\"\'}' "
    fi
  done
  echo "${out% }"
}

# One command: printed quoted (dry run), else printed to stderr and run.
run() {
  if [ "$DRY_RUN" = 1 ]; then
    quote "$@"
  else
    echo "+ $(quote "$@")" >&2
    "$@"
  fi
}

on_workers() {
  run gcloud compute tpus tpu-vm ssh "$NAME" "${LOCATION[@]}" --worker=all --command="$1"
}

CREATE=(gcloud compute tpus tpu-vm create "$NAME" "${LOCATION[@]}" --accelerator-type="$ACCELERATOR"
        --version="$VERSION")
DESCRIBE=(gcloud compute tpus tpu-vm describe "$NAME" "${LOCATION[@]}" --format=value\(state\))
case "$MODE" in
  create) run "${CREATE[@]}" ;;
  reuse) run "${DESCRIBE[@]}" ;;
  auto)
    if [ "$DRY_RUN" = 1 ]; then
      run "${DESCRIBE[@]}"
      echo "# if the describe above fails (no such slice):"
      run "${CREATE[@]}"
    elif ! "${DESCRIBE[@]}" >/dev/null 2>&1; then
      run "${CREATE[@]}"
    else
      echo "+ reusing TPU VM $NAME" >&2
    fi ;;
esac

# The code: committed work only, so every worker runs the same, known tree.
DIR="$(quote "$REMOTE_DIR")"
if [ -n "$REPO" ]; then
  on_workers "rm -rf $DIR && git clone --quiet $(quote "$REPO") $DIR && git -C $DIR checkout --quiet $(quote "$REF")"
else
  if [ "$DRY_RUN" = 0 ] && [ -n "$(git -C "$ROOT" status --porcelain --untracked-files=no)" ]; then
    echo "tpu_pod.sh: note: uncommitted changes are not copied (the workers run $REF)" >&2
  fi
  ARCHIVE="${TMPDIR:-/tmp}/evolver-$NAME.tar.gz"
  run git -C "$ROOT" archive --format=tar.gz --output="$ARCHIVE" "$REF"
  run gcloud compute tpus tpu-vm scp "$ARCHIVE" "$NAME":evolver.tar.gz "${LOCATION[@]}" --worker=all
  on_workers "rm -rf $DIR && mkdir -p $DIR && tar -xzf evolver.tar.gz -C $DIR"
fi

# Install: evolver and what it runs, then JAX's TPU runtime (the tpu extra).
on_workers "cd $DIR && source launch/setup_venv.sh run && python -m pip install --quiet -e '.[tpu]'"

# Run: the same command on every worker; JAX finds the slice's other hosts itself (--distributed).
TRAIN=(python -m launch.train --distributed)
for f in "${GIN_FILES[@]}"; do TRAIN+=("--gin_file=$f"); done
TRAIN+=("--gin_bindings=MODEL_DIR='$MODEL_DIR'")
for b in ${GIN_BINDINGS[@]+"${GIN_BINDINGS[@]}"}; do TRAIN+=("--gin_bindings=$b"); done
on_workers "cd $DIR && source .venv/bin/activate && set -o pipefail && $(quote "${TRAIN[@]}") 2>&1 \
| tee -a ~/evolver-train.log"

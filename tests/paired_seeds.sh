#!/usr/bin/env bash
# Compares two job configs' test AUC over initial seeds, paired: for each
# seed, config A and config B are run one after the other by
# deploy/local/demo.sh from the same initial model values, and the paired
# difference B - A is summarised (mean, standard error, median).
#
#   tests/paired_seeds.sh [--seeds=1-8] [--out=FILE] CONFIG_A CONFIG_B
#
# One run of a job says little when its AUC moves with the seed by more than
# the difference asked about (docs/notes/2026-11-30-hybrid-quality.md: the
# DLRM examples move by up to 0.045); pairing by seed removes the spread the
# two configs share. Used for "sparse async, dense all-reduced against BSP":
#   tests/paired_seeds.sh --seeds=1-24 examples/ctr/dlrm.pbtxt examples/ctr/dlrm_hybrid.pbtxt
#   tests/paired_seeds.sh --seeds=1-24 examples/python/dlrm_bsp.pbtxt examples/python/dlrm_allreduce.pbtxt
#
# The seed: a config whose workers are the C++ trainer gets
# training.model.init_seed; one with launch.worker_command gets "--seed=N"
# appended to the command (examples/python/dlrm_torch.py reads it). The data
# stay the same (data.*.seed is not touched).
#
# --seeds: a list of numbers and ranges (1-8,20,30-31). --out: a file that
# keeps one line per seed ("seed auc_a auc_b"); seeds already in it are not
# run again, so an interrupted comparison resumes, and the summary covers
# every seed in the file. Each run's logs stay in .runs/ (demo.sh).
#
# Prints a line per seed and the summary on stderr, and on stdout one JSON
# line: {"bench":"paired_seeds","metric":"test_auc_delta_mean","value":...,
# "se":...,"median":...,"seeds":N,"a_mean":...,"b_mean":...,"a":"...","b":"...",
# "per_seed":[[seed,a,b],...]}. Exits 1 when a run gave no test AUC, 2 on a
# usage error.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

usage() {
  echo "usage: tests/paired_seeds.sh [--seeds=LIST] [--out=FILE] CONFIG_A CONFIG_B" >&2
  exit 2
}

SEEDS="1-8"
OUT=""
configs=()
for arg in "$@"; do
  case "$arg" in
    --seeds=*) SEEDS="${arg#--seeds=}" ;;
    --out=*) OUT="${arg#--out=}" ;;
    -h | --help) usage ;;
    -*) echo "tests/paired_seeds.sh: unknown flag '$arg'" >&2; usage ;;
    *) configs+=("$arg") ;;
  esac
done
[ ${#configs[@]} -eq 2 ] || usage
for c in "${configs[@]}"; do
  [ -f "$c" ] || { echo "tests/paired_seeds.sh: no config file '$c'" >&2; exit 2; }
done

# "1-3,7" -> "1 2 3 7"
seed_list=()
IFS=',' read -r -a parts <<< "$SEEDS"
for p in "${parts[@]}"; do
  if [[ "$p" =~ ^([0-9]+)-([0-9]+)$ ]]; then
    for ((s = BASH_REMATCH[1]; s <= BASH_REMATCH[2]; s++)); do seed_list+=("$s"); done
  elif [[ "$p" =~ ^[0-9]+$ ]]; then
    seed_list+=("$p")
  else
    echo "tests/paired_seeds.sh: bad --seeds '$SEEDS'" >&2
    usage
  fi
done
[ ${#seed_list[@]} -gt 0 ] || usage

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
[ -n "$OUT" ] || OUT="$WORK/results"
touch "$OUT"

# Writes CONFIG with seed SEED to a file and prints its path. The copy
# lives elsewhere, so {config_dir} is replaced by the original's directory.
seeded_config() {
  local config="$1" seed="$2" tag="$3"
  local dir
  dir="$(cd "$(dirname "$config")" && pwd)"
  local copy="$WORK/$tag.pbtxt"
  if grep -q '^[^#]*worker_command' "$config"; then
    # The list's closing bracket on the same line: append the flag before it.
    sed -e "s#{config_dir}#$dir#g" \
        -e "/^[^#]*worker_command/ s#\]#, \"--seed=$seed\"]#" "$config" > "$copy"
  elif grep -q '^[^#]*init_seed:' "$config"; then
    sed -e "s#{config_dir}#$dir#g" \
        -e "s#^\([^#]*init_seed:\) *[0-9]*#\1 $seed#" "$config" > "$copy"
  else
    sed -e "s#{config_dir}#$dir#g" \
        -e "0,/^\([^#]*\<model *{\)/ s//\1 init_seed: $seed/" "$config" > "$copy"
  fi
  grep -q -e "--seed=$seed\"" -e "init_seed: $seed\b" "$copy" || {
    echo "tests/paired_seeds.sh: could not give $config seed $seed (one-line launch.worker_command, or training.model)" >&2
    exit 2
  }
  echo "$copy"
}

# The test AUC from demo.sh's last line (the job's JSON summary).
run_auc() {
  local config="$1" log="$2"
  if ! "$ROOT/deploy/local/demo.sh" "$config" > "$log" 2>&1; then
    echo "tests/paired_seeds.sh: the job failed; its output: $log" >&2
  fi
  tail -n 1 "$log" | grep -o '"test_auc": *[0-9.eE+-]*' | sed 's/.*: *//'
}

for seed in "${seed_list[@]}"; do
  if awk -v s="$seed" '$1 == s { found = 1 } END { exit !found }' "$OUT"; then
    continue
  fi
  a_cfg="$(seeded_config "${configs[0]}" "$seed" a)"
  b_cfg="$(seeded_config "${configs[1]}" "$seed" b)"
  a="$(run_auc "$a_cfg" "$WORK/a.log")"
  b="$(run_auc "$b_cfg" "$WORK/b.log")"
  if [ -z "$a" ] || [ -z "$b" ]; then
    echo "tests/paired_seeds.sh: seed $seed gave no test AUC (A: '${a}', B: '${b}')" >&2
    exit 1
  fi
  echo "$seed $a $b" >> "$OUT"
  awk -v s="$seed" -v a="$a" -v b="$b" \
    'BEGIN { printf "seed %s: A %.4f  B %.4f  B-A %+.4f\n", s, a, b, b - a }' >&2
done

# Mean, standard error and median of B - A over every seed in $OUT.
median="$(awk '{ print $3 - $2 }' "$OUT" | sort -g |
  awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }')"
awk -v a_name="${configs[0]}" -v b_name="${configs[1]}" -v median="$median" '
  { n++; d = $3 - $2; sd += d; sdd += d * d; sa += $2; sb += $3
    per = per (n > 1 ? "," : "") sprintf("[%d,%.6f,%.6f]", $1, $2, $3) }
  END {
    mean = sd / n
    var = n > 1 ? (sdd - n * mean * mean) / (n - 1) : 0
    if (var < 0) var = 0
    se = sqrt(var / n)
    printf "%d seeds: A mean %.4f, B mean %.4f; B-A mean %+.4f, standard error %.4f, median %+.4f\n",
      n, sa / n, sb / n, mean, se, median > "/dev/stderr"
    printf "{\"bench\":\"paired_seeds\",\"metric\":\"test_auc_delta_mean\",\"value\":%.6f,\"se\":%.6f,\"median\":%.6f,\"seeds\":%d,\"a_mean\":%.6f,\"b_mean\":%.6f,\"a\":\"%s\",\"b\":\"%s\",\"per_seed\":[%s]}\n",
      mean, se, median, n, sa / n, sb / n, a_name, b_name, per
  }' "$OUT"

#!/usr/bin/env bash
# Plots one or more training runs' metrics files (training.metrics_file:
# one JSON line per evaluation, written by rank 0) into one PNG: test AUC
# and loss against wall time and against examples trained.
#
#   deploy/plot/plot_metrics.sh [--title=TEXT] OUT.png [LABEL=]FILE...
#
# Each FILE is one run; LABEL names it in the legend (default: the file's
# name without .jsonl). Lines whose metrics are null (a run without test
# data) are skipped. Needs gnuplot (Debian's gnuplot-nox; installed when
# missing). Exit status: 0 with the PNG written, 2 for a usage error or a
# file without any usable line, 1 when gnuplot fails.
set -euo pipefail

TITLE="training runs"
if [[ "${1:-}" == --title=* ]]; then TITLE="${1#--title=}"; shift; fi
if [ $# -lt 2 ]; then
  sed -n '2,/^set/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
OUT="$1"; shift

if ! command -v gnuplot >/dev/null; then
  SUDO=(); [ "$(id -u)" -ne 0 ] && SUDO=(sudo)
  echo "plot_metrics: installing gnuplot-nox" >&2
  DEBIAN_FRONTEND=noninteractive "${SUDO[@]}" apt-get install -y -qq \
    --no-install-recommends gnuplot-nox fonts-dejavu-core >/dev/null
fi

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# JSON line -> "seconds examples test_auc test_logloss train_loss", sorted
# by seconds. The fields are those worker/trainer.cc writes; a field that
# is missing or null makes the line unusable.
extract() {
  awk '
    function field(name,   m) {
      if (match($0, "\"" name "\":[-+0-9.eE]+")) {
        m = substr($0, RSTART, RLENGTH); sub(/^[^:]*:/, "", m); return m
      }
      return ""
    }
    {
      s = field("seconds"); e = field("examples"); a = field("test_auc")
      l = field("test_logloss"); t = field("train_loss")
      if (s == "" || e == "" || a == "" || l == "") next
      if (t == "") t = "NaN"
      print s, e, a, l, t
    }' "$1" | sort -g -k1,1
}

plots_auc_t=(); plots_auc_e=(); plots_loss_t=(); plots_loss_e=()
i=0
for arg in "$@"; do
  label="${arg%%=*}"; file="${arg#*=}"
  if [ "$label" = "$arg" ]; then label="$(basename "$file" .jsonl)"; fi
  [ -r "$file" ] || { echo "plot_metrics: cannot read $file" >&2; exit 2; }
  i=$((i + 1))
  data="$WORK/run$i.dat"
  extract "$file" >"$data"
  [ -s "$data" ] || { echo "plot_metrics: no evaluation with test metrics in $file" >&2; exit 2; }
  label="${label//\"/}"
  plots_auc_t+=("'$data' using 1:3 with linespoints ls $i title \"$label\"")
  plots_auc_e+=("'$data' using (\$2/1e6):3 with linespoints ls $i title \"$label\"")
  plots_loss_t+=("'$data' using 1:4 with linespoints ls $i title \"$label test\", '$data' using 1:5 with lines ls $i dt 2 title \"$label train\"")
  plots_loss_e+=("'$data' using (\$2/1e6):4 with linespoints ls $i title \"$label test\", '$data' using (\$2/1e6):5 with lines ls $i dt 2 title \"$label train\"")
done

join() { local IFS=','; echo "$*"; }
cat >"$WORK/plot.gp" <<GP
set terminal pngcairo size 1400,900 font "DejaVu Sans,11"
set output "$OUT"
set multiplot layout 2,2 title "${TITLE//\"/}"
set grid
set key bottom right
set style line 1 lc rgb "#1f77b4" lw 2 pt 7 ps 0.6
set style line 2 lc rgb "#d62728" lw 2 pt 5 ps 0.6
set style line 3 lc rgb "#2ca02c" lw 2 pt 9 ps 0.6
set style line 4 lc rgb "#9467bd" lw 2 pt 11 ps 0.6
set style line 5 lc rgb "#ff7f0e" lw 2 pt 13 ps 0.6
set style line 6 lc rgb "#8c564b" lw 2 pt 3 ps 0.6
set xlabel "seconds since training began"
set ylabel "test AUC"
plot $(join "${plots_auc_t[@]}")
set xlabel "examples trained by the evaluating worker (millions)"
plot $(join "${plots_auc_e[@]}")
set key top right
set xlabel "seconds since training began"
set ylabel "log loss (test: solid; training, mean over the epoch so far: dashed)"
plot $(join "${plots_loss_t[@]}")
set xlabel "examples trained by the evaluating worker (millions)"
plot $(join "${plots_loss_e[@]}")
unset multiplot
GP
gnuplot "$WORK/plot.gp" || { echo "plot_metrics: gnuplot failed" >&2; exit 1; }
echo "plot_metrics: wrote $OUT ($i runs)" >&2

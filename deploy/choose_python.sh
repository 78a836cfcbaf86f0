# shellcheck shell=bash
# Sourced by deploy/local/demo.sh and deploy/slurm/ps.sbatch (bash): picks
# the interpreter for a worker command whose first element is "python3".
#
#   choose_python NAME SCRIPT [INSTALLER]
#
# sets PYTHON to $PS_PYTHON if set, else to the first of PATH's python3 and
# /usr/bin/python3 that imports what SCRIPT imports of NumPy and PyTorch
# (the ps package needs NumPy, ps.torch PyTorch). When none does and
# INSTALLER is given, runs `INSTALLER --python [--torch]` (the demo passes
# deploy/install_deps.sh) and looks again. Prints "NAME: <what each skipped
# interpreter lacks>: workers run PYTHON" when it skipped one; when none
# will do, prints one line naming each interpreter, what it lacks and the
# fix, and returns 1. psnode (deploy/launch/psnode.cc) checks the same way,
# with the same python_probe.py built into it, and never installs. Needs
# python_probe.py beside this file.

# The modules of NumPy and PyTorch that the Python script $1 imports, one a
# line: numpy for numpy or the ps package, torch for torch or ps.torch. A
# command that is not a readable .py file needs numpy (the ps package).
python_needs() {
  local script="$1" imports
  case "$script" in
    *.py) [ -r "$script" ] || { echo numpy; return; } ;;
    *) echo numpy; return ;;
  esac
  imports="$(grep -E '^[[:space:]]*(import|from)[[:space:]]' "$script" || true)"
  if grep -qE '\b(numpy|ps|torch)\b' <<<"$imports"; then echo numpy; fi
  if grep -qE '\btorch\b' <<<"$imports"; then echo torch; fi
  return 0
}

# The import check each candidate runs, kept beside this file (a copy of
# the tree, the bundle's bin/ and ps.sbatch's PS_BIN_DIR all carry both).
PS_PYTHON_PROBE="$(dirname "${BASH_SOURCE[0]}")/python_probe.py"

# Prints which of the modules $2... the interpreter $1 cannot import
# (nothing when it has them all); fails when $1 does not run.
python_missing() {
  local python="$1"
  shift
  "$python" -c "$(<"$PS_PYTHON_PROBE")" "$@" 2>/dev/null
}

# Sets PYTHON to the first of the candidate interpreters that imports every
# module of NEEDS, and NOTES to what each one before it lacks; fails when
# none does.
pick_python() {
  local candidates=() c missing seen=" "
  if [ -n "${PS_PYTHON:-}" ]; then
    candidates=("$PS_PYTHON")
  else
    c="$(command -v python3 || true)"
    [ -n "$c" ] && candidates+=("$c")
    candidates+=(/usr/bin/python3)
  fi
  PYTHON=""
  NOTES=()
  for c in "${candidates[@]}"; do
    [[ "$seen" == *" $c "* ]] && continue
    seen+="$c "
    if ! command -v "$c" >/dev/null; then
      NOTES+=("$c is not installed")
    elif ! missing="$(python_missing "$c" "${NEEDS[@]}")"; then
      NOTES+=("$c does not run")
    elif [ -n "$missing" ]; then
      NOTES+=("$c has no ${missing// /, no }")
    else
      PYTHON="$c"
      return 0
    fi
  done
  return 1
}

choose_python() {
  local name="$1" script="$2" installer="${3:-}" notes needs fix install=(--python)
  if [ ! -r "$PS_PYTHON_PROBE" ]; then
    echo "$name: $PS_PYTHON_PROBE is missing: copy deploy/python_probe.py beside choose_python.sh" >&2
    return 1
  fi
  mapfile -t NEEDS < <(python_needs "$script")
  [[ " ${NEEDS[*]} " == *" torch "* ]] && install+=(--torch)
  if ! pick_python && [ -n "$installer" ]; then
    "$installer" "${install[@]}"
    pick_python || true
  fi
  notes="$(printf '%s; ' "${NOTES[@]}")"
  notes="${notes%; }"
  needs="$(printf '%s, ' "${NEEDS[@]}")"
  needs="${needs%, }"
  if [ -z "$PYTHON" ]; then
    if [ -n "${PS_PYTHON:-}" ]; then
      fix="pip install ${NEEDS[*]} for PS_PYTHON=$PS_PYTHON, or unset PS_PYTHON"
    else
      fix="deploy/install_deps.sh ${install[*]} (for Debian's /usr/bin/python3), or PS_PYTHON=a python3 that has ${needs:-what it needs}"
    fi
    echo "$name: no python3 can run $(basename "${script:-python3}")${needs:+, which needs $needs}: $notes; fix: $fix" >&2
    return 1
  fi
  [ -z "$notes" ] || echo "$name: $notes: workers run $PYTHON" >&2
  return 0
}

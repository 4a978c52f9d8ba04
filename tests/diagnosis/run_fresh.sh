#!/usr/bin/env bash
# Runs the CPU sweep of every fresh mutant (tests/diagnosis/fresh_mutants.py) into a report directory,
# one mutant after another, with this checkout's harness (the one that holds this script).
#
#   tests/diagnosis/run_fresh.sh REPORT_DIR [extra `harness run` arguments, e.g. --dtype float32]
#
# Results: REPORT_DIR/cpu/<operator>.{jsonl,md,json} (backends named mutant:<id>), and
# REPORT_DIR/fresh-times.tsv (mutant, operator, exit status, seconds). Exit status 1 from a sweep is
# expected (the mutant fails cells); 2 or 3 (usage error, backend cannot run) is reported and fatal.
# At the end it prints the table of hints (tests/diagnosis/hint_table.py) into REPORT_DIR/fresh-hints.md.
set -euo pipefail

if [ $# -lt 1 ]; then
    echo "usage: $0 REPORT_DIR [extra harness run arguments]" >&2
    exit 2
fi
REPORT=$(mkdir -p "$1" && cd "$1" && pwd)
shift
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
PLUGIN=tests/diagnosis/fresh_mutants.py

python -c 'import harness, sys; print("harness from", harness.__file__, file=sys.stderr)'
# "operator id" per line, in the plugin's order
PAIRS=$(python - "$PLUGIN" <<'EOF'
import sys
from harness import registry
registry.load_plugin(sys.argv[1])
for m in registry.mutants():
    if m.id.startswith("fresh-"):
        print(m.operator, m.id)
EOF
)

TIMES="$REPORT/fresh-times.tsv"
printf 'mutant\toperator\texit\tseconds\n' > "$TIMES"
while read -r op id; do
    echo "=== $id ($op) ===" >&2
    t0=$(date +%s.%N)
    set +e
    python -m harness.cli run --kernel "$op" --sizes sweep --backend "mutant:$id" --device cpu \
        --plugin "$PLUGIN" --report "$REPORT" --no-progress "$@"
    rc=$?
    set -e
    secs=$(python -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.0f}')" "$t0" "$(date +%s.%N)")
    printf '%s\t%s\t%s\t%s\n' "$id" "$op" "$rc" "$secs" >> "$TIMES"
    echo "=== $id: exit $rc in ${secs}s ===" >&2
    if [ "$rc" -ge 2 ]; then
        echo "$id: harness run exited $rc (usage error or backend cannot run here)" >&2
        exit "$rc"
    fi
done <<< "$PAIRS"
cat "$TIMES"
# the table of hints (its grades are suggestions: see hint_table.py). It reads the hints stamped into the JSONL
# cells (record schema 1, up to 350e7a5); cells of schema 2 hold figures only and the hints are in the
# rendered REPORT_DIR/cpu/<operator>.md, which hint_table.py then says instead of making a table.
if python tests/diagnosis/hint_table.py "$REPORT" > "$REPORT/fresh-hints.md"; then
    cat "$REPORT/fresh-hints.md"
else
    echo "no hint table; the hints are in $REPORT/cpu/<operator>.md" >&2
fi

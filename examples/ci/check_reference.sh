#!/usr/bin/env bash
# CI job: re-derive the committed cost-optimal reference configurations (examples/reference/)
# with `provision check`, on the current catalog, simulator and performance model. Fails when
# any optimum moved (exit 1, with a design/field/old -> new diff) or a report is unreadable (2).
# After an intended change, regenerate them: bash examples/ci/regenerate_reference.sh
set -uo pipefail
cd "$(dirname "$0")/../.."

status=0
for report in examples/reference/*/report.json; do
  echo "== provision check $report"
  provision check "$report" --no-cache
  code=$?
  if [ "$code" -gt "$status" ]; then status=$code; fi
done
if [ "$status" -ne 0 ]; then
  echo "reference configurations drifted (exit $status)" >&2
fi
exit "$status"

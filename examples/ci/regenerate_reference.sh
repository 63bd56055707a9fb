#!/usr/bin/env bash
# Regenerate the committed reference reports (report.json only) from the example spec files:
# the cost-optimal configuration of BLOOM-176B and Llama2-70B on coding and conversation.
set -euo pipefail
cd "$(dirname "$0")/../.."

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for spec in examples/specs/*-min-cost.yaml; do
  name=$(basename "$spec" .yaml)
  provision search --spec "$spec" --no-cache --out "$scratch/$name" >/dev/null
  mkdir -p "examples/reference/$name"
  cp "$scratch/$name/report.json" "examples/reference/$name/report.json"
  echo "wrote examples/reference/$name/report.json"
done

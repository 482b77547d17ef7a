#!/bin/sh
# The conflict test of docs/mechanism.md: every lookup primary set removed on the copying tasks
# (ioi, induction), held-out statistics by `cel-numpy test-heads`. Resumable: a finished run
# directory is validated and skipped. One BLAS thread per run.
#   sh scripts/run_conflict.sh smollm2 200 runs/conflict     # ~15 min on one core
#   sh scripts/run_conflict.sh qwen2.5-coder-0.5b 100 runs/conflict
set -e
MODEL=$1; N=$2; OUT=$3
PY=${PYTHON:-python}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
case $MODEL in
  smollm2) SETS="L2H1+L13H2 L8H1+L13H7+L14H3 L10H8+L13H2+L14H3 L8H1+L10H8+L13H2
    L15H5+L21H1+L23H0 L8H1+L11H6+L13H2 L8H1+L13H2+L14H3
    L10H3+L11H5+L23H0 L1H2+L19H5+L23H0 L10H6+L19H2+L19H5 L17H8+L19H5+L29H2
    L8H0+L17H0+L23H0 L3H5+L10H3+L10H6 L7H2+L17H0+L24H6" ;;
  qwen2.5-coder-0.5b) SETS="L2H12+L7H8+L8H1 L6H2+L8H1+L9H3 L8H1+L10H3" ;;
  *) echo "unknown model $MODEL" >&2; exit 2 ;;
esac
for TASK in ioi induction; do
  for HEADS in $SETS; do
    DIR=$OUT/$MODEL-$TASK-$HEADS
    if [ -f "$DIR/report.json" ]; then echo "done: $DIR"; continue; fi
    $PY -m cel_numpy.cli test-heads --model "$MODEL" --task $TASK --heads "$HEADS" \
      --heldout "$N" --seed 0 --quiet --out "$DIR"
  done
done

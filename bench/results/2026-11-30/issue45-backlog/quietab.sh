#!/bin/bash
# Pairs (a then b) run only when the machine is quiet and nothing else started meanwhile;
# keeps going until $PAIRS clean pairs or $DEADLINE (epoch seconds).
OUT=${OUT:-/tmp/ab45/q}; mkdir -p $OUT; n=$(ls $OUT/a-*.json 2>/dev/null | wc -l)
busy() { for p in rustc cargo psrsearch python3 cc1; do pgrep -x $p >/dev/null && return 0; done; return 1; }
while [ $n -lt ${PAIRS:-4} ] && [ $(date +%s) -lt ${DEADLINE:-0} ]; do
  /tmp/waitquiet.sh 60 || continue
  busy && { sleep 5; continue; }
  n1=$((n+1))
  env ${A_ENV:-X=1} $A_BIN bench -n 2 --ops $OPS --sizes $SIZES --json $OUT/a-tmp.json > /dev/null 2>&1
  env ${B_ENV:-X=1} $B_BIN bench -n 2 --ops $OPS --sizes $SIZES --json $OUT/b-tmp.json > /dev/null 2>&1
  if busy; then echo "pair dropped: other work started"; continue; fi
  mv $OUT/a-tmp.json $OUT/a-$n1.json; mv $OUT/b-tmp.json $OUT/b-$n1.json; n=$n1; echo "pair $n at $(date +%T)"
done

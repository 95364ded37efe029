#!/bin/bash
# Waits until both cores have been >= 95% idle for 3 consecutive seconds (max $1 s).
end=$(( $(date +%s) + ${1:-600} )); ok=0
read -r _ a b c d e f g h _ < /proc/stat; pt=$((a+b+c+d+e+f+g+h)); pi=$((d+e))
while [ $(date +%s) -lt $end ]; do
  sleep 1
  read -r _ a b c d e f g h _ < /proc/stat; t=$((a+b+c+d+e+f+g+h)); i=$((d+e))
  idle=$(( 100 * (i-pi) / (t-pt) )); pt=$t; pi=$i
  if [ $idle -ge 95 ]; then ok=$((ok+1)); else ok=0; fi
  [ $ok -ge 3 ] && exit 0
done
exit 1

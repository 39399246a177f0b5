#!/bin/bash
# session 19 (prepared in session 18). `bash device_call.sh start` sets up the stock's packages and starts bg.sh in its own process session;
# `bash device_call.sh` (any call after) only waits. Each call polls until bg.sh is done or DC_WALL seconds
# (default 585) have passed, then packs what bg.sh wrote under /tmp/s19 into $OUT/s19.tar.gz.
# Learned in session 18: a call replaces the repository copy it runs in, so bg.sh must run from a copy of its
# own (/tmp/s19w): the first try ran from .snap, and the next call's copy removed the stock loop's oracle
# under its second repeat. Only 8 files come back from $OUT: one archive, not a tree.
here="$(cd "$(dirname "$0")/../../../.." && pwd)"       # the device's repository root (.snap and the carries)
t0=$(date +%s)
if [ "$1" = start ]; then
  rm -rf /tmp/s19w /tmp/s19 && mkdir -p /tmp/s19w /tmp/s19
  cp -a "$here/.snap" "$here/.whl" "$here/.oracle" "$here/.whl-stock" /tmp/s19w/
  (cd /tmp/s19w/.snap && source docs/bench/s6/device_stock_env.sh)
  nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv > /tmp/s19/gpu.txt 2>&1
  setsid nohup bash /tmp/s19w/.snap/docs/bench/s19/bg.sh > /tmp/s19/bg.log 2>&1 < /dev/null &
fi
while [ ! -f /tmp/s19/DONE ] && [ $(( $(date +%s) - t0 )) -lt ${DC_WALL:-585} ]; do sleep 5; done
(cd /tmp/s19 && tar -czf $OUT/s19.tar.gz --exclude='*.wav' --exclude='*trace*.json' .)
cat /tmp/s19/steps.txt 2>/dev/null; grep -v Warning /tmp/s19/stock-rows.txt 2>/dev/null | head -14
ls /tmp/s19/DONE 2>/dev/null && echo ALL-DONE

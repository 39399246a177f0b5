#!/bin/bash
# The version that ran in session 18 (it ran bg.sh from .snap, which the next call replaced; see
# docs/device-notes-session18.md). The fixed, general form is docs/bench/device_bg.sh.
# session 18: `bash device_call.sh start` sets up the stock's packages and starts bg.sh in its own process
# session; `bash device_call.sh` (any call after) only waits. Each call polls until bg.sh is done or DC_WALL
# seconds (default 585) have passed, then copies the small results under /tmp/s18 to $OUT.
cd "$(dirname "$0")/../../.."
t0=$(date +%s)
if [ "$1" = start ]; then
  mkdir -p /tmp/s18
  source docs/bench/s6/device_stock_env.sh
  nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv > /tmp/s18/gpu.txt 2>&1
  setsid nohup bash docs/bench/s18/bg.sh > /tmp/s18/bg.log 2>&1 < /dev/null &
fi
while [ ! -f /tmp/s18/DONE ] && [ $(( $(date +%s) - t0 )) -lt ${DC_WALL:-585} ]; do sleep 5; done
mkdir -p $OUT/s18 && (cd /tmp/s18 && tar -c --exclude='*.wav' --exclude='trace*.json' . | tar -x -C $OUT/s18)
cat /tmp/s18/steps.txt 2>/dev/null; grep -v Warning /tmp/s18/stock-rows.txt 2>/dev/null | head -14
ls /tmp/s18/DONE 2>/dev/null && echo ALL-DONE

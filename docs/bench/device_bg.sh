#!/bin/bash
# A device job that outlives one call: `bash docs/bench/device_bg.sh JOB start` copies the repository root (.snap and
# the carries) to /tmp/TAGw, sets up the stock's packages and starts JOB (a bash script in the repository, e.g.
# docs/bench/s19/bg.sh, which writes under /tmp/TAG and touches /tmp/TAG/DONE) in its own process session;
# `bash docs/bench/device_bg.sh JOB` (any call after) only waits. TAG is the JOB's folder name (s19). Each call polls
# until the job is done or DC_WALL seconds (default 585) have passed, then packs /tmp/TAG into $OUT/TAG.tar.gz.
# Issue the next call within the machine's idle release (30 s) or it goes back, and the job with it.
# Learned in session 18: a call replaces the repository copy it runs in, so the job runs from a copy of its own
# (the first try ran from .snap, and the next call's copy removed the stock loop's oracle under its second
# repeat); only 8 files come back from $OUT, so one archive, not a tree.
job="$1"; tag="$(basename "$(dirname "$job")")"
here="$(cd "$(dirname "$0")/../../.." && pwd)"          # the device's repository root (.snap and the carries)
t0=$(date +%s)
if [ "$2" = start ]; then
  rm -rf /tmp/${tag}w /tmp/$tag && mkdir -p /tmp/${tag}w /tmp/$tag
  cp -a "$here/.snap" "$here/.whl" "$here/.oracle" "$here/.whl-stock" /tmp/${tag}w/
  (cd /tmp/${tag}w/.snap && source docs/bench/s6/device_stock_env.sh)
  nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv > /tmp/$tag/gpu.txt 2>&1
  setsid nohup bash /tmp/${tag}w/.snap/$job > /tmp/$tag/bg.log 2>&1 < /dev/null &
fi
while [ ! -f /tmp/$tag/DONE ] && [ $(( $(date +%s) - t0 )) -lt ${DC_WALL:-585} ]; do sleep 5; done
(cd /tmp/$tag && tar -czf $OUT/$tag.tar.gz --exclude='*.wav' --exclude='*trace*.json' .)
cat /tmp/$tag/steps.txt 2>/dev/null; grep -v Warning /tmp/$tag/stock-rows.txt 2>/dev/null | head -14
ls /tmp/$tag/DONE 2>/dev/null && echo ALL-DONE

#!/bin/bash
# the MiniCPM-o 60 s graphs bench at HEAD (re-timed), then every GPU test (next session: after the CUDA-parity changes)
cd "$(dirname "$0")/../../.."      # the repository copy (.snap) this script sits in
python3 -m pip install -q --no-deps ../.whl/soxr*.whl ../.whl/einops*.whl $(ls ../.whl-stock/soundfile*.whl ../.whl-stock/cffi*.whl ../.whl-stock/pycparser*.whl 2>/dev/null) 2>&1 | grep -v WARNING | tail -1
export PYTHONPATH=.:../.oracle:tests
timeout 130 python3 -m engine.bench.cli session --backbone minicpm-o-4.5 --size released --device cuda --seconds 60 --modes graphs --flip-seconds 0 --account-seconds 4 --quiet --out $OUT/mc-final > $OUT/mc-final.txt 2>&1
echo "exit $?" >> $OUT/mc-final.txt; grep -v Warning $OUT/mc-final.txt | grep -v "^  _warn" | tail -22
timeout 250 python3 -m pytest -q -m gpu -p no:cacheprovider -s -rs tests/test_core_gpu.py tests/test_host_gpu.py tests/test_memory_cap_gpu.py tests/test_minicpmo45_gpu.py tests/test_session_gpu.py tests/test_step_audio2_gpu.py tests/test_fastpath_gpu.py tests/test_mimi_gpu.py tests/test_nemotron_gpu.py tests/test_memory_map.py > $OUT/gpu-tests-final.txt 2>&1
echo "exit $?" >> $OUT/gpu-tests-final.txt; grep -E "upgraded|late|refused|passed|failed|^E |exit|^FAILED" $OUT/gpu-tests-final.txt | cut -c1-300 | tail -20

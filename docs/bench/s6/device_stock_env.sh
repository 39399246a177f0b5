#!/bin/bash
# sourced from the repository copy (.snap) on the device: the product's extras, the stock's packages
# (transformers 4.51.3 and the rest of tests/stock-loop-requirements.txt, from carried py3.12 wheels, in
# /tmp/vs-site ahead of the image's own: its CUDA torch stays) behind the interpreter /tmp/vs/python, and
# the oracle at ../shared/oracles where the tests look for it
python3 -m pip install -q --no-deps ../.whl/soxr*.whl ../.whl/einops*.whl ../.whl-stock/soundfile*.whl ../.whl-stock/cffi*.whl ../.whl-stock/pycparser*.whl 2>&1 | grep -v WARNING | tail -1
if [ ! -x /tmp/vs/python ]; then
  python3 -m pip install -q --no-deps --no-index --target /tmp/vs-site ../.whl-stock/*.whl 2>&1 | grep -v WARNING | tail -2
  mkdir -p /tmp/vs
  printf '#!/bin/bash\nexport PYTHONPATH=/tmp/vs-site${PYTHONPATH:+:$PYTHONPATH}\nexec python3 "$@"\n' > /tmp/vs/python
  chmod +x /tmp/vs/python
fi
mkdir -p ../shared && ln -sfn "$PWD/shared-oracles" ../shared/oracles
export PYTHONPATH=.:../.oracle:tests DC_STOCK_PYTHON=/tmp/vs/python
/tmp/vs/python -c "import transformers, tokenizers, librosa, hyperpyyaml, diffusers, torch; print('stock packages: transformers', transformers.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available())" 2>&1 | tail -3
python3 -c "import soundfile, soxr, einops; print(\"product extras ok\")" 2>&1 | tail -1

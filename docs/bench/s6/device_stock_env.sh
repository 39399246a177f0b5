#!/bin/bash
# sourced from the repository copy (.snap) on the device: the product's extras, the stock's packages
# (transformers 4.51.3 and the rest of tests/stock-loop-requirements.txt, from carried py3.12 wheels, in
# /tmp/vs-site ahead of the image's own: its CUDA torch stays) behind the interpreter /tmp/vs/python, and
# the oracle at ../shared/oracles where the tests look for it.
# .whl-stock/ is git-ignored; on this (networked) machine it is made with:
#   .venv/bin/python -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl-stock \
#     transformers==4.51.3 tokenizers==0.21.4 huggingface_hub==0.36.2 librosa==0.11.0 soundfile==0.14.0 \
#     hyperpyyaml==1.2.3 ruamel.yaml==0.18.17 diffusers==0.35.2 importlib_metadata==10.2.0 zipp==4.1.2 \
#     audioread==3.1.0 pooch==1.9.0 decorator==5.3.1 platformdirs==4.14.9 cffi==2.1.1 pycparser==3.12
# and each call carries .snap (a `git archive HEAD` copy, with shared-oracles/ = ../shared/oracles copied in),
# .whl, .oracle and .whl-stock.
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
# the released-dims folder (seeded random bfloat16 weights, 16.5 GiB) at /tmp/mc-released, written once per machine
released_folder() {
  [ -f /tmp/mc-released/config.json ] || python3 tests/minicpmo45_stock_folder.py /tmp/mc-released --size released \
    > $OUT/released-folder.txt 2>&1
}

#!/usr/bin/env bash
# Transformer Engine for the offline GPU machine (Python 3.12, torch 2.11.0+cu130), staged in
# carry-sized folders .te1 ... .teN (git-ignored) for back-to-back device calls.
#   bash scripts/stage_te.sh        (from the repository root; needs python3.12, nvcc 13 and the index)
# Its PyTorch extension, transformer_engine_torch, has no wheel on the index: it is built here
# against torch 2.11.0 (the index's default 2.11.0 is the CUDA 13.0 build) in .te_build/. It is
# host C++ only (every CUDA kernel is in the -cu13 core's libtransformer_engine.so), so no GPU
# is needed; NVTE_CUDA_ARCHS=90 only decides that the expert-parallel bindings are built, as in
# the core wheel. The toolkit's headers for cuBLAS, cuDNN and NCCL come from torch's nvidia-*
# wheels. Then the core, the extension and what `import transformer_engine.pytorch` needs beyond
# the device's own packages go through ../shared/device/stage_wheels.sh.
# On the device: each call runs `mkdir -p /tmp/stage && cp .tek/* /tmp/stage/` for its folder,
# in any order, and the last also `eval "$(bash /tmp/stage/unstage.sh)"`; import torch before
# transformer_engine (the core's loader finds libnccl through torch's).
set -euo pipefail
TE=2.20.2
TORCH=2.11.0
PYTHON=${PYTHON:-python3.12}
"$PYTHON" -c "" 2>/dev/null || PYTHON=$(ls ~/.pyenv/versions/3.12*/bin/python3.12 | tail -1)
STAGE=${STAGE:-../shared/device/stage_wheels.sh}
root=$(git rev-parse --show-toplevel); cd "$root"
build=$root/.te_build
wheel=$(ls "$build"/dist/transformer_engine_torch-$TE-cp312-*.whl 2>/dev/null || true)
if [ -z "$wheel" ]; then
  "$PYTHON" -m venv "$build/venv"
  "$build/venv/bin/pip" install -q "torch==$TORCH" "transformer-engine==$TE" \
    "transformer-engine-cu13==$TE" pybind11 ninja setuptools wheel packaging
  "$build/venv/bin/python" -c "import torch; assert torch.version.cuda == '13.0', torch.version.cuda"
  site=$("$build/venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  "$build/venv/bin/pip" download -q --no-deps "transformer_engine_torch==$TE" -d "$build/src"
  PATH=$build/venv/bin:/usr/local/cuda/bin:$PATH CUDA_HOME=/usr/local/cuda \
    NVTE_FRAMEWORK=pytorch NVTE_CUDA_ARCHS=90 NVTE_PYTORCH_FORCE_BUILD=TRUE MAX_JOBS=2 \
    CPLUS_INCLUDE_PATH=$site/nvidia/cu13/include:$site/nvidia/cudnn/include:$site/nvidia/nccl/include \
    "$build/venv/bin/pip" wheel -q --no-build-isolation --no-deps \
    "$build/src/transformer_engine_torch-$TE.tar.gz" -w "$build/dist"
  wheel=$(ls "$build"/dist/transformer_engine_torch-$TE-cp312-*.whl)
fi
# The device has numpy, packaging, PyYAML and typing_extensions (torch's and transformers'),
# and apache-tvm-ffi comes with flash-attn-4's folders.
bash "$STAGE" te "transformer-engine==$TE" "transformer-engine-cu13==$TE" einops==0.8.2 \
  onnx==1.23.2 onnxscript==0.7.2 onnx_ir==1.1.0 ml_dtypes==0.7.0 protobuf==7.36.2 \
  pydantic==2.14.4 pydantic_core==2.50.5 typing_inspection==0.4.5 annotated_types==0.8.0 \
  nvdlfw-inspect==0.2.2 nvidia-cudnn-frontend==1.32.0
last=$(ls -d .te[0-9]* | sort -V | tail -1)
cp "$wheel" "$last/"
du -sh .te[0-9]*

# Sourced by the GPU machine's scripts (gpu_phases.sh, gpu_evidence.sh, triton_evidence.sh):
#   . benchmarks/device_env.sh FILE
# puts the carried wheels (.whl/, from benchmarks/device_wheels.py) on PYTHONPATH (installed
# once per machine into /tmp/site), the checkout's src/ and tests/ too, points the kernel cache
# at /tmp/assay-kernels (unless set), and appends the device, driver, torch, Triton and nvcc
# versions to FILE.
if [ ! -d /tmp/site ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || return 1
fi
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests PYTHONUNBUFFERED=1
export ASSAY_KERNEL_CACHE=${ASSAY_KERNEL_CACHE:-/tmp/assay-kernels}
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, triton; print("torch", torch.__version__, torch.version.cuda,
              "triton", triton.__version__)'
  nvcc --version | tail -1; } 2>&1 | tee -a "$1"

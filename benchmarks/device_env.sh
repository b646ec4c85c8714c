# Sourced by the GPU machine's scripts (gpu_phases.sh, gpu_evidence.sh, triton_evidence.sh):
#   . benchmarks/device_env.sh FILE
# puts the carried wheels (.whl/, from benchmarks/device_wheels.py) on PYTHONPATH (each
# installed once per machine into /tmp/site: a wheel carried to a warm machine later is added),
# the checkout's src/ and tests/ too, points the kernel cache at /tmp/assay-kernels (unless
# set), and appends the device, driver, torch, Triton and nvcc versions to FILE.
fresh=()
for wheel in .whl/*.whl; do
  [ -e "$wheel" ] && [ ! -e "/tmp/site/.installed/${wheel##*/}" ] && fresh+=("$wheel")
done
if [ ${#fresh[@]} -gt 0 ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site "${fresh[@]}" || return 1
  mkdir -p /tmp/site/.installed
  for wheel in "${fresh[@]}"; do touch "/tmp/site/.installed/${wheel##*/}"; done
fi
export PYTHONPATH=/tmp/site:$PWD/src:$PWD/tests PYTHONUNBUFFERED=1
export ASSAY_KERNEL_CACHE=${ASSAY_KERNEL_CACHE:-/tmp/assay-kernels}
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c 'import torch, triton; print("torch", torch.__version__, torch.version.cuda,
              "triton", triton.__version__)'
  nvcc --version | tail -1; } 2>&1 | tee -a "$1"

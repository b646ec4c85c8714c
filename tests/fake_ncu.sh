#!/bin/sh
# Stands in for Nsight Compute on machines without it (tests/test_profile_sandbox.py): takes
# ncu's options as assay.profile.tools.ncu_command writes them, writes what this "profiler"
# process can see (its environment, uid) into the --log-file, then execs the target program as
# ncu does. It runs wherever ncu would: so the test shows the profiler is inside the sandbox.
log=/dev/null
while [ "$#" -gt 0 ]; do
  case "$1" in
    --log-file) log="$2"; shift 2 ;;
    --metrics|--launch-count|--target-processes|--kernel-name|--kernel-name-base) shift 2 ;;
    --*) shift ;;
    *) break ;;
  esac
done
{ echo "# fake ncu: uid $(id -u)"; env | sed 's/^/# env /'; } > "$log"
exec "$@"

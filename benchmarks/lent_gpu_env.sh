# Sourced on the lent GPU machine (device `run`, carry [".whl", ".gpu", "grpofleet", ...]): installs the carried
# wheels and unpacks the carried bubblewrap, then exports what the fleet needs. Files stay only while the machine is
# warm, so a call that carries them installs them again (~10 s); a later call on the same warm machine may leave
# them behind and reuses what the first one installed (a call on a fresh machine without them fails here, saying so).
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
elif [ ! -d /tmp/site ]; then
  echo "lent_gpu_env.sh: no wheels in .whl/ and none installed in /tmp/site: carry .whl" >&2
  return 1 2>/dev/null || exit 1
fi
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 GRPO_FLEET_CACHE=/tmp/grpo-fleet-cache
# The sandbox's tests run on an interpreter probed with `python -I` (PYTHONPATH ignored): a venv over the host's
# Python holding the pytest the task set was built with (.whl/test), named by GRPO_FLEET_TEST_PYTHON
# (gpu_fleet_swe.py and swe_speedrun.sh pass it as sandbox.python). The host's own pytest 8 named a long parameter
# differently and graded two boltons gold patches NO.
if compgen -G ".whl/test/*.whl" > /dev/null; then
  rm -rf /tmp/testpy && python3 -m venv --without-pip /tmp/testpy \
    && python3 -m pip install -q --no-index --no-deps --no-compile --target \
      "$(/tmp/testpy/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" .whl/test/*.whl
fi
if [ -x /tmp/testpy/bin/python ]; then export GRPO_FLEET_TEST_PYTHON=/tmp/testpy/bin/python; fi
if compgen -G ".gpu/deb/*.deb" > /dev/null; then
  mkdir -p /tmp/bw && for f in .gpu/deb/*.deb; do dpkg -x "$f" /tmp/bw; done
elif [ ! -x /tmp/bw/usr/bin/bwrap ]; then
  echo "lent_gpu_env.sh: no .deb in .gpu/deb/ and no bubblewrap unpacked in /tmp/bw: carry .gpu/deb" >&2
  return 1 2>/dev/null || exit 1
fi
export PATH=/tmp/bw/usr/bin:$PATH LD_LIBRARY_PATH=/tmp/bw/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
bwrap --unshare-all --die-with-parent --ro-bind / / true && echo "bwrap ok"

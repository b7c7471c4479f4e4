# Sourced on the lent GPU machine (device `run`, carry [".whl", ".gpu", "grpofleet", ...]): installs the carried
# wheels and unpacks the carried bubblewrap, then exports what the fleet needs. Everything is redone per call (~10 s):
# files stay only while the machine is warm. What travels is made by `bash benchmarks/gpu_fleet_swe.sh prepare`.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 GRPO_FLEET_CACHE=/tmp/grpo-fleet-cache
mkdir -p /tmp/bw && for f in .gpu/deb/*.deb; do dpkg -x "$f" /tmp/bw; done
export PATH=/tmp/bw/usr/bin:$PATH LD_LIBRARY_PATH=/tmp/bw/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
bwrap --unshare-all --die-with-parent --ro-bind / / true && echo "bwrap ok"

"""The Dockerfile's gpu variant built for real, without a GPU, on the pypi-cuda13 base (Debian 13, PyPI's
torch 2.11.0 and CUDA 13.0 compiler, Debian's Open MPI): Apex compiles with amp_C and apex_C, Horovod with
NCCL, MPI and Gloo, and inside the image they import and `gpt2dist doctor --no-gpu --gpus 8 --preset paper`
passes (the build's last step). About an hour on 2 cores when nothing is cached, so it runs only when asked
for: `pytest -m gpu_image` (conftest deselects it otherwise); containers/README.md records its last run.
Where GitHub cannot be reached, APEX_SRC names Apex's source archive (tag 25.05), which the build mounts."""

from __future__ import annotations

import pytest

from test_image import _checked, podman_env  # noqa: F401  (the fixture, shared)

pytestmark = [pytest.mark.gpu_image, pytest.mark.timeout(7200)]
TAG = "localhost/gpt2dist-test:gpu"
IMPORTS = ("import apex.amp, apex.parallel, amp_C, apex_C; import horovod.torch as hvd; "
           "print('nccl', bool(hvd.nccl_built()), 'mpi', hvd.mpi_built(), 'gloo', hvd.gloo_built())")  # nccl: its version


def test_the_gpu_variant_builds_on_pypi_cuda13_and_its_extensions_import(podman_env):  # noqa: F811
    base = _checked(["bash", "containers/standin/build.sh", "pypi-cuda13"], podman_env, 3600).strip().splitlines()[-1]
    _checked(["bash", "containers/build_image.sh", "--variant", "gpu", "--base", base, "--tag", TAG], podman_env, 6000)
    out = _checked(["podman", "run", "--rm", "--network", "none", TAG, "python", "-c", IMPORTS], podman_env, 300)
    assert out.split() == ["nccl", "True", "mpi", "True", "gloo", "True"], out
    doctor = _checked(["podman", "run", "--rm", "--network", "none", TAG, "gpt2dist", "doctor", "--no-gpu", "--gpus",
                       "8", "--params", "/opt/gpt2dist/params.yaml", "--preset", "paper"], podman_env, 300)
    assert "ok: everything preset 'paper'" in doctor, doctor

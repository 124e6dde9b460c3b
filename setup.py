"""The optional C extension of fcoll (the rest of the build is in pyproject.toml).

``fcoll.backends._shmcore`` steps the on-node shared-memory segment in C. It is built with
the machine's C compiler at ``-O3`` for the baseline of the target architecture (no
``-march=native``: a wheel runs on any CPU of its platform), without ``-ffast-math``, and
with ``-ffp-contract=off`` so that no multiply-add is fused: results stay bit-identical to
numpy's. ``optional=True``: without a compiler the install still succeeds and fcoll uses its
numpy path (``python -m fcoll info`` says which one runs; ``FCOLL_NATIVE=0`` forces numpy).
The folds are built twice on x86-64, for the baseline and for AVX2, and the CPU picks one at
load time (``target_clones``). ``FCOLL_SANITIZE=1`` at build time adds AddressSanitizer and
UBSan and builds the baseline folds alone (scripts/sanitize.sh).
"""

import os

import numpy
from setuptools import Extension, setup

flags = ["-std=c11", "-O3", "-ffp-contract=off", "-fno-strict-aliasing", "-Wall", "-Wextra",
         "-Wno-unused-parameter", "-Wno-missing-field-initializers", "-Wno-cast-function-type"]
link = []
if os.environ.get("FCOLL_SANITIZE") == "1":
    flags += ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
              "-fno-omit-frame-pointer", "-O1", "-g", "-DFCOLL_NO_CLONES"]
    link += ["-fsanitize=address,undefined"]

sources = [f"fcoll/backends/{name}.c"
           for name in ("_shmcore", "_shmfold", "_shmfast", "_shmxla", "_shmalltoall")]
# _shmxla.c is the XLA FFI handler (fcoll.xla.channel): against XLA's C API header, vendored
# under fcoll/backends/vendor (with its licence), so neither jaxlib nor MPI is needed to build.
depends = ["fcoll/backends/_shmcore.h", "fcoll/backends/vendor/xla/ffi/api/c_api.h"]
setup(ext_modules=[Extension("fcoll.backends._shmcore", sources, depends=depends,
                             include_dirs=[numpy.get_include(), "fcoll/backends/vendor"],
                             extra_compile_args=flags, extra_link_args=link, optional=True)])

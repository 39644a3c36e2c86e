"""Build of the C kernel; everything else is declared in setup.cfg."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("smerge.merge._ckernel", ["merge/_ckernel.c"], extra_compile_args=["-O3"]),
                   Extension("smerge.merge._wjoin_ckernel", ["merge/_wjoin_ckernel.c"], extra_compile_args=["-O3"])])

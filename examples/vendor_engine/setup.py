"""The build step: compile csrc/vendor_kernels.c into a shared library inside the package.

It is built as a setuptools Extension (the system C compiler) but is a plain C library
with no Python in it: triplane loads it through ctypes and the C ABI of
``triplane_engine.h``, found in the installed triplane (or this checkout's copy).
"""

from pathlib import Path

from setuptools import Extension, setup


def _abi_include() -> str:
    try:
        from triplane.engines.cabi import header_path

        return str(header_path().parent)
    except ImportError:  # building from the triplane checkout without triplane installed
        return str(Path(__file__).resolve().parents[2] / "triplane" / "engines" / "cabi")


setup(ext_modules=[Extension("triplane_vendor._vendor_kernels", sources=["csrc/vendor_kernels.c"],
                             include_dirs=[_abi_include()], libraries=["m"],
                             extra_compile_args=["-O2", "-std=c99"])])

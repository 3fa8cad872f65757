"""Only here for the C extensions; all metadata lives in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "proxy.wire._scanner",
            sources=["proxy/wire/_scanner.c"],
            extra_compile_args=["-O2", "-Wall", "-Werror"],
            optional=False,
        ),
        Extension(
            "proxy.cache._assemble",
            sources=["proxy/cache/_assemble.c"],
            extra_compile_args=["-O2", "-Wall", "-Werror"],
            optional=False,
        ),
        Extension(
            "proxy.cache._names",
            sources=["proxy/cache/_names.c"],
            extra_compile_args=["-O2", "-Wall", "-Werror"],
            optional=False,
        ),
    ]
)

"""Only here for the C scanner; all metadata lives in pyproject.toml."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "proxy.wire._scanner",
            sources=["proxy/wire/_scanner.c"],
            extra_compile_args=["-O2", "-Wall", "-Werror"],
            optional=False,
        )
    ]
)

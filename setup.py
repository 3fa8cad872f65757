"""Only here for the C extensions; all metadata lives in pyproject.toml."""

from setuptools import Extension, setup

# -Wall but never -Werror: a user's newer compiler may warn where ours does not, and a warning
# must not stop their `pip install`. The project's own check (scripts/check.sh) adds -Werror
# through CFLAGS, so a warning fails CI and scripts/test.sh instead.
FLAGS = ["-O2", "-Wall"]
MODULES = {
    "proxy.wire._scanner": "proxy/wire/_scanner.c",
    "proxy.cache._assemble": "proxy/cache/_assemble.c",
    "proxy.cache._names": "proxy/cache/_names.c",
}

setup(
    ext_modules=[
        Extension(name, sources=[source], extra_compile_args=FLAGS, optional=False)
        for name, source in MODULES.items()
    ]
)

"""Fuzzing of the proxy's hostile-input surface: the Thrift message reader, the argument
decoder and the cache planner. ``targets`` is the fuzz target, ``mutate`` makes inputs from
real calls, ``run`` is the dedicated long run (``python -m tests.fuzz.run --inputs 1000000``).
"""

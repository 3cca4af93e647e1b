"""Metal support: the CPU emulator of Metal compute kernels (``emulator``,
built by ``msl_build`` from source read by ``msl_lex`` / ``msl_source``, run
by the fiber runtime and the ``shim_*.h`` headers) and the clang
address-space pass (``static_check``).

The kernels themselves live in ``muser_torch/csrc/metal``; ``ops/mps.py``
assembles and dispatches them.
"""

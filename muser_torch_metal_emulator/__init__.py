"""Metal support: the CPU emulator of Metal compute kernels (``emulator``,
built by ``msl_build`` from source read by ``msl_lex`` / ``msl_source``, run
by the fiber runtime and the ``shim_*.h`` headers) and the clang
address-space pass (``static_check``).

It imports nothing from ``muser_torch``; its one caller is ``muser_torch/ops/metal``,
which holds the kernels, assembles them and dispatches to them.
"""

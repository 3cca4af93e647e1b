"""Metal support: the CPU emulator of Metal compute kernels (``emulator``).

The kernels themselves live in ``muser_torch/csrc/metal``; ``ops/mps.py``
assembles and dispatches them.
"""

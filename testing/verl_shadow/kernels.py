"""Hides the project's `kernels` package from verl's environment (see testing/verl_env.py).

transformers 5.10 (verl's pin) builds hub-kernel descriptors at import time in a form newer `kernels` releases
(0.18+) reject with a ValueError, which its `except ImportError` does not catch; the project's virtualenv carries
such a release for its own newer transformers. Hub kernels are CUDA-only and the hub is offline in these
subprocesses, so verl's environment runs without them: this import fails as if `kernels` were not installed.
"""

raise ImportError("hub kernels are off in verl's test environment (testing/verl_shadow)")

"""A device tensor's copy to the host that does not stop the launch queue."""
from __future__ import annotations

import torch

__all__ = ["HostCopy"]


class HostCopy:
    """Tokens on their way to the host: on CUDA a pinned copy that runs
    behind the next steps (``Generation.stream``'s windows, ``draft_rounds``'
    rounds); elsewhere a plain copy."""

    def __init__(self, tokens: torch.Tensor):
        self.ready = None
        if tokens.device.type == "cuda":
            self.host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
            self.host.copy_(tokens, non_blocking=True)
            self.ready = torch.cuda.Event()
            self.ready.record()
        else:
            self.host = tokens.cpu()

    def tokens(self) -> torch.Tensor:
        if self.ready is not None:
            self.ready.synchronize()
        return self.host
